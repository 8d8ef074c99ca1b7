/* Errors are values: a function that can fail returns 0 on success or -1 after writing one
 * sentence into an Err. Only main() decides to exit. */
#ifndef QT_ERR_H
#define QT_ERR_H

#include <stddef.h>

typedef struct Err {
    char msg[1024];
} Err;

/* Writes a printf-style message into err (when err is not NULL); returns -1. */
int err_set(Err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Like err_set, then appends ": <strerror(errno)>". */
int err_sys(Err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prepends "prefix: " to an existing message (adds context on the way up). */
int err_wrap(Err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Checks a system call at the call site; on failure fills err with the call's text, the
 * source location and errno's message, then returns -1 from the enclosing function. */
#define SYS_CHECK(cond, err, ...)                                                                  \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            err_sys((err), __VA_ARGS__);                                                           \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

/* Propagates a failure: evaluates expr and returns -1 when it returned non-zero. */
#define TRY(expr)                                                                                  \
    do {                                                                                           \
        if ((expr) != 0) return -1;                                                                \
    } while (0)

/* What this thread is doing for the user, printf-style ("tokenizing corpus.jsonl:2"), or NULL
 * to clear it: an allocation failure in that work then names it, not only a source line.
 * Readers of a user's file set it around work whose size that file decides. */
void err_oom_context(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Allocation that cannot fail quietly: out of memory prints the site (and the
 * err_oom_context) and exits with status 3. */
void *xmalloc_at(size_t n, const char *file, int line);
void *xcalloc_at(size_t n, size_t size, const char *file, int line);
void *xrealloc_at(void *p, size_t n, const char *file, int line);
char *xstrdup_at(const char *s, const char *file, int line);
#define xmalloc(n) xmalloc_at((n), __FILE__, __LINE__)
#define xcalloc(n, s) xcalloc_at((n), (s), __FILE__, __LINE__)
#define xrealloc(p, n) xrealloc_at((p), (n), __FILE__, __LINE__)
#define xstrdup(s) xstrdup_at((s), __FILE__, __LINE__)

#endif
