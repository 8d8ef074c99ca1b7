/* Error values and checked allocation. */
#include "core/err.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int err_set(Err *err, const char *fmt, ...) {
    if (!err) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int err_sys(Err *err, const char *fmt, ...) {
    int saved = errno;
    if (!err) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    size_t n = strlen(err->msg);
    snprintf(err->msg + n, sizeof err->msg - n, ": %s", strerror(saved));
    return -1;
}

int err_wrap(Err *err, const char *fmt, ...) {
    if (!err) return -1;
    char prefix[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    char old[sizeof err->msg];
    memcpy(old, err->msg, sizeof old);
    snprintf(err->msg, sizeof err->msg, "%s: %s", prefix, old);
    return -1;
}

/* This thread's open err_oom_push scopes, outermost first, joined by ", "; "" when none. */
static _Thread_local char oom_context[512];
static _Thread_local size_t oom_len;

size_t err_oom_push(const char *fmt, ...) {
    size_t mark = oom_len, cap = sizeof oom_context;
    if (mark + 3 < cap) {
        size_t at = mark;
        if (at) at += (size_t)snprintf(oom_context + at, cap - at, ", ");
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(oom_context + at, cap - at, fmt, ap);
        va_end(ap);
        oom_len = strlen(oom_context);
    }
    return mark;
}

void err_oom_pop(size_t mark) {
    if (mark > oom_len) return;
    oom_len = mark;
    oom_context[mark] = 0;
}

/* The test hook QT_TEST_FAIL_ALLOC=N[:TEXT]: the Nth allocation of this process made inside
 * an err_oom_push scope (one whose text contains TEXT, when given) fails as if memory had run
 * out, so tests (sanitized builds too, where address-space limits do not work) can show that
 * each reader's failures name its file. */
static int test_fail_alloc(void) {
    static _Atomic long want = -1, seen;
    static char text[128];
    if (!oom_len) return 0;
    if (want < 0) {
        const char *e = getenv("QT_TEST_FAIL_ALLOC"), *colon = e ? strchr(e, ':') : NULL;
        if (colon) snprintf(text, sizeof text, "%s", colon + 1);
        want = e && *e ? strtol(e, NULL, 10) : 0;
    }
    return want > 0 && strstr(oom_context, text) && ++seen == want;
}

void err_die_oom(size_t n, const char *file, int line) {
    if (oom_context[0])
        fprintf(stderr, "error: out of memory allocating %zu bytes while %s (at %s:%d)\n", n,
                oom_context, file, line);
    else
        fprintf(stderr, "error: out of memory allocating %zu bytes at %s:%d\n", n, file, line);
    exit(3);
}

void *xmalloc_at(size_t n, const char *file, int line) {
    void *p = test_fail_alloc() ? NULL : malloc(n ? n : 1);
    if (!p) err_die_oom(n, file, line);
    return p;
}

void *xcalloc_at(size_t n, size_t size, const char *file, int line) {
    void *p = test_fail_alloc() ? NULL : calloc(n ? n : 1, size ? size : 1);
    if (!p) err_die_oom(n * size, file, line);
    return p;
}

void *xrealloc_at(void *p, size_t n, const char *file, int line) {
    void *q = test_fail_alloc() ? NULL : realloc(p, n ? n : 1);
    if (!q) err_die_oom(n, file, line);
    return q;
}

char *xstrdup_at(const char *s, const char *file, int line) {
    size_t n = strlen(s) + 1;
    char *p = xmalloc_at(n, file, line);
    memcpy(p, s, n);
    return p;
}
