/* Qwen3 tokenizer parity with HF tokenizers (needs ../shared; exits 77 without it): the edge
 * case set, every C4 sample document (ids compared through per-document FNV-1a hashes stored
 * by tools/tokenizer_fixtures.py), load time, and 100k-character runs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "core/timer.h"
#include "text/tokenizer.h"
#include "tok_cases.h"

static Tokenizer *qwen;
static char *shared_dir;

static uint64_t fnv64(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 0x100000001B3ull;
    return h;
}

static void test_load_time(void **state) {
    (void)state;
    char *p = fs_join(shared_dir, "tokenizers/qwen3");
    Err err;
    double t0 = now_seconds();
    Tokenizer *t = tokenizer_load(p, &err);
    double dt = now_seconds() - t0;
    assert_non_null(t);
    fprintf(stderr, "qwen3 tokenizer.json loaded in %.0f ms\n", dt * 1e3);
    /* Load time is measured in bench/tokenizer/run.sh (target 300 ms idle), not asserted here. */
    assert_int_equal(tokenizer_vocab_size(t), 151669);
    assert_int_equal(tokenizer_token_id(t, "<|endoftext|>"), 151643);
    assert_int_equal(tokenizer_token_id(t, "<|im_start|>"), 151644);
    assert_int_equal(tokenizer_token_id(t, "hello"), 14990);
    assert_true(tokenizer_hash(t) == tokenizer_hash(qwen));
    tokenizer_free(t);
    free(p);
}

static void test_edge_cases(void **state) {
    (void)state;
    int n;
    assert_int_equal(check_cases(qwen, "qwen3_edge.jsonl", &n), 0);
    assert_true(n > 500);
}

static void test_c4_sample(void **state) {
    (void)state;
    char *src = fs_join(shared_dir, "data/c4_sample/c4_sample.jsonl");
    char *fix = fs_join(getenv("QT_SOURCE_DIR"), "tests/fixtures/tokenizer/c4_qwen3.jsonl");
    char *data, *want;
    size_t len, wlen;
    Err err;
    assert_int_equal(fs_read_all(src, &data, &len, &err), 0);
    assert_int_equal(fs_read_all(fix, &want, &wlen, &err), 0);
    char *wsave, *dsave;
    char *wline = strtok_r(want, "\n", &wsave);
    json_t *head = json_loads(wline, 0, NULL);
    char hex[32];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)fnv64(data, len));
    if (strcmp(hex, json_string_value(json_object_get(head, "fnv64"))) != 0) {
        fprintf(stderr, "%s differs from the file the fixture was made from\n", src);
        fail();
    }
    json_decref(head);
    int docs = 0, bad = 0;
    size_t total = 0;
    for (char *line = strtok_r(data, "\n", &dsave); line; line = strtok_r(NULL, "\n", &dsave)) {
        json_t *doc = json_loads(line, 0, NULL);
        json_t *text = json_object_get(doc, "text");
        assert_non_null(text);
        IdVec ids = {0};
        assert_int_equal(
            tokenizer_encode(qwen, json_string_value(text), json_string_length(text), &ids, &err),
            0);
        wline = strtok_r(NULL, "\n", &wsave);
        assert_non_null(wline);
        json_t *w = json_loads(wline, 0, NULL);
        snprintf(hex, sizeof hex, "%016llx",
                 (unsigned long long)fnv64(ids.ids, ids.n * sizeof *ids.ids));
        if ((json_int_t)ids.n != json_integer_value(json_object_get(w, "n")) ||
            strcmp(hex, json_string_value(json_object_get(w, "fnv64"))) != 0) {
            if (bad++ < 5) fprintf(stderr, "C4 document %d: ids differ from HF\n", docs + 1);
        }
        /* decode(encode(x)) == x: the C4 text is NFC already. */
        char *dec;
        size_t dl;
        assert_int_equal(tokenizer_decode(qwen, ids.ids, ids.n, &dec, &dl, &err), 0);
        if (dl != json_string_length(text) || memcmp(dec, json_string_value(text), dl) != 0)
            if (bad++ < 5) fprintf(stderr, "C4 document %d: decode differs\n", docs + 1);
        free(dec);
        total += ids.n;
        docs++;
        json_decref(w);
        json_decref(doc);
        idvec_free(&ids);
    }
    fprintf(stderr, "C4 sample: %d documents, %zu tokens, %d mismatches\n", docs, total, bad);
    assert_int_equal(bad, 0);
    assert_int_equal(docs, 800);
    free(data);
    free(want);
    free(src);
    free(fix);
}

/* 100k-character runs of one piece round-trip; their encode times are printed, and timed with
 * the load in bench/tokenizer/run.sh (a quadratic pass would take minutes and hit the timeout). */
static void test_long_runs(void **state) {
    (void)state;
    const char *runs[] = {"a", " ", "\n", "!", "1", "\xe4\xb8\xad", " a", "\r\n", "ab"};
    size_t N = 100000;
    char *buf = malloc(N + 8);
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        size_t l = strlen(runs[r]), n = 0;
        while (n + l <= N) {
            memcpy(buf + n, runs[r], l);
            n += l;
        }
        IdVec ids = {0};
        Err err;
        double t0 = now_seconds();
        assert_int_equal(tokenizer_encode(qwen, buf, n, &ids, &err), 0);
        double dt = now_seconds() - t0;
        char *dec;
        size_t dl;
        assert_int_equal(tokenizer_decode(qwen, ids.ids, ids.n, &dec, &dl, &err), 0);
        assert_int_equal(dl, n);
        assert_memory_equal(dec, buf, n);
        free(dec);
        fprintf(stderr, "run of \"%s\" (%zu bytes): %.3f s\n", runs[r], n, dt);
        idvec_free(&ids);
    }
    free(buf);
}

int main(void) {
    const char *sd = getenv("QT_SHARED_DIR");
    /* Skipped only without ../shared (a user's clone); CI has it, so a missing file fails. */
    if (!sd || !fs_exists(sd)) {
        fprintf(stderr, "skipped: no ../shared (QT_SHARED_DIR)\n");
        return 77;
    }
    char *p = fs_join(sd, "tokenizers/qwen3/tokenizer.json");
    if (!fs_exists(p)) {
        fprintf(stderr, "%s does not exist\n", p);
        free(p);
        return 1;
    }
    shared_dir = xstrdup(sd);
    Err err;
    qwen = tokenizer_load(p, &err);
    free(p);
    if (!qwen) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_time),
        cmocka_unit_test(test_edge_cases),
        cmocka_unit_test(test_c4_sample),
        cmocka_unit_test(test_long_runs),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tokenizer_free(qwen);
    free(shared_dir);
    return rc;
}
