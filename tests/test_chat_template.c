/* Chat rendering parity with transformers' apply_chat_template on the real Qwen3 tokenizer
 * (needs ../shared; exits 77 without it): ids and assistant flags of every conversation in
 * tests/fixtures/chat/qwen3_chat.jsonl (made by tools/make_chat_fixtures.py; tool definitions,
 * tool calls and tool results included), each line read as training data reads it, the same for
 * the later Qwen3 templates (qwen3_variants_chat.jsonl: string content, Instruct-2507,
 * Thinking-2507, null content), and the error sentences for folders without a chat template
 * qtitan knows. */
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

/* Renders one fixture line (its messages and tools read as training data reads them) with cf
 * and compares ids and assistant flags with transformers'; returns the flagged count. With
 * expect_refusal, the line must fail to render instead, with a sentence holding that text. */
static int check_line(const ChatFormat *cf, const char *line, size_t line_len, const char *path,
                      int lineno, const char *expect_refusal, int *tool_case) {
    Err err;
    json_t *j = json_load_mem(line, line_len, path, &err);
    assert_non_null(j);
    json_t *root;
    ChatMessage *msgs;
    size_t n;
    const json_t *tools;
    if (chat_data_parse_line(line, line_len, DATA_MESSAGES, path, lineno, &root, &msgs, &n, &tools,
                             &err))
        fail_msg("%s", err.msg);
    ChatOptions opt = {.add_generation_prompt =
                           json_is_true(json_object_get(j, "add_generation_prompt")),
                       .enable_thinking = json_is_true(json_object_get(j, "enable_thinking")),
                       .tools = tools};
    const char *name = json_string_value(json_object_get(j, "name"));
    ChatTokens out = {0};
    int flagged = 0, rc = chat_render(cf, msgs, n, opt, &out, &err);
    if (expect_refusal) {
        if (rc == 0) fail_msg("%s:%d (%s): rendered, expected a refusal", path, lineno, name);
        if (!strstr(err.msg, expect_refusal)) fail_msg("%s: %s", name, err.msg);
    } else {
        if (rc != 0) fail_msg("%s:%d (%s): %s", path, lineno, name, err.msg);
        const json_t *ids = json_object_get(j, "ids");
        const char *mask = json_string_value(json_object_get(j, "assistant"));
        if (out.n != json_array_size(ids)) fprintf(stderr, "%s: %zu ids\n", name, out.n);
        assert_int_equal(out.n, json_array_size(ids));
        for (size_t i = 0; i < out.n; i++) {
            if (out.ids[i] != json_integer_value(json_array_get(ids, i)) ||
                out.assistant[i] != mask[i] - '0')
                fprintf(stderr, "%s:%d (%s): token %zu differs\n", path, lineno, name, i);
            assert_int_equal(out.ids[i], json_integer_value(json_array_get(ids, i)));
            assert_int_equal(out.assistant[i], mask[i] - '0');
            flagged += out.assistant[i];
        }
    }
    *tool_case = tools && json_array_size(tools) > 0;
    chat_tokens_free(&out);
    free(msgs);
    json_decref(root);
    json_decref(j);
    return flagged;
}

static void test_fixtures(void **state) {
    (void)state;
    Err err;
    ChatFormat *cf = chat_format_load(qwen, &err);
    if (!cf) fprintf(stderr, "%s\n", err.msg);
    assert_non_null(cf);
    assert_string_equal(chat_format_name(cf), "qwen3");
    assert_int_equal(chat_format_thinking_switch(cf), 1);
    char *path = fs_join(getenv("QT_SOURCE_DIR"), "tests/fixtures/chat/qwen3_chat.jsonl");
    char *buf;
    size_t len, pos = 0, line_len;
    const char *line;
    assert_int_equal(fs_read_all(path, &buf, &len, &err), 0);
    int cases = 0, flagged = 0, tool_cases = 0, tool_case;
    while (jsonl_next_line(buf, len, &pos, &line, &line_len) == 0) {
        flagged += check_line(cf, line, line_len, path, cases + 1, NULL, &tool_case);
        cases++;
        tool_cases += tool_case;
    }
    /* A fixture that lost its cases or its flags would pass the loop above vacuously. */
    assert_true(cases >= 30 && tool_cases >= 6);
    assert_true(flagged > 100);
    ChatTokens out = {0};
    assert_int_not_equal(chat_render(cf, NULL, 0, (ChatOptions){0}, &out, &err), 0);
    assert_non_null(strstr(err.msg, "at least one message"));
    chat_tokens_free(&out);
    chat_format_free(cf);
    free(buf);
    free(path);
}

/* The later Qwen3 templates (tools/qwen3_templates.py derives them from the first): each line
 * of qwen3_variants_chat.jsonl rendered with the template it names equals transformers'; the
 * lines with null content are refused by the first template; the templates without a thinking
 * switch refuse enable_thinking = false. */
static void test_variants(void **state) {
    (void)state;
    Err err;
    static const struct {
        const char *file, *name;
        int thinking_switch;
    } T[] = {
        {"qwen3_string_content", "qwen3", 1},
        {"qwen3_2507_instruct", "qwen3-2507-instruct", 0},
        {"qwen3_2507_thinking", "qwen3-2507-thinking", 0},
    };
    enum { NT = sizeof T / sizeof T[0] };
    ChatFormat *cfs[NT], *first = chat_format_load(qwen, &err);
    int lines[NT] = {0};
    for (int t = 0; t < NT; t++) {
        char rel[256], *text;
        size_t tlen;
        snprintf(rel, sizeof rel, "tests/fixtures/chat/templates/%s.jinja", T[t].file);
        char *p = fs_join(getenv("QT_SOURCE_DIR"), rel);
        assert_int_equal(fs_read_all(p, &text, &tlen, &err), 0);
        cfs[t] = chat_format_from_text(qwen, text, tlen, p, &err);
        if (!cfs[t]) fail_msg("%s", err.msg);
        assert_string_equal(chat_format_name(cfs[t]), T[t].name);
        assert_int_equal(chat_format_thinking_switch(cfs[t]), T[t].thinking_switch);
        free(text);
        free(p);
    }
    char *path = fs_join(getenv("QT_SOURCE_DIR"), "tests/fixtures/chat/qwen3_variants_chat.jsonl");
    char *buf;
    size_t len, pos = 0, line_len;
    const char *line;
    assert_int_equal(fs_read_all(path, &buf, &len, &err), 0);
    int lineno = 0, nulls = 0, tool_case, switches = 0;
    while (jsonl_next_line(buf, len, &pos, &line, &line_len) == 0) {
        lineno++;
        json_t *j = json_load_mem(line, line_len, path, &err);
        assert_non_null(j);
        const char *tname = json_string_value(json_object_get(j, "template"));
        int t = 0;
        while (t < NT && strcmp(T[t].file, tname) != 0)
            t++;
        assert_true(t < NT);
        lines[t]++;
        check_line(cfs[t], line, line_len, path, lineno, NULL, &tool_case);
        const char *name = json_string_value(json_object_get(j, "name"));
        if (strncmp(name, "null_", 5) == 0 || strncmp(name, "missing_", 8) == 0) {
            check_line(first, line, line_len, path, lineno, "cannot render: give a string",
                       &tool_case);
            nulls++;
        }
        /* Generation prompts of the templates without a switch: thinking off is refused. */
        if (json_is_true(json_object_get(j, "add_generation_prompt")) && !T[t].thinking_switch) {
            json_object_set_new(j, "enable_thinking", json_false());
            char *off = json_dumps(j, JSON_COMPACT);
            check_line(cfs[t], off, strlen(off), path, lineno, "has no thinking switch",
                       &tool_case);
            free(off);
            switches++;
        }
        json_decref(j);
    }
    for (int t = 0; t < NT; t++)
        assert_true(lines[t] >= 6);
    assert_true(nulls >= 6 && switches >= 4);

    /* Null content in the first message, a system one, fails in every template (transformers
     * adds it to a string). */
    ChatMessage sys_null[2] = {{.role = CHAT_SYSTEM, .content = "", .content_null = 1},
                               {.role = CHAT_USER, .content = "hi", .content_len = 2}};
    ChatTokens out = {0};
    for (int t = 0; t < NT; t++) {
        assert_int_not_equal(
            chat_render(cfs[t], sys_null, 2, (ChatOptions){0, 1, NULL}, &out, &err), 0);
        assert_non_null(strstr(err.msg, "messages[0] is a system message with null content"));
    }
    chat_tokens_free(&out);
    for (int t = 0; t < NT; t++)
        chat_format_free(cfs[t]);
    chat_format_free(first);
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
         d4[] = "/tmp/qt_chat_XXXXXX", d5[] = "/tmp/qt_chat_XXXXXX";

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

    /* chat_template.jinja beside tokenizer_config.json wins, as in transformers: the folder's
     * format is the 2507 Thinking one, not the config's first Qwen3 template. */
    char *jinja_src =
        fs_join(getenv("QT_SOURCE_DIR"), "tests/fixtures/chat/templates/qwen3_2507_thinking.jinja");
    assert_int_equal(fs_read_all(qwen_cfg, &cfg, &len, &err), 0);
    t = folder(d5, qwen_json, cfg);
    free(cfg);
    assert_int_equal(fs_read_all(jinja_src, &cfg, &len, &err), 0);
    char *jinja = fs_join(d5, "chat_template.jinja");
    assert_int_equal(fs_write_atomic(jinja, cfg, len, &err), 0);
    ChatFormat *cf = chat_format_load(t, &err);
    assert_non_null(cf);
    assert_string_equal(chat_format_name(cf), "qwen3-2507-thinking");
    IdVec ids = {0};
    assert_int_not_equal(chat_render_prompt(cf, NULL, "hi", 0, NULL, &ids, &err), 0);
    assert_non_null(strstr(err.msg, "chat_template.jinja) has no thinking switch"));
    assert_int_equal(chat_render_prompt(cf, NULL, "hi", 1, NULL, &ids, &err), 0);
    /* <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n */
    assert_true(ids.n >= 3 && ids.ids[ids.n - 2] == (uint32_t)tokenizer_token_id(t, "<think>"));
    idvec_free(&ids);
    chat_format_free(cf);
    tokenizer_free(t);
    free(cfg);
    free(jinja);
    free(jinja_src);

    const char *dirs[] = {d1, d2, d3, d4, d5};
    for (int i = 0; i < 5; i++)
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
        cmocka_unit_test(test_variants),
        cmocka_unit_test(test_bad_folders),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tokenizer_free(qwen);
    free(shared_dir);
    return rc;
}
