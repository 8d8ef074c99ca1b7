/* JSON through jansson, with errors that name the file, line, column and byte offset, and
 * typed getters that name the key and what was expected. */
#ifndef QT_JSON_H
#define QT_JSON_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

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
int json_req_str(const json_t *obj, const char *key, const char **out, const char *what,
                 Err *err);
int json_opt_str(const json_t *obj, const char *key, const char **out, const char *what,
                 Err *err);

#endif
