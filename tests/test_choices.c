/* Multiple-choice evaluation (infer/choices.h): requests encoded as lm-evaluation-harness
 * encodes them, with the Qwen3 tokenizer of ../shared (tests/fixtures/generate/
 * qwen3_requests.json, made by tools/make_choices_fixture.py from lm_eval's own
 * TemplateLM.loglikelihood and HFLM._encode_pair); the metrics on hand-made scores (numpy's
 * argmax, characters and bytes, the standard error); the question file's sentences. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h> /* after the headers it relies on */

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "infer/choices.h"

static char *source_path(const char *rel) {
    const char *src = getenv("QT_SOURCE_DIR");
    return fs_join(src ? src : ".", rel);
}

static void expect_ids(const json_t *want, const IdVec *got, const char *what, size_t i) {
    size_t n = json_array_size(want);
    int same = n == got->n;
    for (size_t t = 0; same && t < n; t++)
        same = (uint32_t)json_integer_value(json_array_get(want, t)) == got->ids[t];
    if (!same) {
        char *w = json_dumps(want, JSON_COMPACT);
        fprintf(stderr, "request %zu: %s ids differ from lm-eval's %s:", i, what, w);
        for (size_t t = 0; t < got->n; t++)
            fprintf(stderr, " %u", got->ids[t]);
        fprintf(stderr, "\n");
        free(w);
        fail();
    }
}

static void test_qwen3_requests(void **state) {
    (void)state;
    const char *sd = getenv("QT_SHARED_DIR");
    /* Skipped only without ../shared (a user's clone); CI has it. */
    if (!sd || !fs_exists(sd)) skip();
    char *dir = fs_join(sd, "tokenizers/qwen3"),
         *path = source_path("tests/fixtures/generate/qwen3_requests.json");
    Err err;
    Tokenizer *tok = tokenizer_load(dir, &err);
    if (!tok) fail_msg("%s", err.msg);
    json_t *root = json_load_file(path, 0, NULL);
    assert_non_null(root);
    int32_t prefix = (int32_t)json_integer_value(json_object_get(root, "prefix"));
    assert_int_equal(prefix, tokenizer_token_id(tok, "<|im_end|>"));
    size_t i;
    json_t *r;
    IdVec ctx = {0}, cont = {0};
    json_array_foreach(json_object_get(root, "requests"), i, r) {
        const json_t *c = json_object_get(r, "context"), *k = json_object_get(r, "continuation");
        if (choice_encode(tok, json_string_value(c), json_string_length(c), json_string_value(k),
                          json_string_length(k), prefix, &ctx, &cont, &err))
            fail_msg("request %zu: %s", i, err.msg);
        expect_ids(json_object_get(r, "context_ids"), &ctx, "context", i);
        expect_ids(json_object_get(r, "continuation_ids"), &cont, "continuation", i);
    }
    assert_true(i >= 16);
    idvec_free(&ctx), idvec_free(&cont);
    json_decref(root);
    tokenizer_free(tok);
    free(dir), free(path);
}

/* numpy's argmax (the first of equal maxima) of the scores, over characters and over bytes. */
static void test_metrics(void **state) {
    (void)state;
    const char *text = "{\"context\": \"q\", \"choices\": [\" ab\", \" \\u00e9\\u00e9\", \" c\"], "
                       "\"label\": 1}\n"
                       "{\"context\": \"q\", \"choices\": [\"x\", \"y\"], \"label\": 0}\n"
                       "{\"context\": \"q\", \"choices\": [\"x\", \"y\"]}\n";
    ChoiceSet cs;
    Err err;
    if (choice_set_parse(&cs, text, strlen(text), "m.jsonl", &err)) fail_msg("%s", err.msg);
    assert_int_equal(cs.n, 3);
    assert_int_equal(cs.n_choices, 7);
    /* item 1: " ab" 3 chars 3 bytes, " ee" 3 chars 5 bytes, " c" 2 chars 2 bytes */
    double ll[7] = {-6.0, -6.3, -4.5, -1.0, -1.0, -3.0, -2.0};
    ChoiceMetrics m;
    int pred[9];
    choice_metrics(&cs, ll, &m, pred);
    /* by ll: " c" (2); by chars: -2, -2.1, -2.25 -> " ab" (0); by bytes: -2, -1.26, -2.25 ->
     * " ee" (1); item 2: a tie, the first (0), right */
    int want[9] = {2, 0, 1, 0, 0, 0, 1, 1, 1};
    assert_memory_equal(pred, want, sizeof want);
    assert_int_equal(m.n, 2);
    assert_float_equal(m.acc, 0.5, 1e-12);
    assert_float_equal(m.acc_norm, 0.5, 1e-12);
    assert_float_equal(m.acc_bytes, 1.0, 1e-12);
    /* the sample deviation of {0, 1} is sqrt(0.5); over sqrt(2) */
    assert_float_equal(m.acc_se, 0.5, 1e-12);
    assert_float_equal(m.acc_bytes_se, 0.0, 1e-12);
    choice_set_free(&cs);
}

static void test_bad_files(void **state) {
    (void)state;
    static const char *const bad[][2] = {
        {"[1]\n", "b.jsonl:1: expected a JSON object with \"context\" and \"choices\""},
        {"\n{\"choices\": [\"a\"]}\n", "b.jsonl:2: \"context\" must be a string, found none"},
        {"{\"context\": \"\", \"choices\": \"a\"}", "\"choices\" must be a non-empty array"},
        {"{\"context\": \"\", \"choices\": [\"a\", 2]}", "b.jsonl:1: choice 1 must be a string"},
        {"{\"context\": \"\", \"choices\": [\"a\"], \"label\": \"a\"}",
         "\"label\" must be the index of the right choice (0 to 0) or null, found a string"},
        {"{\"context\": \"\", \"choices\": [\"a\"], \"label\": -1}", "found an index out of range"},
        {"{\"context\": ", "b.jsonl:1: not valid JSON"},
        {"  \n\n", "b.jsonl holds no question"},
    };
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        ChoiceSet cs;
        Err err;
        assert_int_not_equal(choice_set_parse(&cs, bad[b][0], strlen(bad[b][0]), "b.jsonl", &err),
                             0);
        fprintf(stderr, "expected error: %s\n", err.msg);
        if (!strstr(err.msg, bad[b][1])) fail_msg("case %zu: %s", b, err.msg);
        assert_null(cs.item);
    }
    /* A byte order mark, CRLF line ends, a null label, other fields. */
    const char *ok =
        "\xEF\xBB\xBF{\"context\": \"a\", \"choices\": [\"b\"], \"label\": null, "
        "\"id\": 7}\r\n{\"context\": \"c\", \"choices\": [\"d\", \"e\"], \"label\": 1}\r\n";
    ChoiceSet cs;
    Err err;
    if (choice_set_parse(&cs, ok, strlen(ok), "ok.jsonl", &err)) fail_msg("%s", err.msg);
    assert_int_equal(cs.n, 2);
    assert_int_equal(cs.item[0].label, -1);
    assert_int_equal(cs.item[1].label, 1);
    assert_int_equal(cs.item[1].line, 2);
    choice_set_free(&cs);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_requests),
        cmocka_unit_test(test_metrics),
        cmocka_unit_test(test_bad_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
