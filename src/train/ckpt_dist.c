/* Sharded checkpoints: per-rank ckpt_save folders and rank 0's latest.json commit marker. */
#include "train/ckpt_dist.h"

#include <dirent.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fs.h"
#include "core/json.h"
#include "core/log.h"
#include "core/param_table.h"
#include "io/hf_config.h"
#include "io/hf_export.h"
#include "io/hf_keys.h"
#include "io/safetensors.h"
#include "train/shard_slice.h"

#define FORMAT "qtitan-sharded-checkpoint"
#define LAYOUT_FORMAT "qtitan-shard-layout"

char *ckpt_dist_rank_dir(const char *root, int rank) {
    char name[32];
    snprintf(name, sizeof name, "rank-%d", rank);
    return fs_join(root, name);
}

/* The marker's version; markers without one (and without a checksum) were written before
 * latest.json carried its own checksum. */
#define MARKER_VERSION 2

/* A mesh [dp_replicate, dp_shard, tp, ep] as recorded for `ranks` processes (m absent: [1,
 * ranks, 1, 1]; ep absent, as markers written before expert parallelism have it: 1): 3 or 4
 * positive integers whose first three multiply to ranks, and an expert-parallel degree from 1
 * to ranks. */
static int parse_mesh(const json_t *m, int64_t ranks, int64_t mesh[4], const char *path, Err *err) {
    mesh[0] = 1, mesh[1] = ranks, mesh[2] = 1, mesh[3] = 1;
    size_t len = json_is_array(m) ? json_array_size(m) : 0;
    for (size_t k = 0; k < 4 && k < len; k++)
        mesh[k] = json_integer_value(json_array_get(m, k));
    /* Checked before multiplying: a hostile mesh must not wrap to the right product. */
    int64_t product = 0;
    if (m && (!json_is_array(m) || (len != 3 && len != 4) || mesh[0] < 1 || mesh[1] < 1 ||
              mesh[2] < 1 || __builtin_mul_overflow(mesh[0], mesh[1], &product) ||
              __builtin_mul_overflow(product, mesh[2], &product) || product != ranks ||
              mesh[3] < 1 || mesh[3] > ranks))
        return err_set(err,
                       "%s: mesh must be 3 positive integers whose product is ranks, and an "
                       "expert-parallel degree from 1 to ranks",
                       path);
    return 0;
}

/* The marker's fields, from its parsed (and checked) JSON o. */
static int parse_marker(const json_t *o, const char *path, int64_t *steps, int *n, int64_t *ranks,
                        int64_t mesh[4], Err *err) {
    const char *format = NULL;
    json_t *list = json_object_get(o, "steps"), *version = json_object_get(o, "version");
    TRY(json_req_str(o, "format", &format, path, err));
    TRY(json_req_int(o, "ranks", ranks, path, err));
    if (strcmp(format, FORMAT) != 0 || !json_is_array(list) ||
        json_array_size(list) > CKPT_DIST_MAX_KEPT)
        return err_set(err, "%s: expected format \"%s\" and a list \"steps\" of at most %d numbers",
                       path, FORMAT, CKPT_DIST_MAX_KEPT);
    if (version && (!json_is_integer(version) || json_integer_value(version) != MARKER_VERSION))
        return err_set(err, "%s: version must be %d (written by another qtitan?)", path,
                       MARKER_VERSION);
    TRY(parse_mesh(json_object_get(o, "mesh"), *ranks, mesh, path, err));
    for (size_t i = 0; i < json_array_size(list); i++) {
        json_t *v = json_array_get(list, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return err_set(err, "%s: steps[%zu] is not a step number", path, i);
        steps[(*n)++] = json_integer_value(v);
    }
    return 0;
}

/* The ranks and mesh that wrote root/rank-0/step-N, from its layout.json (which records them
 * from this version on); -1 when it does not. */
static int step_mesh(const char *root, int64_t step, int64_t *ranks, int64_t mesh[4]) {
    char name[48];
    snprintf(name, sizeof name, "step-%" PRId64 "/%s", step, CKPT_DIST_LAYOUT);
    char *dir = ckpt_dist_rank_dir(root, 0), *path = fs_join(dir, name);
    Err ignore;
    json_t *o = json_load_path(path, &ignore);
    int rc = o && json_req_int(o, "ranks", ranks, path, &ignore) == 0 && *ranks >= 1 &&
                     *ranks <= 1 << 20 && json_object_get(o, "mesh") &&
                     parse_mesh(json_object_get(o, "mesh"), *ranks, mesh, path, &ignore) == 0
                 ? 0
                 : -1;
    json_decref(o);
    free(dir), free(path);
    return rc;
}

/* 1 when every rank's root/rank-K/step-N (K < ranks) passes ckpt_verify's cheap check (the
 * state's own checksum and step, every file's size; a resume verifies the checksums). */
static int step_complete(const char *root, int64_t step, int64_t ranks) {
    char name[48];
    snprintf(name, sizeof name, "step-%" PRId64, step);
    int ok = 1;
    for (int64_t k = 0; k < ranks && ok; k++) {
        char *rdir = ckpt_dist_rank_dir(root, (int)k), *dir = fs_join(rdir, name);
        Err ignore;
        ok = ckpt_verify(dir, 0, &ignore) == 0;
        free(rdir), free(dir);
    }
    return ok;
}

/* What a broken marker should have said, from the step directories: the newest step of
 * rank-0 whose layout records the mesh that wrote it and that every rank of that mesh holds
 * complete, and the older complete steps of the same mesh (oldest first, as the marker lists
 * them). *n = 0 when rank-0 holds no step at all; -1 when it holds some but none can be
 * recovered (written before layouts recorded the mesh, or incomplete). */
static int scan_steps(const char *root, int64_t *steps, int *n, int64_t *ranks, int64_t mesh[4],
                      Err *err) {
    char *dir0 = ckpt_dist_rank_dir(root, 0);
    int64_t *all, got[CKPT_DIST_MAX_KEPT];
    int nall, k = 0;
    int rc = ckpt_list_steps(dir0, &all, &nall, err);
    free(dir0);
    TRY(rc);
    for (int i = 0; i < nall && k < CKPT_DIST_MAX_KEPT; i++) {
        int64_t r, m[4];
        if (step_mesh(root, all[i], &r, m) != 0) continue;
        if (k > 0 && (r != *ranks || memcmp(m, mesh, sizeof m) != 0)) continue;
        if (!step_complete(root, all[i], r)) continue;
        if (k == 0) *ranks = r, memcpy(mesh, m, sizeof m);
        got[k++] = all[i];
    }
    free(all);
    for (int i = 0; i < k; i++)
        steps[i] = got[k - 1 - i];
    *n = k;
    if (nall > 0 && k == 0)
        return err_set(err,
                       "no step could be recovered from the step directories of %s (none is "
                       "complete on every rank with a layout.json that records its mesh)",
                       root);
    return 0;
}

/* Rank 0: the marker's steps (oldest first) into steps[0..*n), *ranks and the mesh
 * [dp_replicate, dp_shard, tp, ep]. 0 and *n = 0 when there is neither a marker nor a step
 * directory. A marker that does not parse or fails its own checksum (a flipped byte, a hand
 * edit, a truncation), or is missing while rank-0 holds steps (deleted, a link to nothing, a
 * crash between the step directories and the commit), is replaced by what the step directories
 * hold (scan_steps), with a warning when warn is set: a fresh start would overwrite them. One
 * without a version and a checksum, written before markers carried them, is read as it is,
 * with a notice when warn is set. */
static int read_marker(const char *root, int64_t *steps, int *n, int64_t *ranks, int64_t mesh[4],
                       int warn, Err *err) {
    *n = 0;
    *ranks = 0;
    char *path = fs_join(root, CKPT_DIST_MARKER), *text = NULL;
    size_t len = 0;
    int rc = 0;
    Err why;
    json_t *o = NULL;
    struct stat st;
    int missing = !fs_exists(path);
    if (missing)
        err_set(&why, "%s %s", path,
                lstat(path, &st) == 0 ? "is a symbolic link to nothing" : "is missing");
    else {
        size_t scope = err_oom_push("reading %s", path);
        rc = fs_read_all(path, &text, &len, err);
        o = rc == 0 ? json_load_mem(text, len, path, &why) : NULL;
        err_oom_pop(scope);
    }
    int sealed = json_object_get(o, "version") || json_object_get(o, CKPT_SUM_KEY);
    if (rc == 0 && (!o || (sealed && ckpt_sum_check(text, len, path, &why) != 0))) {
        Err scan;
        rc = scan_steps(root, steps, n, ranks, mesh, &scan);
        /* Saving (warn unset) with no marker: steps the resume could not take start the list
         * afresh, as the resume refused them first (or they predate layouts). */
        if (rc != 0 && missing && !warn) rc = 0, *n = 0;
        if (rc != 0 && missing)
            err_set(err, "%s; %s: remove its rank-N folders to start afresh", why.msg, scan.msg);
        else if (rc != 0)
            err_set(err, "%s; %s: fix %s, or remove it and the rank-N folders to start afresh",
                    why.msg, scan.msg, path);
        else if (warn && *n > 0)
            log_warn("[checkpoint] %s; recovered from the step directories instead: step %" PRId64
                     " of %" PRId64 " ranks is the newest complete one",
                     why.msg, steps[*n - 1], *ranks);
        else if (warn && !missing)
            log_warn("[checkpoint] %s; the step directories hold no step to recover", why.msg);
    } else if (rc == 0) {
        if (!sealed && warn)
            log_info("[checkpoint] %s has no %s (written before latest.json carried one); "
                     "read as it is",
                     path, CKPT_SUM_KEY);
        rc = parse_marker(o, path, steps, n, ranks, mesh, err);
    }
    json_decref(o);
    free(text);
    free(path);
    return rc;
}

static int write_marker(const char *root, const int64_t *steps, int n, int ranks, const int mesh[4],
                        Err *err) {
    json_t *o = json_object(), *list = json_array(), *m = json_array();
    json_object_set_new(o, "format", json_string(FORMAT));
    json_object_set_new(o, "version", json_integer(MARKER_VERSION));
    json_object_set_new(o, "ranks", json_integer(ranks));
    for (int k = 0; k < 4; k++)
        json_array_append_new(m, json_integer(mesh[k]));
    json_object_set_new(o, "mesh", m);
    json_object_set_new(o, "step", json_integer(steps[n - 1]));
    for (int i = 0; i < n; i++)
        json_array_append_new(list, json_integer(steps[i]));
    json_object_set_new(o, "steps", list);
    json_object_set_new(o, CKPT_SUM_KEY, json_string("0000000000000000"));
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(o);
    char *path = fs_join(root, CKPT_DIST_MARKER);
    size_t len = strlen(text);
    text[len] = '\n';
    ckpt_sum_seal(text, len + 1);
    int rc = fs_write_atomic(path, text, len + 1, err);
    free(text);
    free(path);
    return rc;
}

/* Removes this rank's step-N folders whose N is not among kept[0..n). */
static void prune_rank(const char *dir, const int64_t *kept, int n) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char *end;
        if (strncmp(e->d_name, "step-", 5) != 0) continue;
        long long s = strtoll(e->d_name + 5, &end, 10);
        if (*end != 0 || end == e->d_name + 5) continue;
        int keep = 0;
        for (int i = 0; i < n && !keep; i++)
            keep = kept[i] == s;
        if (keep) continue;
        char *path = fs_join(dir, e->d_name);
        Err ignore;
        if (fs_remove_tree(path, &ignore) != 0)
            log_warn("checkpoint: cannot remove old %s: %s", path, ignore.msg);
        free(path);
    }
    closedir(d);
}

int ckpt_dist_check_keep(int ranks, int enable, int keep_latest_k, Err *err) {
    if (ranks > 1 && enable && keep_latest_k > CKPT_DIST_MAX_KEPT)
        return err_set(err,
                       "checkpoint.keep_latest_k = %d: a sharded checkpoint keeps at most %d steps "
                       "(older ones would be removed); set it to %d or less",
                       keep_latest_k, CKPT_DIST_MAX_KEPT, CKPT_DIST_MAX_KEPT);
    return 0;
}

/* layout.json of model[0..n) holding slices[0..n), saved by `ranks` processes on mesh, as
 * text (malloc'd, *len bytes). The ranks and mesh let a broken latest.json be recovered from
 * the step directories. */
static char *layout_text(const CkptTensor *model, const ShardSlice *slices, int n, int rank,
                         int ranks, const int mesh[4], size_t *len) {
    json_t *o = json_object(), *t = json_object(), *m = json_array();
    json_object_set_new(o, "format", json_string(LAYOUT_FORMAT));
    json_object_set_new(o, "version", json_integer(1));
    json_object_set_new(o, "rank", json_integer(rank));
    json_object_set_new(o, "ranks", json_integer(ranks));
    for (int k = 0; k < 4; k++)
        json_array_append_new(m, json_integer(mesh[k]));
    json_object_set_new(o, "mesh", m);
    for (int i = 0; i < n; i++)
        json_object_set_new(t, model[i].name, shard_slice_to_json(&slices[i]));
    json_object_set_new(o, "tensors", t);
    char *text = json_dumps(o, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(o);
    *len = strlen(text);
    return text;
}

int ckpt_dist_write(int rank, int ranks, const int mesh[4], const char *root, const CkptState *st,
                    const CkptTensor *model, const ShardSlice *slices, int nmodel,
                    const CkptTensor *optim, int noptim, Err *err) {
    char *dir = ckpt_dist_rank_dir(root, rank);
    /* The layout travels as one more of the step's checksummed files. */
    CkptState with = *st;
    CkptFile *files = xcalloc((size_t)st->nfiles + 1, sizeof *files);
    if (st->nfiles > 0) memcpy(files, st->files, (size_t)st->nfiles * sizeof *files);
    char *layout = NULL;
    if (slices) {
        size_t len;
        layout = layout_text(model, slices, nmodel, rank, ranks, mesh, &len);
        files[with.nfiles++] = (CkptFile){CKPT_DIST_LAYOUT, layout, len};
    }
    with.files = files;
    int rc = ckpt_save(dir, &with, model, nmodel, optim, noptim, 0, err);
    free(layout);
    free(files);
    free(dir);
    return rc;
}

int ckpt_dist_commit(Comm *world, const int mesh[4], const char *root, int64_t step, int written,
                     int keep_latest_k, Err *err) {
    if (comm_agree(world, written, err) != 0) return -1;
    char *dir = ckpt_dist_rank_dir(root, world->rank);
    int rc = 0;
    /* Rank 0 commits; the list of kept steps travels to every rank: [count, steps...]. */
    double kept[CKPT_DIST_MAX_KEPT + 1] = {0};
    if (world->rank == 0) {
        int64_t steps[CKPT_DIST_MAX_KEPT + 1], ranks, old_mesh[4];
        int n;
        rc = read_marker(root, steps, &n, &ranks, old_mesh, 0, err);
        if (rc == 0) {
            int m = 0; /* drop step if listed (saved again after a resume) and newer ones */
            for (int i = 0; i < n; i++)
                if (steps[i] < step) steps[m++] = steps[i];
            steps[m++] = step;
            int keep = keep_latest_k > 0 && keep_latest_k < CKPT_DIST_MAX_KEPT ? keep_latest_k
                                                                               : CKPT_DIST_MAX_KEPT;
            int first = m > keep ? m - keep : 0;
            rc = write_marker(root, steps + first, m - first, world->size, mesh, err);
            kept[0] = m - first;
            for (int i = first; i < m; i++)
                kept[1 + i - first] = (double)steps[i];
        }
        if (rc != 0) err_wrap(err, "cannot commit the checkpoint of step %" PRId64, step);
    }
    rc = comm_agree(world, rc, err);
    if (rc == 0) rc = comm_broadcast(world, kept, sizeof kept, 0, err);
    if (rc == 0 && keep_latest_k > 0) {
        int64_t k64[CKPT_DIST_MAX_KEPT];
        int n = (int)kept[0];
        for (int i = 0; i < n; i++)
            k64[i] = (int64_t)kept[1 + i];
        prune_rank(dir, k64, n);
    }
    free(dir);
    return rc;
}

int ckpt_dist_save(Comm *world, const int mesh[4], const char *root, const CkptState *st,
                   const CkptTensor *model, const ShardSlice *slices, int nmodel,
                   const CkptTensor *optim, int noptim, int keep_latest_k, Err *err) {
    int rc = ckpt_dist_write(world->rank, world->size, mesh, root, st, model, slices, nmodel, optim,
                             noptim, err);
    return ckpt_dist_commit(world, mesh, root, st->step, rc, keep_latest_k, err);
}

/* Rank 0's choice for ckpt_dist_locate: found[0] 1 when there is one, [1] its step, [2] the
 * ranks that wrote it (0: one process's), [3..6] their mesh. The newest sharded step below
 * `below` is considered (the ones at or above it were found broken on some rank). */
static int locate_here(const char *root, int64_t load_step, int64_t below, double found[7],
                       Err *err) {
    int64_t steps[CKPT_DIST_MAX_KEPT + 1], ranks, mesh[4], one = -1;
    int n;
    if (below == INT64_MAX) TRY(ckpt_clean_stale(root, err));
    TRY(read_marker(root, steps, &n, &ranks, mesh, below == INT64_MAX, err));
    while (n > 0 && steps[n - 1] >= below)
        n--;
    int64_t sharded = n > 0 ? steps[n - 1] : -1;
    if (load_step >= 0) {
        sharded = -1;
        for (int i = 0; i < n; i++)
            if (steps[i] == load_step) sharded = load_step;
        char name[48];
        snprintf(name, sizeof name, "step-%" PRId64, load_step);
        char *dir = fs_join(root, name);
        Err why;
        if (sharded < 0 && fs_exists(dir)) {
            if (ckpt_verify(dir, 1, &why) != 0) {
                err_set(err, "checkpoint.load_step = %" PRId64 ": %s", load_step, why.msg);
                free(dir);
                return -1;
            }
            one = load_step;
        }
        free(dir);
        if (sharded < 0 && one < 0)
            return err_set(err,
                           "checkpoint.load_step = %" PRId64 ": %s holds no complete step %" PRId64
                           " (neither %s/step-%" PRId64 " nor a step listed in %s)",
                           load_step, root, load_step, root, load_step, CKPT_DIST_MARKER);
    } else {
        char *path;
        int r = ckpt_find_latest(root, &one, &path, err);
        if (r < 0) return -1;
        if (r > 0)
            free(path);
        else
            one = -1;
    }
    if (sharded < 0 && one < 0) return 0;
    found[0] = 1;
    if (sharded >= one) {
        found[1] = (double)sharded;
        found[2] = (double)ranks;
        for (int k = 0; k < 4; k++)
            found[3 + k] = (double)mesh[k];
    } else {
        found[1] = (double)one;
    }
    return 0;
}

int ckpt_dist_locate(Comm *world, const char *root, int64_t load_step, CkptDistFound *found,
                     Err *err) {
    memset(found, 0, sizeof *found);
    int rank = world ? world->rank : 0, rc = 0;
    char *dir = ckpt_dist_rank_dir(root, rank);
    if (world && rank > 0 && fs_exists(dir)) rc = ckpt_clean_stale(dir, err);
    free(dir);
    double f[7];
    for (int64_t below = INT64_MAX;;) {
        memset(f, 0, sizeof f);
        if (rc == 0 && rank == 0) rc = locate_here(root, load_step, below, f, err);
        /* A one-process step and a sharded one of the same number: the job's own kind wins. */
        if (world) {
            rc = comm_agree(world, rc, err);
            if (rc == 0) rc = comm_broadcast(world, f, sizeof f, 0, err);
        }
        if (rc != 0) return -1;
        if (f[0] == 0) return 0;
        found->step = (int64_t)f[1];
        found->ranks = (int)f[2];
        for (int k = 0; k < 4; k++)
            found->mesh[k] = (int)f[3 + k];
        /* The marker lists a step once every rank had written it; a rank's folder of it broken
         * or removed since then makes the newest step the one before it, as a broken step of
         * one process is skipped (checkpoint.load_step names one and gets the sentence). Every
         * folder is checked by one rank: rank r those of ranks r, r + size, ... */
        if (found->ranks == 0 || load_step >= 0) return 1;
        Err why;
        int size = world ? world->size : 1, bad = 0;
        for (int k = rank; k < found->ranks && !bad; k += size) {
            char *sdir = ckpt_dist_found_dir(root, found, k);
            bad = ckpt_verify(sdir, 0, &why) != 0;
            free(sdir);
        }
        if ((world ? comm_agree(world, -bad, &why) : -bad) == 0) return 1;
        if (rank == 0)
            log_warn("[checkpoint] skipping sharded step %" PRId64 ": %s", found->step, why.msg);
        below = found->step;
    }
}

int ckpt_dist_check_rank(const char *step_dir, int rank, Err *err) {
    char *path = fs_join(step_dir, CKPT_DIST_LAYOUT);
    int rc = 0;
    if (fs_exists(path)) {
        /* One that does not parse fails its checksum when the step is loaded. */
        Err ignore;
        json_t *o = json_load_path(path, &ignore), *k = o ? json_object_get(o, "rank") : NULL;
        if (k && (!json_is_integer(k) || json_integer_value(k) != rank))
            rc = err_set(err,
                         "%s records the shard of rank %" PRId64 ", not of rank %d whose folder "
                         "holds it: was a rank-N folder copied or linked from another?",
                         path, json_is_integer(k) ? (int64_t)json_integer_value(k) : (int64_t)-1,
                         rank);
        json_decref(o);
    }
    free(path);
    return rc;
}

char *ckpt_dist_found_dir(const char *root, const CkptDistFound *found, int rank) {
    char name[48];
    snprintf(name, sizeof name, "step-%" PRId64, found->step);
    if (found->ranks == 0) return fs_join(root, name);
    char *dir = ckpt_dist_rank_dir(root, rank), *path = fs_join(dir, name);
    free(dir);
    return path;
}

static int open_sharded(CkptDistReader *r, const char *root, int64_t step, int dp_shard, int tp,
                        int optim, int verify_every, int verify_first, Err *err);

int ckpt_dist_reader_open(CkptDistReader *r, const char *root, Err *err) {
    return ckpt_dist_reader_open_step(r, root, -1, err);
}

/* The "tensors" object of step_dir's layout file (a new reference), NULL with *err clear
 * when there is none (a checkpoint written before layouts), NULL with -1 on a bad one. */
static json_t *load_layout(const char *step_dir, int *rc, Err *err) {
    char *path = fs_join(step_dir, CKPT_DIST_LAYOUT);
    json_t *o = NULL, *t = NULL;
    *rc = 0;
    if (fs_exists(path)) {
        o = json_load_path(path, err);
        const char *format = NULL;
        int64_t version = 0;
        t = o ? json_object_get(o, "tensors") : NULL;
        if (!o || json_req_str(o, "format", &format, path, err) != 0 ||
            json_req_int(o, "version", &version, path, err) != 0)
            *rc = -1;
        else if (strcmp(format, LAYOUT_FORMAT) != 0 || version != 1 || !json_is_object(t))
            *rc = err_set(err, "%s: expected format \"%s\", version 1 and an object \"tensors\"",
                          path, LAYOUT_FORMAT);
        else
            json_incref(t);
    }
    json_decref(o);
    free(path);
    return *rc == 0 ? t : NULL;
}

/* The step ckpt_dist_locate would choose under root, without collectives or reading weights:
 * 1 for one process's root/step-*one, 2 for the sharded step *sharded of a marker recording
 * `ranks` ranks on `mesh`, 0 for none (or a broken marker: ckpt_dist_locate's to report). */
static int candidate(const char *root, int64_t load_step, int64_t *one, int64_t *sharded,
                     int64_t *ranks, int64_t mesh[4]) {
    int64_t steps[CKPT_DIST_MAX_KEPT + 1];
    int nsteps;
    Err ignore;
    if (read_marker(root, steps, &nsteps, ranks, mesh, 0, &ignore) != 0) nsteps = 0;
    *sharded = -1;
    for (int i = 0; i < nsteps; i++)
        if (load_step < 0 || steps[i] == load_step) *sharded = steps[i];
    *one = ckpt_resume_candidate(root, load_step);
    if (*one > *sharded) return 1; /* the sharded one on a tie */
    return *sharded >= 0 && *ranks >= 1 && *ranks <= 1 << 20 ? 2 : 0;
}

char *ckpt_dist_candidate_dir(const char *root, int64_t load_step) {
    int64_t one, sharded, ranks, mesh[4];
    int kind = candidate(root, load_step, &one, &sharded, &ranks, mesh);
    if (kind == 0) return NULL;
    char name[48];
    snprintf(name, sizeof name, "step-%" PRId64, kind == 1 ? one : sharded);
    char *rdir = kind == 1 ? NULL : ckpt_dist_rank_dir(root, 0);
    char *dir = fs_join(rdir ? rdir : root, name);
    free(rdir);
    return dir;
}

int ckpt_dist_check_shapes(const char *root, int64_t load_step, const ParamInfo *params, int n,
                           int initial, Err *err) {
    int64_t ranks, mesh[4], sharded, one;
    Err ignore;
    int kind = candidate(root, load_step, &one, &sharded, &ranks, mesh);
    char name[48];
    if (kind == 1) {
        snprintf(name, sizeof name, "step-%" PRId64, one);
        char *dir = fs_join(root, name);
        int rc = ckpt_check_step_shapes(dir, params, n, initial, err);
        free(dir);
        return rc;
    }
    if (kind == 0) return 0;
    /* Replica 0's layouts record every parameter's whole shape (each file holds a slice). */
    int nfiles = (int)(mesh[1] * mesh[2]), rc = 0;
    json_t **lay = xcalloc((size_t)nfiles, sizeof *lay);
    char **paths = xcalloc((size_t)nfiles, sizeof *paths);
    snprintf(name, sizeof name, "step-%" PRId64, sharded);
    int usable = 1;
    for (int k = 0; k < nfiles && usable; k++) {
        char *rdir = ckpt_dist_rank_dir(root, k), *dir = fs_join(rdir, name);
        int lrc;
        /* A rank folder copied from another holds that rank's tensors, not another model. */
        rc = ckpt_dist_check_rank(dir, k, err);
        lay[k] = rc == 0 ? load_layout(dir, &lrc, &ignore) : NULL;
        paths[k] = fs_join(dir, CKPT_DIST_LAYOUT);
        usable = lay[k] != NULL; /* broken or written before layouts: its load checks it */
        free(rdir), free(dir);
    }
    for (int p = 0; p < n && usable && rc == 0; p++) {
        const json_t *shape = NULL;
        int at = 0;
        for (int k = 0; k < nfiles && !shape; k++) {
            const json_t *e = json_object_get(lay[k], params[p].name);
            if (e) shape = json_object_get(e, "shape"), at = k;
        }
        int64_t got[CKPT_MAX_DIMS];
        int nd = (int)json_array_size(shape), same = nd == params[p].ndim;
        for (int d = 0; d < nd && d < CKPT_MAX_DIMS; d++)
            got[d] = json_integer_value(json_array_get(shape, (size_t)d));
        for (int d = 0; same && d < nd; d++)
            same = got[d] == params[p].shape[d];
        if (!same)
            rc = ckpt_shape_mismatch(paths[at], &params[p], shape ? got : NULL,
                                     nd < CKPT_MAX_DIMS ? nd : CKPT_MAX_DIMS, initial, err);
    }
    for (int k = 0; k < nfiles; k++) {
        json_decref(lay[k]);
        free(paths[k]);
    }
    free(lay);
    free(paths);
    return rc;
}

/* Opens model (and with optim, optimizer) files of the step directories dirs[0..n); verifies
 * the checksums of those k with k % verify_every == verify_first (verify_every 0: none). */
static int open_dirs(CkptDistReader *r, char *const *dirs, int n, int optim, int verify_every,
                     int verify_first, Err *err) {
    r->files = xcalloc((size_t)n, sizeof *r->files);
    r->optim = optim ? xcalloc((size_t)n, sizeof *r->optim) : NULL;
    r->layout = xcalloc((size_t)n, sizeof *r->layout);
    int rc = 0;
    for (int k = 0; k < n && rc == 0; k++) {
        char *mpath = fs_join(dirs[k], CKPT_MODEL_FILE), *opath = fs_join(dirs[k], CKPT_OPTIM_FILE);
        /* The checksums, as a resume checks them: an export of a corrupted piece would
         * otherwise be a model with wrong weights and no error. */
        if (verify_every > 0 && k % verify_every == verify_first) rc = ckpt_verify(dirs[k], 1, err);
        if (rc == 0) rc = st_open(&r->files[k], mpath, err);
        if (rc == 0) r->nfiles = k + 1;
        if (rc == 0 && optim && (rc = st_open(&r->optim[k], opath, err)) != 0) {
            st_close(&r->files[k]);
            r->nfiles = k;
        }
        if (rc == 0) r->layout[k] = load_layout(dirs[k], &rc, err);
        free(mpath), free(opath);
    }
    if (rc != 0) ckpt_dist_reader_close(r);
    return rc;
}

int ckpt_dist_reader_open_step(CkptDistReader *r, const char *root, int64_t step, Err *err) {
    memset(r, 0, sizeof *r);
    int64_t steps[CKPT_DIST_MAX_KEPT + 1], ranks, mesh[4];
    int n;
    TRY(read_marker(root, steps, &n, &ranks, mesh, 1, err));
    if (n == 0)
        return err_set(err, "%s has no %s: not a committed sharded checkpoint", root,
                       CKPT_DIST_MARKER);
    int listed = step < 0;
    for (int i = 0; i < n && !listed; i++)
        listed = steps[i] == step;
    if (!listed)
        return err_set(err,
                       "%s/%s does not list step %" PRId64
                       " as committed (the newest is step %" PRId64 ")",
                       root, CKPT_DIST_MARKER, step, steps[n - 1]);
    if (ranks < 1 || ranks > 1 << 20)
        return err_set(err, "%s/%s: ranks = %" PRId64 " is out of range", root, CKPT_DIST_MARKER,
                       ranks);
    return open_sharded(r, root, step < 0 ? steps[n - 1] : step, (int)mesh[1], (int)mesh[2], 0, 1,
                        0, err);
}

static int open_sharded(CkptDistReader *r, const char *root, int64_t step, int dp_shard, int tp,
                        int optim, int verify_every, int verify_first, Err *err) {
    memset(r, 0, sizeof *r);
    /* With HSDP every replica holds the same pieces: replica 0 (the first dp_shard x tp ranks)
     * has all of them. */
    int n = dp_shard * tp;
    char **dirs = xcalloc((size_t)n, sizeof *dirs), name[48];
    snprintf(name, sizeof name, "step-%" PRId64, step);
    for (int k = 0; k < n; k++) {
        char *dir = ckpt_dist_rank_dir(root, k);
        dirs[k] = fs_join(dir, name);
        free(dir);
    }
    int rc = 0;
    for (int k = 0; k < n && rc == 0; k++)
        rc = ckpt_dist_check_rank(dirs[k], k, err);
    if (rc == 0) rc = open_dirs(r, dirs, n, optim, verify_every, verify_first, err);
    r->dp_shard = dp_shard, r->tp = tp, r->step = step;
    for (int k = 0; k < n; k++)
        free(dirs[k]);
    free(dirs);
    return rc;
}

void ckpt_dist_reader_close(CkptDistReader *r) {
    for (int k = 0; k < r->nfiles; k++) {
        st_close(&r->files[k]);
        if (r->optim) st_close(&r->optim[k]);
    }
    for (int k = 0; r->layout && k < r->nfiles; k++)
        json_decref(r->layout[k]);
    free(r->files);
    free(r->optim);
    free(r->layout);
    memset(r, 0, sizeof *r);
}

/* File k's slice of `param`, when it was written before layouts: the saving mesh says which
 * part (tp rank k % tp) and which run of it (FSDP slices in rank order: *at[t] elements of
 * tp rank t's part come before) it holds. */
static int legacy_slice(const CkptDistReader *r, int k, const char *param, const ShardSlice *want,
                        int64_t numel, int64_t *at, ShardSlice *s, Err *err) {
    TpSplit split = r->tp > 1 ? tp_split_of(param) : TP_REPLICATED;
    int t = k % r->tp, last = want->ndim - 1;
    shard_slice_whole(s, want->ndim, want->shape);
    int dim = split == TP_ROWS ? 0 : split == TP_COLS ? last : -1;
    if (dim >= 0 && (want->shape[dim] % r->tp || (split == TP_COLS && want->ndim < 2)))
        return err_set(err,
                       "sharded checkpoint step %" PRId64 ": %s (%lld in dimension %d) does not "
                       "split into %d tensor-parallel parts",
                       r->step, param, (long long)want->shape[dim < 0 ? 0 : dim], dim, r->tp);
    if (dim >= 0) {
        s->box_len[dim] = want->shape[dim] / r->tp;
        s->box_off[dim] = t * s->box_len[dim];
    }
    int64_t box = shard_slice_box_numel(s);
    if (at[t] + numel > box)
        return err_set(err, "%s: %s holds %lld elements past the %lld of its part of the parameter",
                       r->files[k].path, param, (long long)(at[t] + numel - box), (long long)box);
    s->start = at[t];
    s->numel = numel;
    at[t] += numel;
    return 0;
}

/* Every file's slice of tensor `name` (model, or optimizer state with optim) of parameter
 * `param`, whose whole shape want->shape is; *src (malloc'd) holds *n of them. */
static int sources_of(const CkptDistReader *r, const char *name, const char *param, int optim,
                      const ShardSlice *want, ShardSource **src, int *n, Err *err) {
    *src = xcalloc((size_t)r->nfiles + 1, sizeof **src);
    *n = 0;
    int64_t *at = xcalloc((size_t)r->tp + 1, sizeof *at);
    int rc = 0;
    for (int k = 0; k < r->nfiles && rc == 0; k++) {
        const StFile *f = optim ? &r->optim[k] : &r->files[k];
        const StTensor *x = st_find(f, name);
        const json_t *entry = r->layout[k] ? json_object_get(r->layout[k], param) : NULL;
        ShardSource *s = &(*src)[*n];
        if (r->layout[k] && !entry != !x) {
            rc = err_set(err, "%s %s %s, but its %s %s", f->path, x ? "holds" : "has no", name,
                         CKPT_DIST_LAYOUT, x ? "does not list it" : "lists a slice of it");
        } else if (!x) {
            continue;
        } else if (x->dtype != DT_F32) {
            rc = err_set(err, "%s: %s is %s, expected F32", f->path, name, dtype_name(x->dtype));
        } else if (entry) {
            rc = shard_slice_from_json(entry, &s->slice, f->path, param, err);
            if (rc == 0 && s->slice.numel != x->numel)
                rc = err_set(err,
                             "%s holds %lld elements of %s, but its %s gives its slice %lld: "
                             "the recorded layout disagrees with the file",
                             f->path, (long long)x->numel, name, CKPT_DIST_LAYOUT,
                             (long long)s->slice.numel);
        } else {
            rc = legacy_slice(r, k, param, want, x->numel, at, &s->slice, err);
        }
        if (rc == 0) {
            s->data = x->data;
            s->file = f->path;
            (*n)++;
        }
    }
    free(at);
    if (rc != 0) {
        free(*src);
        *src = NULL;
    }
    return rc;
}

/* The shape a layout records for param (its first file's), else NULL. */
static const json_t *layout_shape(const CkptDistReader *r, const char *param) {
    for (int k = 0; k < r->nfiles; k++) {
        const json_t *e = r->layout[k] ? json_object_get(r->layout[k], param) : NULL;
        if (e) return json_object_get(e, "shape");
    }
    return NULL;
}

int ckpt_dist_reader_range(const CkptDistReader *r, const char *name, size_t numel, size_t cols,
                           size_t first, size_t n, float *out, Err *err) {
    if (first > numel || n > numel - first)
        return err_set(err, "elements [%zu, %zu) of %s are outside its %zu elements", first,
                       first + n, name, numel);
    if (n == 0) return 0;
    /* Whole-tensor runs read the same in any view of the shape: the layout's own, else
     * (rows, cols), which is what a legacy tensor-parallel split needs. */
    ShardSlice want;
    const json_t *shape = layout_shape(r, name);
    int64_t dims[CKPT_MAX_DIMS] = {0}, total = 1;
    int nd = 0;
    for (size_t d = 0; d < json_array_size(shape) && d < CKPT_MAX_DIMS; d++) {
        dims[nd++] = json_integer_value(json_array_get(shape, d));
        total *= dims[nd - 1] > 0 ? dims[nd - 1] : 0;
    }
    if (!shape) {
        if (cols == 0 || numel % cols)
            return err_set(err,
                           "sharded checkpoint step %" PRId64 ": %s (%zu elements in rows of %zu) "
                           "does not split into %d tensor-parallel parts",
                           r->step, name, numel, cols, r->tp);
        dims[0] = (int64_t)(numel / cols), dims[1] = (int64_t)cols, nd = 2, total = (int64_t)numel;
    }
    if (total != (int64_t)numel)
        return err_set(err,
                       "sharded checkpoint step %" PRId64 ": %s has %lld elements, expected %zu",
                       r->step, name, (long long)total, numel);
    shard_slice_whole(&want, nd, dims);
    want.start = (int64_t)first, want.numel = (int64_t)n;
    ShardSource *src;
    int nsrc;
    TRY(sources_of(r, name, name, 0, &want, &src, &nsrc, err));
    int rc = shard_copy(&want, out, src, nsrc, name, err);
    free(src);
    return rc;
}

int ckpt_dist_reader_tensor(const CkptDistReader *r, const char *name, float *out, size_t numel,
                            size_t cols, Err *err) {
    return ckpt_dist_reader_range(r, name, numel, cols, 0, numel, out, err);
}

int ckpt_dist_reader_open_found(CkptDistReader *r, Comm *world, const char *root,
                                const CkptDistFound *found, int optim, Err *err) {
    memset(r, 0, sizeof *r);
    int every = world ? world->size : 1, first = world ? world->rank : 0, rc;
    if (found->ranks == 0) {
        char *dir = ckpt_dist_found_dir(root, found, 0);
        rc = open_dirs(r, &dir, 1, optim, 1, first, err);
        r->dp_shard = r->tp = 1, r->step = found->step;
        free(dir);
    } else {
        rc = open_sharded(r, root, found->step, found->mesh[1], found->mesh[2], optim, every, first,
                          err);
    }
    if (world) {
        rc = comm_agree(world, rc, err);
        if (rc != 0 && r->files) ckpt_dist_reader_close(r);
    }
    return rc;
}

static int in_model(const char *name, const CkptTensor *t, int n) {
    for (int i = 0; i < n; i++)
        if (strcmp(t[i].name, name) == 0) return 1;
    return 0;
}

/* The name of entry i of file k (a layout's parameter, or a legacy file's tensor), or NULL
 * past the last; *it carries the iteration of a layout. */
static const char *file_name(const CkptDistReader *r, int k, int i, void **it) {
    if (!r->layout[k]) return i < r->files[k].n ? r->files[k].tensors[i].name : NULL;
    *it = i == 0 ? json_object_iter(r->layout[k]) : json_object_iter_next(r->layout[k], *it);
    return *it ? json_object_iter_key(*it) : NULL;
}

int ckpt_dist_reader_check_names(const CkptDistReader *r, Comm *world, const CkptTensor *model,
                                 int n, Err *err) {
    /* Entry by entry, whether some rank's model has it: a rank holds pieces of only some. */
    int total = 0;
    for (int k = 0; k < r->nfiles; k++) {
        void *it = NULL;
        for (int i = 0; file_name(r, k, i, &it); i++)
            total++;
    }
    double *held = xcalloc((size_t)total + 1, sizeof *held);
    int at = 0, rc = 0;
    for (int k = 0; k < r->nfiles; k++) {
        void *it = NULL;
        const char *name;
        for (int i = 0; (name = file_name(r, k, i, &it)) != NULL; i++)
            held[at++] = in_model(name, model, n);
    }
    if (world && total > 0) rc = comm_all_reduce_sum(world, held, (size_t)total, COMM_F64, err);
    at = 0;
    for (int k = 0; k < r->nfiles && rc == 0; k++) {
        void *it = NULL;
        const char *name;
        for (int i = 0; (name = file_name(r, k, i, &it)) != NULL && rc == 0; i++)
            if (held[at++] == 0)
                rc = err_set(err, "%s holds %s, which this model does not have", r->files[k].path,
                             name);
    }
    free(held);
    return rc;
}

int ckpt_dist_read_into(const CkptDistReader *r, const CkptTensor *t, int n,
                        const ShardSlice *slices, int per, int optim, Progress *p, Err *err) {
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        ShardSlice want;
        if (slices)
            want = slices[i / per];
        else
            shard_slice_whole(&want, t[i].ndim, t[i].shape);
        /* The parameter's name: optimizer tensors are "<param>.exp_avg" and ".exp_avg_sq". */
        char param[256];
        snprintf(param, sizeof param, "%s", t[i].name);
        char *dot = optim ? strrchr(param, '.') : NULL;
        if (dot) *dot = '\0';
        ShardSource *src;
        int nsrc;
        rc = sources_of(r, t[i].name, param, optim, &want, &src, &nsrc, err);
        if (rc != 0) break;
        int same = nsrc > 0 && src[0].slice.ndim == want.ndim;
        for (int d = 0; same && d < want.ndim; d++)
            same = src[0].slice.shape[d] == want.shape[d];
        if (nsrc == 0) {
            rc = err_set(err, "checkpoint step %" PRId64 " has no tensor %s", r->step, t[i].name);
        } else if (!same) {
            char have[160], need[160];
            st_shape_str(have, sizeof have, src[0].slice.shape, src[0].slice.ndim);
            st_shape_str(need, sizeof need, want.shape, want.ndim);
            rc = err_set(err, "%s: %s is %s in the checkpoint, but %s in this model", src[0].file,
                         t[i].name, have, need);
        } else {
            float *buf = xmalloc((size_t)want.numel * sizeof *buf + 1);
            rc = shard_copy(&want, buf, src, nsrc, t[i].name, err);
            if (rc == 0)
                ckpt_tensor_device(&t[i])->from_host(t[i].data, buf,
                                                     (size_t)want.numel * sizeof *buf);
            free(buf);
            if (p) progress_add(p, (double)want.numel * sizeof(float));
        }
        free(src);
    }
    return rc;
}

/* One HF tensor: a whole parameter or one expert's slice of a stacked one. */
typedef struct ExportSource {
    const CkptDistReader *r;
    const char *param;
    size_t numel;  /* of the parameter */
    size_t cols;   /* its last dimension */
    size_t offset; /* of the HF tensor within it */
} ExportSource;

static int pull(void *ctx, float *dst, size_t first, size_t n, Err *err) {
    const ExportSource *s = ctx;
    return ckpt_dist_reader_range(s->r, s->param, s->numel, s->cols, s->offset + first, n, dst,
                                  err);
}

int ckpt_dist_export_hf(const char *out_dir, const CkptDistReader *r, const ModelSpec *spec,
                        const HfConfigExtra *extra, DType dtype, size_t max_shard_bytes, Err *err) {
    const char *torch = dtype == DT_F32    ? "float32"
                        : dtype == DT_BF16 ? "bfloat16"
                        : dtype == DT_F16  ? "float16"
                                           : NULL;
    if (!torch)
        return err_set(err, "export dtype %s is not one of float32, bfloat16, float16",
                       dtype_name(dtype));
    HfKeyTable t;
    hf_keys_build(&t, spec);
    ExportSource *src = xcalloc((size_t)t.nhf + 1, sizeof *src);
    StWriter w;
    st_writer_init(&w);
    for (int i = 0; i < t.nhf; i++) {
        const HfTensor *h = &t.hf[i];
        const ParamInfo *p = &t.params[h->param];
        src[i] = (ExportSource){r, p->name, (size_t)p->numel, (size_t)p->shape[p->ndim - 1],
                                h->expert < 0 ? 0 : (size_t)h->expert * (size_t)h->numel};
        st_writer_add_f32_source(&w, h->name, dtype, h->ndim, h->shape, pull, &src[i], 0);
    }
    char *cfg = fs_join(out_dir, "config.json");
    int rc = model_spec_write_hf_config_ex(spec, extra, cfg, torch, err);
    if (rc == 0)
        rc = st_write_hf_shards(
            &w, out_dir, max_shard_bytes ? max_shard_bytes : (size_t)5000 * 1000 * 1000, err);
    if (rc != 0) err_wrap(err, "HF export of sharded checkpoint step %" PRId64, r->step);
    free(cfg);
    st_writer_free(&w);
    free(src);
    hf_keys_free(&t);
    return rc;
}

/* Exports r's step to out_dir through fs_tmp_name(out_dir), renamed into place (an existing
 * out_dir is replaced only when it holds nothing but an export's files). */
static int export_to(const char *out_dir, const CkptDistReader *r, const ModelSpec *spec,
                     const HfConfigExtra *extra, DType dtype, size_t max_shard_bytes,
                     const char *tokenizer, Err *err) {
    TRY(hf_export_check_out_dir(out_dir, err));
    char *tmp = fs_tmp_name(out_dir);
    int rc = fs_mkdirs(tmp, err);
    if (rc == 0) rc = ckpt_dist_export_hf(tmp, r, spec, extra, dtype, max_shard_bytes, err);
    if (rc == 0) rc = hf_export_copy_tokenizer(tokenizer, tmp, err);
    if (rc == 0 && fs_exists(out_dir)) rc = fs_remove_tree(out_dir, err);
    if (rc == 0 && rename(tmp, out_dir) != 0)
        rc = err_sys(err, "cannot rename %s to %s", tmp, out_dir);
    Err ignore;
    if (rc != 0 && fs_exists(tmp)) fs_remove_tree(tmp, &ignore);
    free(tmp);
    return rc;
}

static int export_step(const char *root, const ModelSpec *spec, const HfConfigExtra *extra,
                       DType dtype, Err *err) {
    CkptDistReader r;
    TRY(ckpt_dist_reader_open(&r, root, err));
    char name[48];
    snprintf(name, sizeof name, "step-%" PRId64, r.step);
    char *dir = fs_join(root, name), *out = fs_join(dir, "hf");
    int rc = fs_mkdirs(dir, err);
    if (rc == 0) rc = export_to(out, &r, spec, extra, dtype, 0, root, err);
    if (rc == 0) rc = fs_sync_dir(dir, err);
    if (rc == 0)
        log_info("[checkpoint] exported step %" PRId64 " to %s (Hugging Face format)", r.step, out);
    free(dir), free(out);
    ckpt_dist_reader_close(&r);
    return rc;
}

int ckpt_dist_last_save_hf(Comm *world, const char *root, const ModelSpec *spec,
                           const HfConfigExtra *extra, DType dtype, Err *err) {
    int rc = world->rank == 0 ? export_step(root, spec, extra, dtype, err) : 0;
    return comm_agree(world, rc, err);
}

int ckpt_dist_write_config(Comm *world, const char *root, const ModelSpec *spec,
                           const HfConfigExtra *extra, const CkptFile *files, int nfiles,
                           Err *err) {
    int rc = 0;
    if (world->rank == 0) {
        char *path = fs_join(root, "config.json");
        rc = fs_mkdirs(root, err);
        if (rc == 0) rc = model_spec_write_hf_config_ex(spec, extra, path, "float32", err);
        free(path);
        for (int i = 0; i < nfiles && rc == 0; i++) {
            if (strcmp(files[i].name, "config.json") == 0) continue;
            path = fs_join(root, files[i].name);
            rc = fs_write_atomic(path, files[i].data, files[i].len, err);
            free(path);
        }
        for (int k = 0; k < HF_NTOKENIZER_FILES && rc == 0; k++) {
            int kept = 0;
            for (int i = 0; i < nfiles; i++)
                kept |= strcmp(files[i].name, HF_TOKENIZER_FILES[k]) == 0;
            path = fs_join(root, HF_TOKENIZER_FILES[k]);
            if (!kept && fs_exists(path) && unlink(path) != 0)
                rc = err_sys(err, "cannot remove %s, an earlier job's tokenizer file", path);
            free(path);
        }
    }
    return comm_agree(world, rc, err);
}

/* The checkpoint folder of path (malloc'd) and the step it names (-1: the newest), or NULL
 * when path is neither a folder with the marker (or, the marker lost, rank-0/) nor
 * FOLDER/rank-K/step-N. */
static char *sharded_root(const char *path, int64_t *step) {
    /* path is the root (it has the marker, or rank-0/ to recover it from) or
     * root/rank-K/step-N. */
    char *root = NULL;
    int64_t want = -1;
    char *marker = fs_join(path, CKPT_DIST_MARKER), *rank0 = ckpt_dist_rank_dir(path, 0);
    int is_root = fs_exists(marker) || fs_is_dir(rank0);
    free(rank0);
    if (is_root) {
        root = xstrdup(path);
    } else {
        /* Split off the last two components: rank-K and step-N; the rest is the root. */
        char *p = xstrdup(path);
        size_t n = strlen(p);
        while (n > 1 && p[n - 1] == '/')
            p[--n] = '\0';
        char *step_part = strrchr(p, '/');
        if (step_part) {
            *step_part++ = '\0';
            char *rank_part = strrchr(p, '/');
            const char *rest = ".";
            if (rank_part) {
                *rank_part++ = '\0';
                rest = *p ? p : "/";
            } else {
                rank_part = p;
            }
            long long s;
            int k, a = 0, b = 0;
            if (sscanf(step_part, "step-%lld%n", &s, &a) == 1 && step_part[a] == '\0' &&
                sscanf(rank_part, "rank-%d%n", &k, &b) == 1 && rank_part[b] == '\0') {
                root = xstrdup(rest);
                want = s;
            }
        }
        free(p);
    }
    free(marker);
    *step = want;
    return root;
}

int ckpt_dist_is_sharded_path(const char *path) {
    char *root = ckpt_dist_path_root(path);
    free(root);
    return root != NULL;
}

char *ckpt_dist_path_root(const char *path) {
    int64_t step;
    return sharded_root(path, &step);
}

int ckpt_dist_initial_path(const char *path, char **root, int64_t *step, Err *err) {
    *root = NULL;
    *step = -1;
    if (!fs_is_dir(path))
        return err_set(err,
                       "checkpoint.initial_load_path %s is not a folder: with initial_load_in_hf = "
                       "false it names a training checkpoint (a checkpoint folder or one of its "
                       "step-N folders); Hugging Face weights need initial_load_in_hf = true",
                       path);
    char *r = sharded_root(path, step);
    if (!r) {
        char *state = fs_join(path, "train_state.json");
        int is_step = fs_exists(state);
        free(state);
        if (is_step) {
            char *dir = fs_dir_of(path), *p = xstrdup(path);
            size_t n = strlen(p);
            while (n > 1 && p[n - 1] == '/')
                p[--n] = '\0';
            const char *base = strrchr(p, '/') ? strrchr(p, '/') + 1 : p;
            long long s;
            int end = 0;
            if (sscanf(base, "step-%lld%n", &s, &end) != 1 || base[end] || s < 0) {
                err_set(err,
                        "checkpoint.initial_load_path %s holds a checkpoint step, but its name "
                        "is not step-N, which says which step it is",
                        path);
                free(dir), free(p);
                return -1;
            }
            r = dir, *step = s;
            free(p);
        } else {
            r = xstrdup(path);
        }
    }
    int64_t one, sharded, ranks, mesh[4];
    if (candidate(r, *step, &one, &sharded, &ranks, mesh) == 0) {
        if (*step >= 0)
            err_set(err, "checkpoint.initial_load_path %s: %s holds no complete step %" PRId64,
                    path, r, *step);
        else if (fs_exists_in(path, "model.safetensors") ||
                 fs_exists_in(path, "model.safetensors.index.json"))
            err_set(err,
                    "checkpoint.initial_load_path %s is a Hugging Face model directory; set "
                    "checkpoint.initial_load_in_hf = true to start from it (false names a "
                    "training checkpoint)",
                    path);
        else
            err_set(err,
                    "checkpoint.initial_load_path %s holds no complete training checkpoint step "
                    "(with initial_load_in_hf = false it names a checkpoint folder or one of its "
                    "steps)",
                    path);
        free(r);
        return -1;
    }
    *root = r;
    return 0;
}

int ckpt_dist_find_initial(Comm *world, const char *root, int64_t step, CkptDistFound *found,
                           Err *err) {
    double f[7] = {0};
    int rc = 0;
    if (!world || world->rank == 0) {
        int64_t one, sharded, ranks, mesh[4];
        int kind = candidate(root, step, &one, &sharded, &ranks, mesh);
        if (kind == 0) rc = err_set(err, "%s holds no complete checkpoint step", root);
        f[0] = kind, f[1] = (double)(kind == 1 ? one : sharded), f[2] = kind == 2 ? ranks : 0;
        for (int k = 0; k < 4; k++)
            f[3 + k] = kind == 2 ? (double)mesh[k] : 0;
    }
    if (world) {
        rc = comm_agree(world, rc, err);
        if (rc == 0) rc = comm_broadcast(world, f, sizeof f, 0, err);
    }
    TRY(rc);
    *found = (CkptDistFound){.step = (int64_t)f[1], .ranks = (int)f[2]};
    for (int k = 0; k < 4; k++)
        found->mesh[k] = (int)f[3 + k];
    char *dir0 = ckpt_dist_found_dir(root, found, 0);
    rc = ckpt_refuse_lora(dir0, err);
    free(dir0);
    return world ? comm_agree(world, rc, err) : rc;
}

int ckpt_dist_open_initial(CkptDistReader *r, Comm *world, const char *root, int64_t step,
                           Err *err) {
    CkptDistFound found;
    TRY(ckpt_dist_find_initial(world, root, step, &found, err));
    return ckpt_dist_reader_open_found(r, world, root, &found, 0, err);
}

int ckpt_dist_open_path(CkptDistReader *r, const char *path, char **root, ModelSpec *spec,
                        HfConfigExtra *extra, Err *err) {
    int64_t want;
    *root = sharded_root(path, &want);
    if (!*root)
        return err_set(err,
                       "%s is not a sharded checkpoint: expected a checkpoint folder with %s or "
                       "its FOLDER/rank-K/step-N",
                       path, CKPT_DIST_MARKER);
    char *cfg = fs_join(*root, "config.json");
    int rc = 0;
    if (!fs_exists(cfg))
        rc = err_set(err,
                     "%s has no config.json (sharded checkpoints record the model from this "
                     "version on); its model is not known",
                     *root);
    if (rc == 0) rc = model_spec_from_hf_config_ex(spec, extra, cfg, err);
    free(cfg);
    if (rc == 0) rc = ckpt_dist_reader_open_step(r, *root, want, err);
    if (rc == 0) {
        CkptDistFound found = {.step = r->step, .ranks = 1};
        char *dir0 = ckpt_dist_found_dir(*root, &found, 0);
        rc = ckpt_refuse_lora(dir0, err);
        free(dir0);
        if (rc != 0) ckpt_dist_reader_close(r);
    }
    if (rc != 0) {
        free(*root);
        *root = NULL;
    }
    return rc;
}

int ckpt_dist_export_path(const char *path, const char *out_dir, DType dtype,
                          size_t max_shard_bytes, const char *tokenizer, int64_t *step, Err *err) {
    CkptDistReader r;
    ModelSpec spec;
    HfConfigExtra extra;
    char *root;
    TRY(ckpt_dist_open_path(&r, path, &root, &spec, &extra, err));
    *step = r.step;
    int rc = export_to(out_dir, &r, &spec, &extra, dtype, max_shard_bytes,
                       tokenizer ? tokenizer : root, err);
    ckpt_dist_reader_close(&r);
    free(root);
    return rc;
}
