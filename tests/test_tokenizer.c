/* Tokenizer tests that need no shared data: the tiny GPT-2-style fixture against HF ids, the
 * Qwen pre-tokenizer scanner against PCRE2 running the same pattern (random and adversarial
 * strings), the two BPE merge algorithms against each other, UTF-8 repair, thread safety, and
 * malformed tokenizer.json files. */
#include <omp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fs.h"
#include "core/json.h"
#include "core/rng.h"
#include "core/timer.h"
#include "text/bpe.h"
#include "text/pretok.h"
#include "text/tokenizer.h"
#include "text/utf8.h"
#include "tok_cases.h"

static char *fixture(const char *rel) {
    return fs_join(getenv("QT_SOURCE_DIR"), rel);
}

static Tokenizer *load_tiny(void) {
    char *p = fixture("tests/fixtures/tokenizer/tiny_gpt2");
    Err err;
    Tokenizer *t = tokenizer_load(p, &err);
    if (!t) fprintf(stderr, "%s\n", err.msg);
    free(p);
    return t;
}

static void test_tiny_matches_hf(void **state) {
    (void)state;
    Tokenizer *t = load_tiny();
    assert_non_null(t);
    int n;
    assert_int_equal(check_cases(t, "tiny_edge.jsonl", &n), 0);
    assert_true(n > 400);
    assert_int_equal(tokenizer_token_id(t, "<mask>"), 600);
    assert_int_equal(tokenizer_token_id(t, "no such token"), -1);
    tokenizer_free(t);
}

/* The tiny tokenizer with other pre-tokenizer / normalizer settings (ByteLevel with a prefix
 * space, Split by a string or a custom regex through PCRE2, no normalizer, NFKC, NFD+NFC)
 * against HF's ids (tests/fixtures/tokenizer/tiny_variants.json). */
static void test_variants_match_hf(void **state) {
    (void)state;
    char *bp = fixture("tests/fixtures/tokenizer/tiny_gpt2/tokenizer.json");
    char *vp = fixture("tests/fixtures/tokenizer/tiny_variants.json");
    Err err;
    json_t *base = json_load_path(bp, &err), *vars = json_load_path(vp, &err);
    assert_non_null(base);
    assert_non_null(vars);
    size_t i, k;
    json_t *v, *c;
    int bad = 0, n = 0;
    json_array_foreach(json_object_get(vars, "variants"), i, v) {
        json_object_set(base, "pre_tokenizer", json_object_get(v, "pre_tokenizer"));
        json_object_set(base, "normalizer", json_object_get(v, "normalizer"));
        char *text = json_dumps(base, 0);
        const char *name = json_string_value(json_object_get(v, "name"));
        Tokenizer *t = tokenizer_load_mem(text, strlen(text), name, &err);
        free(text);
        if (!t) {
            fprintf(stderr, "%s\n", err.msg);
            fail();
        }
        json_array_foreach(json_object_get(v, "cases"), k, c) {
            json_t *in = json_object_get(c, "text"), *want = json_object_get(c, "ids");
            IdVec ids = {0};
            assert_int_equal(
                tokenizer_encode(t, json_string_value(in), json_string_length(in), &ids, &err), 0);
            int ok = ids.n == json_array_size(want);
            for (size_t m = 0; ok && m < ids.n; m++)
                ok = ids.ids[m] == (uint32_t)json_integer_value(json_array_get(want, m));
            if (!ok && bad++ < 5)
                fprintf(stderr, "%s: ids differ from HF on \"%s\"\n", name, json_string_value(in));
            n++;
            idvec_free(&ids);
        }
        tokenizer_free(t);
    }
    assert_int_equal(bad, 0);
    assert_true(n >= 100);
    json_decref(base);
    json_decref(vars);
    free(bp);
    free(vp);
}

/* The same file through jansson alone (the fast vocab/merges reader declines when the "model"
 * key is spelled with an escape) gives the same tokenizer. */
static void test_jansson_path_matches(void **state) {
    (void)state;
    char *p = fixture("tests/fixtures/tokenizer/tiny_gpt2/tokenizer.json");
    char *data;
    size_t len;
    Err err;
    assert_int_equal(fs_read_all(p, &data, &len, &err), 0);
    char *at = strstr(data, "\"model\"");
    assert_non_null(at);
    char *alt = malloc(len + 16);
    size_t head = (size_t)(at - data);
    memcpy(alt, data, head);
    memcpy(alt + head, "\"\\u006dodel\"", 12);
    memcpy(alt + head + 12, at + 7, len - head - 7);
    Tokenizer *t = tokenizer_load_mem(alt, len + 5, "tiny-jansson", &err);
    if (!t) fprintf(stderr, "%s\n", err.msg);
    assert_non_null(t);
    int n;
    assert_int_equal(check_cases(t, "tiny_edge.jsonl", &n), 0);
    tokenizer_free(t);
    free(alt);
    free(data);
    free(p);
}

/* Every non-ASCII code point gets the class that HF's Qwen3 pre-tokenizer gives it
 * (tests/fixtures/tokenizer/qwen3_classes.json, probed by tools/tokenizer_fixtures.py). */
static void test_unicode_classes_match_hf(void **state) {
    (void)state;
    char *p = fixture("tests/fixtures/tokenizer/qwen3_classes.json");
    Err err;
    json_t *j = json_load_path(p, &err);
    assert_non_null(j);
    uint8_t *want = calloc(0x110000, 1); /* UC_OTHER unless listed */
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(j, "ranges"), i, r) {
        const char *k = json_string_value(json_array_get(r, 2));
        int cls = k[0] == 'L' ? UC_LETTER : k[0] == 'N' ? UC_NUMBER : UC_SPACE;
        for (json_int_t cp = json_integer_value(json_array_get(r, 0));
             cp <= json_integer_value(json_array_get(r, 1)); cp++)
            want[cp] = (uint8_t)cls;
    }
    int bad = 0;
    for (uint32_t cp = 0x80; cp < 0x110000; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        if (utf8_class(cp) != want[cp] && bad++ < 10)
            fprintf(stderr, "U+%04X: class %d, HF %d\n", cp, utf8_class(cp), want[cp]);
    }
    if (bad) fprintf(stderr, "%d code points differ from HF\n", bad);
    assert_int_equal(bad, 0);
    free(want);
    json_decref(j);
    free(p);
}

/* ---- scanner vs PCRE2 */

typedef struct Pieces {
    size_t ends[1 << 16];
    size_t n;
    const char *base;
    int overflow;
} Pieces;

static int collect(void *ctx, const char *s, size_t len) {
    Pieces *p = ctx;
    if (p->n == sizeof p->ends / sizeof p->ends[0]) {
        p->overflow = 1;
        return 0;
    }
    p->ends[p->n++] = (size_t)(s - p->base) + len;
    return 0;
}

static Pieces scan_a, scan_b;

/* 1 when the scanner and PCRE2 split s identically. */
static int same_split(const PretokRegex *re, const char *s, size_t n) {
    Err err;
    memset(&scan_a, 0, sizeof scan_a);
    memset(&scan_b, 0, sizeof scan_b);
    scan_a.base = scan_b.base = s;
    pretok_qwen(s, n, collect, &scan_a);
    if (pretok_regex_split(re, s, n, collect, &scan_b, &err) != 0) {
        fprintf(stderr, "pcre2: %s\n", err.msg);
        return 0;
    }
    if (scan_a.overflow || scan_b.overflow) return scan_a.overflow == scan_b.overflow;
    if (scan_a.n != scan_b.n) return 0;
    return memcmp(scan_a.ends, scan_b.ends, scan_a.n * sizeof scan_a.ends[0]) == 0;
}

static const char *const PIECES[] = {"a",
                                     "Z",
                                     "\xc3\xa9",
                                     "e\xcc\x81",
                                     "\xc3\x9f",
                                     "\xc5\xbf",
                                     "\xc4\xb0",
                                     "\xe4\xb8\xad",
                                     "\xed\x95\x9c",
                                     "\xd0\xb6",
                                     "\xd7\x94",
                                     "\xd8\xb9",
                                     "1",
                                     "\xd9\xa3",
                                     "\xc2\xbd",
                                     "\xe2\x85\xab",
                                     " ",
                                     "  ",
                                     "\t",
                                     "\n",
                                     "\r",
                                     "\r\n",
                                     "\xc2\xa0",
                                     "\xe2\x80\x83",
                                     "\xe3\x80\x80",
                                     "\xe2\x80\xa8",
                                     "\xc2\x85",
                                     "\x0b",
                                     "\x0c",
                                     "'",
                                     "'s",
                                     "'S",
                                     "'ll",
                                     "'LL",
                                     "'Re",
                                     "'rE",
                                     "'ve",
                                     "'VE",
                                     "'m",
                                     "'M",
                                     "'d",
                                     "'D",
                                     "'t",
                                     "'T",
                                     "'l",
                                     "'r",
                                     "'v",
                                     "'\xc5\xbf",
                                     "!",
                                     "?",
                                     ".",
                                     "-",
                                     "_",
                                     "$",
                                     "\"",
                                     "\xf0\x9f\x91\x8d",
                                     "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9",
                                     "\xf0\x9f\x8f\xbd",
                                     "\xe2\x80\x8d",
                                     "\xcc\x81",
                                     "\xef\xb8\x8f",
                                     "hello",
                                     " world",
                                     "\x00",
                                     "\x7f",
                                     "\xe2\x82\xac",
                                     "\xf0\x9d\x94\x98",
                                     "\xf0\x9d\x9f\x99",
                                     "\xc7\x85",
                                     "\xe2\x80\x8b"};

static void test_scanner_matches_pcre2(void **state) {
    (void)state;
    Err err;
    PretokRegex *re = pretok_regex_compile(PRETOK_QWEN_PATTERN, "test", &err);
    assert_non_null(re);
    Rng rng;
    rng_seed(&rng, 7, 0);
    char buf[4096];
    size_t npieces = sizeof PIECES / sizeof PIECES[0];
    /* Random mixes of the pieces above. */
    for (int it = 0; it < 20000; it++) {
        size_t n = 0, k = 1 + rng_below(&rng, 30);
        for (size_t i = 0; i < k; i++) {
            const char *p = PIECES[rng_below(&rng, npieces)];
            size_t l = p[0] ? strlen(p) : 1;
            memcpy(buf + n, p, l);
            n += l;
        }
        if (!same_split(re, buf, n)) {
            fprintf(stderr, "split differs on:");
            for (size_t i = 0; i < n; i++)
                fprintf(stderr, " %02x", (uint8_t)buf[i]);
            fprintf(stderr, "\n");
            fail();
        }
    }
    /* Random code points from every plane (the regex path uses the same class table, so the
     * two must agree everywhere). */
    for (int it = 0; it < 5000; it++) {
        size_t n = 0, k = 1 + rng_below(&rng, 20);
        for (size_t i = 0; i < k; i++) {
            uint32_t cp;
            do {
                cp = rng_below(&rng, 4) == 0 ? (uint32_t)rng_below(&rng, 0x80)
                                             : (uint32_t)rng_below(&rng, 0x110000);
            } while (cp >= 0xD800 && cp <= 0xDFFF);
            n += (size_t)utf8_encode(buf + n, cp);
        }
        if (!same_split(re, buf, n)) {
            fprintf(stderr, "split differs on:");
            for (size_t i = 0; i < n; i++)
                fprintf(stderr, " %02x", (uint8_t)buf[i]);
            fprintf(stderr, "\n");
            fail();
        }
    }
    pretok_regex_free(re);
}

/* Long runs of one character, of newlines and of alternations stay linear: 100k characters
 * split in well under a second, the same way PCRE2 splits them. */
static void test_scanner_long_runs(void **state) {
    (void)state;
    Err err;
    PretokRegex *re = pretok_regex_compile(PRETOK_QWEN_PATTERN, "test", &err);
    assert_non_null(re);
    const char *runs[] = {"a",        " ",  "\n",           "\r\n", "!",  "1",  " \n", "\n ",
                          "\xc2\xa0", "'s", "\xe4\xb8\xad", "\t",   " a", "a ", " !"};
    size_t N = 100000;
    char *buf = malloc(N * 4 + 8);
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        size_t l = strlen(runs[r]), n = 0;
        while (n + l <= N) {
            memcpy(buf + n, runs[r], l);
            n += l;
        }
        for (int tail = 0; tail < 2; tail++) {
            if (tail) buf[n++] = 'x';
            double t0 = now_seconds();
            memset(&scan_a, 0, sizeof scan_a);
            scan_a.base = buf;
            pretok_qwen(buf, n, collect, &scan_a);
            double dt = now_seconds() - t0;
            assert_true(dt < 0.5);
            if (!same_split(re, buf, n)) {
                fprintf(stderr, "long run of \"%s\" (tail %d) splits differently\n", runs[r], tail);
                fail();
            }
        }
    }
    free(buf);
    pretok_regex_free(re);
}

static void test_bpe_heap_matches_scan(void **state) {
    (void)state;
    Tokenizer *t = load_tiny();
    assert_non_null(t);
    const Bpe *b = tokenizer_bpe(t);
    Rng rng;
    rng_seed(&rng, 3, 0);
    const char alpha[] = "aeinorst hl";
    uint8_t w[600];
    for (int it = 0; it < 3000; it++) {
        size_t n = 1 + rng_below(&rng, it < 2900 ? 40 : 600);
        for (size_t i = 0; i < n; i++)
            w[i] = (uint8_t)alpha[rng_below(&rng, sizeof alpha - 1)];
        IdVec a = {0}, c = {0}, d = {0};
        bpe_encode_word_uncached(b, w, n, 0, &a);
        bpe_encode_word_uncached(b, w, n, 1, &c);
        bpe_encode_word(b, w, n, &d);
        assert_int_equal(a.n, c.n);
        assert_memory_equal(a.ids, c.ids, a.n * sizeof *a.ids);
        assert_int_equal(a.n, d.n);
        assert_memory_equal(a.ids, d.ids, a.n * sizeof *a.ids);
        idvec_free(&a);
        idvec_free(&c);
        idvec_free(&d);
    }
    tokenizer_free(t);
}

static void test_utf8_repair(void **state) {
    (void)state;
    struct {
        const char *in, *out;
    } cases[] = {
        {"ok", "ok"},
        {"\xff", "\xef\xbf\xbd"},
        {"a\xe2\x82x", "a\xef\xbf\xbdx"}, /* truncated sequence: one U+FFFD */
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* surrogate: per byte */
        {"\xf0\x9f\x98", "\xef\xbf\xbd"},
        {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n;
        char *r = utf8_repair(cases[i].in, strlen(cases[i].in), &n);
        assert_string_equal(r, cases[i].out);
        free(r);
    }
}

/* Encoding from many threads at once gives the same ids as one thread. */
static void test_threads(void **state) {
    (void)state;
    Tokenizer *t = load_tiny();
    assert_non_null(t);
    const char *texts[] = {"Hello world, it's a test.", "  spaces   and\n\nnewlines\t",
                           "numbers 12345 and caf\xc3\xa9 <mask> [SEP] word"};
    IdVec ref[3] = {{0}};
    Err err;
    for (int i = 0; i < 3; i++)
        assert_int_equal(tokenizer_encode(t, texts[i], strlen(texts[i]), &ref[i], &err), 0);
    int bad = 0;
#pragma omp parallel for num_threads(4) reduction(+ : bad)
    for (int it = 0; it < 3000; it++) {
        IdVec v = {0};
        Err e;
        int k = it % 3;
        tokenizer_encode(t, texts[k], strlen(texts[k]), &v, &e);
        bad += v.n != ref[k].n || memcmp(v.ids, ref[k].ids, v.n * sizeof *v.ids) != 0;
        idvec_free(&v);
    }
    assert_int_equal(bad, 0);
    for (int i = 0; i < 3; i++)
        idvec_free(&ref[i]);
    tokenizer_free(t);
}

/* ---- malformed tokenizer.json: one sentence naming the file and the component */

static char *write_tmp(const char *text) {
    static int k;
    char *p = malloc(256);
    snprintf(p, 256, "/tmp/qt_tok_bad_%d_%d.json", (int)getpid(), k++);
    FILE *f = fopen(p, "w");
    fputs(text, f);
    fclose(f);
    return p;
}

#define PRE "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"use_regex\": true}"
#define VOCAB "\"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}"

static void test_malformed(void **state) {
    (void)state;
    struct {
        const char *json, *needle;
    } cases[] = {
        {"not json", "invalid JSON"},
        {"[]", "expected a JSON object"},
        {"{" PRE "}", "missing \"model\""},
        {"{" PRE ", \"model\": {\"type\": \"WordPiece\"}}", "model type \"WordPiece\""},
        {"{\"normalizer\": {\"type\": \"Lowercase\"}, " PRE
         ", \"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": []}}",
         "normalizer type \"Lowercase\""},
        {"{\"pre_tokenizer\": {\"type\": \"Whitespace\"}, \"model\": {\"type\": \"BPE\", " VOCAB
         ", \"merges\": []}}",
         "pre_tokenizer type \"Whitespace\""},
        {"{" PRE ", \"decoder\": {\"type\": \"WordPiece\"}, \"model\": {\"type\": \"BPE\", " VOCAB
         ", \"merges\": []}}",
         "decoder type \"WordPiece\""},
        {"{" PRE ", \"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": [\"ab\"]}}",
         "model.merges[0]"},
        {"{" PRE ", \"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": [7]}}",
         "model.merges[0]"},
        {"{" PRE ", \"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": [\"a c\"]}}",
         "not in model.vocab"},
        {"{" PRE ", \"model\": {\"type\": \"BPE\", " VOCAB
         ", \"merges\": [\"a b\", [\"a\", \"b\"]]}}",
         "repeats an earlier merge"},
        {"{" PRE ", \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}}",
         "model.vocab[\"a\"]"},
        {"{" PRE ", \"model\": {\"type\": \"BPE\", " VOCAB "}}", "model.merges"},
        {"{\"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": []}}", "pre_tokenizer"},
        {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": "
         "\"Isolated\"}, \"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": []}}",
         "does not compile"},
        {"{" PRE ", \"added_tokens\": [{\"id\": 5}], \"model\": {\"type\": \"BPE\", " VOCAB
         ", \"merges\": []}}",
         "added_tokens[0]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *p = write_tmp(cases[i].json);
        Err err;
        Tokenizer *t = tokenizer_load(p, &err);
        if (t || !strstr(err.msg, p) || !strstr(err.msg, cases[i].needle)) {
            fprintf(stderr, "case %zu: %s\n", i, t ? "loaded" : err.msg);
            fail();
        }
        unlink(p);
        free(p);
    }
    Err err;
    assert_null(tokenizer_load("/nonexistent/tokenizer.json", &err));
    assert_non_null(strstr(err.msg, "/nonexistent/tokenizer.json"));
}

/* A minimal valid file loads, and decode rejects ids it does not have. */
static void test_minimal_and_decode_errors(void **state) {
    (void)state;
    char *p = write_tmp("{" PRE ", \"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": "
                        "\"BPE\", " VOCAB ", \"merges\": [[\"a\", \"b\"]]}}");
    Err err;
    Tokenizer *t = tokenizer_load(p, &err);
    assert_non_null(t);
    IdVec v = {0};
    assert_int_equal(tokenizer_encode(t, "abab c", 6, &v, &err), 0);
    /* "abab" is one pre-token -> ab ab; " " and "c" have no token and are dropped as HF does. */
    assert_int_equal(v.n, 2);
    assert_int_equal(v.ids[0], 2);
    char *text;
    size_t len;
    assert_int_equal(tokenizer_decode(t, v.ids, v.n, &text, &len, &err), 0);
    assert_string_equal(text, "abab");
    free(text);
    uint32_t bad = 99;
    assert_int_equal(tokenizer_decode(t, &bad, 1, &text, &len, &err), -1);
    assert_non_null(strstr(err.msg, "99"));
    idvec_free(&v);
    tokenizer_free(t);
    unlink(p);
    free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_matches_hf),
        cmocka_unit_test(test_unicode_classes_match_hf),
        cmocka_unit_test(test_jansson_path_matches),
        cmocka_unit_test(test_variants_match_hf),
        cmocka_unit_test(test_scanner_matches_pcre2),
        cmocka_unit_test(test_scanner_long_runs),
        cmocka_unit_test(test_bpe_heap_matches_scan),
        cmocka_unit_test(test_utf8_repair),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_minimal_and_decode_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
