/* Training checkpoints: bitwise round trip, keep_latest_k, fallback past truncated / corrupted /
 * incomplete steps, stale temporary directories, a full disk and an impossible folder, and
 * shape mismatches on load. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fs.h"
#include "core/rng.h"
#include "ops/gemm.h"
#include "train/checkpoint.h"

enum { NA = 24 * 16, NB = 16, NPAR = 2 };

typedef struct Bufs {
    float a[NA], b[NB];                   /* parameters */
    float ma[NA], va[NA], mb[NB], vb[NB]; /* optimizer state */
    CkptTensor model[NPAR], optim[2 * NPAR];
} Bufs;

static void bufs_init(Bufs *x) {
    x->model[0] = (CkptTensor){"layers.0.attention.wq.weight", 2, {24, 16}, x->a, NULL};
    x->model[1] = (CkptTensor){"norm.weight", 1, {16}, x->b, NULL};
    x->optim[0] = (CkptTensor){"layers.0.attention.wq.weight.exp_avg", 2, {24, 16}, x->ma, NULL};
    x->optim[1] = (CkptTensor){"layers.0.attention.wq.weight.exp_avg_sq", 2, {24, 16}, x->va, NULL};
    x->optim[2] = (CkptTensor){"norm.weight.exp_avg", 1, {16}, x->mb, NULL};
    x->optim[3] = (CkptTensor){"norm.weight.exp_avg_sq", 1, {16}, x->vb, NULL};
}

static void bufs_fill(Bufs *x, uint64_t seed) {
    Rng r;
    rng_seed(&r, seed, 3);
    rng_fill_normal(&r, x->a, NA, 1.0f);
    rng_fill_normal(&r, x->b, NB, 1.0f);
    rng_fill_normal(&r, x->ma, NA, 1.0f);
    rng_fill_normal(&r, x->va, NA, 1.0f);
    rng_fill_normal(&r, x->mb, NB, 1.0f);
    rng_fill_normal(&r, x->vb, NB, 1.0f);
}

static CkptState state_for(int64_t step, json_t *pos) {
    CkptState st = {.step = step,
                    .tokens_seen = step * 4096,
                    .optim_step = step,
                    .lr = 3e-4 / (double)step,
                    .data_position = pos,
                    .rng = {1, UINT64_MAX, 0x8000000000000000ULL, (uint64_t)step},
                    .config_hash = 0xfedcba9876543210ULL};
    return st;
}

static char *make_root(void) {
    char tmpl[] = "/tmp/qt_ckpt_XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    return fs_join(tmpl, "checkpoint");
}

static void remove_root(char *root) {
    Err err;
    char *parent = xstrdup(root);
    *strrchr(parent, '/') = 0;
    fs_remove_tree(parent, &err);
    free(parent);
    free(root);
}

static void save_step(const char *root, Bufs *x, int64_t step, int keep) {
    bufs_fill(x, (uint64_t)step);
    json_t *pos = json_pack("{s:I,s:s}", "row", (json_int_t)step * 8, "epoch_seed", "42");
    CkptState st = state_for(step, pos);
    Err err;
    int rc = ckpt_save(root, &st, x->model, NPAR, x->optim, 2 * NPAR, keep, &err);
    if (rc != 0) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
    json_decref(pos);
}

static int64_t latest(const char *root) {
    int64_t step = -1;
    char *path = NULL;
    Err err;
    int rc = ckpt_find_latest(root, &step, &path, &err);
    assert_true(rc >= 0);
    free(path);
    return rc == 1 ? step : -1;
}

static char *file_in(const char *root, int64_t step, const char *name) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s/step-%lld/%s", root, (long long)step, name);
    return xstrdup(buf);
}

static void test_round_trip(void **state) {
    (void)state;
    char *root = make_root();
    Bufs *x = calloc(1, sizeof *x), *y = calloc(1, sizeof *y);
    bufs_init(x);
    bufs_init(y);
    assert_int_equal(latest(root), -1); /* no folder yet */
    save_step(root, x, 7, 0);
    bufs_fill(x, 7);
    int64_t step;
    char *path;
    Err err;
    assert_int_equal(ckpt_find_latest(root, &step, &path, &err), 1);
    assert_int_equal(step, 7);
    CkptState st;
    assert_int_equal(ckpt_load(path, &st, y->model, NPAR, y->optim, 2 * NPAR, &err), 0);
    assert_memory_equal(x->a, y->a, sizeof x->a);
    assert_memory_equal(x->b, y->b, sizeof x->b);
    assert_memory_equal(x->ma, y->ma, sizeof x->ma);
    assert_memory_equal(x->vb, y->vb, sizeof x->vb);
    CkptState want = state_for(7, NULL);
    assert_int_equal(st.step, 7);
    assert_int_equal(st.tokens_seen, want.tokens_seen);
    assert_int_equal(st.optim_step, 7);
    assert_true(st.lr == want.lr);
    assert_memory_equal(st.rng, want.rng, sizeof st.rng);
    assert_true(st.config_hash == want.config_hash);
    assert_non_null(st.data_position);
    assert_int_equal(json_integer_value(json_object_get(st.data_position, "row")), 56);
    json_decref(st.data_position);
    /* Saving the same step again replaces it. */
    save_step(root, x, 7, 0);
    assert_int_equal(latest(root), 7);
    free(path);
    free(x);
    free(y);
    remove_root(root);
}

static void test_keep_latest_k(void **state) {
    (void)state;
    char *root = make_root();
    Bufs *x = calloc(1, sizeof *x);
    bufs_init(x);
    for (int s = 1; s <= 5; s++)
        save_step(root, x, s * 10, 2);
    for (int s = 1; s <= 5; s++) {
        char buf[4096];
        snprintf(buf, sizeof buf, "%s/step-%d", root, s * 10);
        assert_int_equal(fs_exists(buf), s >= 4);
    }
    /* A broken newer step does not count towards k: step-50 breaks, then 60 is saved with
     * k = 2; 40 must survive as the second complete step. */
    char *f = file_in(root, 50, "train_state.json");
    assert_int_equal(unlink(f), 0);
    free(f);
    save_step(root, x, 60, 2);
    char buf[4096];
    snprintf(buf, sizeof buf, "%s/step-40", root);
    assert_true(fs_exists(buf));
    free(x);
    remove_root(root);
}

static void test_broken_newest_falls_back(void **state) {
    (void)state;
    char *root = make_root();
    Bufs *x = calloc(1, sizeof *x);
    bufs_init(x);
    for (int s = 1; s <= 4; s++)
        save_step(root, x, s, 0);
    assert_int_equal(latest(root), 4);
    /* Truncated model file in the newest step. */
    char *f = file_in(root, 4, "model.safetensors");
    assert_int_equal(truncate(f, 100), 0);
    free(f);
    assert_int_equal(latest(root), 3);
    /* One flipped byte (same size) in step 3's optimizer data: the checksum catches it. */
    f = file_in(root, 3, "optim.safetensors");
    struct stat sb;
    assert_int_equal(stat(f, &sb), 0);
    int fd = open(f, O_RDWR);
    assert_true(fd >= 0);
    unsigned char c;
    assert_int_equal(pread(fd, &c, 1, sb.st_size - 5), 1);
    c ^= 0x10;
    assert_int_equal(pwrite(fd, &c, 1, sb.st_size - 5), 1);
    close(fd);
    Err err;
    char *dir = file_in(root, 3, "");
    assert_int_equal(ckpt_verify(dir, 0, &err), 0); /* sizes still agree */
    assert_int_equal(ckpt_verify(dir, 1, &err), -1);
    assert_non_null(strstr(err.msg, "checksum"));
    free(dir);
    free(f);
    assert_int_equal(latest(root), 2);
    /* A truncated train_state.json. */
    f = file_in(root, 2, "train_state.json");
    assert_int_equal(truncate(f, 40), 0);
    free(f);
    assert_int_equal(latest(root), 1);
    /* Loading a broken step directly is an error too. */
    CkptState st;
    dir = file_in(root, 4, "");
    assert_int_equal(ckpt_load(dir, &st, x->model, NPAR, x->optim, 2 * NPAR, &err), -1);
    free(dir);
    free(x);
    remove_root(root);
}

static void test_stale_tmp(void **state) {
    (void)state;
    char *root = make_root();
    Bufs *x = calloc(1, sizeof *x);
    bufs_init(x);
    save_step(root, x, 1, 0);
    char buf[4096];
    snprintf(buf, sizeof buf, "%s/step-2.tmp-99999", root);
    Err err;
    assert_int_equal(fs_mkdirs(buf, &err), 0);
    snprintf(buf, sizeof buf, "%s/step-2.tmp-99999/model.safetensors", root);
    assert_int_equal(fs_write_atomic(buf, "junk", 4, &err), 0);
    /* A save in progress in a process that runs (here: this one's parent) is not touched. */
    char live[4096];
    snprintf(live, sizeof live, "%s/step-3.tmp-%ld", root, (long)getppid());
    assert_int_equal(fs_mkdirs(live, &err), 0);
    assert_int_equal(latest(root), 1);
    assert_int_equal(ckpt_clean_stale(root, &err), 0);
    snprintf(buf, sizeof buf, "%s/step-2.tmp-99999", root);
    assert_false(fs_exists(buf));
    assert_true(fs_exists(live));
    snprintf(buf, sizeof buf, "%s/step-1", root);
    assert_true(fs_exists(buf));
    free(x);
    remove_root(root);
}

/* Rewrites the first occurrence of from in file path by to (same or other length). */
static void edit_file(const char *path, const char *from, const char *to) {
    char *data;
    size_t len;
    Err err;
    assert_int_equal(fs_read_all(path, &data, &len, &err), 0);
    char *at = strstr(data, from);
    assert_non_null(at);
    size_t head = (size_t)(at - data), nf = strlen(from), nt = strlen(to);
    char *out = malloc(len - nf + nt);
    memcpy(out, data, head);
    memcpy(out + head, to, nt);
    memcpy(out + head + nt, at + nf, len - head - nf);
    assert_int_equal(fs_write_atomic(path, out, len - nf + nt, &err), 0);
    free(out);
    free(data);
}

/* train_state.json is trusted only when its own checksum holds and its step agrees with the
 * step-N directory and with optim.safetensors: otherwise the step is skipped like any other
 * corruption, and the one before it is resumed. */
static void test_state_tampered(void **state) {
    (void)state;
    char *root = make_root();
    Bufs *x = calloc(1, sizeof *x);
    bufs_init(x);
    for (int s = 1; s <= 4; s++)
        save_step(root, x, s, 0);
    /* "step": 4 edited to 8 (the resume would skip steps 5 to 8). */
    char *f = file_in(root, 4, "train_state.json");
    edit_file(f, "\"step\": 4", "\"step\": 8");
    Err err;
    char *dir = file_in(root, 4, "");
    assert_int_equal(ckpt_verify(dir, 0, &err), -1);
    assert_non_null(strstr(err.msg, "edited or corrupted"));
    free(dir);
    free(f);
    assert_int_equal(latest(root), 3);
    /* Step 2 moved whole (every checksum intact) to step-3: the directory disagrees. */
    char *two = file_in(root, 2, ""), *three = file_in(root, 3, "");
    assert_int_equal(fs_remove_tree(three, &err), 0);
    assert_int_equal(rename(two, three), 0);
    assert_int_equal(ckpt_verify(three, 1, &err), -1);
    assert_non_null(strstr(err.msg, "records step 2, but it is in the directory of step 3"));
    free(two);
    free(three);
    assert_int_equal(latest(root), 1);
    /* A flipped digit of step 1's checksum itself. */
    f = file_in(root, 1, "train_state.json");
    edit_file(f, "\"state_checksum\": \"", "\"state_checksum\": \"f");
    free(f);
    assert_int_equal(latest(root), -1);
    save_step(root, x, 5, 0);
    /* A removed checksum. */
    f = file_in(root, 5, "train_state.json");
    edit_file(f, "\"state_checksum\"", "\"state_sum\"");
    free(f);
    assert_int_equal(latest(root), -1);
    free(x);
    remove_root(root);
}

/* A bf16 job's GEMM path is saved and read back; an fp32 job's (NONE) is not written; a value
 * that is neither path, sealed with a correct checksum, is a sentence naming the file. */
static void test_state_gemm_bf16(void **state) {
    (void)state;
    char *root = make_root();
    Bufs *x = calloc(1, sizeof *x);
    bufs_init(x);
    Err err;
    for (int path = CKPT_GEMM_BF16_NONE; path <= GEMM_BF16_AMX; path++) {
        CkptState st = state_for(path + 1, NULL);
        st.gemm_bf16 = path;
        assert_int_equal(ckpt_save(root, &st, x->model, NPAR, x->optim, 2 * NPAR, 0, &err), 0);
        char *dir = file_in(root, path + 1, "");
        CkptState got;
        assert_int_equal(ckpt_read_state(dir, &got, &err), 0);
        assert_int_equal(got.gemm_bf16, path);
        ckpt_state_release(&got);
        free(dir);
    }
    char *f = file_in(root, 1, "train_state.json");
    char *data;
    size_t len;
    assert_int_equal(fs_read_all(f, &data, &len, &err), 0);
    assert_null(strstr(data, "gemm_bf16"));
    free(data);
    free(f);
    /* "widen" made "wider" and the file sealed again: the checksum holds, the value does not. */
    f = file_in(root, GEMM_BF16_WIDEN + 1, "train_state.json");
    edit_file(f, "\"widen\"", "\"wider\"");
    assert_int_equal(fs_read_all(f, &data, &len, &err), 0);
    char *sum = strstr(data, "\"" CKPT_SUM_KEY "\": \"");
    assert_non_null(sum);
    memset(sum + strlen("\"" CKPT_SUM_KEY "\": \""), '0', 16);
    ckpt_sum_seal(data, len);
    assert_int_equal(fs_write_atomic(f, data, len, &err), 0);
    free(data);
    char *dir = file_in(root, GEMM_BF16_WIDEN + 1, "");
    CkptState got;
    assert_int_equal(ckpt_read_state(dir, &got, &err), -1);
    assert_non_null(strstr(err.msg, "train_state.json: gemm_bf16 \"wider\" is not"));
    free(dir);
    free(f);
    free(x);
    remove_root(root);
}

static void test_write_failures(void **state) {
    (void)state;
    char *root = make_root();
    Bufs *x = calloc(1, sizeof *x);
    bufs_init(x);
    save_step(root, x, 1, 1);
    /* A full disk, simulated with a file-size limit: the save fails with a clear error, leaves
     * no temporary directory and keeps step 1 (keep_latest_k = 1 must not prune it). */
    struct rlimit old, small = {.rlim_cur = 1000};
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    small.rlim_max = old.rlim_max;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
    CkptState st = state_for(2, NULL);
    Err err;
    int rc = ckpt_save(root, &st, x->model, NPAR, x->optim, 2 * NPAR, 1, &err);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, prev);
    assert_int_equal(rc, -1);
    assert_non_null(strstr(err.msg, "step 2"));
    assert_int_equal(latest(root), 1);
    char buf[4096];
    snprintf(buf, sizeof buf, "%s/step-2.tmp-%ld", root, (long)getpid());
    assert_false(fs_exists(buf));
    /* A folder that cannot exist (below a regular file). */
    snprintf(buf, sizeof buf, "%s/step-1/model.safetensors/ckpt", root);
    assert_int_equal(ckpt_save(buf, &st, x->model, NPAR, x->optim, 2 * NPAR, 1, &err), -1);
    assert_non_null(strstr(err.msg, "checkpoint folder"));
    /* Not writable (only meaningful when not running as root). */
    if (geteuid() != 0) {
        assert_int_equal(chmod(root, 0555), 0);
        assert_int_equal(ckpt_save(root, &st, x->model, NPAR, x->optim, 2 * NPAR, 1, &err), -1);
        assert_int_equal(chmod(root, 0755), 0);
        assert_int_equal(latest(root), 1);
    }
    free(x);
    remove_root(root);
}

static void test_load_mismatch(void **state) {
    (void)state;
    char *root = make_root();
    Bufs *x = calloc(1, sizeof *x);
    bufs_init(x);
    save_step(root, x, 1, 0);
    char *dir = file_in(root, 1, "");
    CkptState st;
    Err err;
    x->model[0].shape[0] = 16;
    x->model[0].shape[1] = 24;
    assert_int_equal(ckpt_load(dir, &st, x->model, NPAR, x->optim, 2 * NPAR, &err), -1);
    /* Both shapes, so a resume under a changed model says what changed. */
    assert_non_null(strstr(err.msg,
                           "tensor layers.0.attention.wq.weight is F32 [24, 16], the model "
                           "expects F32 [16, 24]"));
    bufs_init(x);
    x->model[1].name = "norm.bias";
    assert_int_equal(ckpt_load(dir, &st, x->model, NPAR, x->optim, 2 * NPAR, &err), -1);
    assert_non_null(strstr(err.msg, "norm.bias"));
    bufs_init(x);
    assert_int_equal(ckpt_load(dir, &st, x->model, 1, x->optim, 2 * NPAR, &err), -1);
    assert_non_null(strstr(err.msg, "does not have"));
    bufs_init(x);
    assert_int_equal(ckpt_load(dir, &st, x->model, NPAR, x->optim, 2 * NPAR, &err), 0);
    json_decref(st.data_position);
    free(dir);
    free(x);
    remove_root(root);
}

static void test_checksum(void **state) {
    (void)state;
    unsigned char buf[100];
    for (int i = 0; i < 100; i++)
        buf[i] = (unsigned char)i;
    uint64_t h = ckpt_checksum(buf, 100);
    assert_true(h == ckpt_checksum(buf, 100));
    /* Every single-bit flip, in the block part and in the tail, changes the checksum, and so
     * does the length. */
    for (int i = 0; i < 100; i++)
        for (int b = 0; b < 8; b++) {
            buf[i] ^= (unsigned char)(1u << b);
            assert_true(ckpt_checksum(buf, 100) != h);
            buf[i] ^= (unsigned char)(1u << b);
        }
    assert_true(ckpt_checksum(buf, 99) != h);
    assert_true(ckpt_checksum(buf, 0) != ckpt_checksum(buf, 1));
    /* Several 4 MiB blocks (hashed in parallel): a flip in any block shows, and swapping two
     * equal-length blocks changes the result (the blocks are folded in order). */
    size_t n = (size_t)9 << 20;
    unsigned char *big = malloc(n);
    Rng r;
    rng_seed(&r, 3, 3);
    for (size_t i = 0; i < n; i++)
        big[i] = (unsigned char)rng_u64(&r);
    uint64_t hb = ckpt_checksum(big, n);
    assert_true(hb == ckpt_checksum(big, n));
    size_t spots[] = {0, (size_t)4 << 20, ((size_t)8 << 20) + 5, n - 1};
    for (size_t i = 0; i < 4; i++) {
        big[spots[i]] ^= 1;
        assert_true(ckpt_checksum(big, n) != hb);
        big[spots[i]] ^= 1;
    }
    unsigned char *tmp = malloc((size_t)4 << 20);
    memcpy(tmp, big, (size_t)4 << 20);
    memcpy(big, big + ((size_t)4 << 20), (size_t)4 << 20);
    memcpy(big + ((size_t)4 << 20), tmp, (size_t)4 << 20);
    assert_true(ckpt_checksum(big, n) != hb);
    free(tmp);
    free(big);
}

/* AdamW state through a checkpoint: a resumed optimizer continues bitwise like the original. */
static void test_adamw_resume(void **state) {
    (void)state;
    char *root = make_root();
    enum { P = 40 };
    float w[P], g[P], w2[P];
    Rng r;
    rng_seed(&r, 5, 0);
    rng_fill_normal(&r, w, P, 1.0f);
    CkptTensor model[1] = {{"w", 2, {8, 5}, w, NULL}};
    AdamWParam ap = {"w", w, g, P, 1};
    AdamWConfig cfg = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    AdamW a, b;
    Err err;
    assert_int_equal(adamw_init(&a, &cfg, &ap, 1, &err), 0);
    for (int s = 0; s < 3; s++) {
        rng_fill_normal(&r, g, P, 0.1f);
        adamw_step(&a, 1e-2);
    }
    CkptTensor *ot = ckpt_adamw_tensors(&a, model, 1, &err);
    assert_non_null(ot);
    assert_string_equal(ot[1].name, "w.exp_avg_sq");
    CkptState st = state_for(3, NULL);
    st.optim_step = a.step;
    assert_int_equal(ckpt_save(root, &st, model, 1, ot, 2, 0, &err), 0);
    /* Fresh optimizer and parameters, loaded from the checkpoint. */
    AdamWParam bp = {"w", w2, g, P, 1};
    assert_int_equal(adamw_init(&b, &cfg, &bp, 1, &err), 0);
    CkptTensor model2[1] = {{"w", 2, {8, 5}, w2, NULL}};
    CkptTensor *ot2 = ckpt_adamw_tensors(&b, model2, 1, &err);
    CkptState got;
    char *dir = file_in(root, 3, "");
    assert_int_equal(ckpt_load(dir, &got, model2, 1, ot2, 2, &err), 0);
    b.step = got.optim_step;
    rng_fill_normal(&r, g, P, 0.1f);
    adamw_step(&a, 1e-2);
    adamw_step(&b, 1e-2);
    assert_memory_equal(w, w2, sizeof w);
    /* A model list that does not match the optimizer is refused. */
    CkptTensor wrong[1] = {{"w", 1, {41}, w, NULL}};
    assert_null(ckpt_adamw_tensors(&a, wrong, 1, &err));
    assert_non_null(strstr(err.msg, "41"));
    ckpt_tensors_free(ot, 2);
    ckpt_tensors_free(ot2, 2);
    adamw_free(&a);
    adamw_free(&b);
    free(dir);
    remove_root(root);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_keep_latest_k),
        cmocka_unit_test(test_broken_newest_falls_back),
        cmocka_unit_test(test_stale_tmp),
        cmocka_unit_test(test_state_tampered),
        cmocka_unit_test(test_state_gemm_bf16),
        cmocka_unit_test(test_write_failures),
        cmocka_unit_test(test_load_mismatch),
        cmocka_unit_test(test_checksum),
        cmocka_unit_test(test_adamw_resume),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
