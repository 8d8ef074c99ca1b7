/* Parser for token-id text files. */
#include "io/token_lines.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"

int token_lines_read(TokenLines *t, const char *path, int vocab, long max_len, Err *err) {
    memset(t, 0, sizeof *t);
    char *data;
    size_t len;
    if (fs_read_all(path, &data, &len, err)) return -1;
    int rc = token_lines_parse(t, data, len, path, vocab, max_len, err);
    free(data);
    return rc;
}

int token_lines_parse(TokenLines *t, const char *data, size_t len, const char *path, int vocab,
                      long max_len, Err *err) {
    memset(t, 0, sizeof *t);
    long cap = 1024, lcap = 16;
    t->ids = xmalloc((size_t)cap * sizeof *t->ids);
    t->start = xmalloc((size_t)lcap * sizeof *t->start);
    t->start[0] = 0;
    long line = 1, line_begin = 0;
    size_t i = 0;
    while (i <= len) {
        if (i == len || data[i] == '\n') {
            if (t->total > t->start[t->n]) { /* a non-blank line ends */
                if (t->n + 2 > lcap) {
                    lcap *= 2;
                    t->start = xrealloc(t->start, (size_t)lcap * sizeof *t->start);
                }
                t->start[++t->n] = t->total;
            }
            i++;
            line++;
            line_begin = (long)i;
            continue;
        }
        if (isspace((unsigned char)data[i])) {
            i++;
            continue;
        }
        char *end;
        errno = 0;
        long v = strtol(data + i, &end, 10);
        long col = (long)i - line_begin + 1;
        if (end == data + i || (*end && !isspace((unsigned char)*end)) || errno) {
            size_t w = 0;
            while (i + w < len && !isspace((unsigned char)data[i + w]) && w < 20)
                w++;
            err_set(err, "%s:%ld:%ld: expected a token id (a non-negative integer), got \"%.*s\"",
                    path, line, col, (int)w, data + i);
            goto fail;
        }
        if (v < 0 || v >= vocab) {
            err_set(err, "%s:%ld:%ld: token id %ld is outside the vocabulary [0, %d)", path, line,
                    col, v, vocab);
            goto fail;
        }
        if (t->total - t->start[t->n] >= max_len) {
            err_set(err, "%s:%ld: line is longer than %ld tokens", path, line, max_len);
            goto fail;
        }
        if (t->total == cap) {
            cap *= 2;
            t->ids = xrealloc(t->ids, (size_t)cap * sizeof *t->ids);
        }
        t->ids[t->total++] = (int32_t)v;
        i = (size_t)(end - data);
    }
    if (t->n == 0) {
        token_lines_free(t);
        return err_set(err, "%s holds no token ids", path);
    }
    return 0;
fail:
    token_lines_free(t);
    return -1;
}

void token_lines_free(TokenLines *t) {
    free(t->ids);
    free(t->start);
    memset(t, 0, sizeof *t);
}
