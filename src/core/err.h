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

/* What this thread is reading for the user, printf-style ("reading the tokenizer
 * t/tokenizer.json"): an allocation failure inside the scope names it (every open scope,
 * outermost first), not only a source line. Readers of a user's file open one around the work
 * whose size that file decides; returns the mark that err_oom_pop closes it with. */
size_t err_oom_push(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void err_oom_pop(size_t mark);
/* Out of memory allocating n bytes at file:line: prints the sentence with the open scopes and
 * exits with status 3. What every allocation that cannot fail quietly ends in. */
_Noreturn void err_die_oom(size_t n, const char *file, int line);
/* Allocation that cannot fail quietly: out of memory is err_die_oom. QT_TEST_FAIL_ALLOC=N[:TEXT]
 * (tests only) fails the Nth of them made inside an err_oom_push scope (containing TEXT). */
void *xmalloc_at(size_t n, const char *file, int line);
void *xcalloc_at(size_t n, size_t size, const char *file, int line);
void *xrealloc_at(void *p, size_t n, const char *file, int line);
char *xstrdup_at(const char *s, const char *file, int line);
#define xmalloc(n) xmalloc_at((n), __FILE__, __LINE__)
#define xcalloc(n, s) xcalloc_at((n), (s), __FILE__, __LINE__)
#define xrealloc(p, n) xrealloc_at((p), (n), __FILE__, __LINE__)
#define xstrdup(s) xstrdup_at((s), __FILE__, __LINE__)

#endif
