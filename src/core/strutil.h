/* Small string helpers: edit distance for "did you mean" suggestions, glob over FQNs. */
#ifndef QT_STRUTIL_H
#define QT_STRUTIL_H

#include <stddef.h>

/* Levenshtein distance between a and b. */
int str_edit_distance(const char *a, const char *b);
/* The candidate nearest to s (NULL when none is within a useful distance). */
const char *str_nearest(const char *s, const char *const *candidates, size_t n);
/* Glob match where '*' matches any run of characters, dots included. */
int str_glob_match(const char *pattern, const char *s);
int str_ends_with(const char *s, const char *suffix);

#endif
