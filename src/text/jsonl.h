/* JSON Lines reading for datasets: splits a buffer into lines and pulls the "text" string out
 * of one line, with errors that name FILE:LINE. */
#ifndef QT_JSONL_H
#define QT_JSONL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

/* Finds the next line of buf[0..len) at or after *pos: *line points at its first byte and
 * *line_len excludes the '\n' and a '\r' before it. Advances *pos past the line. Returns 0 when
 * a line was found, 1 at the end of the buffer. A last line without '\n' still counts. */
int jsonl_next_line(const char *buf, size_t len, size_t *pos, const char **line, size_t *line_len);

/* 3 when buf[0..len) starts with a UTF-8 byte order mark, which some editors write and which
 * is not part of line 1's JSON, else 0: where reading starts. */
size_t jsonl_bom_len(const char *buf, size_t len);

/* 1 when line[0..len) is empty or only JSON whitespace: such lines hold no document. */
int jsonl_is_blank(const char *line, size_t len);

/* Parses one JSONL line that must be an object with a string field `field` (NULL: "text"). On
 * success *text is a malloc'd copy of the decoded string (it may contain NUL bytes) and
 * *text_len its length. On failure fills err with "FILE:LINE: ..." and returns -1. */
int jsonl_parse_text(const char *line, size_t len, const char *field, const char *file,
                     int64_t lineno, char **text, size_t *text_len, Err *err);

/* "an object", "a string", "a number", ...: a JSON value's kind for error sentences. */
const char *json_kind(const json_t *v);

#endif
