/* Growable byte strings (see strbuf.h). */
#include "core/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"

void strbuf_add(StrBuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = 2 * (b->n + n + 1);
        b->p = xrealloc(b->p, b->cap);
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void strbuf_lit(StrBuf *b, const char *s) {
    strbuf_add(b, s, strlen(s));
}

void strbuf_printf(StrBuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n <= 0) return;
    strbuf_add(b, "", 0);
    if (b->n + (size_t)n + 1 > b->cap) {
        b->cap = 2 * (b->n + (size_t)n + 1);
        b->p = xrealloc(b->p, b->cap);
    }
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
}

void strbuf_json_string(StrBuf *b, const char *s, size_t n) {
    strbuf_lit(b, "\"");
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[8];
        switch (c) {
        case '"':
            esc = "\\\"";
            break;
        case '\\':
            esc = "\\\\";
            break;
        case '\n':
            esc = "\\n";
            break;
        case '\r':
            esc = "\\r";
            break;
        case '\t':
            esc = "\\t";
            break;
        case '\b':
            esc = "\\b";
            break;
        case '\f':
            esc = "\\f";
            break;
        default:
            if (c < 0x20) {
                snprintf(u, sizeof u, "\\u%04x", c);
                esc = u;
            }
        }
        if (!esc) continue;
        strbuf_add(b, s + run, i - run);
        strbuf_lit(b, esc);
        run = i + 1;
    }
    strbuf_add(b, s + run, n - run);
    strbuf_lit(b, "\"");
}

void strbuf_free(StrBuf *b) {
    free(b->p);
    *b = (StrBuf){0};
}
