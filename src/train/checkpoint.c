/* Training checkpoints written with a rename as the commit point and verified on load. */
#include "train/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fs.h"
#include "core/json.h"
#include "core/log.h"
#include "core/progress.h"
#include "io/safetensors.h"
#include "ops/gemm.h"

#define CKPT_FORMAT_NAME "qtitan-checkpoint"
/* The optimizer's step count travels in optim.safetensors under this name too. */
#define CKPT_STEP_TENSOR "step"

static const char *const CKPT_FILES[] = {CKPT_MODEL_FILE, CKPT_OPTIM_FILE};
#define CKPT_NFILES 2

/* ---- checksum ---------------------------------------------------------------------------- */

static inline uint64_t rotl64(uint64_t x, int r) {
    return (x << r) | (x >> (64 - r));
}

static inline uint64_t load64(const unsigned char *p) {
    uint64_t w;
    memcpy(&w, p, 8);
    return w;
}

static inline uint64_t avalanche(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

/* Four independent multiply-rotate lanes over 32-byte blocks (so the loop runs at memory
 * speed), folded together with the length; the tail goes through FNV-1a. */
static uint64_t block_checksum(const void *data, size_t n) {
    const unsigned char *p = data;
    const uint64_t m1 = 0x9e3779b97f4a7c15ULL, m2 = 0xd6e8feb86659fd93ULL;
    uint64_t lane[4] = {m1, m2, ~m1, ~m2};
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++)
            lane[k] = rotl64(lane[k] ^ (load64(p + i + 8 * k) * m2), 29) * m1;
    uint64_t tail = 0xcbf29ce484222325ULL;
    for (; i < n; i++)
        tail = (tail ^ p[i]) * 0x100000001b3ULL;
    uint64_t h = (uint64_t)n * m1;
    for (int k = 0; k < 4; k++)
        h = rotl64(h ^ avalanche(lane[k]), 27) * m2;
    return avalanche(h ^ avalanche(tail));
}

/* Blocks hashed independently (in parallel) and then folded in order: the result depends on
 * the bytes only, not on the thread count. */
#define CKPT_HASH_BLOCK ((size_t)4 << 20)

uint64_t ckpt_checksum(const void *data, size_t n) {
    const unsigned char *p = data;
    long nblocks = n == 0 ? 1 : (long)((n + CKPT_HASH_BLOCK - 1) / CKPT_HASH_BLOCK);
    if (nblocks == 1) return block_checksum(p, n);
    uint64_t *h = xmalloc((size_t)nblocks * sizeof *h);
#pragma omp parallel for schedule(dynamic, 1)
    for (long b = 0; b < nblocks; b++) {
        size_t lo = (size_t)b * CKPT_HASH_BLOCK;
        size_t len = n - lo < CKPT_HASH_BLOCK ? n - lo : CKPT_HASH_BLOCK;
        h[b] = block_checksum(p + lo, len);
    }
    uint64_t acc = avalanche((uint64_t)n);
    for (long b = 0; b < nblocks; b++)
        acc = avalanche(rotl64(acc, 23) ^ h[b]) * 0x9e3779b97f4a7c15ULL;
    free(h);
    return avalanche(acc);
}

/* Size and checksum of a whole file, read through a mapping. */
static int file_digest(const char *path, uint64_t *size, uint64_t *hash, Err *err) {
    struct stat st;
    int fd = fs_open_read(path, &st, err);
    if (fd < 0) return -1;
    *size = (uint64_t)st.st_size;
    if (st.st_size == 0) {
        close(fd);
        *hash = ckpt_checksum("", 0);
        return 0;
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    SYS_CHECK(map != MAP_FAILED, err, "cannot map %s", path);
    madvise(map, (size_t)st.st_size, MADV_SEQUENTIAL);
    *hash = ckpt_checksum(map, (size_t)st.st_size);
    munmap(map, (size_t)st.st_size);
    return 0;
}

static int fsync_path(const char *path, Err *err) {
    int fd = open(path, O_RDONLY);
    SYS_CHECK(fd >= 0, err, "cannot open %s", path);
    int rc = fsync(fd);
    close(fd);
    SYS_CHECK(rc == 0, err, "cannot sync %s", path);
    return 0;
}

/* ---- directory names --------------------------------------------------------------------- */

/* "step-123" -> 123; anything else (tmp dirs, other files) -> -1. */
static int64_t parse_step_name(const char *name) {
    if (strncmp(name, "step-", 5) != 0) return -1;
    const char *p = name + 5;
    if (*p < '0' || *p > '9') return -1;
    int64_t v = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9' || v > (INT64_MAX - 9) / 10) return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

static int cmp_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x < y) - (x > y);
}

/* Step numbers of the step-N directories under root, newest first. *n = 0 when root is
 * missing. */
int ckpt_list_steps(const char *root, int64_t **steps, int *n, Err *err) {
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(root);
    if (!d) {
        if (errno == ENOENT) return 0;
        return err_sys(err, "cannot list checkpoint folder %s", root);
    }
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int64_t s = parse_step_name(e->d_name);
        if (s < 0) continue;
        char *full = fs_join(root, e->d_name);
        int is_dir = fs_is_dir(full);
        free(full);
        if (!is_dir) continue;
        if (*n == cap)
            *steps = xrealloc(*steps, (size_t)(cap = cap ? 2 * cap : 16) * sizeof **steps);
        (*steps)[(*n)++] = s;
    }
    closedir(d);
    if (*n > 1) qsort(*steps, (size_t)*n, sizeof **steps, cmp_desc);
    return 0;
}

static char *step_dir(const char *root, int64_t step) {
    char name[64];
    snprintf(name, sizeof name, "step-%" PRId64, step);
    return fs_join(root, name);
}

/* ---- save -------------------------------------------------------------------------------- */

int64_t ckpt_tensor_numel(const CkptTensor *t) {
    int64_t n = 1;
    for (int k = 0; k < t->ndim; k++)
        n *= t->shape[k];
    return n;
}

const Device *ckpt_tensor_device(const CkptTensor *t) {
    return t->device ? t->device : &device_cpu;
}

static int check_tensors(const CkptTensor *t, int n, const char *what, Err *err) {
    for (int i = 0; i < n; i++) {
        if (!t[i].name || !t[i].data)
            return err_set(err, "checkpoint: %s tensor %d has no name or data", what, i);
        if (t[i].ndim < 0 || t[i].ndim > CKPT_MAX_DIMS || t[i].ndim > ST_MAX_DIMS)
            return err_set(err, "checkpoint: %s tensor %s has %d dimensions, at most %d allowed",
                           what, t[i].name, t[i].ndim, CKPT_MAX_DIMS);
        if (strcmp(t[i].name, CKPT_STEP_TENSOR) == 0 && strcmp(what, "optimizer") == 0)
            return err_set(err, "checkpoint: optimizer tensor name \"%s\" is reserved",
                           CKPT_STEP_TENSOR);
    }
    return 0;
}

static int write_tensors(const char *path, const CkptTensor *t, int n, const int64_t *step,
                         Err *err) {
    StWriter w;
    st_writer_init(&w);
    for (int i = 0; i < n; i++)
        st_writer_add_f32_on(&w, ckpt_tensor_device(&t[i]), t[i].name, DT_F32, t[i].ndim,
                             t[i].shape, t[i].data);
    const int64_t one = 1;
    if (step) st_writer_add(&w, CKPT_STEP_TENSOR, DT_I64, 1, &one, step);
    int rc = st_write_finish(&w, path, err);
    st_writer_free(&w);
    if (rc != 0) return -1;
    /* The writer syncs its file; syncing again costs nothing and does not rely on it. */
    return fsync_path(path, err);
}

static json_t *u64_str(uint64_t v, int hex) {
    char buf[32];
    snprintf(buf, sizeof buf, hex ? "%016" PRIx64 : "%" PRIu64, v);
    return json_string(buf);
}

/* A state file's own checksum (train_state.json, a sharded checkpoint's latest.json):
 * "state_checksum" is the checksum of the file's bytes with those 16 hex digits as zeros.
 * Byte flips, a truncation or a hand edit (say of "step") anywhere in the file are caught
 * before any field is trusted. */
#define STATE_SUM_KEY CKPT_SUM_KEY

/* The 16 hex digits of the last "state_checksum": "..." in text, or NULL. */
static char *state_sum_field(char *text, size_t len) {
    static const char key[] = "\"" STATE_SUM_KEY "\": \"";
    size_t k = sizeof key - 1;
    char *found = NULL;
    for (char *p = text; (size_t)(p - text) + k + 17 <= len;) {
        char *q = memmem(p, len - (size_t)(p - text), key, k);
        if (!q || (size_t)(q - text) + k + 17 > len) break;
        found = q + k;
        p = q + 1;
    }
    return found && found[16] == '"' ? found : NULL;
}

void ckpt_sum_seal(char *text, size_t len) {
    char *sum = state_sum_field(text, len);
    if (!sum) return;
    memset(sum, '0', 16);
    uint64_t h = ckpt_checksum(text, len);
    for (int i = 15; i >= 0; i--, h >>= 4)
        sum[i] = "0123456789abcdef"[h & 15];
}

int ckpt_sum_check(char *text, size_t len, const char *path, Err *err) {
    char *sum = state_sum_field(text, len);
    if (!sum) return err_set(err, "%s has no %s (corrupted)", path, STATE_SUM_KEY);
    char digits[17];
    memcpy(digits, sum, 16);
    digits[16] = 0;
    uint64_t want;
    char *end;
    errno = 0;
    want = strtoull(digits, &end, 16);
    if (errno || *end || digits[0] == '-')
        return err_set(err, "%s: %s \"%s\" is not 16 hex digits (corrupted)", path, STATE_SUM_KEY,
                       digits);
    memset(sum, '0', 16);
    uint64_t have = ckpt_checksum(text, len);
    memcpy(sum, digits, 16);
    if (have != want)
        return err_set(err,
                       "%s has checksum %016" PRIx64 ", its %s records %016" PRIx64
                       " (edited or corrupted)",
                       path, have, STATE_SUM_KEY, want);
    return 0;
}

/* The names train_state.json gives CkptState.gemm_bf16 (QT_GEMM_BF16's names); index 0, auto,
 * is never written. */
static const char *const gemm_bf16_names[] = GEMM_BF16_PATH_NAMES;

static int write_state(const char *dir, const CkptState *st, Err *err) {
    json_t *o = json_object();
    json_object_set_new(o, "format", json_string(CKPT_FORMAT_NAME));
    json_object_set_new(o, "version", json_integer(CKPT_FORMAT_VERSION));
    json_object_set_new(o, "step", json_integer(st->step));
    json_object_set_new(o, "tokens_seen", json_integer(st->tokens_seen));
    json_t *sched = json_object();
    json_object_set_new(sched, "last_step", json_integer(st->step));
    json_object_set_new(sched, "lr", json_real(st->lr));
    json_object_set_new(o, "lr_schedule", sched);
    json_object_set_new(o, "optim_step", json_integer(st->optim_step));
    if (st->model_only) json_object_set_new(o, "model_only", json_true());
    if (st->gemm_bf16 != CKPT_GEMM_BF16_NONE)
        json_object_set_new(o, "gemm_bf16", json_string(gemm_bf16_names[st->gemm_bf16]));
    json_object_set(o, "data_position", st->data_position ? st->data_position : json_null());
    json_t *rng = json_array();
    for (int i = 0; i < 4; i++)
        json_array_append_new(rng, u64_str(st->rng[i], 0));
    json_object_set_new(o, "rng", rng);
    json_object_set_new(o, "config_hash", u64_str(st->config_hash, 1));
    if (st->config) json_object_set(o, "config", st->config);
    json_t *files = json_object();
    for (int i = 0; i < CKPT_NFILES + st->nfiles; i++) {
        const char *name = i < CKPT_NFILES ? CKPT_FILES[i] : st->files[i - CKPT_NFILES].name;
        char *path = fs_join(dir, name);
        uint64_t size, hash;
        int rc = file_digest(path, &size, &hash, err);
        free(path);
        if (rc != 0) {
            json_decref(files);
            json_decref(o);
            return -1;
        }
        json_t *f = json_object();
        json_object_set_new(f, "bytes", json_integer((json_int_t)size));
        json_object_set_new(f, "checksum", u64_str(hash, 1));
        json_object_set_new(files, name, f);
    }
    json_object_set_new(o, "files", files);
    json_object_set_new(o, STATE_SUM_KEY, u64_str(0, 1));
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(o);
    if (!text) return err_set(err, "checkpoint: cannot serialise %s", CKPT_STATE_FILE);
    char *path = fs_join(dir, CKPT_STATE_FILE);
    size_t len = strlen(text);
    text[len] = '\n'; /* replaces the NUL: the buffer is written by length */
    ckpt_sum_seal(text, len + 1);
    int rc = fs_write_atomic(path, text, len + 1, err);
    free(text);
    free(path);
    return rc;
}

/* Keeps the keep newest steps that pass the cheap check; removes every step older than the
 * last kept one (broken ones included). The newest complete step is always among those kept. */
static int prune(const char *root, int keep, Err *err) {
    if (keep <= 0) return 0;
    int64_t *steps;
    int n;
    TRY(ckpt_list_steps(root, &steps, &n, err));
    int kept = 0;
    for (int i = 0; i < n; i++) {
        char *dir = step_dir(root, steps[i]);
        Err e;
        if (kept < keep) {
            if (ckpt_verify(dir, 0, &e) == 0) kept++;
        } else if (fs_remove_tree(dir, &e) != 0) {
            log_warn("checkpoint: cannot remove old %s: %s", dir, e.msg);
        }
        free(dir);
    }
    free(steps);
    return 0;
}

int ckpt_save(const char *root, const CkptState *st, const CkptTensor *model, int nmodel,
              const CkptTensor *optim, int noptim, int keep_latest_k, Err *err) {
    if (st->step < 0) return err_set(err, "checkpoint: step must be >= 0, got %" PRId64, st->step);
    if (st->data_position && !json_is_object(st->data_position))
        return err_set(err, "checkpoint: the data position must be a JSON object");
    TRY(check_tensors(model, nmodel, "model", err));
    TRY(check_tensors(optim, noptim, "optimizer", err));
    if (st->model_only && noptim != 0)
        return err_set(err, "checkpoint: a model-only save takes no optimizer tensors");
    for (int i = 0; i < st->nfiles; i++) {
        const char *n = st->files[i].name;
        if (!n || !*n || strchr(n, '/') || n[0] == '.' || strcmp(n, CKPT_STATE_FILE) == 0 ||
            strcmp(n, CKPT_MODEL_FILE) == 0 || strcmp(n, CKPT_OPTIM_FILE) == 0)
            return err_set(err, "checkpoint: extra file name \"%s\" is not allowed", n ? n : "");
    }
    if (fs_mkdirs(root, err) != 0) return err_wrap(err, "cannot create checkpoint folder %s", root);
    char name[96];
    snprintf(name, sizeof name, "step-%" PRId64 ".tmp-%ld", st->step, (long)getpid());
    char *tmp = fs_join(root, name);
    char *final = step_dir(root, st->step);
    char *old = NULL;
    Err ignore;
    if (fs_exists(tmp) && fs_remove_tree(tmp, err) != 0) goto fail;
    if (mkdir(tmp, 0755) != 0) {
        err_sys(err, "cannot create checkpoint directory %s", tmp);
        goto fail;
    }
    char *model_path = fs_join(tmp, CKPT_MODEL_FILE), *optim_path = fs_join(tmp, CKPT_OPTIM_FILE);
    int rc = write_tensors(model_path, model, nmodel, NULL, err);
    if (rc == 0) rc = write_tensors(optim_path, optim, noptim, &st->optim_step, err);
    free(model_path);
    free(optim_path);
    for (int i = 0; i < st->nfiles && rc == 0; i++) {
        char *path = fs_join(tmp, st->files[i].name);
        rc = fs_write_atomic(path, st->files[i].data, st->files[i].len, err);
        free(path);
    }
    if (rc != 0 || write_state(tmp, st, err) != 0 || fs_sync_dir(tmp, err) != 0) goto fail;
    if (fs_exists(final)) {
        /* A step saved again (after a resume): move the old one aside under a stale-tmp name
         * so a crash between the renames leaves it to the start-up clean-up. */
        snprintf(name, sizeof name, "step-%" PRId64 ".tmp-%ld-old", st->step, (long)getpid());
        old = fs_join(root, name);
        if (rename(final, old) != 0) {
            err_sys(err, "cannot move %s aside", final);
            goto fail;
        }
    }
    if (rename(tmp, final) != 0) {
        err_sys(err, "cannot rename %s to %s", tmp, final);
        goto fail;
    }
    if (fs_sync_dir(root, err) != 0) goto fail_committed;
    if (old && fs_remove_tree(old, &ignore) != 0)
        log_warn("checkpoint: cannot remove %s: %s", old, ignore.msg);
    free(tmp);
    free(final);
    free(old);
    return prune(root, keep_latest_k, err);
fail:
    if (fs_exists(tmp)) fs_remove_tree(tmp, &ignore);
    if (old && !fs_exists(final)) rename(old, final);
fail_committed:
    free(tmp);
    free(final);
    free(old);
    return err_wrap(err, "checkpoint of step %" PRId64 " in %s failed", st->step, root);
}

/* ---- verify / find / load ---------------------------------------------------------------- */

static int parse_u64(const char *s, int hex, uint64_t *out) {
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, hex ? 16 : 10);
    if (errno || *end || *s == '-') return -1;
    *out = v;
    return 0;
}

static json_t *load_state_json(const char *dir, char **path_out, Err *err) {
    char *path = fs_join(dir, CKPT_STATE_FILE), *text;
    size_t len;
    if (fs_read_all(path, &text, &len, err) != 0) {
        free(path);
        return NULL;
    }
    json_t *o = json_load_mem(text, len, path, err);
    /* Version 1 files predate the state checksum; everything later carries one. */
    json_t *v = o ? json_object_get(o, "version") : NULL;
    if (o && !(json_is_integer(v) && json_integer_value(v) == 1) &&
        ckpt_sum_check(text, len, path, err) != 0) {
        json_decref(o);
        o = NULL;
    }
    free(text);
    if (!o) {
        free(path);
        return NULL;
    }
    const char *fmt = NULL;
    int64_t version = 0;
    if (!json_is_object(o) || json_req_str(o, "format", &fmt, path, err) != 0 ||
        json_req_int(o, "version", &version, path, err) != 0) {
        if (!json_is_object(o)) err_set(err, "%s: expected a JSON object", path);
        json_decref(o);
        free(path);
        return NULL;
    }
    if (strcmp(fmt, CKPT_FORMAT_NAME) != 0 || version < 1 || version > CKPT_FORMAT_VERSION) {
        err_set(err, "%s: format \"%s\" version %" PRId64 ", expected \"%s\" version 1 to %d", path,
                fmt, version, CKPT_FORMAT_NAME, CKPT_FORMAT_VERSION);
        json_decref(o);
        free(path);
        return NULL;
    }
    *path_out = path;
    return o;
}

/* The state's step against the step-N directory it sits in (when it is named so: a copy under
 * another name is the user's to vouch for), and its optim_step against the step that
 * optim.safetensors carries: a state file moved or copied between steps, with its checksum
 * intact, still names the wrong step. */
static int check_steps(const char *dir, const json_t *o, const char *spath, Err *err) {
    int64_t step, optim_step;
    TRY(json_req_int(o, "step", &step, spath, err));
    TRY(json_req_int(o, "optim_step", &optim_step, spath, err));
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/')
        b--;
    char base[64];
    int64_t named = -1;
    if (n - b < sizeof base) {
        memcpy(base, dir + b, n - b);
        base[n - b] = 0;
        named = parse_step_name(base);
    }
    if (named >= 0 && named != step)
        return err_set(err,
                       "%s records step %" PRId64 ", but it is in the directory of step %" PRId64,
                       spath, step, named);
    char *opath = fs_join(dir, CKPT_OPTIM_FILE);
    StFile f;
    int rc = st_open(&f, opath, err);
    if (rc == 0) {
        const StTensor *s = st_find(&f, CKPT_STEP_TENSOR);
        int64_t ostep = -1;
        if (!s || s->dtype != DT_I64 || s->numel != 1)
            rc = err_set(err, "checkpoint file %s has no I64 tensor \"%s\" of one element", opath,
                         CKPT_STEP_TENSOR);
        else
            memcpy(&ostep, s->data, sizeof ostep);
        if (rc == 0 && ostep != optim_step)
            rc = err_set(
                err, "%s: optimizer step %" PRId64 " disagrees with optim_step %" PRId64 " in %s",
                opath, ostep, optim_step, CKPT_STATE_FILE);
        st_close(&f);
    }
    free(opath);
    return rc;
}

int ckpt_verify(const char *dir, int full, Err *err) {
    char *spath = NULL;
    json_t *o = load_state_json(dir, &spath, err);
    if (!o) return -1;
    int rc = 0;
    json_t *files = json_object_get(o, "files");
    for (int i = 0; i < CKPT_NFILES && rc == 0; i++)
        if (!json_is_object(json_object_get(files, CKPT_FILES[i])))
            rc = err_set(err, "%s: files.%s is missing", spath, CKPT_FILES[i]);
    const char *name;
    json_t *f;
    json_object_foreach(files, name, f) {
        if (rc != 0) break;
        int64_t bytes;
        const char *sum;
        uint64_t want;
        if (!json_is_object(f) || !*name || strchr(name, '/') || name[0] == '.') {
            rc = err_set(err, "%s: files.%s is not a file entry", spath, name);
            break;
        }
        if (json_req_int(f, "bytes", &bytes, spath, err) != 0 ||
            json_req_str(f, "checksum", &sum, spath, err) != 0) {
            rc = -1;
            break;
        }
        if (parse_u64(sum, 1, &want) != 0) {
            rc = err_set(err, "%s: files.%s.checksum \"%s\" is not a hex number", spath, name, sum);
            break;
        }
        char *path = fs_join(dir, name);
        struct stat st;
        if (stat(path, &st) != 0) {
            rc = err_sys(err, "checkpoint file %s is missing", path);
        } else if ((int64_t)st.st_size != bytes) {
            rc = err_set(err, "checkpoint file %s has %lld bytes, %s records %" PRId64, path,
                         (long long)st.st_size, CKPT_STATE_FILE, bytes);
        } else if (full) {
            uint64_t size, hash;
            if (file_digest(path, &size, &hash, err) != 0)
                rc = -1;
            else if (hash != want)
                rc = err_set(err,
                             "checkpoint file %s has checksum %016" PRIx64
                             ", %s records %016" PRIx64 " (corrupted)",
                             path, hash, CKPT_STATE_FILE, want);
        }
        free(path);
    }
    if (rc == 0) rc = check_steps(dir, o, spath, err);
    json_decref(o);
    free(spath);
    return rc;
}

int ckpt_find_latest(const char *root, int64_t *step, char **path, Err *err) {
    int64_t *steps;
    int n;
    TRY(ckpt_list_steps(root, &steps, &n, err));
    for (int i = 0; i < n; i++) {
        char *dir = step_dir(root, steps[i]);
        Err e;
        e.msg[0] = 0;
        if (ckpt_verify(dir, 1, &e) == 0) {
            *step = steps[i];
            *path = dir;
            free(steps);
            return 1;
        }
        log_warn("checkpoint: skipping incomplete %s: %s", dir, e.msg);
        free(dir);
    }
    free(steps);
    return 0;
}

static void shape_text(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = (size_t)snprintf(buf, cap, "(");
    for (int k = 0; k < ndim && n < cap; k++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", k ? ", " : "", (long long)shape[k]);
    if (n < cap) snprintf(buf + n, cap - n, ")");
}

/* The shapes sentence of ckpt_check_step_shapes and ckpt_dist_check_shapes: `where` holds
 * params[k] with shape got (NULL: not at all). */
int ckpt_shape_mismatch(const char *where, const ParamInfo *p, const int64_t *got, int got_ndim,
                        int initial, Err *err) {
    char want[96], have[96];
    const char *what = initial ? "the initial weights (checkpoint.initial_load_path)"
                               : "the checkpoint to resume",
               *other = initial ? "" : ", or choose another checkpoint.folder";
    shape_text(want, sizeof want, p->ndim, p->shape);
    if (!got)
        return err_set(err,
                       "%s, %s, has no tensor %s %s that the job's model has; it was written for "
                       "another model (compare its config.json with the job's [model] and "
                       "[lora])%s",
                       what, where, p->name, want, other);
    shape_text(have, sizeof have, got_ndim, got);
    return err_set(err,
                   "%s, %s, holds %s with shape %s but the job's model has %s; it was written for "
                   "another model (compare its config.json with the job's [model] and [lora])%s",
                   what, where, p->name, have, want, other);
}

int64_t ckpt_resume_candidate(const char *root, int64_t load_step) {
    int64_t *steps, found = -1;
    int nsteps;
    Err ignore;
    if (ckpt_list_steps(root, &steps, &nsteps, &ignore) != 0) return -1;
    for (int i = 0; i < nsteps && found < 0; i++) {
        if (load_step >= 0 && steps[i] != load_step) continue;
        char *dir = step_dir(root, steps[i]);
        CkptState st;
        if (ckpt_read_state(dir, &st, &ignore) == 0) { /* else resume skips it, with a warning */
            ckpt_state_release(&st);
            found = steps[i];
        }
        free(dir);
    }
    free(steps);
    return found;
}

int ckpt_check_step_shapes(const char *dir, const ParamInfo *params, int n, int initial, Err *err) {
    char *path = fs_join(dir, CKPT_MODEL_FILE);
    StFile f;
    Err ignore;
    int rc = 0;
    if (st_open(&f, path, &ignore) == 0) { /* unreadable: resume's to report */
        for (int k = 0; rc == 0 && k < n; k++) {
            const StTensor *t = st_find(&f, params[k].name);
            int same = t && t->ndim == params[k].ndim;
            for (int d = 0; same && d < t->ndim; d++)
                same = t->shape[d] == params[k].shape[d];
            if (!same)
                rc = ckpt_shape_mismatch(path, &params[k], t ? t->shape : NULL, t ? t->ndim : 0,
                                         initial, err);
        }
        st_close(&f);
    }
    free(path);
    return rc;
}

int ckpt_clean_stale(const char *root, Err *err) {
    /* Another process may be saving into a step-N.tmp-<pid> right now (a second trainer that
     * the lock refused, or one on another folder sharing it): only a dead owner's goes. */
    return fs_remove_stale_tmps(root, "step-", err);
}

static int in_list(const char *name, const CkptTensor *t, int n) {
    for (int i = 0; i < n; i++)
        if (strcmp(t[i].name, name) == 0) return 1;
    return 0;
}

static int read_tensors(const char *path, const CkptTensor *t, int n, int64_t *step, Progress *p,
                        Err *err) {
    StFile f;
    TRY(st_open(&f, path, err));
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        const StTensor *s = st_find(&f, t[i].name);
        if (!s) {
            rc = err_set(err, "checkpoint file %s has no tensor %s", path, t[i].name);
            break;
        }
        int same = s->dtype == DT_F32 && s->ndim == t[i].ndim;
        for (int k = 0; same && k < s->ndim; k++)
            same = s->shape[k] == t[i].shape[k];
        if (!same) {
            char have[160], want[160];
            st_shape_str(have, sizeof have, s->shape, s->ndim);
            st_shape_str(want, sizeof want, t[i].shape, t[i].ndim);
            rc = err_set(err, "checkpoint file %s: tensor %s is %s %s, the model expects F32 %s",
                         path, t[i].name, dtype_name(s->dtype), have, want);
            break;
        }
        ckpt_tensor_device(&t[i])->from_host(t[i].data, s->data, s->nbytes);
        progress_add(p, (double)s->nbytes);
    }
    for (int i = 0; i < f.n && rc == 0; i++) {
        if (step && strcmp(f.tensors[i].name, CKPT_STEP_TENSOR) == 0) continue;
        if (!in_list(f.tensors[i].name, t, n))
            rc = err_set(err, "checkpoint file %s holds tensor %s, which this model does not have",
                         path, f.tensors[i].name);
    }
    if (rc == 0 && step) {
        const StTensor *s = st_find(&f, CKPT_STEP_TENSOR);
        if (!s || s->dtype != DT_I64 || s->numel != 1)
            rc = err_set(err, "checkpoint file %s has no I64 tensor \"%s\" of one element", path,
                         CKPT_STEP_TENSOR);
        else
            memcpy(step, s->data, sizeof *step);
    }
    st_close(&f);
    return rc;
}

static int read_state(const char *dir, CkptState *st, Err *err);

int ckpt_refuse_lora(const char *step_dir, Err *err) {
    CkptState st;
    Err ignore;
    if (read_state(step_dir, &st, &ignore) != 0) return 0;
    const char *rank = json_string_value(json_object_get(st.config, "lora.rank"));
    int rc = 0;
    if (rank && atoi(rank) > 0)
        rc = err_set(err,
                     "%s was written by a LoRA run (lora.rank = %s) and holds its adapters, not a "
                     "model: the run writes them in peft's format to job.dump_folder/adapter "
                     "and, with checkpoint.last_save_in_hf = true, the merged model to "
                     "job.dump_folder/merged; for this step run the job again with "
                     "training.steps = %" PRId64 ", checkpoint.load_step = %" PRId64
                     " and checkpoint.last_save_in_hf = true (it trains nothing and writes both)",
                     step_dir, rank, st.step, st.step);
    ckpt_state_release(&st);
    return rc;
}

void ckpt_state_release(CkptState *st) {
    json_decref(st->data_position);
    json_decref(st->config);
    st->data_position = NULL;
    st->config = NULL;
}

int ckpt_read_state(const char *dir, CkptState *st, Err *err) {
    size_t scope = err_oom_push("reading %s/%s", dir, CKPT_STATE_FILE);
    int rc = read_state(dir, st, err);
    err_oom_pop(scope);
    return rc;
}

static int read_state(const char *dir, CkptState *st, Err *err) {
    memset(st, 0, sizeof *st);
    char *spath = NULL;
    json_t *o = load_state_json(dir, &spath, err);
    if (!o) return -1;
    int rc = -1;
    json_t *rng = json_object_get(o, "rng"), *sched = json_object_get(o, "lr_schedule");
    const char *hash = NULL;
    if (json_req_int(o, "step", &st->step, spath, err) != 0 ||
        json_req_int(o, "tokens_seen", &st->tokens_seen, spath, err) != 0 ||
        json_req_int(o, "optim_step", &st->optim_step, spath, err) != 0 ||
        json_req_str(o, "config_hash", &hash, spath, err) != 0)
        goto out;
    if (st->step < 0 || st->tokens_seen < 0 || st->optim_step < 0) {
        err_set(err, "%s: step, tokens_seen and optim_step must be >= 0", spath);
        goto out;
    }
    if (parse_u64(hash, 1, &st->config_hash) != 0) {
        err_set(err, "%s: config_hash \"%s\" is not a hex number", spath, hash);
        goto out;
    }
    if (!json_is_array(rng) || json_array_size(rng) != 4) {
        err_set(err, "%s: rng must be an array of 4 decimal strings", spath);
        goto out;
    }
    for (int i = 0; i < 4; i++)
        if (parse_u64(json_string_value(json_array_get(rng, (size_t)i)), 0, &st->rng[i]) != 0) {
            err_set(err, "%s: rng[%d] is not an unsigned decimal string", spath, i);
            goto out;
        }
    if (json_is_object(sched) && json_opt_num(sched, "lr", &st->lr, spath, err) != 0) goto out;
    json_t *mo = json_object_get(o, "model_only");
    if (mo && !json_is_boolean(mo)) {
        err_set(err, "%s: model_only must be true or false", spath);
        goto out;
    }
    st->model_only = json_is_true(mo);
    const char *path16 = NULL;
    if (json_opt_str(o, "gemm_bf16", &path16, spath, err) != 0) goto out;
    for (int i = GEMM_BF16_WIDEN; path16 && i <= GEMM_BF16_AMX; i++)
        if (strcmp(path16, gemm_bf16_names[i]) == 0) st->gemm_bf16 = i;
    if (path16 && st->gemm_bf16 == CKPT_GEMM_BF16_NONE) {
        err_set(err, "%s: gemm_bf16 \"%s\" is not \"widen\", \"onednn\" or \"amx\"", spath, path16);
        goto out;
    }
    json_t *cfg = json_object_get(o, "config"), *v;
    const char *key;
    if (cfg && !json_is_object(cfg)) {
        err_set(err, "%s: config must be an object of \"section.key\": \"value\" strings", spath);
        goto out;
    }
    json_object_foreach(cfg, key, v) if (!json_is_string(v)) {
        err_set(err, "%s: config key \"%s\" must have a string value", spath, key);
        goto out;
    }
    json_t *pos = json_object_get(o, "data_position");
    if (json_is_object(pos)) st->data_position = json_incref(pos);
    if (cfg) st->config = json_incref(cfg);
    rc = 0;
out:
    json_decref(o);
    free(spath);
    return rc;
}

static int load(const char *dir, int full, CkptState *st, const CkptTensor *model, int nmodel,
                const CkptTensor *optim, int noptim, Err *err) {
    memset(st, 0, sizeof *st);
    TRY(ckpt_verify(dir, full, err));
    TRY(ckpt_read_state(dir, st, err));
    char *mpath = fs_join(dir, CKPT_MODEL_FILE), *opath = fs_join(dir, CKPT_OPTIM_FILE);
    int64_t ostep = -1;
    int rc = 0;
    if (st->model_only && noptim > 0)
        rc = err_set(err,
                     "%s holds the model only (checkpoint.last_save_model_only), not the optimizer "
                     "state training resumes with; export it (qtitan export --checkpoint DIR --out "
                     "HFDIR) to start a new run from its weights, or resume from an earlier step",
                     dir);
    /* Rank 0 shows the copy (the checksums were verified above): a large model's resume
     * takes a while, and a log should show it moving. */
    double bytes = 0;
    for (int i = 0; i < nmodel; i++)
        bytes += (double)ckpt_tensor_numel(&model[i]) * sizeof(float);
    for (int i = 0; i < noptim; i++)
        bytes += (double)ckpt_tensor_numel(&optim[i]) * sizeof(float);
    char what[96];
    snprintf(what, sizeof what, "loading checkpoint step %" PRId64, st->step);
    Progress p;
    progress_start(&p, what, bytes, "MB", 1e6);
    if (rc == 0) rc = read_tensors(mpath, model, nmodel, NULL, &p, err);
    if (rc == 0) rc = read_tensors(opath, optim, noptim, &ostep, &p, err);
    progress_finish(&p);
    if (rc == 0 && ostep != st->optim_step)
        rc = err_set(err,
                     "%s: optimizer step %" PRId64 " disagrees with optim_step %" PRId64 " in %s",
                     opath, ostep, st->optim_step, CKPT_STATE_FILE);
    free(mpath);
    free(opath);
    if (rc != 0) ckpt_state_release(st);
    return rc;
}

/* load inside the out-of-memory scope that names the checkpoint. */
static int load_scoped(const char *dir, int full, CkptState *st, const CkptTensor *model,
                       int nmodel, const CkptTensor *optim, int noptim, Err *err) {
    size_t scope = err_oom_push("loading the checkpoint %s", dir);
    int rc = load(dir, full, st, model, nmodel, optim, noptim, err);
    err_oom_pop(scope);
    return rc;
}

int ckpt_load(const char *dir, CkptState *st, const CkptTensor *model, int nmodel,
              const CkptTensor *optim, int noptim, Err *err) {
    return load_scoped(dir, 1, st, model, nmodel, optim, noptim, err);
}

int ckpt_load_found(const char *dir, CkptState *st, const CkptTensor *model, int nmodel,
                    const CkptTensor *optim, int noptim, Err *err) {
    return load_scoped(dir, 0, st, model, nmodel, optim, noptim, err);
}

/* ---- optimizer state as tensors ---------------------------------------------------------- */

CkptTensor *ckpt_adamw_tensors(const AdamW *opt, const CkptTensor *model, int nmodel, Err *err) {
    if (nmodel != opt->nparams) {
        err_set(err, "checkpoint: the model lists %d tensors but the optimizer holds %d", nmodel,
                opt->nparams);
        return NULL;
    }
    for (int i = 0; i < nmodel; i++)
        if ((size_t)ckpt_tensor_numel(&model[i]) != opt->params[i].n) {
            err_set(err,
                    "checkpoint: tensor %d (%s) has %lld elements but optimizer entry %d has "
                    "%zu",
                    i, model[i].name, (long long)ckpt_tensor_numel(&model[i]), i, opt->params[i].n);
            return NULL;
        }
    CkptTensor *t = xcalloc((size_t)(2 * nmodel > 0 ? 2 * nmodel : 1), sizeof *t);
    for (int i = 0; i < nmodel; i++) {
        size_t len = strlen(model[i].name) + 16;
        char *m = xmalloc(len), *v = xmalloc(len);
        snprintf(m, len, "%s.exp_avg", model[i].name);
        snprintf(v, len, "%s.exp_avg_sq", model[i].name);
        t[2 * i] = model[i];
        t[2 * i].name = m;
        t[2 * i].data = opt->m[i];
        t[2 * i + 1] = model[i];
        t[2 * i + 1].name = v;
        t[2 * i + 1].data = opt->v[i];
    }
    return t;
}

void ckpt_tensors_free(CkptTensor *t, int n) {
    if (!t) return;
    for (int i = 0; i < n; i++)
        free((char *)t[i].name);
    free(t);
}
