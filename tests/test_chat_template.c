/* Chat rendering parity with transformers' apply_chat_template on the real Qwen3 tokenizer
 * (needs ../shared; exits 77 without it): ids and assistant flags of every conversation in
 * tests/fixtures/chat/qwen3_chat.jsonl (made by tools/make_chat_fixtures.py; tool definitions,
 * tool calls and tool results included), each line read as training data reads it, and the error
 * sentences for folders without a chat template qtitan knows. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fs.h"
#include "core/json.h"
#include "text/chat_data.h"
#include "text/chat_template.h"
#include "text/jsonl.h"

static Tokenizer *qwen;
static char *shared_dir;

static void test_fixtures(void **state) {
    (void)state;
    Err err;
    ChatFormat *cf = chat_format_load(qwen, &err);
    if (!cf) fprintf(stderr, "%s\n", err.msg);
    assert_non_null(cf);
    assert_string_equal(chat_format_name(cf), "qwen3");
    char *path = fs_join(getenv("QT_SOURCE_DIR"), "tests/fixtures/chat/qwen3_chat.jsonl");
    char *buf;
    size_t len, pos = 0, line_len;
    const char *line;
    assert_int_equal(fs_read_all(path, &buf, &len, &err), 0);
    int cases = 0, flagged = 0, tool_cases = 0;
    ChatTokens out = {0};
    while (jsonl_next_line(buf, len, &pos, &line, &line_len) == 0) {
        json_t *j = json_load_mem(line, line_len, path, &err);
        assert_non_null(j);
        /* The line's messages and tools as training data reads them. */
        json_t *root;
        ChatMessage *msgs;
        size_t n;
        const json_t *tools;
        if (chat_data_parse_line(line, line_len, DATA_MESSAGES, path, cases + 1, &root, &msgs, &n,
                                 &tools, &err))
            fail_msg("%s", err.msg);
        ChatOptions opt = {.add_generation_prompt =
                               json_is_true(json_object_get(j, "add_generation_prompt")),
                           .enable_thinking = json_is_true(json_object_get(j, "enable_thinking")),
                           .tools = tools};
        assert_int_equal(chat_render(cf, msgs, n, opt, &out, &err), 0);
        const json_t *ids = json_object_get(j, "ids");
        const char *mask = json_string_value(json_object_get(j, "assistant"));
        const char *name = json_string_value(json_object_get(j, "name"));
        if (out.n != json_array_size(ids)) fprintf(stderr, "%s: %zu ids\n", name, out.n);
        assert_int_equal(out.n, json_array_size(ids));
        for (size_t i = 0; i < out.n; i++) {
            if (out.ids[i] != json_integer_value(json_array_get(ids, i)) ||
                out.assistant[i] != mask[i] - '0')
                fprintf(stderr, "%s: token %zu differs\n", name, i);
            assert_int_equal(out.ids[i], json_integer_value(json_array_get(ids, i)));
            assert_int_equal(out.assistant[i], mask[i] - '0');
            flagged += out.assistant[i];
        }
        cases++;
        tool_cases += tools && json_array_size(tools) > 0;
        free(msgs);
        json_decref(root);
        json_decref(j);
    }
    /* A fixture that lost its cases or its flags would pass the loop above vacuously. */
    assert_true(cases >= 30 && tool_cases >= 6);
    assert_true(flagged > 100);
    assert_int_not_equal(chat_render(cf, NULL, 0, (ChatOptions){0}, &out, &err), 0);
    assert_non_null(strstr(err.msg, "at least one message"));
    chat_tokens_free(&out);
    chat_format_free(cf);
    free(buf);
    free(path);
}

/* A tokenizer folder in a fresh temporary directory: the tiny committed tokenizer.json or the
 * Qwen3 one, and tokenizer_config.json with `config` (none when NULL). */
static Tokenizer *folder(char *dir, const char *tokenizer_json, const char *config) {
    Err err;
    assert_non_null(mkdtemp(dir));
    char *buf, *p = fs_join(dir, "tokenizer.json");
    size_t len;
    assert_int_equal(fs_read_all(tokenizer_json, &buf, &len, &err), 0);
    assert_int_equal(fs_write_atomic(p, buf, len, &err), 0);
    free(buf);
    if (config) {
        char *c = fs_join(dir, "tokenizer_config.json");
        assert_int_equal(fs_write_atomic(c, config, strlen(config), &err), 0);
        free(c);
    }
    Tokenizer *t = tokenizer_load(p, &err);
    assert_non_null(t);
    free(p);
    return t;
}

static void expect_error(const Tokenizer *t, const char *dir, const char *what) {
    Err err;
    assert_null(chat_format_load(t, &err));
    fprintf(stderr, "expected error: %s\n", err.msg);
    assert_non_null(strstr(err.msg, dir));
    assert_non_null(strstr(err.msg, what));
}

static void test_bad_folders(void **state) {
    (void)state;
    Err err;
    char *tiny =
        fs_join(getenv("QT_SOURCE_DIR"), "tests/fixtures/tokenizer/tiny_gpt2/tokenizer.json");
    char *qwen_json = fs_join(shared_dir, "tokenizers/qwen3/tokenizer.json");
    char *qwen_cfg = fs_join(shared_dir, "tokenizers/qwen3/tokenizer_config.json");
    char d1[] = "/tmp/qt_chat_XXXXXX", d2[] = "/tmp/qt_chat_XXXXXX", d3[] = "/tmp/qt_chat_XXXXXX",
         d4[] = "/tmp/qt_chat_XXXXXX";

    Tokenizer *t = folder(d1, tiny, NULL);
    expect_error(t, d1, "tokenizer_config.json: not found");
    tokenizer_free(t);

    t = folder(d2, qwen_json, "{\"eos_token\": \"<|im_end|>\"}");
    expect_error(t, d2, "no \"chat_template\" string");
    tokenizer_free(t);

    t = folder(d3, qwen_json, "{\"chat_template\": \"{{ messages }}\"}");
    expect_error(t, d3, "is not one qtitan renders");
    tokenizer_free(t);

    /* Qwen3's template over a tokenizer without <|im_start|>. */
    char *cfg;
    size_t len;
    assert_int_equal(fs_read_all(qwen_cfg, &cfg, &len, &err), 0);
    t = folder(d4, tiny, cfg);
    expect_error(t, d4, "needs the token <|im_start|>");
    tokenizer_free(t);
    free(cfg);

    const char *dirs[] = {d1, d2, d3, d4};
    for (int i = 0; i < 4; i++)
        assert_int_equal(fs_remove_tree(dirs[i], &err), 0);
    free(tiny);
    free(qwen_json);
    free(qwen_cfg);
}

int main(void) {
    const char *sd = getenv("QT_SHARED_DIR");
    /* Skipped only without ../shared (a user's clone); CI has it, so a missing file fails. */
    if (!sd || !fs_exists(sd)) {
        fprintf(stderr, "skipped: no ../shared (QT_SHARED_DIR)\n");
        return 77;
    }
    shared_dir = xstrdup(sd);
    char *p = fs_join(sd, "tokenizers/qwen3");
    Err err;
    qwen = tokenizer_load(p, &err);
    free(p);
    if (!qwen) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures),
        cmocka_unit_test(test_bad_folders),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tokenizer_free(qwen);
    free(shared_dir);
    return rc;
}
