/* JSON Lines reading: line splitting and the per-line "text" extraction through jansson. */
#include "text/jsonl.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"

int jsonl_next_line(const char *buf, size_t len, size_t *pos, const char **line, size_t *line_len) {
    size_t p = *pos;
    if (p >= len) return 1;
    const char *nl = memchr(buf + p, '\n', len - p);
    size_t end = nl ? (size_t)(nl - buf) : len;
    *line = buf + p;
    *line_len = end - p;
    if (*line_len > 0 && buf[end - 1] == '\r') (*line_len)--;
    *pos = nl ? end + 1 : len;
    return 0;
}

size_t jsonl_bom_len(const char *buf, size_t len) {
    return len >= 3 && memcmp(buf, "\xef\xbb\xbf", 3) == 0 ? 3 : 0;
}

int jsonl_is_blank(const char *line, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (line[i] != ' ' && line[i] != '\t' && line[i] != '\r' && line[i] != '\n') return 0;
    return 1;
}

const char *json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "null";
    }
}

int jsonl_parse_text(const char *line, size_t len, const char *field, const char *file,
                     int64_t lineno, char **text, size_t *text_len, Err *err) {
    json_error_t je;
    if (!field) field = "text";
    /* NUL is allowed inside strings because the tokenizer takes (text, len), not C strings. */
    json_t *j = json_parse(line, len, JSON_ALLOW_NUL, &je);
    if (!j)
        return err_set(err,
                       "%s:%lld: not valid JSON at column %d (%s); expected one object "
                       "with a \"%s\" string per line",
                       file, (long long)lineno, je.column, je.text, field);
    int rc = 0;
    json_t *t = json_is_object(j) ? json_object_get(j, field) : NULL;
    if (!json_is_object(j))
        rc = err_set(err, "%s:%lld: expected a JSON object with a \"%s\" string, found %s", file,
                     (long long)lineno, field, json_kind(j));
    else if (!t)
        rc =
            err_set(err, "%s:%lld: the object has no \"%s\" field", file, (long long)lineno, field);
    else if (!json_is_string(t))
        rc = err_set(err, "%s:%lld: \"%s\" must be a string, found %s", file, (long long)lineno,
                     field, json_kind(t));
    else {
        size_t n = json_string_length(t);
        char *s = xmalloc(n + 1);
        memcpy(s, json_string_value(t), n);
        s[n] = 0;
        *text = s;
        *text_len = n;
    }
    json_decref(j);
    return rc;
}
