/* The Parquet reader (text/parquet.h) against pyarrow (tests/fixtures/parquet, made by
 * tools/make_parquet_fixtures.py): every non-null "text" value of each readable fixture, in
 * row order, byte for byte; the conversations of the chat fixtures, message by message, against
 * chat.jsonl; and damaged files: every single-byte change of tiny_gzip.parquet
 * (each byte xor 0x01, 0x80 and 0xff) either reads or fails with a sentence naming the file,
 * never anything else (the sanitizer build checks the memory accesses). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "core/json.h"
#include "text/parquet.h"

static char *fix_dir;

static char *read_file(const char *dir, const char *name, size_t *len) {
    char *p = fs_join(dir, name), *data;
    Err err;
    if (fs_read_all(p, &data, len, &err)) fail_msg("%s", err.msg);
    free(p);
    return data;
}

static void test_fixtures_match_pyarrow(void **state) {
    (void)state;
    Err err;
    char *ep = fs_join(fix_dir, "expected.json");
    json_t *expected = json_load_path(ep, &err);
    assert_non_null(expected);
    const char *names[] = {
        "snappy_dict.parquet",    "zstd_v2.parquet",      "gzip_fallback.parquet",
        "plain_required.parquet", "tiny_gzip.parquet",    "tiny_none_v2.parquet",
        "delta_prefix.parquet",   "delta_length.parquet", "lz4.parquet",
        "brotli.parquet",         "empty.parquet"};
    for (size_t f = 0; f < sizeof names / sizeof *names; f++) {
        const json_t *want = json_object_get(expected, names[f]);
        assert_non_null(want);
        size_t len;
        char *data = read_file(fix_dir, names[f], &len);
        Parquet *pq;
        if (parquet_open(&pq, data, len, names[f], "text", &err)) fail_msg("%s", err.msg);
        size_t k = 0;
        int groups = parquet_row_groups(pq);
        for (int g = 0; g < groups; g++) {
            const ParquetStr *v;
            int64_t n;
            if (parquet_read_group(pq, g, &v, &n, &err)) fail_msg("%s", err.msg);
            for (int64_t i = 0; i < n; i++, k++) {
                const json_t *w = json_array_get(want, k);
                assert_non_null(w);
                assert_int_equal(v[i].n, json_string_length(w));
                assert_memory_equal(v[i].p, json_string_value(w), v[i].n);
            }
        }
        printf("%s: %zu values in %d row group(s), as pyarrow wrote them\n", names[f], k, groups);
        assert_int_equal(k, json_array_size(want));
        parquet_close(pq);
        free(data);
    }
    json_decref(expected);
    free(ep);
}

/* Conversations: chat.parquet (list/element names, two row groups) and chat_item.parquet
 * (list/item, v2 pages) hold chat.jsonl's conversations, message by message. */
typedef struct Want {
    json_t *lines; /* one parsed chat.jsonl line a row */
    int64_t rows, calls;
} Want;

/* A tool call's function object as the template reads it: its "function" when there is one. */
static const json_t *call_fn(const json_t *call) {
    const json_t *f = json_object_get(call, "function");
    return f ? f : call;
}

static int check_row(void *ctx, int64_t row, const ParquetStr *roles, const ParquetStr *contents,
                     const ParquetStr *reasonings, const json_t *const *tool_calls, int64_t n,
                     Err *err) {
    (void)err;
    Want *w = ctx;
    const json_t *msgs = json_object_get(json_array_get(w->lines, (size_t)row), "messages");
    assert_int_equal(row, w->rows);
    assert_int_equal(n, json_array_size(msgs));
    for (int64_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(msgs, (size_t)i);
        const json_t *r = json_object_get(m, "role"), *c = json_object_get(m, "content");
        assert_int_equal(roles[i].n, json_string_length(r));
        assert_memory_equal(roles[i].p, json_string_value(r), roles[i].n);
        assert_int_equal(contents[i].n, json_string_length(c));
        assert_memory_equal(contents[i].p, json_string_value(c), contents[i].n);
        /* The first of the reasoning fields that is not null, as transformers takes them. */
        const json_t *want = NULL;
        const char *names[] = {"reasoning_content", "thinking", "reasoning"};
        for (int k = 0; k < 3 && !want; k++) {
            const json_t *x = json_object_get(m, names[k]);
            if (x && !json_is_null(x)) want = x;
        }
        if (!want) {
            assert_null(reasonings[i].p);
        } else {
            assert_non_null(reasonings[i].p);
            assert_int_equal(reasonings[i].n, json_string_length(want));
            assert_memory_equal(reasonings[i].p, json_string_value(want), reasonings[i].n);
        }
        /* Tool calls: none where the line's are null or absent, else each call's name and
         * arguments, in or out of a "function" as the line has them. */
        const json_t *calls = json_object_get(m, "tool_calls");
        if (!calls || json_is_null(calls)) {
            assert_null(tool_calls[i]);
            continue;
        }
        assert_non_null(tool_calls[i]);
        assert_int_equal(json_array_size(tool_calls[i]), json_array_size(calls));
        for (size_t c = 0; c < json_array_size(calls); c++) {
            const json_t *wc = json_array_get(calls, c), *gc = json_array_get(tool_calls[i], c);
            assert_int_equal(json_object_get(wc, "function") != NULL,
                             json_object_get(gc, "function") != NULL);
            assert_true(json_equal(json_object_get(call_fn(wc), "name"),
                                   json_object_get(call_fn(gc), "name")));
            assert_true(json_equal(json_object_get(call_fn(wc), "arguments"),
                                   json_object_get(call_fn(gc), "arguments")));
            w->calls++;
        }
    }
    w->rows++;
    return 0;
}

static void test_conversations_match_pyarrow(void **state) {
    (void)state;
    Err err;
    size_t len;
    char *jl = read_file(fix_dir, "chat.jsonl", &len);
    Want w = {json_array(), 0, 0};
    for (char *line = strtok(jl, "\n"); line; line = strtok(NULL, "\n"))
        json_array_append_new(w.lines, json_loads(line, 0, NULL));
    const char *names[] = {"chat.parquet", "chat_item.parquet", "chat_reasoning.parquet",
                           "chat_tool_calls.parquet", "chat_tool_calls_bare.parquet"};
    for (size_t f = 0; f < 5; f++) {
        if (f >= 2) { /* its own JSON Lines */
            char jname[64];
            snprintf(jname, sizeof jname, "%.*s.jsonl", (int)(strlen(names[f]) - 8), names[f]);
            json_decref(w.lines);
            free(jl);
            jl = read_file(fix_dir, jname, &len);
            w.lines = json_array();
            for (char *line = strtok(jl, "\n"); line; line = strtok(NULL, "\n"))
                json_array_append_new(w.lines, json_loads(line, 0, NULL));
        }
        char *data = read_file(fix_dir, names[f], &len);
        w.rows = 0;
        if (parquet_read_conversations(data, len, names[f], "messages", check_row, &w, &err))
            fail_msg("%s", err.msg);
        printf("%s: %lld conversations, as its JSON Lines holds them\n", names[f],
               (long long)w.rows);
        assert_int_equal(w.rows, json_array_size(w.lines));
        free(data);
    }
    /* 20 conversations a tool-call file, one call each and a second in every third. */
    assert_int_equal(w.calls, 2 * (20 + 7));
    json_decref(w.lines);
    free(jl);
}

/* Streamed groups (parquet_stream_group) hand over the values of parquet_read_group in order,
 * in batches: many.parquet's 6,000 values ("row 0" .. "row 5999", as the tool writes them) come
 * in more than one. */
typedef struct Streamed {
    int64_t n, batches;
} Streamed;

static int streamed_batch(void *ctx, const ParquetStr *v, int64_t n, Err *err) {
    (void)err;
    Streamed *s = ctx;
    for (int64_t i = 0; i < n; i++, s->n++) {
        char want[32];
        int len = snprintf(want, sizeof want, "row %lld", (long long)s->n);
        assert_int_equal(v[i].n, len);
        assert_memory_equal(v[i].p, want, (size_t)len);
    }
    s->batches++;
    return 0;
}

static void test_streamed_batches(void **state) {
    (void)state;
    size_t len;
    char *data = read_file(fix_dir, "many.parquet", &len);
    Parquet *pq;
    Err err;
    if (parquet_open(&pq, data, len, "many.parquet", "text", &err)) fail_msg("%s", err.msg);
    Streamed s = {0, 0};
    for (int g = 0; g < parquet_row_groups(pq); g++)
        if (parquet_stream_group(pq, g, streamed_batch, &s, &err)) fail_msg("%s", err.msg);
    printf("many.parquet: %lld values in %lld batches\n", (long long)s.n, (long long)s.batches);
    assert_int_equal(s.n, 6000);
    assert_true(s.batches > 1);
    parquet_close(pq);
    free(data);
}

static void test_damaged_bytes(void **state) {
    (void)state;
    size_t len;
    char *orig = read_file(fix_dir, "tiny_gzip.parquet", &len);
    char *data = malloc(len);
    const unsigned char flips[] = {0x01, 0x80, 0xff};
    int ok = 0, refused = 0;
    for (size_t i = 0; i < len; i++)
        for (size_t f = 0; f < sizeof flips; f++) {
            memcpy(data, orig, len);
            data[i] ^= (char)flips[f];
            Parquet *pq;
            Err err;
            int rc = parquet_open(&pq, data, len, "damaged.parquet", "text", &err);
            for (int g = 0; rc == 0 && g < parquet_row_groups(pq); g++) {
                const ParquetStr *v;
                int64_t n;
                rc = parquet_read_group(pq, g, &v, &n, &err);
            }
            if (pq) parquet_close(pq);
            if (rc) {
                if (strncmp(err.msg, "damaged.parquet: ", 17) != 0) fail_msg("%s", err.msg);
                refused++;
            } else {
                ok++;
            }
        }
    printf("%zu single-byte changes: %d read, %d refused with a sentence\n", 3 * len, ok, refused);
    assert_true(refused > 0);
    free(data);
    free(orig);
}

int main(void) {
    const char *src = getenv("QT_SOURCE_DIR");
    if (!src) return 77;
    fix_dir = fs_join(src, "tests/fixtures/parquet");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures_match_pyarrow),
        cmocka_unit_test(test_conversations_match_pyarrow),
        cmocka_unit_test(test_streamed_batches),
        cmocka_unit_test(test_damaged_bytes),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    free(fix_dir);
    return rc;
}
