/* Unit tests for src/train/data_feed: the trainer's steps, ranks and micro-batches map to the
 * global rows step*G + r*G/N + k*G/N/M; the position saved after a step resumes the next rows,
 * even under another global batch size; bad splits are sentences. A byte encoder stands in for
 * the tokenizer (id = byte value, EOS = 256). */
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
#include "train/data_feed.h"

static int byte_encode(const void *ctx, const char *text, size_t len, IdVec *out, Err *err) {
    (void)ctx;
    (void)err;
    if (out->n + len > out->cap) {
        out->cap = out->n + len + 16;
        out->ids = realloc(out->ids, out->cap * sizeof *out->ids);
    }
    for (size_t i = 0; i < len; i++)
        out->ids[out->n++] = (unsigned char)text[i];
    return 0;
}

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

static void assert_rows(const Batch *got, int64_t row) {
    Batch want;
    Err err;
    batch_alloc(&want, got->B, T);
    assert_int_equal(dataset_rows(&g_ds, row, got->B, &want, &err), 0);
    size_t n = (size_t)got->B * T;
    assert_memory_equal(got->tokens, want.tokens, n * sizeof *want.tokens);
    assert_memory_equal(got->targets, want.targets, n * sizeof *want.targets);
    assert_memory_equal(got->positions, want.positions, n * sizeof *want.positions);
    assert_memory_equal(got->doc_ids, want.doc_ids, n * sizeof *want.doc_ids);
    batch_free(&want);
}

static void test_steps_ranks_micro(void **state) {
    (void)state;
    const int G = 8;
    int splits[][2] = {{1, 1}, {1, 4}, {2, 1}, {2, 2}, {4, 2}};
    for (size_t s = 0; s < sizeof splits / sizeof splits[0]; s++) {
        int N = splits[s][0], M = splits[s][1];
        for (int r = 0; r < N; r++) {
            DataFeed f;
            TrainData td;
            Err err;
            assert_int_equal(data_feed_init(&f, &g_ds, G, r, N, M, &err), 0);
            data_feed_bind(&f, &td);
            for (int64_t step = 1; step <= 9; step++) {
                int64_t tokens, valid;
                assert_int_equal(td.count(td.ctx, step, &tokens, &valid, &err), 0);
                assert_int_equal(tokens, G / N * T);
                assert_int_equal(valid, G * T);
                for (int k = 0; k < M; k++) {
                    const void *b;
                    assert_int_equal(td.next(td.ctx, step, k, &b, &err), 0);
                    assert_int_equal(((const Batch *)b)->B, G / N / M);
                    assert_rows(b, (step - 1) * G + r * (G / N) + k * (G / N / M));
                }
            }
            data_feed_free(&f);
        }
    }
}

static void test_resume(void **state) {
    (void)state;
    DataFeed f;
    TrainData td;
    Err err;
    const void *b;
    assert_int_equal(data_feed_init(&f, &g_ds, 4, 0, 1, 1, &err), 0);
    data_feed_bind(&f, &td);
    for (int64_t step = 1; step <= 5; step++)
        assert_int_equal(td.next(td.ctx, step, 0, &b, &err), 0);
    json_t *pos = td.position(td.ctx);
    assert_int_equal(json_integer_value(json_object_get(pos, "row")), 20);
    data_feed_free(&f);
    /* Resumed at step 6 with the same batch: the rows a run without a stop reads. */
    assert_int_equal(data_feed_init(&f, &g_ds, 4, 0, 1, 1, &err), 0);
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
    assert_int_equal(data_feed_init(&f, &g_ds, 2, 0, 1, 1, &err), 0);
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
    assert_int_equal(data_feed_init(&f, &g_ds, 4, 0, 1, 1, &err), 0);
    data_feed_bind(&f, &td);
    assert_int_equal(td.restore(td.ctx, pos, &err), -1);
    assert_non_null(strstr(err.msg, "changed since the checkpoint"));
    data_feed_free(&f);
    json_decref(pos);
}

static void test_bad_split(void **state) {
    (void)state;
    DataFeed f;
    Err err;
    assert_int_equal(data_feed_init(&f, &g_ds, 6, 0, 4, 1, &err), -1);
    assert_non_null(strstr(err.msg, "global_batch_size 6 is not a positive multiple of 4"));
    assert_int_equal(data_feed_init(&f, &g_ds, 8, 2, 2, 1, &err), -1);
    assert_int_equal(data_feed_init(&f, &g_ds, 8, 0, 1, 0, &err), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_steps_ranks_micro),
        cmocka_unit_test(test_resume),
        cmocka_unit_test(test_bad_split),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
