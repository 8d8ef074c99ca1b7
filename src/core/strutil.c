/* String helpers. */
#include "core/strutil.h"

#include <stdlib.h>
#include <string.h>

#include "core/err.h"

int str_edit_distance(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    int *row = xmalloc((nb + 1) * sizeof(int));
    for (size_t j = 0; j <= nb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    int d = row[nb];
    free(row);
    return d;
}

const char *str_nearest(const char *s, const char *const *candidates, size_t n) {
    const char *best = NULL;
    int best_d = 1 << 30;
    for (size_t i = 0; i < n; i++) {
        int d = str_edit_distance(s, candidates[i]);
        if (d < best_d) {
            best_d = d;
            best = candidates[i];
        }
    }
    int limit = (int)strlen(s) / 2 + 2;
    return best_d <= limit ? best : NULL;
}

int str_glob_match(const char *p, const char *s) {
    const char *star = NULL, *resume = NULL;
    while (*s) {
        if (*p == '*') {
            star = p++;
            resume = s;
        } else if (*p == *s) {
            p++;
            s++;
        } else if (star) {
            p = star + 1;
            s = ++resume;
        } else {
            return 0;
        }
    }
    while (*p == '*')
        p++;
    return *p == 0;
}

int str_ends_with(const char *s, const char *suffix) {
    size_t ns = strlen(s), nx = strlen(suffix);
    return ns >= nx && memcmp(s + ns - nx, suffix, nx) == 0;
}
