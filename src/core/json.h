/* JSON through jansson, with errors that name the file, line, column and byte offset, and
 * typed getters that name the key and what was expected. */
#ifndef QT_JSON_H
#define QT_JSON_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

/* jansson allocates through qtitan's hooks (installed before main): while json_parse runs, a
 * failed allocation fails the parse with je->text "out of memory", which every caller turns
 * into a sentence naming the file and line; anywhere else (building a document) it ends the
 * process with a sentence, as xmalloc does, instead of a NULL that jansson or its caller would
 * not check. */
/* json_loadb with allocation failures reported as a parse error. Every parse goes here. */
json_t *json_parse(const char *data, size_t len, size_t flags, json_error_t *je);
/* Parses a JSON file; on failure: "FILE:LINE:COL (byte N): MESSAGE". */
json_t *json_load_path(const char *path, Err *err);
/* Parses len bytes; `what` names the source in errors (a file name, "safetensors header"). */
json_t *json_load_mem(const char *data, size_t len, const char *what, Err *err);

/* Typed getters: `what` names the source file for the error sentence. A missing key is an
 * error for the *_req forms; the *_opt forms leave *out untouched when the key is absent. */
int json_req_int(const json_t *obj, const char *key, int64_t *out, const char *what, Err *err);
int json_opt_int(const json_t *obj, const char *key, int64_t *out, const char *what, Err *err);
int json_req_num(const json_t *obj, const char *key, double *out, const char *what, Err *err);
int json_opt_num(const json_t *obj, const char *key, double *out, const char *what, Err *err);
int json_opt_bool(const json_t *obj, const char *key, int *out, const char *what, Err *err);
int json_req_str(const json_t *obj, const char *key, const char **out, const char *what, Err *err);
int json_opt_str(const json_t *obj, const char *key, const char **out, const char *what, Err *err);

/* v as Python's json.dumps(v, ensure_ascii=False) writes it (what transformers' chat templates
 * print with `| tojson`): ", " and ": " separators, keys in the object's order, non-ASCII text
 * as is, control characters escaped, reals as Python's repr (the shortest digits that read back
 * the same; 1e-05, 100.0, 1e+16). Returns a NUL-terminated malloc'd string of *len bytes (a
 * string value may hold NUL, escaped as \u0000). Non-finite reals, which jansson never parses,
 * are written as Python writes them (NaN, Infinity, -Infinity). */
char *json_dumps_py(const json_t *v, size_t *len);

#endif
