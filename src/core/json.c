/* jansson wrappers with sentence-shaped errors. */
#include "core/json.h"

#include "core/fs.h"
#include "core/strbuf.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* > 0 while this thread is inside json_parse; set when an allocation failed there. */
static _Thread_local int parsing, parse_oom;

static void *json_alloc(size_t n) {
    /* jansson's lexer drops a failed append and goes on with the next byte: once one
     * allocation failed, fail the rest at once, or a long string retries malloc per byte
     * (minutes for a 200 MB line) before the parse can report. */
    if (parsing && parse_oom) return NULL;
    void *p = malloc(n);
    if (!p) {
        if (parsing) {
            parse_oom = 1;
            return NULL;
        }
        err_die_oom(n, __FILE__, __LINE__);
    }
    return p;
}

__attribute__((constructor)) static void json_install_hooks(void) {
    json_set_alloc_funcs(json_alloc, free);
}

json_t *json_parse(const char *data, size_t len, size_t flags, json_error_t *je) {
    parsing++;
    parse_oom = 0;
    json_t *j = json_loadb(data, len, flags, je);
    parsing--;
    if (parse_oom) {
        json_decref(j);
        j = NULL;
        snprintf(je->text, sizeof je->text, "out of memory parsing %zu bytes of JSON", len);
    }
    return j;
}

json_t *json_load_mem(const char *data, size_t len, const char *what, Err *err) {
    json_error_t je;
    json_t *j = json_parse(data, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    if (!j)
        err_set(err, "%s:%d:%d (byte %d): invalid JSON: %s", what, je.line, je.column, je.position,
                je.text);
    return j;
}

static json_t *json_load_path_in(const char *path, Err *err) {
    char *data;
    size_t len;
    if (fs_read_all(path, &data, &len, err) != 0) return NULL;
    json_t *j = json_load_mem(data, len, path, err);
    free(data);
    return j;
}

json_t *json_load_path(const char *path, Err *err) {
    size_t scope = err_oom_push("reading %s", path);
    json_t *r = json_load_path_in(path, err);
    err_oom_pop(scope);
    return r;
}

static int lookup(const json_t *obj, const char *key, json_t **v, int required, const char *what,
                  Err *err) {
    if (!json_is_object(obj)) return err_set(err, "%s: expected a JSON object", what);
    *v = json_object_get(obj, key);
    if (!*v && required) return err_set(err, "%s: missing key \"%s\"", what, key);
    return 0;
}

static int get_int(const json_t *obj, const char *key, int64_t *out, int req, const char *what,
                   Err *err) {
    json_t *v;
    TRY(lookup(obj, key, &v, req, what, err));
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v)) return err_set(err, "%s: key \"%s\" must be an integer", what, key);
    *out = json_integer_value(v);
    return 0;
}

int json_req_int(const json_t *obj, const char *key, int64_t *out, const char *what, Err *err) {
    return get_int(obj, key, out, 1, what, err);
}
int json_opt_int(const json_t *obj, const char *key, int64_t *out, const char *what, Err *err) {
    return get_int(obj, key, out, 0, what, err);
}

static int get_num(const json_t *obj, const char *key, double *out, int req, const char *what,
                   Err *err) {
    json_t *v;
    TRY(lookup(obj, key, &v, req, what, err));
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return err_set(err, "%s: key \"%s\" must be a number", what, key);
    *out = json_number_value(v);
    return 0;
}

int json_req_num(const json_t *obj, const char *key, double *out, const char *what, Err *err) {
    return get_num(obj, key, out, 1, what, err);
}
int json_opt_num(const json_t *obj, const char *key, double *out, const char *what, Err *err) {
    return get_num(obj, key, out, 0, what, err);
}

int json_opt_bool(const json_t *obj, const char *key, int *out, const char *what, Err *err) {
    json_t *v;
    TRY(lookup(obj, key, &v, 0, what, err));
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return err_set(err, "%s: key \"%s\" must be true or false", what, key);
    *out = json_is_true(v);
    return 0;
}

static int get_str(const json_t *obj, const char *key, const char **out, int req, const char *what,
                   Err *err) {
    json_t *v;
    TRY(lookup(obj, key, &v, req, what, err));
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return err_set(err, "%s: key \"%s\" must be a string", what, key);
    *out = json_string_value(v);
    return 0;
}

int json_req_str(const json_t *obj, const char *key, const char **out, const char *what, Err *err) {
    return get_str(obj, key, out, 1, what, err);
}
int json_opt_str(const json_t *obj, const char *key, const char **out, const char *what, Err *err) {
    return get_str(obj, key, out, 0, what, err);
}

/* ---- json_dumps_py ------------------------------------------------------------------------ */

/* Python's repr of a double: the fewest significant digits that read back as x (the correctly
 * rounded ones), in fixed notation when the decimal exponent is in [-4, 16), else as
 * D.DDDe+XX with at least two exponent digits. */
static void py_real(StrBuf *o, double x) {
    if (isnan(x) || isinf(x) || x == 0) {
        strbuf_lit(o, isnan(x)   ? "NaN"
                      : isinf(x) ? (x > 0 ? "Infinity" : "-Infinity")
                                 : (signbit(x) ? "-0.0" : "0.0"));
        return;
    }
    char sci[40];
    for (int p = 0; p < 17; p++) {
        snprintf(sci, sizeof sci, "%.*e", p, x);
        if (strtod(sci, NULL) == x) break;
    }
    const char *c = sci;
    char out[64], digits[24];
    int k = 0, nd = 0;
    if (*c == '-') out[k++] = *c++;
    for (; *c && *c != 'e'; c++)
        if (*c != '.') digits[nd++] = *c;
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    int decpt = atoi(c + 1) + 1; /* x = 0.DIGITS * 10^decpt */
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            out[k++] = '0';
            out[k++] = '.';
            for (int i = 0; i < -decpt; i++)
                out[k++] = '0';
            for (int i = 0; i < nd; i++)
                out[k++] = digits[i];
        } else {
            for (int i = 0; i < decpt || i < nd; i++) {
                if (i == decpt) out[k++] = '.';
                out[k++] = i < nd ? digits[i] : '0';
            }
            if (decpt >= nd) {
                out[k++] = '.';
                out[k++] = '0';
            }
        }
        out[k] = 0;
    } else {
        out[k++] = digits[0];
        if (nd > 1) out[k++] = '.';
        for (int i = 1; i < nd; i++)
            out[k++] = digits[i];
        snprintf(out + k, sizeof out - (size_t)k, "e%c%02d", decpt - 1 < 0 ? '-' : '+',
                 abs(decpt - 1));
    }
    strbuf_lit(o, out);
}

static void py_value(StrBuf *o, const json_t *v) {
    char num[32];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *key;
        const json_t *item;
        int first = 1;
        strbuf_lit(o, "{");
        json_object_foreach((json_t *)v, key, item) {
            if (!first) strbuf_lit(o, ", ");
            first = 0;
            strbuf_json_string(o, key, strlen(key));
            strbuf_lit(o, ": ");
            py_value(o, item);
        }
        strbuf_lit(o, "}");
        break;
    }
    case JSON_ARRAY:
        strbuf_lit(o, "[");
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) strbuf_lit(o, ", ");
            py_value(o, json_array_get(v, i));
        }
        strbuf_lit(o, "]");
        break;
    case JSON_STRING:
        strbuf_json_string(o, json_string_value(v), json_string_length(v));
        break;
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%" PRId64, (int64_t)json_integer_value(v));
        strbuf_lit(o, num);
        break;
    case JSON_REAL:
        py_real(o, json_real_value(v));
        break;
    case JSON_TRUE:
        strbuf_lit(o, "true");
        break;
    case JSON_FALSE:
        strbuf_lit(o, "false");
        break;
    case JSON_NULL:
        strbuf_lit(o, "null");
        break;
    }
}

char *json_dumps_py(const json_t *v, size_t *len) {
    StrBuf o = {0};
    strbuf_add(&o, "", 0);
    py_value(&o, v);
    *len = o.n;
    return o.p;
}
