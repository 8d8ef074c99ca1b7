/* Unit tests for the prompt-file splitter (text/prompt_lines.h): one prompt a line, CRLF line
 * ends, blank and whitespace-only lines skipped, a last line without a newline kept; a NUL
 * byte (its offset named) and a file without a prompt fail with one sentence naming the
 * source. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "text/prompt_lines.h"

/* Splits text (len bytes) and checks the prompts against want (NULL-terminated). */
static void split_ok(const char *text, size_t len, const char *const *want) {
    PromptLines p;
    Err err;
    assert_int_equal(prompt_lines_split(&p, text, len, "p.txt", &err), 0);
    int n = 0;
    while (want[n])
        n++;
    assert_int_equal(p.n, n);
    for (int i = 0; i < n; i++)
        assert_string_equal(p.text[i], want[i]);
    prompt_lines_free(&p);
}

static void split_fails(const char *text, size_t len, const char *msg) {
    PromptLines p;
    Err err;
    assert_int_not_equal(prompt_lines_split(&p, text, len, "p.txt", &err), 0);
    assert_string_equal(err.msg, msg);
    assert_int_equal(p.n, 0);
    assert_null(p.data);
}

static void test_lines(void **state) {
    (void)state;
    const char *t1 = "one\ntwo\n";
    split_ok(t1, strlen(t1), (const char *const[]){"one", "two", NULL});
    const char *t2 = "a b\r\n\r\n \t \n\tc\r\nlast";
    split_ok(t2, strlen(t2), (const char *const[]){"a b", "\tc", "last", NULL});
    /* Only the line end's CR goes; one inside a line stays. */
    const char *t3 = "x\ry\r\r\n";
    split_ok(t3, strlen(t3), (const char *const[]){"x\ry\r", NULL});
    /* The length bounds the text: bytes after it are not read. */
    split_ok("keep\ndrop", 4, (const char *const[]){"keep", NULL});
}

static void test_malformed(void **state) {
    (void)state;
    const char nul[] = "fine\nbad\0line\n";
    split_fails(nul, sizeof nul - 1,
                "p.txt: byte 8 is NUL; a prompt file is text, one prompt a line");
    const char *none = "one prompt a line; blank lines are skipped)";
    char msg[128];
    snprintf(msg, sizeof msg, "p.txt holds no prompt (%s", none);
    split_fails("", 0, msg);
    split_fails("\n\n \t\r\n\r", 6, msg);
}

static void test_one(void **state) {
    (void)state;
    PromptLines p;
    Err err;
    assert_int_equal(prompt_lines_one(&p, "two\nlines", &err), 0);
    assert_int_equal(p.n, 1);
    assert_string_equal(p.text[0], "two\nlines");
    prompt_lines_free(&p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lines),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_one),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
