/* Background checkpoint writes (train/ckpt_async.h): the step written is the state as staged,
 * whatever happens to the tensors after the start; the files are a synchronous save's, byte
 * for byte; a sharded rank's write goes to its folder; a write that fails reports its sentence
 * at the wait; the staging buffer is reused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "train/ckpt_async.h"
#include "train/ckpt_dist.h"

enum { NA = 96, NB = 8 };

typedef struct Bufs {
    float a[NA], b[NB], ma[NA], va[NA], mb[NB], vb[NB];
    CkptTensor model[2], optim[4];
} Bufs;

static void bufs_init(Bufs *x, float seed) {
    x->model[0] = (CkptTensor){"layers.0.attention.wq.weight", 2, {12, 8}, x->a, NULL};
    x->model[1] = (CkptTensor){"norm.weight", 1, {8}, x->b, NULL};
    x->optim[0] = (CkptTensor){"layers.0.attention.wq.weight.exp_avg", 2, {12, 8}, x->ma, NULL};
    x->optim[1] = (CkptTensor){"layers.0.attention.wq.weight.exp_avg_sq", 2, {12, 8}, x->va, NULL};
    x->optim[2] = (CkptTensor){"norm.weight.exp_avg", 1, {8}, x->mb, NULL};
    x->optim[3] = (CkptTensor){"norm.weight.exp_avg_sq", 1, {8}, x->vb, NULL};
    for (int i = 0; i < NA; i++)
        x->a[i] = seed + (float)i, x->ma[i] = seed - (float)i, x->va[i] = seed * (float)i;
    for (int i = 0; i < NB; i++)
        x->b[i] = seed / (float)(i + 1), x->mb[i] = -seed, x->vb[i] = seed + 0.5f;
}

static char *make_dir(void) {
    char tmpl[] = "/tmp/qt_ckpt_async_XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    return xstrdup(tmpl);
}

static char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(*n + 1);
    assert_int_equal(fread(buf, 1, *n, f), *n);
    fclose(f);
    return buf;
}

static void same_file(const char *a, const char *b) {
    size_t na, nb;
    char *x = read_all(a, &na), *y = read_all(b, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(x, y, na);
    free(x), free(y);
}

static void test_snapshot_and_bytes(void **state) {
    (void)state;
    char *dir = make_dir(), *sync_root = fs_join(dir, "sync"), *bg_root = fs_join(dir, "bg");
    Bufs *x = calloc(1, sizeof *x);
    bufs_init(x, 3.0f);
    json_t *pos = json_pack("{s:I}", "row", (json_int_t)24);
    CkptState st = {
        .step = 5, .tokens_seen = 640, .optim_step = 5, .lr = 1e-3, .data_position = pos};
    Err err;
    assert_int_equal(ckpt_save(sync_root, &st, x->model, 2, x->optim, 4, 0, &err), 0);
    CkptAsync *a = ckpt_async_new();
    CkptAsyncTarget to = {.root = bg_root, .keep_latest_k = 1};
    assert_int_equal(ckpt_async_start(a, &to, &st, x->model, 2, x->optim, 4, &err), 0);
    assert_true(ckpt_async_pending(a));
    /* Training goes on: the tensors and the caller's state change at once. */
    bufs_init(x, 99.0f);
    json_object_set_new(pos, "row", json_integer(1000));
    assert_int_equal(ckpt_async_start(a, &to, &st, x->model, 2, x->optim, 4, &err), -1);
    assert_non_null(strstr(err.msg, "still in flight"));
    int64_t step = -1;
    double seconds = -1;
    assert_int_equal(ckpt_async_wait(a, &step, &seconds, &err), 0);
    assert_int_equal(step, 5);
    assert_true(seconds >= 0);
    assert_false(ckpt_async_pending(a));
    assert_false(ckpt_async_busy(a));
    static const char *const files[] = {CKPT_MODEL_FILE, CKPT_OPTIM_FILE, CKPT_STATE_FILE};
    for (int i = 0; i < 3; i++) {
        char rel[64];
        snprintf(rel, sizeof rel, "step-5/%s", files[i]);
        char *p = fs_join(sync_root, rel), *q = fs_join(bg_root, rel);
        same_file(p, q);
        free(p), free(q);
    }
    /* A second write reuses the staging; keep_latest_k = 1 leaves step 6 alone. */
    size_t staged = ckpt_async_staging_bytes(a);
    assert_int_equal(staged, (size_t)3 * (NA + NB) * sizeof(float));
    st.step = 6;
    assert_int_equal(ckpt_async_start(a, &to, &st, x->model, 2, x->optim, 4, &err), 0);
    assert_int_equal(ckpt_async_wait(a, &step, NULL, &err), 0);
    assert_int_equal(ckpt_async_staging_bytes(a), staged);
    int64_t *steps;
    int n;
    assert_int_equal(ckpt_list_steps(bg_root, &steps, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_int_equal(steps[0], 6);
    free(steps);
    ckpt_async_free(a);
    json_decref(pos);
    fs_remove_tree(dir, &err);
    free(sync_root), free(bg_root), free(dir), free(x);
}

/* A sharded rank's write: ckpt_dist_write's folder and files, no commit (latest.json) yet. */
static void test_sharded_rank(void **state) {
    (void)state;
    char *dir = make_dir(), *a_root = fs_join(dir, "a"), *b_root = fs_join(dir, "b");
    Bufs *x = calloc(1, sizeof *x);
    bufs_init(x, 7.0f);
    CkptState st = {.step = 2, .optim_step = 2};
    const int mesh[4] = {1, 2, 1, 1};
    Err err;
    assert_int_equal(ckpt_dist_write(1, 2, mesh, a_root, &st, x->model, NULL, 2, x->optim, 4, &err),
                     0);
    CkptAsync *a = ckpt_async_new();
    CkptAsyncTarget to = {.root = b_root, .rank = 1, .ranks = 2, .mesh = mesh};
    assert_int_equal(ckpt_async_start(a, &to, &st, x->model, 2, x->optim, 4, &err), 0);
    assert_int_equal(ckpt_async_wait(a, NULL, NULL, &err), 0);
    char *p = fs_join(a_root, "rank-1/step-2/" CKPT_OPTIM_FILE);
    char *q = fs_join(b_root, "rank-1/step-2/" CKPT_OPTIM_FILE);
    same_file(p, q);
    char *marker = fs_join(b_root, "latest.json");
    assert_false(fs_exists(marker)); /* the trainer commits, collectively */
    ckpt_async_free(a);
    fs_remove_tree(dir, &err);
    free(p), free(q), free(marker), free(a_root), free(b_root), free(dir), free(x);
}

/* A write that fails (its root is a file) says why at the wait, and a free without a wait
 * waits. */
static void test_failure(void **state) {
    (void)state;
    char *dir = make_dir(), *file = fs_join(dir, "plain");
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    char *root = fs_join(file, "checkpoint");
    Bufs *x = calloc(1, sizeof *x);
    bufs_init(x, 1.0f);
    CkptState st = {.step = 3, .optim_step = 3};
    Err err;
    CkptAsync *a = ckpt_async_new();
    CkptAsyncTarget to = {.root = root};
    assert_int_equal(ckpt_async_start(a, &to, &st, x->model, 2, x->optim, 4, &err), 0);
    assert_int_equal(ckpt_async_wait(a, NULL, NULL, &err), -1);
    if (!strstr(err.msg, "plain")) fail_msg("%s", err.msg);
    assert_int_equal(ckpt_async_start(a, &to, &st, x->model, 2, x->optim, 4, &err), 0);
    ckpt_async_free(a); /* waits for the failing write */
    fs_remove_tree(dir, &err);
    free(root), free(file), free(dir), free(x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_snapshot_and_bytes),
        cmocka_unit_test(test_sharded_rank),
        cmocka_unit_test(test_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
