/* Sharded checkpoints: per-rank ckpt_save folders and rank 0's latest.json commit marker. */
#include "train/ckpt_dist.h"

#include <dirent.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fs.h"
#include "core/json.h"
#include "core/log.h"
#include "core/param_table.h"
#include "io/hf_config.h"
#include "io/hf_export.h"
#include "io/hf_keys.h"
#include "io/safetensors.h"

#define FORMAT "qtitan-sharded-checkpoint"

char *ckpt_dist_rank_dir(const char *root, int rank) {
    char name[32];
    snprintf(name, sizeof name, "rank-%d", rank);
    return fs_join(root, name);
}

/* Rank 0: the marker's steps (oldest first) into steps[0..*n), *ranks and the mesh
 * [dp_replicate, dp_shard, tp, expert_parallel] (mesh absent: [1, ranks, 1]; expert_parallel
 * absent: 1). 0 and *n = 0 when there is no marker. */
static int read_marker(const char *root, int64_t *steps, int *n, int64_t *ranks, int64_t mesh[4],
                       Err *err) {
    *n = 0;
    *ranks = 0;
    char *path = fs_join(root, CKPT_DIST_MARKER);
    if (!fs_exists(path)) {
        free(path);
        return 0;
    }
    json_t *o = json_load_path(path, err);
    int rc = 0;
    const char *format = NULL;
    json_t *list = o ? json_object_get(o, "steps") : NULL;
    if (!o) {
        rc = -1;
    } else if (json_req_str(o, "format", &format, path, err) != 0 ||
               json_req_int(o, "ranks", ranks, path, err) != 0) {
        rc = -1;
    } else if (strcmp(format, FORMAT) != 0 || !json_is_array(list) ||
               json_array_size(list) > CKPT_DIST_MAX_KEPT) {
        rc = err_set(err, "%s: expected format \"%s\" and a list \"steps\" of at most %d numbers",
                     path, FORMAT, CKPT_DIST_MAX_KEPT);
    } else {
        json_t *m = json_object_get(o, "mesh"), *ep = json_object_get(o, "expert_parallel");
        mesh[0] = 1, mesh[1] = *ranks, mesh[2] = 1;
        mesh[3] = ep ? json_integer_value(ep) : 1;
        for (int k = 0; k < 3 && json_is_array(m); k++)
            mesh[k] = json_integer_value(json_array_get(m, (size_t)k));
        /* Checked before multiplying: a hostile mesh must not wrap to the right product. */
        int64_t product = 0;
        if (m && (!json_is_array(m) || json_array_size(m) != 3 || mesh[0] < 1 || mesh[1] < 1 ||
                  mesh[2] < 1 || __builtin_mul_overflow(mesh[0], mesh[1], &product) ||
                  __builtin_mul_overflow(product, mesh[2], &product) || product != *ranks))
            rc = err_set(err, "%s: mesh must be 3 positive integers whose product is ranks", path);
        /* Expert-parallel block q lies in rank q's files (train_qwen3.c): at most all ranks. */
        else if (ep && (!json_is_integer(ep) || mesh[3] < 1 || mesh[3] > *ranks))
            rc = err_set(err, "%s: expert_parallel must be an integer from 1 to ranks", path);
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

static int write_marker(const char *root, const int64_t *steps, int n, int ranks, const int mesh[4],
                        Err *err) {
    json_t *o = json_object(), *list = json_array(), *m = json_array();
    json_object_set_new(o, "format", json_string(FORMAT));
    json_object_set_new(o, "ranks", json_integer(ranks));
    for (int k = 0; k < 3; k++)
        json_array_append_new(m, json_integer(mesh[k]));
    json_object_set_new(o, "mesh", m);
    if (mesh[3] > 1) json_object_set_new(o, "expert_parallel", json_integer(mesh[3]));
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

int ckpt_dist_check_keep(int ranks, int enable, int keep_latest_k, Err *err) {
    if (ranks > 1 && enable && keep_latest_k > CKPT_DIST_MAX_KEPT)
        return err_set(err,
                       "checkpoint.keep_latest_k = %d: a sharded checkpoint keeps at most %d steps "
                       "(older ones would be removed); set it to %d or less",
                       keep_latest_k, CKPT_DIST_MAX_KEPT, CKPT_DIST_MAX_KEPT);
    return 0;
}

int ckpt_dist_save(Comm *world, const int mesh[4], const char *root, const CkptState *st,
                   const CkptTensor *model, int nmodel, const CkptTensor *optim, int noptim,
                   int keep_latest_k, Err *err) {
    char *dir = ckpt_dist_rank_dir(root, world->rank);
    int rc = ckpt_save(dir, st, model, nmodel, optim, noptim, 0, err);
    if (comm_agree(world, rc, err) != 0) {
        free(dir);
        return -1;
    }
    /* Rank 0 commits; the list of kept steps travels to every rank: [count, steps...]. */
    double kept[CKPT_DIST_MAX_KEPT + 1] = {0};
    if (world->rank == 0) {
        int64_t steps[CKPT_DIST_MAX_KEPT + 1], ranks, old_mesh[4];
        int n;
        rc = read_marker(root, steps, &n, &ranks, old_mesh, err);
        if (rc == 0) {
            int m = 0; /* drop st->step if listed (saved again after a resume) and newer ones */
            for (int i = 0; i < n; i++)
                if (steps[i] < st->step) steps[m++] = steps[i];
            steps[m++] = st->step;
            int keep = keep_latest_k > 0 && keep_latest_k < CKPT_DIST_MAX_KEPT ? keep_latest_k
                                                                               : CKPT_DIST_MAX_KEPT;
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
        int64_t k64[CKPT_DIST_MAX_KEPT];
        int n = (int)kept[0];
        for (int i = 0; i < n; i++)
            k64[i] = (int64_t)kept[1 + i];
        prune_rank(dir, k64, n);
    }
    free(dir);
    return rc;
}

/* A folder holding one process's checkpoints (root/step-N) has no marker: without this check
 * a job on many processes would train from scratch beside them, as if nothing were there. */
static int refuse_one_process_steps(const char *root, int nproc, Err *err) {
    int64_t step;
    char *path;
    int found = ckpt_find_latest(root, &step, &path, err);
    if (found <= 0) return found;
    free(path);
    return err_set(err,
                   "the checkpoint in %s (step %" PRId64 ") was saved by 1 process but this job "
                   "has %d; resume with 1 process (resharding a checkpoint is not supported)",
                   root, step, nproc);
}

int ckpt_dist_find_latest(Comm *world, const int mesh[4], const char *root, int64_t *step,
                          char **path, Err *err) {
    *path = NULL;
    char *dir = ckpt_dist_rank_dir(root, world->rank);
    int rc = fs_exists(dir) ? ckpt_clean_stale(dir, err) : 0;
    double found[7] = {0}; /* have one, step, ranks, mesh */
    if (rc == 0 && world->rank == 0) {
        int64_t steps[CKPT_DIST_MAX_KEPT + 1], ranks, old_mesh[4];
        int n;
        rc = read_marker(root, steps, &n, &ranks, old_mesh, err);
        if (rc == 0 && n > 0) {
            found[0] = 1;
            found[1] = (double)steps[n - 1];
            found[2] = (double)ranks;
            for (int k = 0; k < 4; k++)
                found[3 + k] = (double)old_mesh[k];
        }
    }
    if (rc == 0 && world->rank == 0 && found[0] == 0)
        rc = refuse_one_process_steps(root, world->size, err);
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
    else if (rc == 0 && found[0] != 0 && (int)found[6] != mesh[3])
        rc = err_set(err,
                     "the checkpoint in %s was saved with parallelism.expert_parallel_degree = %d "
                     "but this job's is %d; resume with the same degree",
                     root, (int)found[6], mesh[3]);
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

int ckpt_dist_refuse_sharded(const char *root, Err *err) {
    int64_t steps[CKPT_DIST_MAX_KEPT + 1], ranks, mesh[4];
    int n;
    TRY(read_marker(root, steps, &n, &ranks, mesh, err));
    if (n == 0) return 0;
    return err_set(err,
                   "the checkpoint in %s was saved by %" PRId64 " processes but this job has 1; "
                   "resume with %" PRId64 " processes (resharding a checkpoint is not supported)",
                   root, ranks, ranks);
}

int ckpt_dist_reader_open(CkptDistReader *r, const char *root, Err *err) {
    return ckpt_dist_reader_open_step(r, root, -1, err);
}

int ckpt_dist_reader_open_step(CkptDistReader *r, const char *root, int64_t step, Err *err) {
    memset(r, 0, sizeof *r);
    int64_t steps[CKPT_DIST_MAX_KEPT + 1], ranks, mesh[4];
    int n;
    TRY(read_marker(root, steps, &n, &ranks, mesh, err));
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
    /* With HSDP every replica holds the same pieces: replica 0 (the first dp_shard x tp ranks)
     * has all of them. */
    r->dp_shard = (int)mesh[1];
    r->tp = (int)mesh[2];
    r->ep = (int)mesh[3];
    r->step = step < 0 ? steps[n - 1] : step;
    int nfiles = r->dp_shard * r->tp;
    r->files = xcalloc((size_t)nfiles, sizeof *r->files);
    for (int k = 0; k < nfiles; k++) {
        char *dir = ckpt_dist_rank_dir(root, k), name[64];
        snprintf(name, sizeof name, "step-%" PRId64, r->step);
        char *step_dir = fs_join(dir, name), *path = fs_join(step_dir, "model.safetensors");
        /* The checksums, as a resume checks them: an export of a corrupted piece would
         * otherwise be a model with wrong weights and no error. */
        int rc = ckpt_verify(step_dir, 1, err);
        if (rc == 0) rc = st_open(&r->files[k], path, err);
        free(path);
        free(step_dir);
        free(dir);
        if (rc != 0) {
            r->dp_shard = k, r->tp = 1; /* close the ones opened */
            ckpt_dist_reader_close(r);
            return -1;
        }
    }
    return 0;
}

void ckpt_dist_reader_close(CkptDistReader *r) {
    for (int k = 0; r->files && k < r->dp_shard * r->tp; k++)
        st_close(&r->files[k]);
    free(r->files);
    memset(r, 0, sizeof *r);
}

/* One rank's piece of a parameter: elements [start, start + numel) of its tp rank's part. */
typedef struct Piece {
    const char *data; /* F32, maybe unaligned; NULL when the rank holds none */
    size_t start, numel;
} Piece;

/* pc[t * dp_shard + s] = rank s * tp + t's piece of `name`, for t < nparts; the pieces of each
 * part must be 1-D F32 runs that add up to part elements. */
static int find_pieces(const CkptDistReader *r, const char *name, size_t part, int nparts,
                       Piece *pc, Err *err) {
    for (int t = 0; t < nparts; t++) {
        size_t at = 0;
        for (int s = 0; s < r->dp_shard; s++) {
            const StFile *f = &r->files[s * r->tp + t];
            const StTensor *x = st_find(f, name);
            Piece *p = &pc[t * r->dp_shard + s];
            *p = (Piece){NULL, at, 0};
            if (!x) continue;
            if (x->dtype != DT_F32 || x->ndim != 1 || at + (size_t)x->numel > part)
                return err_set(err,
                               "%s: %s is not a 1-D F32 piece that fits the %zu elements of the "
                               "parameter's part (%zu already read)",
                               f->path, name, part, at);
            p->data = x->data;
            p->numel = (size_t)x->numel;
            at += p->numel;
        }
        if (at != part)
            return err_set(err,
                           "sharded checkpoint step %" PRId64 ": the pieces of %s%s hold %zu of "
                           "its %zu elements",
                           r->step, name, nparts > 1 ? " on one tp rank" : "", at, part);
    }
    return 0;
}

/* out = elements [first, first + n) of one part, from its consecutive pieces pc[0..ns). */
static void copy_part(const Piece *pc, int ns, size_t first, size_t n, float *out) {
    for (int s = 0; s < ns && n > 0; s++) {
        size_t end = pc[s].start + pc[s].numel;
        if (first >= end) continue;
        size_t m = n < end - first ? n : end - first;
        memcpy(out, pc[s].data + (first - pc[s].start) * sizeof(float), m * sizeof(float));
        out += m, first += m, n -= m;
    }
}

/* An expert parameter under expert parallelism: block q of the ep equal blocks of experts is
 * rank q's whole piece (replica 0 of each EP rank: s = q / tp, t = q % tp, so rank q). */
static int ep_range(const CkptDistReader *r, const char *name, size_t numel, size_t first, size_t n,
                    float *out, Err *err) {
    size_t part = numel / (size_t)r->ep;
    if (numel % (size_t)r->ep)
        return err_set(err,
                       "sharded checkpoint step %" PRId64 ": %s (%zu elements) does not split into "
                       "%d expert-parallel blocks",
                       r->step, name, numel, r->ep);
    while (n > 0) {
        size_t q = first / part, at = first % part, m = part - at < n ? part - at : n;
        const StFile *f = &r->files[q];
        const StTensor *x = st_find(f, name);
        if (!x || x->dtype != DT_F32 || x->ndim != 1 || (size_t)x->numel != part)
            return err_set(err,
                           "%s: %s is not the 1-D F32 piece of %zu elements that expert-parallel "
                           "rank %zu holds",
                           f->path, name, part, q);
        memcpy(out, (const char *)x->data + at * sizeof(float), m * sizeof(float));
        out += m, first += m, n -= m;
    }
    return 0;
}

int ckpt_dist_reader_range(const CkptDistReader *r, const char *name, size_t numel, size_t cols,
                           size_t first, size_t n, float *out, Err *err) {
    if (first > numel || n > numel - first)
        return err_set(err, "elements [%zu, %zu) of %s are outside its %zu elements", first,
                       first + n, name, numel);
    const ParamKind *kind = param_kind_of_name(name, NULL);
    if (r->ep > 1 && kind && kind->role == ROLE_EXPERTS)
        return ep_range(r, name, numel, first, n, out, err);
    TpSplit split = r->tp > 1 ? tp_split_of(name) : TP_REPLICATED;
    int nparts = split == TP_REPLICATED ? 1 : r->tp;
    if (numel % (size_t)nparts ||
        (split == TP_COLS && (cols == 0 || numel % cols || cols % (size_t)nparts)))
        return err_set(err,
                       "sharded checkpoint step %" PRId64 ": %s (%zu elements in rows of %zu) "
                       "does not split into %d tensor-parallel parts",
                       r->step, name, numel, cols, r->tp);
    size_t part = numel / (size_t)nparts;
    int ns = r->dp_shard;
    Piece *pc = xmalloc((size_t)nparts * (size_t)ns * sizeof *pc);
    int rc = find_pieces(r, name, part, nparts, pc, err);
    while (rc == 0 && n > 0) {
        /* The next run that lies in one part: tp rank t's elements [at, at + m). */
        size_t t = 0, at = first, m = n;
        if (split == TP_ROWS) {
            t = first / part, at = first % part;
            m = part - at;
        } else if (split == TP_COLS) {
            size_t c = cols / (size_t)nparts, col = first % cols;
            t = col / c, at = first / cols * c + col % c;
            m = c - col % c;
        }
        if (m > n) m = n;
        copy_part(pc + t * (size_t)ns, ns, at, m, out);
        out += m, first += m, n -= m;
    }
    free(pc);
    return rc;
}

int ckpt_dist_reader_tensor(const CkptDistReader *r, const char *name, float *out, size_t numel,
                            size_t cols, Err *err) {
    return ckpt_dist_reader_range(r, name, numel, cols, 0, numel, out, err);
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
                        DType dtype, size_t max_shard_bytes, Err *err) {
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
        st_writer_add_f32_source(&w, h->name, dtype, h->ndim, h->shape, pull, &src[i]);
    }
    char *cfg = fs_join(out_dir, "config.json");
    int rc = model_spec_write_hf_config(spec, cfg, torch, err);
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
                     DType dtype, size_t max_shard_bytes, Err *err) {
    TRY(hf_export_check_out_dir(out_dir, err));
    char *tmp = fs_tmp_name(out_dir);
    int rc = fs_mkdirs(tmp, err);
    if (rc == 0) rc = ckpt_dist_export_hf(tmp, r, spec, dtype, max_shard_bytes, err);
    if (rc == 0 && fs_exists(out_dir)) rc = fs_remove_tree(out_dir, err);
    if (rc == 0 && rename(tmp, out_dir) != 0)
        rc = err_sys(err, "cannot rename %s to %s", tmp, out_dir);
    Err ignore;
    if (rc != 0 && fs_exists(tmp)) fs_remove_tree(tmp, &ignore);
    free(tmp);
    return rc;
}

static int export_step(const char *root, const ModelSpec *spec, DType dtype, Err *err) {
    CkptDistReader r;
    TRY(ckpt_dist_reader_open(&r, root, err));
    char name[48];
    snprintf(name, sizeof name, "step-%" PRId64, r.step);
    char *dir = fs_join(root, name), *out = fs_join(dir, "hf");
    int rc = fs_mkdirs(dir, err);
    if (rc == 0) rc = export_to(out, &r, spec, dtype, 0, err);
    if (rc == 0) rc = fs_sync_dir(dir, err);
    if (rc == 0)
        log_info("[checkpoint] exported step %" PRId64 " to %s (Hugging Face format)", r.step, out);
    free(dir), free(out);
    ckpt_dist_reader_close(&r);
    return rc;
}

int ckpt_dist_last_save_hf(Comm *world, const char *root, const ModelSpec *spec, DType dtype,
                           Err *err) {
    int rc = world->rank == 0 ? export_step(root, spec, dtype, err) : 0;
    return comm_agree(world, rc, err);
}

int ckpt_dist_write_config(Comm *world, const char *root, const ModelSpec *spec, Err *err) {
    int rc = 0;
    if (world->rank == 0) {
        char *path = fs_join(root, "config.json");
        rc = fs_mkdirs(root, err);
        if (rc == 0) rc = model_spec_write_hf_config(spec, path, "float32", err);
        free(path);
    }
    return comm_agree(world, rc, err);
}

/* The checkpoint folder of path (malloc'd) and the step it names (-1: the newest), or NULL
 * when path is neither a folder with the marker nor FOLDER/rank-K/step-N. */
static char *sharded_root(const char *path, int64_t *step) {
    /* path is the root (it has the marker) or root/rank-K/step-N. */
    char *root = NULL;
    int64_t want = -1;
    char *marker = fs_join(path, CKPT_DIST_MARKER);
    if (fs_exists(marker)) {
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
    int64_t step;
    char *root = sharded_root(path, &step);
    free(root);
    return root != NULL;
}

int ckpt_dist_export_path(const char *path, const char *out_dir, DType dtype,
                          size_t max_shard_bytes, int64_t *step, Err *err) {
    int64_t want;
    char *root = sharded_root(path, &want);
    if (!root)
        return err_set(err,
                       "%s is not a sharded checkpoint: expected a checkpoint folder with %s or "
                       "its FOLDER/rank-K/step-N",
                       path, CKPT_DIST_MARKER);
    char *cfg = fs_join(root, "config.json");
    ModelSpec spec;
    int rc = 0;
    if (!fs_exists(cfg))
        rc = err_set(err,
                     "%s has no config.json (sharded checkpoints record the model from this "
                     "version on); it cannot be exported",
                     root);
    if (rc == 0) rc = model_spec_from_hf_config(&spec, cfg, err);
    CkptDistReader r;
    if (rc == 0) rc = ckpt_dist_reader_open_step(&r, root, want, err);
    if (rc == 0) {
        *step = r.step;
        rc = export_to(out_dir, &r, &spec, dtype, max_shard_bytes, err);
        ckpt_dist_reader_close(&r);
    }
    free(cfg);
    free(root);
    return rc;
}
