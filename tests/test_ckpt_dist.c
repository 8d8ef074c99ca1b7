/* Sharded checkpoints (src/train/ckpt_dist.h) on the single-process communicator: the commit
 * marker, keep_latest_k pruning per rank, refusing shards saved by another number of ranks,
 * and the offline reader that assembles each full parameter from 2 and 3 ranks' FSDP pieces
 * (checked bitwise against the tensors that were cut up). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "core/rng.h"
#include "dist/fsdp.h"
#include "train/ckpt_dist.h"

static const int MESH1[3] = {1, 1, 1};

static char *tmp_root(void) {
    char tmpl[] = "/tmp/qt_ckpt_dist_XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    return strdup(tmpl);
}

static void write_marker(const char *root, int ranks, const char *steps, int64_t step) {
    char *path = fs_join(root, CKPT_DIST_MARKER), text[256];
    int n = snprintf(text, sizeof text,
                     "{\"format\": \"qtitan-sharded-checkpoint\", \"ranks\": %d, \"step\": %lld, "
                     "\"steps\": [%s]}\n",
                     ranks, (long long)step, steps);
    Err err;
    assert_int_equal(fs_write_atomic(path, text, (size_t)n, &err), 0);
    free(path);
}

static void test_save_find_prune(void **state) {
    (void)state;
    char *root = tmp_root();
    Comm *c = comm_single_create();
    float w[8] = {1, 2, 3, 4, 5, 6, 7, 8}, m[8] = {0}, v[8] = {0};
    CkptTensor model = {"w", 1, {8}, w};
    CkptTensor optim[2] = {{"w.exp_avg", 1, {8}, m}, {"w.exp_avg_sq", 1, {8}, v}};
    Err err;
    int64_t step;
    char *path;
    assert_int_equal(ckpt_dist_find_latest(c, MESH1, root, &step, &path, &err), 0);
    for (int64_t s = 1; s <= 3; s++) {
        CkptState st = {.step = s, .optim_step = s};
        w[0] = (float)s;
        assert_int_equal(ckpt_dist_save(c, MESH1, root, &st, &model, 1, optim, 2, 2, &err), 0);
    }
    assert_int_equal(ckpt_dist_find_latest(c, MESH1, root, &step, &path, &err), 1);
    assert_int_equal(step, 3);
    assert_non_null(strstr(path, "rank-0/step-3"));
    CkptState st;
    w[0] = 0;
    assert_int_equal(ckpt_load(path, &st, &model, 1, optim, 2, &err), 0);
    assert_true(w[0] == 3.0f);
    json_decref(st.data_position);
    free(path);
    /* keep_latest_k = 2: step 1 is gone, 2 and 3 stay. */
    char *dir = ckpt_dist_rank_dir(root, 0);
    char *s1 = fs_join(dir, "step-1"), *s2 = fs_join(dir, "step-2");
    assert_false(fs_exists(s1));
    assert_true(fs_exists(s2));
    /* A crash before the marker named step 3 leaves step 2 current. */
    write_marker(root, 1, "2", 2);
    assert_int_equal(ckpt_dist_find_latest(c, MESH1, root, &step, &path, &err), 1);
    assert_int_equal(step, 2);
    free(path);
    /* Shards of another world size are refused with a sentence. */
    write_marker(root, 4, "2", 2);
    assert_int_equal(ckpt_dist_find_latest(c, MESH1, root, &step, &path, &err), -1);
    assert_non_null(strstr(err.msg, "saved by 4 processes but this job has 1"));
    write_marker(root, 1, "\"x\"", 2);
    assert_int_equal(ckpt_dist_find_latest(c, MESH1, root, &step, &path, &err), -1);
    assert_non_null(strstr(err.msg, "steps[0]"));
    free(s1);
    free(s2);
    free(dir);
    comm_destroy(c);
    assert_int_equal(fs_remove_tree(root, &err), 0);
    free(root);
}

/* Cuts three parameters in two units into `ranks` FSDP shards, saves each rank's pieces as
 * ckpt_save does for a trainer on that rank, and reads every parameter back whole. */
static void reader_round_trip(int ranks) {
    enum { NP = 3 };
    const size_t numel[NP] = {37, 200, 5};
    const int unit[NP] = {0, 1, 1};
    const char *names[NP] = {"tok_embeddings.weight", "layers.0.attention.wq.weight",
                             "layers.0.attention_norm.weight"};
    float *full[NP];
    Rng r;
    rng_seed(&r, 11, (uint64_t)ranks);
    for (int i = 0; i < NP; i++) {
        full[i] = malloc(numel[i] * sizeof(float));
        rng_fill_normal(&r, full[i], (long)numel[i], 1.0f);
    }
    char *root = tmp_root();
    Err err;
    for (int k = 0; k < ranks; k++) {
        FsdpPlan p;
        assert_int_equal(fsdp_plan(&p, numel, unit, NP, 2, ranks, k, &err), 0);
        float *shard = calloc(p.shard_numel + 1, sizeof(float));
        fsdp_shard_from_full(&p, shard, (const float *const *)full);
        CkptTensor pieces[NP];
        int n = 0;
        for (int i = 0; i < NP; i++) {
            size_t lo, hi, at;
            fsdp_param_shard(&p, i, &lo, &hi, &at);
            if (hi > lo) pieces[n++] = (CkptTensor){names[i], 1, {(int64_t)(hi - lo)}, shard + at};
        }
        CkptState st = {.step = 7};
        char *dir = ckpt_dist_rank_dir(root, k);
        assert_int_equal(ckpt_save(dir, &st, pieces, n, NULL, 0, 0, &err), 0);
        free(dir);
        free(shard);
        fsdp_plan_free(&p);
    }
    CkptDistReader rd;
    assert_int_equal(ckpt_dist_reader_open(&rd, root, &err), -1); /* no marker yet */
    write_marker(root, ranks, "7", 7);
    assert_int_equal(ckpt_dist_reader_open(&rd, root, &err), 0);
    for (int i = 0; i < NP; i++) {
        float *back = calloc(numel[i], sizeof(float));
        assert_int_equal(ckpt_dist_reader_tensor(&rd, names[i], back, numel[i], &err), 0);
        assert_memory_equal(back, full[i], numel[i] * sizeof(float));
        /* The wrong size is caught. */
        assert_int_equal(ckpt_dist_reader_tensor(&rd, names[i], back, numel[i] + 1, &err), -1);
        free(back);
        free(full[i]);
    }
    ckpt_dist_reader_close(&rd);
    /* Tensor-parallel pieces are not consecutive runs: the reader refuses them. */
    char *path = fs_join(root, CKPT_DIST_MARKER), text[256];
    int len = snprintf(text, sizeof text,
                       "{\"format\": \"qtitan-sharded-checkpoint\", \"ranks\": %d, \"mesh\": "
                       "[1, %d, 2], \"step\": 7, \"steps\": [7]}\n",
                       2 * ranks, ranks);
    assert_int_equal(fs_write_atomic(path, text, (size_t)len, &err), 0);
    free(path);
    assert_int_equal(ckpt_dist_reader_open(&rd, root, &err), -1);
    assert_non_null(strstr(err.msg, "tensor parallelism"));
    assert_int_equal(fs_remove_tree(root, &err), 0);
    free(root);
}

static void test_reader(void **state) {
    (void)state;
    reader_round_trip(2);
    reader_round_trip(3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_save_find_prune),
        cmocka_unit_test(test_reader),
    };
    return cmocka_run_group_tests(tests, 0, NULL);
}
