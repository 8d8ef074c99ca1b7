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

/* This thread's err_oom_context, "" when none. */
static _Thread_local char oom_context[256];

void err_oom_context(const char *fmt, ...) {
    if (!fmt) {
        oom_context[0] = 0;
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(oom_context, sizeof oom_context, fmt, ap);
    va_end(ap);
}

static void die_oom(size_t n, const char *file, int line) {
    if (oom_context[0])
        fprintf(stderr, "error: out of memory allocating %zu bytes while %s (at %s:%d)\n", n,
                oom_context, file, line);
    else
        fprintf(stderr, "error: out of memory allocating %zu bytes at %s:%d\n", n, file, line);
    exit(3);
}

void *xmalloc_at(size_t n, const char *file, int line) {
    void *p = malloc(n ? n : 1);
    if (!p) die_oom(n, file, line);
    return p;
}

void *xcalloc_at(size_t n, size_t size, const char *file, int line) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) die_oom(n * size, file, line);
    return p;
}

void *xrealloc_at(void *p, size_t n, const char *file, int line) {
    void *q = realloc(p, n ? n : 1);
    if (!q) die_oom(n, file, line);
    return q;
}

char *xstrdup_at(const char *s, const char *file, int line) {
    size_t n = strlen(s) + 1;
    char *p = xmalloc_at(n, file, line);
    memcpy(p, s, n);
    return p;
}
