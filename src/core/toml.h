/* A TOML parser for job configs: tables, dotted tables and keys, arrays of tables, basic /
 * literal / multi-line strings, integers, floats, booleans, arrays and inline tables.
 * Dates and times are not supported (an error says so). Every error is one sentence that
 * starts with "file:line:" and names the key when there is one.
 *
 * The result is a tree of TomlValue owned by its root (toml_free). Tables keep their keys in
 * the order they were written, each with the line that defined it. */
#ifndef QT_TOML_H
#define QT_TOML_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

/* Nesting of arrays / inline tables / table headers beyond this is an error, so hostile input
 * cannot exhaust the stack. */
#define TOML_MAX_DEPTH 64

typedef enum TomlType {
    TOML_STRING,
    TOML_INT,
    TOML_FLOAT,
    TOML_BOOL,
    TOML_ARRAY, /* also an array of tables ([[name]]) */
    TOML_TABLE,
} TomlType;

typedef struct TomlValue TomlValue;

typedef struct TomlKeyVal {
    char *key;        /* unquoted key text (may contain '.' when it was quoted) */
    int line;         /* line where the key (or the table header) was written */
    TomlValue *value; /* owned */
} TomlKeyVal;

struct TomlValue {
    TomlType type;
    int line;  /* line where the value starts */
    int flags; /* parser bookkeeping (how a table was created); not for callers */
    char *s;   /* TOML_STRING: UTF-8, NUL-terminated (may hold no NUL inside: \u0000 is refused) */
    int64_t i; /* TOML_INT */
    double f;  /* TOML_FLOAT */
    int b;     /* TOML_BOOL: 0 or 1 */
    TomlValue **items; /* TOML_ARRAY: n items, owned */
    TomlKeyVal *kv;    /* TOML_TABLE: n entries in definition order, owned */
    int n, cap;
    int *index;    /* TOML_TABLE with many keys: hash slots holding kv positions + 1 (private) */
    int index_cap; /* slots in index (a power of two), 0 = none yet */
};

/* Parses text[0..len) (NUL bytes inside are an error); filename only labels errors.
 * On success *root is a TOML_TABLE the caller frees with toml_free. */
int toml_parse(TomlValue **root, const char *text, size_t len, const char *filename, Err *err);
/* Reads and parses a file; errors are labelled with path. */
int toml_parse_file(TomlValue **root, const char *path, Err *err);
/* Parses text as one TOML value (e.g. "20", "3e-4", "true", "\"x\"", "[1, 2]"); the whole
 * text must be that value, surrounding whitespace aside. origin labels errors. */
int toml_parse_value(TomlValue **out, const char *text, const char *origin, Err *err);
void toml_free(TomlValue *v);

/* The value stored under key in a table (NULL when absent or v is not a table). */
const TomlValue *toml_get(const TomlValue *table, const char *key);
/* The entry (key, line, value) for key in a table, or NULL. */
const TomlKeyVal *toml_get_entry(const TomlValue *table, const char *key);
/* "a string", "an integer", ... for error messages. */
const char *toml_type_name(TomlType t);

#endif
