/* Token-id text files: one sequence per line, ids separated by whitespace (what `qtitan eval
 * --tokens` and the parity fixtures use). Blank lines are skipped. */
#ifndef QT_TOKEN_LINES_H
#define QT_TOKEN_LINES_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

typedef struct TokenLines {
    int32_t *ids; /* (total) all lines back to back */
    long *start;  /* (n + 1) line i is ids[start[i] .. start[i + 1]) */
    int n;
    long total;
} TokenLines;

/* Reads path; a non-integer token, an id outside [0, vocab), a line longer than max_len or a
 * file without any id is an error naming the file, line and column. */
int token_lines_read(TokenLines *t, const char *path, int vocab, long max_len, Err *err);
/* The same on text already in memory (data[len] must be NUL); path names it in errors. */
int token_lines_parse(TokenLines *t, const char *data, size_t len, const char *path, int vocab,
                      long max_len, Err *err);
void token_lines_free(TokenLines *t);

#endif
