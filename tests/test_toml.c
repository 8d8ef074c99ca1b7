/* Unit tests for the TOML parser: every construct job configs use, and malformed inputs that
 * must give one-sentence errors with the right line (never a crash or unbounded recursion). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/toml.h"

static TomlValue *parse_ok(const char *text) {
    TomlValue *root = NULL;
    Err err = {{0}};
    int rc = toml_parse(&root, text, strlen(text), "t.toml", &err);
    if (rc != 0) fail_msg("unexpected error: %s", err.msg);
    return root;
}

/* Parses text that must fail and checks the message contains every given fragment. */
static void expect_error_n(const char *text, size_t len, const char *frag1, const char *frag2) {
    TomlValue *root = NULL;
    Err err = {{0}};
    int rc = toml_parse(&root, text, len, "t.toml", &err);
    if (rc == 0) {
        toml_free(root);
        fail_msg("expected an error for: %s", text);
    }
    assert_null(root);
    if (frag1 && !strstr(err.msg, frag1)) fail_msg("error '%s' lacks '%s'", err.msg, frag1);
    if (frag2 && !strstr(err.msg, frag2)) fail_msg("error '%s' lacks '%s'", err.msg, frag2);
    assert_non_null(strstr(err.msg, "t.toml:"));
}

static void expect_error(const char *text, const char *frag1, const char *frag2) {
    expect_error_n(text, strlen(text), frag1, frag2);
}

static const TomlValue *path_get(const TomlValue *t, const char *a, const char *b) {
    const TomlValue *v = toml_get(t, a);
    return b ? toml_get(v, b) : v;
}

static void test_tables_and_order(void **state) {
    (void)state;
    TomlValue *r = parse_ok("# leading comment\n"
                            "title = \"x\"\n"
                            "\n"
                            "[training]  # trailing comment\n"
                            "steps = 10\n"
                            "seq_len = 128\n"
                            "[a.b]\n"
                            "c = 1\n"
                            "[ a . \"quoted.key\" ]\n"
                            "d = 2\n");
    assert_int_equal(r->type, TOML_TABLE);
    assert_int_equal(r->n, 3);
    assert_string_equal(r->kv[0].key, "title");
    assert_string_equal(r->kv[1].key, "training");
    assert_string_equal(r->kv[2].key, "a");
    const TomlValue *tr = toml_get(r, "training");
    assert_int_equal(tr->n, 2);
    assert_string_equal(tr->kv[0].key, "steps");
    assert_int_equal(tr->kv[0].line, 5);
    assert_string_equal(tr->kv[1].key, "seq_len");
    assert_int_equal(tr->kv[1].line, 6);
    assert_int_equal(toml_get_entry(r, "training")->line, 4);
    assert_int_equal(path_get(r, "a", "b")->type, TOML_TABLE);
    assert_int_equal(toml_get(path_get(r, "a", "b"), "c")->i, 1);
    assert_int_equal(toml_get(path_get(r, "a", "quoted.key"), "d")->i, 2);
    toml_free(r);
}

static void test_keys(void **state) {
    (void)state;
    TomlValue *r = parse_ok("bare_key-1 = 1\n"
                            "\"quoted key\" = 2\n"
                            "'literal \\n key' = 3\n"
                            "\"\" = 4\n"
                            "dotted.key . here = 5\n"
                            "dotted.other = 6\n"
                            "1234 = 7\n");
    assert_int_equal(toml_get(r, "bare_key-1")->i, 1);
    assert_int_equal(toml_get(r, "quoted key")->i, 2);
    assert_int_equal(toml_get(r, "literal \\n key")->i, 3);
    assert_int_equal(toml_get(r, "")->i, 4);
    const TomlValue *d = toml_get(r, "dotted");
    assert_int_equal(toml_get(toml_get(d, "key"), "here")->i, 5);
    assert_int_equal(toml_get(d, "other")->i, 6);
    assert_int_equal(toml_get(r, "1234")->i, 7);
    toml_free(r);
}

static void test_strings(void **state) {
    (void)state;
    TomlValue *r = parse_ok("a = \"tab\\there \\\"q\\\" back\\\\slash\\nnl\"\n"
                            "b = \"\\u00e9\\U0001F600\\b\\f\\r\"\n"
                            "c = 'C:\\path\\no escapes'\n"
                            "d = \"\"\"\nline1\nline2 \\\n    joined\"\"\"\n"
                            "e = '''\nraw \\n ''text'''''\n"
                            "f = \"\"\n"
                            "g = \"caf\xc3\xa9\"\n");
    assert_string_equal(toml_get(r, "a")->s, "tab\there \"q\" back\\slash\nnl");
    assert_string_equal(toml_get(r, "b")->s, "\xc3\xa9\xf0\x9f\x98\x80\b\f\r");
    assert_string_equal(toml_get(r, "c")->s, "C:\\path\\no escapes");
    assert_string_equal(toml_get(r, "d")->s, "line1\nline2 joined");
    assert_string_equal(toml_get(r, "e")->s, "raw \\n ''text''");
    assert_string_equal(toml_get(r, "f")->s, "");
    assert_string_equal(toml_get(r, "g")->s, "caf\xc3\xa9");
    toml_free(r);
}

static void test_numbers(void **state) {
    (void)state;
    TomlValue *r = parse_ok("i1 = 42\ni2 = -17\ni3 = +5\ni4 = 1_000_000\ni5 = 0\n"
                            "i6 = 9223372036854775807\ni7 = -9223372036854775808\n"
                            "h = 0xff\no = 0o17\nbn = 0b101\n"
                            "f1 = 3e-4\nf2 = 1.5\nf3 = -2E+3\nf4 = 6.022_140e2_3\nf5 = 0.0\n"
                            "f6 = inf\nf7 = -inf\nf8 = nan\nf9 = +inf\nf10 = 1e0\n"
                            "t = true\nfa = false\n");
    assert_int_equal(toml_get(r, "i1")->i, 42);
    assert_int_equal(toml_get(r, "i2")->i, -17);
    assert_int_equal(toml_get(r, "i3")->i, 5);
    assert_int_equal(toml_get(r, "i4")->i, 1000000);
    assert_int_equal(toml_get(r, "i5")->i, 0);
    assert_true(toml_get(r, "i6")->i == INT64_MAX);
    assert_true(toml_get(r, "i7")->i == INT64_MIN);
    assert_int_equal(toml_get(r, "h")->i, 255);
    assert_int_equal(toml_get(r, "o")->i, 15);
    assert_int_equal(toml_get(r, "bn")->i, 5);
    assert_int_equal(toml_get(r, "f1")->type, TOML_FLOAT);
    assert_true(toml_get(r, "f1")->f == 3e-4);
    assert_true(toml_get(r, "f2")->f == 1.5);
    assert_true(toml_get(r, "f3")->f == -2000.0);
    assert_true(toml_get(r, "f4")->f == 6.022140e23);
    assert_true(toml_get(r, "f5")->f == 0.0);
    assert_true(isinf(toml_get(r, "f6")->f) && toml_get(r, "f6")->f > 0);
    assert_true(isinf(toml_get(r, "f7")->f) && toml_get(r, "f7")->f < 0);
    assert_true(isnan(toml_get(r, "f8")->f));
    assert_true(isinf(toml_get(r, "f9")->f));
    assert_true(toml_get(r, "f10")->f == 1.0);
    assert_int_equal(toml_get(r, "t")->type, TOML_BOOL);
    assert_int_equal(toml_get(r, "t")->b, 1);
    assert_int_equal(toml_get(r, "fa")->b, 0);
    toml_free(r);
}

static void test_arrays(void **state) {
    (void)state;
    TomlValue *r = parse_ok("a = [1, 2, 3]\n"
                            "b = [ [1, 2], [\"x\", 'y'], [] ]\n"
                            "c = [\n  1,  # one\n  2,\n\n  3,  # trailing comma\n]\n"
                            "d = []\n"
                            "e = [1, \"mixed\", 2.5, true]\n"
                            "after = 9\n");
    const TomlValue *a = toml_get(r, "a");
    assert_int_equal(a->type, TOML_ARRAY);
    assert_int_equal(a->n, 3);
    assert_int_equal(a->items[2]->i, 3);
    const TomlValue *b = toml_get(r, "b");
    assert_int_equal(b->n, 3);
    assert_int_equal(b->items[0]->items[1]->i, 2);
    assert_string_equal(b->items[1]->items[1]->s, "y");
    assert_int_equal(b->items[2]->n, 0);
    const TomlValue *c = toml_get(r, "c");
    assert_int_equal(c->n, 3);
    assert_int_equal(c->items[1]->line, 5);
    assert_int_equal(toml_get(r, "d")->n, 0);
    assert_int_equal(toml_get(r, "e")->n, 4);
    assert_int_equal(toml_get_entry(r, "after")->line, 11);
    toml_free(r);
}

static void test_array_of_tables(void **state) {
    (void)state;
    TomlValue *r = parse_ok("[[override]]\n"
                            "target = \"layers.*.attention.rope\"\n"
                            "kernel = \"rope_nogather\"\n"
                            "\n"
                            "[[override]]\n"
                            "target = \"layers.*.attention.sdpa\"\n"
                            "kernel = \"flash\"\n"
                            "[override.sub]\n"
                            "x = 1\n"
                            "[[fruit.variety]]\n"
                            "name = \"a\"\n"
                            "[[fruit.variety]]\n"
                            "name = \"b\"\n");
    const TomlValue *o = toml_get(r, "override");
    assert_int_equal(o->type, TOML_ARRAY);
    assert_int_equal(o->n, 2);
    assert_int_equal(o->items[0]->line, 1);
    assert_int_equal(o->items[1]->line, 5);
    assert_string_equal(toml_get(o->items[1], "kernel")->s, "flash");
    assert_int_equal(toml_get(toml_get(o->items[1], "sub"), "x")->i, 1);
    const TomlValue *v = toml_get(toml_get(r, "fruit"), "variety");
    assert_int_equal(v->n, 2);
    assert_string_equal(toml_get(v->items[1], "name")->s, "b");
    toml_free(r);
}

static void test_inline_tables(void **state) {
    (void)state;
    TomlValue *r = parse_ok("p = { x = 1, y.z = \"w\" }\n"
                            "e = {}\n"
                            "arr = [ { a = 1 }, { a = 2 } ]\n");
    const TomlValue *p = toml_get(r, "p");
    assert_int_equal(p->type, TOML_TABLE);
    assert_int_equal(toml_get(p, "x")->i, 1);
    assert_string_equal(toml_get(toml_get(p, "y"), "z")->s, "w");
    assert_int_equal(toml_get(r, "e")->n, 0);
    assert_int_equal(toml_get(r, "arr")->items[1]->kv[0].value->i, 2);
    toml_free(r);
}

static void test_implicit_then_defined(void **state) {
    (void)state;
    /* [a.b] creates a implicitly; defining [a] afterwards is valid, once. */
    TomlValue *r = parse_ok("[a.b]\nx = 1\n[a]\ny = 2\n"
                            "[fruit]\napple.color = \"red\"\n[fruit.apple.texture]\nsmooth = true\n"
                            "\r\n");
    assert_int_equal(toml_get(toml_get(r, "a"), "y")->i, 2);
    assert_int_equal(toml_get_entry(r, "a")->line, 3);
    toml_free(r);
    expect_error("[a.b]\n[a]\n[a]\n", "duplicate table [a]", "line 2");
}

static void test_errors(void **state) {
    (void)state;
    expect_error("a = \"abc\n", "t.toml:1:", "unterminated string");
    expect_error("\n\na = \"abc", "t.toml:3:", "unterminated string");
    expect_error("a = 'abc\n", "t.toml:1:", "unterminated literal string");
    expect_error("a = \"\"\"abc\n\n", "t.toml:1:", "unterminated");
    expect_error("a = \"bad \\q escape\"\n", "t.toml:1:", "invalid escape \\q");
    expect_error("a = \"\\u12\"\n", "t.toml:1:", "4 hex digits");
    expect_error("a = \"\\uD800\"\n", "not a Unicode scalar", NULL);
    expect_error("a = \"\\u0000\"\n", "\\u0000", NULL);
    expect_error("[t]\nkey = 1\nother = 2\nkey = 3\n", "t.toml:4:", "duplicate key \"key\" in [t]");
    expect_error("key = 1\nkey = 2\n", "first defined on line 1", NULL);
    expect_error("a.b = 1\na.b = 2\n", "duplicate key \"a.b\"", NULL);
    expect_error("a = 1\na.b = 2\n", "t.toml:2:", "cannot add keys to \"a\"");
    expect_error("[x]\n[y]\n[x]\n", "t.toml:3:", "duplicate table [x] (first defined on line 1)");
    expect_error("[x]\na = 1\n[x.a]\n", "t.toml:3:", "cannot be opened");
    expect_error("[x]\nb.c = 1\n[x.b]\n", "t.toml:3:", "duplicate table [x.b]");
    expect_error("[[a]]\n[a]\n", "t.toml:2:", "already defined on line 1 as an array");
    expect_error("a = [1]\n[[a]]\n", "t.toml:2:", "cannot be an array of tables");
    expect_error("p = {x = 1}\n[p]\n", "t.toml:2:", NULL);
    expect_error("p = {x = 1}\np.y = 2\n", "t.toml:2:", "cannot add keys");
    expect_error("p = {x = 1,}\n", "trailing comma", NULL);
    expect_error("p = {x = 1\n}\n", "inline table", NULL);
    expect_error("a = 1__0\n", "t.toml:1: invalid number '1__0' in the value of \"a\"", NULL);
    expect_error("[s]\nx.y = [1, {z = \"\\q\"}]\n",
                 "t.toml:2: invalid escape \\q in the value of \"z\"", NULL);
    expect_error("a = 01\n", "leading zeros", NULL);
    expect_error("a = 1.\n", "invalid number", NULL);
    expect_error("a = .5\n", "t.toml:1:", NULL);
    expect_error("a = 1e\n", "invalid number", NULL);
    expect_error("a = 0x\n", "invalid number", NULL);
    expect_error("a = 9223372036854775808\n", "does not fit", NULL);
    expect_error("a = 1e999\n", "out of range", NULL);
    expect_error("a = 12abc\n", "invalid number", NULL);
    expect_error("a = hello\n", "strings need quotes", NULL);
    expect_error("a = 1979-05-27\n", "dates and times are not supported", NULL);
    expect_error("a = 07:32:00\n", "dates and times", NULL);
    expect_error("\n\n\nkey value\n", "t.toml:4:", "expected '=' after key \"key\"");
    expect_error("key =\n", "t.toml:1:", "expected a value");
    expect_error("key = 1 2\n", "t.toml:1:", "end of the line");
    expect_error("= 1\n", "expected a key", NULL);
    expect_error("[a\nb = 1\n", "t.toml:1:", "close the table header");
    expect_error("[[a]\n", "]]", NULL);
    expect_error("[]\n", "expected a key", NULL);
    expect_error("a = [1, 2\n", "t.toml:1:", "unterminated array");
    expect_error("a = [1 2]\n", "expected ',' or ']'", NULL);
    expect_error("a = [,]\n", "expected a value", NULL);
    expect_error("a = 1\rb = 2\n", "carriage return", NULL);
    expect_error("a = \"x\ty\x01\"\n", "control character", NULL);
    expect_error("a = \"\xff\"\n", "invalid UTF-8", NULL);
    expect_error("a = \"\xed\xa0\x80\"\n", "invalid UTF-8", NULL);
    expect_error("a = \"\xc0\xaf\"\n", "invalid UTF-8", NULL);
    expect_error("\"\"\"k\"\"\" = 1\n", "multi-line string cannot be a key", NULL);
}

static void test_nul_bytes(void **state) {
    (void)state;
    static const char text[] = "a = 1\nb = \"x\0y\"\n";
    expect_error_n(text, sizeof text - 1, "t.toml:2:", "NUL byte");
    static const char text2[] = "a = 1\0";
    expect_error_n(text2, sizeof text2 - 1, "NUL byte", NULL);
}

static void test_deep_nesting(void **state) {
    (void)state;
    /* Nesting far beyond the limit must fail cleanly (no stack overflow). */
    size_t n = 100000;
    char *text = malloc(2 * n + 16);
    size_t o = 0;
    o += (size_t)sprintf(text, "a = ");
    for (size_t i = 0; i < n; i++)
        text[o++] = '[';
    for (size_t i = 0; i < n; i++)
        text[o++] = ']';
    text[o++] = '\n';
    text[o] = 0;
    expect_error(text, "nested deeper than 64", NULL);
    o = (size_t)sprintf(text, "a = ");
    for (size_t i = 0; i < n; i++)
        text[o++] = '{';
    text[o] = 0;
    expect_error(text, "t.toml:1:", NULL);
    free(text);
    /* Just within the limit is fine. */
    char ok[256];
    o = (size_t)sprintf(ok, "a = ");
    for (int i = 0; i < TOML_MAX_DEPTH; i++)
        ok[o++] = '[';
    for (int i = 0; i < TOML_MAX_DEPTH; i++)
        ok[o++] = ']';
    ok[o++] = '\n';
    ok[o] = 0;
    TomlValue *r = parse_ok(ok);
    toml_free(r);
    /* A key with too many dotted parts. */
    char *key = malloc(4 * 200 + 16);
    o = 0;
    for (int i = 0; i < 200; i++)
        o += (size_t)sprintf(key + o, "%sk", i ? "." : "");
    sprintf(key + o, " = 1\n");
    expect_error(key, "dotted parts", NULL);
    free(key);
}

static void test_many_keys(void **state) {
    (void)state;
    /* 200k keys in one table: linear time (the hash index), lookups and duplicates still work. */
    int n = 200000;
    char *text = malloc((size_t)n * 24 + 64);
    size_t o = 0;
    for (int i = 0; i < n; i++)
        o += (size_t)sprintf(text + o, "k%d = %d\n", i, i);
    TomlValue *r = parse_ok(text);
    assert_int_equal(r->n, n);
    assert_int_equal(toml_get(r, "k123456")->i, 123456);
    assert_int_equal(toml_get_entry(r, "k199999")->line, 200000);
    assert_null(toml_get(r, "k200000"));
    toml_free(r);
    sprintf(text + o, "k77 = 1\n");
    expect_error(text, "t.toml:200001: duplicate key \"k77\" (first defined on line 78)", NULL);
    free(text);
}

static void test_parse_value(void **state) {
    (void)state;
    TomlValue *v;
    Err err = {{0}};
    assert_int_equal(toml_parse_value(&v, "20", "cli", &err), 0);
    assert_int_equal(v->type, TOML_INT);
    assert_int_equal(v->i, 20);
    toml_free(v);
    assert_int_equal(toml_parse_value(&v, " 3e-4 ", "cli", &err), 0);
    assert_true(v->f == 3e-4);
    toml_free(v);
    assert_int_equal(toml_parse_value(&v, "\"quoted\"", "cli", &err), 0);
    assert_string_equal(v->s, "quoted");
    toml_free(v);
    assert_int_equal(toml_parse_value(&v, "[1, [2]]", "cli", &err), 0);
    assert_int_equal(v->items[1]->items[0]->i, 2);
    toml_free(v);
    assert_int_equal(toml_parse_value(&v, "1 2", "cli", &err), -1);
    assert_non_null(strstr(err.msg, "cli: unexpected text"));
    assert_int_equal(toml_parse_value(&v, "abc", "cli", &err), -1);
    assert_non_null(strstr(err.msg, "cli: "));
}

static void test_empty_and_comments_only(void **state) {
    (void)state;
    TomlValue *r = parse_ok("");
    assert_int_equal(r->n, 0);
    toml_free(r);
    r = parse_ok("# only a comment");
    assert_int_equal(r->n, 0);
    toml_free(r);
    r = parse_ok("a = 1 # no final newline");
    assert_int_equal(toml_get(r, "a")->i, 1);
    toml_free(r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tables_and_order), cmocka_unit_test(test_keys),
        cmocka_unit_test(test_strings),          cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_arrays),           cmocka_unit_test(test_array_of_tables),
        cmocka_unit_test(test_inline_tables),    cmocka_unit_test(test_implicit_then_defined),
        cmocka_unit_test(test_errors),           cmocka_unit_test(test_nul_bytes),
        cmocka_unit_test(test_deep_nesting),     cmocka_unit_test(test_many_keys),
        cmocka_unit_test(test_parse_value),      cmocka_unit_test(test_empty_and_comments_only),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
