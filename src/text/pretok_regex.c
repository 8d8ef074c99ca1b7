/* Split patterns other than Qwen's, run through PCRE2 with UTF and UCP. HF tokenizers runs
 * them with its own regex engine, whose Unicode tables are newer than PCRE2's and whose \s is
 * the White_Space property (PCRE2's also takes U+180E). So \s, \S, \p{L} and \p{N} are
 * rewritten into explicit classes from the same table the Qwen scanner uses
 * (unicode_classes.c) before compiling. */
#include "text/pretok.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/strbuf.h"
#include "text/unicode_classes.h"

struct PretokRegex {
    pcre2_code *code;
};

/* Appends text to a growing buffer. */
/* The members of class k (UC_LETTER, UC_NUMBER, UC_SPACE) as class-body ranges. */
static void put_members(StrBuf *b, int k) {
    if (k == UC_LETTER)
        strbuf_lit(b, "A-Za-z");
    else if (k == UC_NUMBER)
        strbuf_lit(b, "0-9");
    else
        strbuf_lit(b, "\\t-\\r ");
    for (size_t i = 0; i < UNICODE_CLASS_N_RANGES; i++) {
        const UnicodeRange *r = &UNICODE_CLASS_RANGES[i];
        if (r->cls != k) continue;
        char tmp[48];
        int n = r->first == r->last
                    ? snprintf(tmp, sizeof tmp, "\\x{%x}", r->first)
                    : snprintf(tmp, sizeof tmp, "\\x{%x}-\\x{%x}", r->first, r->last);
        strbuf_add(b, tmp, (size_t)n);
    }
}

/* Rewrites \s, \p{L}, \p{N} (anywhere) and \S, \P{L}, \P{N} (outside classes). */
static char *rewrite_classes(const char *p) {
    size_t n = strlen(p);
    StrBuf b = {0};
    strbuf_add(&b, "", 0);
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '\\' && i + 1 < n) {
            char e = p[i + 1];
            int k = -1, neg = 0;
            size_t len = 2;
            if (e == 's' || e == 'S')
                k = UC_SPACE, neg = e == 'S';
            else if ((e == 'p' || e == 'P') && strncmp(p + i + 2, "{L}", 3) == 0)
                k = UC_LETTER, neg = e == 'P', len = 5;
            else if ((e == 'p' || e == 'P') && strncmp(p + i + 2, "{N}", 3) == 0)
                k = UC_NUMBER, neg = e == 'P', len = 5;
            if (k >= 0 && !(neg && in_class)) {
                if (!in_class) strbuf_lit(&b, neg ? "[^" : "[");
                put_members(&b, k);
                if (!in_class) strbuf_lit(&b, "]");
            } else {
                strbuf_add(&b, p + i, len);
            }
            i += len - 1;
            continue;
        }
        if (p[i] == '[' && !in_class) {
            in_class = 1;
            strbuf_add(&b, p + i, 1);
            /* A ']' right after '[' or '[^' is a literal. */
            if (i + 1 < n && p[i + 1] == '^') strbuf_add(&b, p + ++i, 1);
            if (i + 1 < n && p[i + 1] == ']') strbuf_add(&b, p + ++i, 1);
            continue;
        }
        if (p[i] == ']' && in_class) in_class = 0;
        strbuf_add(&b, p + i, 1);
    }
    return b.p;
}

PretokRegex *pretok_regex_compile(const char *pattern, const char *what, Err *err) {
    char *p = rewrite_classes(pattern);
    int code;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)p, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                   &code, &off, NULL);
    free(p);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        err_set(err, "%s: split pattern \"%s\" does not compile: %s", what, pattern,
                (const char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter on failure */
    PretokRegex *r = xmalloc(sizeof *r);
    r->code = re;
    return r;
}

void pretok_regex_free(PretokRegex *re) {
    if (!re) return;
    pcre2_code_free(re->code);
    free(re);
}

int pretok_regex_split(const PretokRegex *re, const char *s, size_t len, PieceFn fn, void *ctx,
                       Err *err) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re->code, NULL);
    size_t pos = 0, prev = 0;
    int rc = 0;
    while (pos <= len) {
        int m = pcre2_match(re->code, (PCRE2_SPTR)s, len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (m == PCRE2_ERROR_NOMATCH) break;
        if (m < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(m, msg, sizeof msg);
            rc = err_set(err, "split pattern failed at byte %zu: %s", pos, (const char *)msg);
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t a = ov[0], b = ov[1];
        if (a == b) {
            /* Empty matches produce no piece; move on by one character. */
            if (a >= len) break;
            pos = a + 1;
            while (pos < len && ((unsigned char)s[pos] & 0xC0) == 0x80)
                pos++;
            continue;
        }
        if (a > prev && fn(ctx, s + prev, a - prev) != 0) {
            rc = -1;
            break;
        }
        if (fn(ctx, s + a, b - a) != 0) {
            rc = -1;
            break;
        }
        prev = pos = b;
    }
    if (rc == 0 && prev < len && fn(ctx, s + prev, len - prev) != 0) rc = -1;
    pcre2_match_data_free(md);
    return rc;
}
