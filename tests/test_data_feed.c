/* Unit tests for src/train/data_feed: the trainer's steps, ranks and micro-batches map to the
 * global rows (step - 1) * G + (k * N + r) * G/N/M (micro-batch k of all N data-parallel ranks
 * is one run of rows), which together cover every row of the step once; the position saved
 * after a step resumes the next rows, even under another global batch size; bad splits are the
 * mesh's sentences. A byte encoder stands in for the tokenizer (id = byte value, EOS = 256). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "byte_encode_util.h"
#include "core/fs.h"
#include "core/rng.h"
#include "train/data_feed.h"

static char g_dir[64];
static Dataset g_ds;
static const int T = 8;

static int setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/qt_feed_XXXXXX");
    assert_non_null(mkdtemp(g_dir));
    char *path = fs_join(g_dir, "d.jsonl");
    FILE *f = fopen(path, "wb");
    Rng r;
    rng_seed(&r, 3, 0);
    for (int d = 0; d < 25; d++) {
        int len = 1 + (int)rng_below(&r, 15);
        fputs("{\"text\": \"", f);
        for (int i = 0; i < len; i++)
            fputc('a' + (int)rng_below(&r, 26), f);
        fputs("\"}\n", f);
    }
    fclose(f);
    DatasetEncoder enc = {byte_encode, NULL, 1, 256, 257};
    DatasetOptions o;
    dataset_options_default(&o);
    o.path = path;
    char *cache = fs_join(g_dir, "cache");
    o.cache_dir = cache;
    o.seq_len = T;
    o.seed = 5;
    Err err;
    assert_int_equal(dataset_open(&g_ds, &o, &enc, &err), 0);
    free(cache);
    free(path);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    dataset_close(&g_ds);
    Err err;
    fs_remove_tree(g_dir, &err);
    return 0;
}

/* The mesh of N data-parallel ranks (FSDP) for rank r, with M micro-batches of G/N/M rows. */
static int dims_of(MeshDims *d, int G, int r, int N, int M, Err *err) {
    MeshConfig c = {.world = N,
                    .dp_replicate = 1,
                    .dp_shard = N,
                    .tp = 1,
                    .local_batch = M > 0 ? G / N / M : 0,
                    .global_batch = G};
    return mesh_resolve(d, &c, r, err);
}

static void feed_init(DataFeed *f, int G, int r, int N, int M) {
    MeshDims d;
    Err err;
    assert_int_equal(dims_of(&d, G, r, N, M, &err), 0);
    data_feed_init(f, &g_ds, &d);
}

static void assert_rows(const void *batch, int64_t row) {
    const TrainQwen3Batch *got = batch;
    Batch want;
    Err err;
    batch_alloc(&want, got->B, T);
    assert_int_equal(dataset_rows(&g_ds, row, got->B, &want, &err), 0);
    size_t n = (size_t)got->B * T;
    for (size_t i = 0; i < n; i++)
        assert_int_equal(got->tokens[i], (int32_t)want.tokens[i]);
    assert_memory_equal(got->targets, want.targets, n * sizeof *want.targets);
    assert_memory_equal(got->positions, want.positions, n * sizeof *want.positions);
    assert_memory_equal(got->doc, want.doc_ids, n * sizeof *want.doc_ids);
    batch_free(&want);
}

static void test_steps_ranks_micro(void **state) {
    (void)state;
    const int G = 8;
    int splits[][2] = {{1, 1}, {1, 4}, {2, 1}, {2, 2}, {4, 2}};
    for (size_t s = 0; s < sizeof splits / sizeof splits[0]; s++) {
        int N = splits[s][0], M = splits[s][1];
        int seen[10][8] = {{0}}; /* [step][row of the step (G)]: micro-batches that read it */
        for (int r = 0; r < N; r++) {
            DataFeed f;
            TrainData td;
            Err err;
            feed_init(&f, G, r, N, M);
            data_feed_bind(&f, &td);
            for (int64_t step = 1; step <= 9; step++) {
                int64_t tokens, valid;
                assert_int_equal(td.count(td.ctx, step, &tokens, &valid, &err), 0);
                assert_int_equal(tokens, G / N * T);
                assert_int_equal(valid, G * T);
                for (int k = 0; k < M; k++) {
                    const void *b;
                    assert_int_equal(td.next(td.ctx, step, k, &b, &err), 0);
                    int m = G / N / M;
                    assert_int_equal(((const TrainQwen3Batch *)b)->B, m);
                    assert_rows(b, (step - 1) * G + (k * N + r) * m);
                    for (int i = 0; i < m; i++)
                        seen[step][(k * N + r) * m + i]++;
                }
            }
            data_feed_free(&f);
        }
        /* The ranks' micro-batches read every row of each step once: one process would
         * read the same rows. */
        for (int step = 1; step <= 9; step++)
            for (int i = 0; i < G; i++)
                assert_int_equal(seen[step][i], 1);
    }
}

static void test_resume(void **state) {
    (void)state;
    DataFeed f;
    TrainData td;
    Err err;
    const void *b;
    feed_init(&f, 4, 0, 1, 1);
    data_feed_bind(&f, &td);
    for (int64_t step = 1; step <= 5; step++)
        assert_int_equal(td.next(td.ctx, step, 0, &b, &err), 0);
    json_t *pos = td.position(td.ctx);
    assert_int_equal(json_integer_value(json_object_get(pos, "row")), 20);
    data_feed_free(&f);
    /* Resumed at step 6 with the same batch: the rows a run without a stop reads. */
    feed_init(&f, 4, 0, 1, 1);
    data_feed_bind(&f, &td);
    assert_int_equal(td.restore(td.ctx, pos, &err), 0);
    assert_int_equal(td.next(td.ctx, 6, 0, &b, &err), 0);
    assert_rows(b, 20);
    assert_int_equal(td.next(td.ctx, 7, 0, &b, &err), 0);
    assert_rows(b, 24);
    json_t *pos2 = td.position(td.ctx);
    assert_int_equal(json_integer_value(json_object_get(pos2, "row")), 28);
    json_decref(pos2);
    data_feed_free(&f);
    /* Resumed with a global batch of 2 rows: it continues at row 20 all the same. */
    feed_init(&f, 2, 0, 1, 1);
    data_feed_bind(&f, &td);
    assert_int_equal(td.restore(td.ctx, pos, &err), 0);
    assert_int_equal(td.next(td.ctx, 6, 0, &b, &err), 0);
    assert_rows(b, 20);
    assert_int_equal(td.next(td.ctx, 7, 0, &b, &err), 0);
    assert_rows(b, 22);
    assert_int_equal(td.next(td.ctx, 5, 0, &b, &err), -1);
    data_feed_free(&f);
    /* A position from other data is refused. */
    json_object_set_new(pos, "offset", json_integer(3));
    feed_init(&f, 4, 0, 1, 1);
    data_feed_bind(&f, &td);
    assert_int_equal(td.restore(td.ctx, pos, &err), -1);
    assert_non_null(strstr(err.msg, "changed since the checkpoint"));
    data_feed_free(&f);
    json_decref(pos);
}

static void test_bad_split(void **state) {
    (void)state;
    MeshDims d;
    Err err;
    assert_int_equal(dims_of(&d, 6, 0, 4, 1, &err), -1);
    assert_non_null(strstr(err.msg, "global_batch_size = 6 is not divisible by data-parallel "
                                    "ranks x training.local_batch_size = 4 x 1"));
    assert_int_equal(dims_of(&d, 8, 0, 1, 0, &err), -1);
    assert_non_null(strstr(err.msg, "local_batch_size = 0 must be at least 1"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_steps_ranks_micro),
        cmocka_unit_test(test_resume),
        cmocka_unit_test(test_bad_split),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
