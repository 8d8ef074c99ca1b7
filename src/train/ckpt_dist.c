/* Sharded checkpoints: per-rank ckpt_save folders and rank 0's latest.json commit marker. */
#include "train/ckpt_dist.h"

#include <dirent.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "core/json.h"
#include "core/log.h"
#include "io/safetensors.h"

#define FORMAT "qtitan-sharded-checkpoint"
#define MAX_KEPT 64 /* steps listed in the marker when keep_latest_k is 0 or larger */

char *ckpt_dist_rank_dir(const char *root, int rank) {
    char name[32];
    snprintf(name, sizeof name, "rank-%d", rank);
    return fs_join(root, name);
}

/* Rank 0: the marker's steps (oldest first) into steps[0..*n), *ranks and the mesh
 * [dp_replicate, dp_shard, tp] (mesh absent: [1, ranks, 1]). 0 and *n = 0 when there is no
 * marker. */
static int read_marker(const char *root, int64_t *steps, int *n, int64_t *ranks, int64_t mesh[3],
                       Err *err) {
    *n = 0;
    *ranks = 0;
    char *path = fs_join(root, CKPT_DIST_MARKER);
    if (!fs_exists(path)) {
        free(path);
        return 0;
    }
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    int rc = 0;
    const char *format = NULL;
    json_t *list = o ? json_object_get(o, "steps") : NULL;
    if (!o) {
        rc = err_set(err, "%s:%d:%d: %s", path, je.line, je.column, je.text);
    } else if (json_req_str(o, "format", &format, path, err) != 0 ||
               json_req_int(o, "ranks", ranks, path, err) != 0) {
        rc = -1;
    } else if (strcmp(format, FORMAT) != 0 || !json_is_array(list) ||
               json_array_size(list) > MAX_KEPT) {
        rc = err_set(err, "%s: expected format \"%s\" and a list \"steps\" of at most %d numbers",
                     path, FORMAT, MAX_KEPT);
    } else {
        json_t *m = json_object_get(o, "mesh");
        mesh[0] = 1, mesh[1] = *ranks, mesh[2] = 1;
        for (int k = 0; k < 3 && json_is_array(m); k++)
            mesh[k] = json_integer_value(json_array_get(m, (size_t)k));
        if (m && (!json_is_array(m) || json_array_size(m) != 3 || mesh[0] < 1 || mesh[1] < 1 ||
                  mesh[2] < 1 || mesh[0] * mesh[1] * mesh[2] != *ranks))
            rc = err_set(err, "%s: mesh must be 3 positive integers whose product is ranks", path);
        for (size_t i = 0; i < json_array_size(list) && rc == 0; i++) {
            json_t *v = json_array_get(list, i);
            if (!json_is_integer(v) || json_integer_value(v) < 0)
                rc = err_set(err, "%s: steps[%zu] is not a step number", path, i);
            else
                steps[(*n)++] = json_integer_value(v);
        }
    }
    json_decref(o);
    free(path);
    return rc;
}

static int write_marker(const char *root, const int64_t *steps, int n, int ranks, const int mesh[3],
                        Err *err) {
    json_t *o = json_object(), *list = json_array(), *m = json_array();
    json_object_set_new(o, "format", json_string(FORMAT));
    json_object_set_new(o, "ranks", json_integer(ranks));
    for (int k = 0; k < 3; k++)
        json_array_append_new(m, json_integer(mesh[k]));
    json_object_set_new(o, "mesh", m);
    json_object_set_new(o, "step", json_integer(steps[n - 1]));
    for (int i = 0; i < n; i++)
        json_array_append_new(list, json_integer(steps[i]));
    json_object_set_new(o, "steps", list);
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(o);
    char *path = fs_join(root, CKPT_DIST_MARKER);
    size_t len = strlen(text);
    text[len] = '\n';
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

int ckpt_dist_save(Comm *world, const int mesh[3], const char *root, const CkptState *st,
                   const CkptTensor *model, int nmodel, const CkptTensor *optim, int noptim,
                   int keep_latest_k, Err *err) {
    char *dir = ckpt_dist_rank_dir(root, world->rank);
    int rc = ckpt_save(dir, st, model, nmodel, optim, noptim, 0, err);
    if (comm_agree(world, rc, err) != 0) {
        free(dir);
        return -1;
    }
    /* Rank 0 commits; the list of kept steps travels to every rank: [count, steps...]. */
    double kept[MAX_KEPT + 1] = {0};
    if (world->rank == 0) {
        int64_t steps[MAX_KEPT + 1], ranks, old_mesh[3];
        int n;
        rc = read_marker(root, steps, &n, &ranks, old_mesh, err);
        if (rc == 0) {
            int m = 0; /* drop st->step if listed (saved again after a resume) and newer ones */
            for (int i = 0; i < n; i++)
                if (steps[i] < st->step) steps[m++] = steps[i];
            steps[m++] = st->step;
            int keep = keep_latest_k > 0 && keep_latest_k < MAX_KEPT ? keep_latest_k : MAX_KEPT;
            int first = m > keep ? m - keep : 0;
            rc = write_marker(root, steps + first, m - first, world->size, mesh, err);
            kept[0] = m - first;
            for (int i = first; i < m; i++)
                kept[1 + i - first] = (double)steps[i];
        }
        if (rc != 0) err_wrap(err, "cannot commit the checkpoint of step %" PRId64, st->step);
    }
    rc = comm_agree(world, rc, err);
    if (rc == 0) rc = comm_broadcast(world, kept, sizeof kept, 0, err);
    if (rc == 0 && keep_latest_k > 0) {
        int64_t k64[MAX_KEPT];
        int n = (int)kept[0];
        for (int i = 0; i < n; i++)
            k64[i] = (int64_t)kept[1 + i];
        prune_rank(dir, k64, n);
    }
    free(dir);
    return rc;
}

int ckpt_dist_find_latest(Comm *world, const int mesh[3], const char *root, int64_t *step,
                          char **path, Err *err) {
    *path = NULL;
    char *dir = ckpt_dist_rank_dir(root, world->rank);
    int rc = fs_exists(dir) ? ckpt_clean_stale(dir, err) : 0;
    double found[6] = {0}; /* have one, step, ranks, mesh */
    if (rc == 0 && world->rank == 0) {
        int64_t steps[MAX_KEPT + 1], ranks, old_mesh[3];
        int n;
        rc = read_marker(root, steps, &n, &ranks, old_mesh, err);
        if (rc == 0 && n > 0) {
            found[0] = 1;
            found[1] = (double)steps[n - 1];
            found[2] = (double)ranks;
            for (int k = 0; k < 3; k++)
                found[3 + k] = (double)old_mesh[k];
        }
    }
    rc = comm_agree(world, rc, err);
    if (rc == 0) rc = comm_broadcast(world, found, sizeof found, 0, err);
    if (rc == 0 && found[0] != 0 && (int)found[2] != world->size)
        rc = err_set(err,
                     "the checkpoint in %s was saved by %d processes but this job has %d; "
                     "resume with %d processes (resharding a checkpoint is not supported)",
                     root, (int)found[2], world->size, (int)found[2]);
    else if (rc == 0 && found[0] != 0 &&
             ((int)found[3] != mesh[0] || (int)found[4] != mesh[1] || (int)found[5] != mesh[2]))
        rc = err_set(err,
                     "the checkpoint in %s was saved on the mesh [dp_replicate %d, dp_shard %d, "
                     "tp %d] but this job's is [%d, %d, %d]; resume on the same mesh",
                     root, (int)found[3], (int)found[4], (int)found[5], mesh[0], mesh[1], mesh[2]);
    if (rc != 0 || found[0] == 0) {
        free(dir);
        return rc != 0 ? -1 : 0;
    }
    *step = (int64_t)found[1];
    char name[48];
    snprintf(name, sizeof name, "step-%" PRId64, *step);
    *path = fs_join(dir, name);
    free(dir);
    return 1;
}

int ckpt_dist_reader_open(CkptDistReader *r, const char *root, Err *err) {
    memset(r, 0, sizeof *r);
    int64_t steps[MAX_KEPT + 1], ranks, mesh[3];
    int n;
    TRY(read_marker(root, steps, &n, &ranks, mesh, err));
    if (n == 0)
        return err_set(err, "%s has no %s: not a committed sharded checkpoint", root,
                       CKPT_DIST_MARKER);
    if (ranks < 1 || ranks > 1 << 20)
        return err_set(err, "%s/%s: ranks = %" PRId64 " is out of range", root, CKPT_DIST_MARKER,
                       ranks);
    if (mesh[2] != 1)
        return err_set(err,
                       "%s was saved with tensor parallelism (tp %" PRId64
                       "); the reader only joins FSDP pieces",
                       root, mesh[2]);
    /* With HSDP every replica holds the same pieces: replica 0 (the first dp_shard ranks) has
     * all of them. */
    r->ranks = (int)mesh[1];
    r->step = steps[n - 1];
    r->files = xcalloc((size_t)r->ranks, sizeof *r->files);
    for (int k = 0; k < r->ranks; k++) {
        char *dir = ckpt_dist_rank_dir(root, k), name[64];
        snprintf(name, sizeof name, "step-%" PRId64 "/model.safetensors", r->step);
        char *path = fs_join(dir, name);
        int rc = st_open(&r->files[k], path, err);
        free(path);
        free(dir);
        if (rc != 0) {
            r->ranks = k; /* close the ones opened */
            ckpt_dist_reader_close(r);
            return -1;
        }
    }
    return 0;
}

void ckpt_dist_reader_close(CkptDistReader *r) {
    for (int k = 0; r->files && k < r->ranks; k++)
        st_close(&r->files[k]);
    free(r->files);
    memset(r, 0, sizeof *r);
}

int ckpt_dist_reader_tensor(const CkptDistReader *r, const char *name, float *out, size_t numel,
                            Err *err) {
    size_t at = 0;
    for (int k = 0; k < r->ranks; k++) {
        const StTensor *t = st_find(&r->files[k], name);
        if (!t) continue;
        if (t->dtype != DT_F32 || t->ndim != 1 || at + (size_t)t->numel > numel)
            return err_set(err,
                           "%s: %s is not a 1-D F32 piece that fits the %zu elements of the "
                           "parameter (%zu already read)",
                           r->files[k].path, name, numel, at);
        st_to_f32(t, out + at);
        at += (size_t)t->numel;
    }
    if (at != numel)
        return err_set(err,
                       "sharded checkpoint step %" PRId64 ": the pieces of %s hold %zu of its %zu "
                       "elements",
                       r->step, name, at, numel);
    return 0;
}
