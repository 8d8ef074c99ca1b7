/* Split patterns other than Qwen's, run through PCRE2 with UTF and UCP. HF tokenizers runs
 * them with Oniguruma, whose \s is the White_Space property; PCRE2's \s also takes U+180E, so
 * \s and \S are rewritten to an explicit White_Space class before compiling. */
#include "text/pretok.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"

struct PretokRegex {
    pcre2_code *code;
};

#define WS_SET                                                                                     \
    "\\t-\\r "                                                                                     \
    "\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"

/* Rewrites \s and \S (outside character classes for \S) into explicit classes. */
static char *rewrite_space(const char *p) {
    size_t n = strlen(p), o = 0;
    char *out = xmalloc(n * 64 + 1);
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '\\' && i + 1 < n) {
            char e = p[i + 1];
            const char *rep = NULL;
            if (e == 's')
                rep = in_class ? WS_SET : "[" WS_SET "]";
            else if (e == 'S' && !in_class)
                rep = "[^" WS_SET "]";
            if (rep) {
                memcpy(out + o, rep, strlen(rep));
                o += strlen(rep);
            } else {
                out[o++] = p[i];
                out[o++] = e;
            }
            i++;
            continue;
        }
        if (p[i] == '[' && !in_class) {
            in_class = 1;
            out[o++] = p[i];
            /* A ']' right after '[' or '[^' is a literal. */
            if (i + 1 < n && p[i + 1] == '^') out[o++] = p[++i];
            if (i + 1 < n && p[i + 1] == ']') out[o++] = p[++i];
            continue;
        }
        if (p[i] == ']' && in_class) in_class = 0;
        out[o++] = p[i];
    }
    out[o] = 0;
    return out;
}

PretokRegex *pretok_regex_compile(const char *pattern, const char *what, Err *err) {
    char *p = rewrite_space(pattern);
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
