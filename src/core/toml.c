/* TOML parser (see toml.h). One pass over the text with a cursor; recursion only for nested
 * arrays and inline tables, bounded by TOML_MAX_DEPTH. */
#include "core/toml.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"

/* How a table came to exist; TOML forbids redefining or extending tables in some ways. */
enum {
    TF_DEFINED = 1, /* by a [header] (or the root) */
    TF_DOTTED = 2,  /* by a dotted key a.b = v */
    TF_INLINE = 4,  /* an inline table { }: closed for extension */
    TF_AOT = 8,     /* an array created by [[header]] (others are closed) */
};

typedef struct Parser {
    const char *s, *end;
    const char *file;
    int line;        /* current line, 1-based; 0 = do not print lines (single values) */
    int depth;       /* nesting of arrays and inline tables */
    char table[256]; /* name of the current [table] for messages ("" = root) */
    char key[256];   /* key whose value is being parsed, for messages ("" = none) */
    Err *err;
} Parser;

typedef struct Buf {
    char *p;
    size_t n, cap;
} Buf;

static void buf_push(Buf *b, char c) {
    if (b->n + 2 > b->cap) {
        b->cap = b->cap ? b->cap * 2 : 32;
        b->p = xrealloc(b->p, b->cap);
    }
    b->p[b->n++] = c;
    b->p[b->n] = 0;
}

static char *buf_take(Buf *b) {
    if (!b->p) return xstrdup("");
    char *s = b->p;
    b->p = NULL;
    b->n = b->cap = 0;
    return s;
}

__attribute__((format(printf, 2, 3))) static int perr(Parser *p, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char ctx[300] = "";
    if (p->key[0]) snprintf(ctx, sizeof ctx, " in the value of \"%s\"", p->key);
    if (p->line > 0) return err_set(p->err, "%s:%d: %s%s", p->file, p->line, msg, ctx);
    return err_set(p->err, "%s: %s%s", p->file, msg, ctx);
}

static int peek(const Parser *p) {
    return p->s < p->end ? (unsigned char)*p->s : -1;
}
static int peek_at(const Parser *p, size_t k) {
    return p->s + k < p->end ? (unsigned char)p->s[k] : -1;
}

static void skip_ws(Parser *p) {
    while (p->s < p->end && (*p->s == ' ' || *p->s == '\t'))
        p->s++;
}

static void skip_comment(Parser *p) {
    if (peek(p) != '#') return;
    while (p->s < p->end && *p->s != '\n' && *p->s != '\r')
        p->s++;
}

/* Consumes one newline (LF or CRLF) when there is one; returns 1 if consumed, -1 on a lone
 * CR, 0 when the next character is not a newline. */
static int eat_newline(Parser *p) {
    if (peek(p) == '\n') {
        p->s++;
        if (p->line > 0) p->line++;
        return 1;
    }
    if (peek(p) == '\r') {
        if (peek_at(p, 1) != '\n') return perr(p, "carriage return without a line feed");
        p->s += 2;
        if (p->line > 0) p->line++;
        return 1;
    }
    return 0;
}

/* Whitespace, comments and newlines, as allowed between array elements. */
static int skip_blank(Parser *p) {
    for (;;) {
        skip_ws(p);
        skip_comment(p);
        int r = eat_newline(p);
        if (r < 0) return -1;
        if (r == 0) return 0;
    }
}

static TomlValue *new_value(TomlType t, int line) {
    TomlValue *v = xcalloc(1, sizeof *v);
    v->type = t;
    v->line = line;
    return v;
}

void toml_free(TomlValue *v) {
    if (!v) return;
    free(v->s);
    for (int i = 0; i < v->n; i++) {
        if (v->type == TOML_ARRAY) toml_free(v->items[i]);
        if (v->type == TOML_TABLE) {
            free(v->kv[i].key);
            toml_free(v->kv[i].value);
        }
    }
    free(v->items);
    free(v->kv);
    free(v->index);
    free(v);
}

/* Tables with more keys than this get a hash index, so a file with very many keys in one
 * table parses in linear time instead of quadratic. */
#define TOML_INDEX_MIN 16

static uint32_t hash_key(const char *s) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

static void index_put(TomlValue *t, int pos) {
    uint32_t mask = (uint32_t)t->index_cap - 1;
    uint32_t i = hash_key(t->kv[pos].key) & mask;
    while (t->index[i])
        i = (i + 1) & mask;
    t->index[i] = pos + 1;
}

/* Keeps the index at most half full; called after each key is added. */
static void index_update(TomlValue *t) {
    if (t->n < TOML_INDEX_MIN) return;
    if (2 * t->n <= t->index_cap) {
        index_put(t, t->n - 1);
        return;
    }
    t->index_cap = t->index_cap ? t->index_cap * 2 : 4 * TOML_INDEX_MIN;
    free(t->index);
    t->index = xcalloc((size_t)t->index_cap, sizeof *t->index);
    for (int i = 0; i < t->n; i++)
        index_put(t, i);
}

const TomlKeyVal *toml_get_entry(const TomlValue *t, const char *key) {
    if (!t || t->type != TOML_TABLE) return NULL;
    if (t->index_cap) {
        uint32_t mask = (uint32_t)t->index_cap - 1;
        for (uint32_t i = hash_key(key) & mask; t->index[i]; i = (i + 1) & mask)
            if (strcmp(t->kv[t->index[i] - 1].key, key) == 0) return &t->kv[t->index[i] - 1];
        return NULL;
    }
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->kv[i].key, key) == 0) return &t->kv[i];
    return NULL;
}

const TomlValue *toml_get(const TomlValue *t, const char *key) {
    const TomlKeyVal *e = toml_get_entry(t, key);
    return e ? e->value : NULL;
}

const char *toml_type_name(TomlType t) {
    switch (t) {
    case TOML_STRING:
        return "a string";
    case TOML_INT:
        return "an integer";
    case TOML_FLOAT:
        return "a float";
    case TOML_BOOL:
        return "a boolean";
    case TOML_ARRAY:
        return "an array";
    case TOML_TABLE:
        return "a table";
    }
    return "a value";
}

static TomlKeyVal *table_add(TomlValue *t, char *key, int line, TomlValue *v) {
    if (t->n == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 8;
        t->kv = xrealloc(t->kv, (size_t)t->cap * sizeof *t->kv);
    }
    TomlKeyVal *e = &t->kv[t->n++];
    e->key = key;
    e->line = line;
    e->value = v;
    index_update(t);
    return e;
}

static void array_add(TomlValue *a, TomlValue *v) {
    if (a->n == a->cap) {
        a->cap = a->cap ? a->cap * 2 : 8;
        a->items = xrealloc(a->items, (size_t)a->cap * sizeof *a->items);
    }
    a->items[a->n++] = v;
}

static TomlKeyVal *table_find(TomlValue *t, const char *key) {
    return (TomlKeyVal *)toml_get_entry(t, key);
}

/* ---- strings ---- */

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static void push_utf8(Buf *b, unsigned cp) {
    if (cp < 0x80) {
        buf_push(b, (char)cp);
    } else if (cp < 0x800) {
        buf_push(b, (char)(0xC0 | (cp >> 6)));
        buf_push(b, (char)(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        buf_push(b, (char)(0xE0 | (cp >> 12)));
        buf_push(b, (char)(0x80 | ((cp >> 6) & 0x3F)));
        buf_push(b, (char)(0x80 | (cp & 0x3F)));
    } else {
        buf_push(b, (char)(0xF0 | (cp >> 18)));
        buf_push(b, (char)(0x80 | ((cp >> 12) & 0x3F)));
        buf_push(b, (char)(0x80 | ((cp >> 6) & 0x3F)));
        buf_push(b, (char)(0x80 | (cp & 0x3F)));
    }
}

static int is_control(int c) {
    return (c < 0x20 && c != '\t') || c == 0x7F;
}

/* After a backslash inside a basic string. */
static int parse_escape(Parser *p, Buf *b) {
    int c = peek(p);
    if (c < 0) return perr(p, "unterminated string");
    p->s++;
    switch (c) {
    case 'b':
        buf_push(b, '\b');
        return 0;
    case 't':
        buf_push(b, '\t');
        return 0;
    case 'n':
        buf_push(b, '\n');
        return 0;
    case 'f':
        buf_push(b, '\f');
        return 0;
    case 'r':
        buf_push(b, '\r');
        return 0;
    case '"':
        buf_push(b, '"');
        return 0;
    case '\\':
        buf_push(b, '\\');
        return 0;
    case 'u':
    case 'U': {
        int nd = c == 'u' ? 4 : 8;
        unsigned cp = 0;
        for (int i = 0; i < nd; i++) {
            int h = hexval(peek(p));
            if (h < 0) return perr(p, "\\%c escape needs %d hex digits", c, nd);
            cp = cp * 16 + (unsigned)h;
            p->s++;
        }
        if (cp == 0) return perr(p, "\\u0000 is not allowed in strings");
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return perr(p, "escape \\%c%0*X is not a Unicode scalar value", c, nd, cp);
        push_utf8(b, cp);
        return 0;
    }
    default:
        if (c >= 0x20 && c < 0x7F) return perr(p, "invalid escape \\%c", c);
        return perr(p, "invalid escape (byte 0x%02X after a backslash)", c);
    }
}

/* Basic ("...", """...""") or literal ('...', '''...''') string; the cursor is on the opening
 * quote(s). Literal strings take no escapes; otherwise the two kinds read alike. */
static int parse_string(Parser *p, char **out) {
    const char quote = (char)peek(p);
    const int basic = quote == '"';
    const char *what = basic ? "string" : "literal string";
    int multi = peek_at(p, 1) == quote && peek_at(p, 2) == quote;
    int start_line = p->line;
    Buf b = {0};
    p->s += multi ? 3 : 1;
    if (multi && eat_newline(p) < 0) goto fail;
    for (;;) {
        int c = peek(p);
        if (c < 0) {
            p->line = start_line;
            perr(p, "unterminated %s", what);
            goto fail;
        }
        if (c == quote) {
            if (!multi) {
                p->s++;
                break;
            }
            int q = 0;
            while (peek_at(p, (size_t)q) == quote)
                q++;
            if (q >= 3) {
                if (q > 5) {
                    perr(p, "too many quotes at the end of a multi-line %s", what);
                    goto fail;
                }
                for (int i = 0; i < q - 3; i++)
                    buf_push(&b, quote);
                p->s += q;
                break;
            }
            for (int i = 0; i < q; i++)
                buf_push(&b, quote);
            p->s += q;
            continue;
        }
        if (c == '\\' && basic) {
            p->s++;
            if (multi) {
                /* A backslash ending a line trims the newline and the blanks after it. */
                const char *save = p->s;
                skip_ws(p);
                int r = eat_newline(p);
                if (r < 0) goto fail;
                if (r == 1) {
                    for (;;) {
                        skip_ws(p);
                        r = eat_newline(p);
                        if (r < 0) goto fail;
                        if (r == 0) break;
                    }
                    continue;
                }
                p->s = save;
            }
            if (parse_escape(p, &b) != 0) goto fail;
            continue;
        }
        if (c == '\n' || c == '\r') {
            if (!multi) {
                perr(p, "unterminated %s (a newline before the closing quote)", what);
                goto fail;
            }
            if (eat_newline(p) < 0) goto fail;
            buf_push(&b, '\n');
            continue;
        }
        if (is_control(c)) {
            perr(p, "control character 0x%02X in a %s%s", c, what, basic ? "; use an escape" : "");
            goto fail;
        }
        buf_push(&b, (char)c);
        p->s++;
    }
    *out = buf_take(&b);
    return 0;
fail:
    free(b.p);
    return -1;
}

/* ---- keys ---- */

static int is_bare_key_char(int c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
}

static int parse_simple_key(Parser *p, char **out) {
    int c = peek(p);
    if (c == '"' || c == '\'') {
        if (peek_at(p, 1) == c && peek_at(p, 2) == c)
            return perr(p, "a multi-line string cannot be a key");
        return parse_string(p, out);
    }
    const char *start = p->s;
    while (p->s < p->end && is_bare_key_char((unsigned char)*p->s))
        p->s++;
    if (p->s == start) {
        if (c < 0 || c == '\n' || c == '\r') return perr(p, "expected a key");
        if (c >= 0x20 && c < 0x7F) return perr(p, "expected a key, found '%c'", c);
        return perr(p, "expected a key, found byte 0x%02X", c);
    }
    size_t n = (size_t)(p->s - start);
    char *k = xmalloc(n + 1);
    memcpy(k, start, n);
    k[n] = 0;
    *out = k;
    return 0;
}

typedef struct Key {
    char *part[TOML_MAX_DEPTH];
    int n;
} Key;

static void key_free(Key *k) {
    for (int i = 0; i < k->n; i++)
        free(k->part[i]);
    k->n = 0;
}

/* "a.b.c" for messages (quotes omitted). */
static void key_join(const Key *k, int upto, char *out, size_t cap) {
    size_t o = 0;
    out[0] = 0;
    for (int i = 0; i < upto && o + 1 < cap; i++)
        o += (size_t)snprintf(out + o, cap - o, "%s%s", i ? "." : "", k->part[i]);
}

static int parse_key(Parser *p, Key *k) {
    k->n = 0;
    for (;;) {
        if (k->n == TOML_MAX_DEPTH) {
            key_free(k);
            return perr(p, "key has more than %d dotted parts", TOML_MAX_DEPTH);
        }
        if (parse_simple_key(p, &k->part[k->n]) != 0) {
            key_free(k);
            return -1;
        }
        k->n++;
        skip_ws(p);
        if (peek(p) != '.') return 0;
        p->s++;
        skip_ws(p);
    }
}

/* ---- numbers and other bare values ---- */

static int is_token_char(int c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '+' || c == '.' || c == ':';
}

static int is_digit(int c) {
    return c >= '0' && c <= '9';
}

/* Checks that underscores in digits[0..n) sit between two digits of the given base. */
static int digits_ok(const char *d, size_t n, int base) {
    if (n == 0) return 0;
    for (size_t i = 0; i < n; i++) {
        int c = (unsigned char)d[i];
        if (c == '_') {
            if (i == 0 || i + 1 == n || d[i + 1] == '_') return 0;
            continue;
        }
        int v = hexval(c);
        if (v < 0 || v >= base) return 0;
    }
    return 1;
}

static int parse_int_token(Parser *p, const char *t, size_t n, int64_t *out) {
    int neg = 0, base = 10;
    const char *d = t;
    if (n > 2 && t[0] == '0' && (t[1] == 'x' || t[1] == 'o' || t[1] == 'b')) {
        base = t[1] == 'x' ? 16 : t[1] == 'o' ? 8 : 2;
        d += 2;
    } else if (*d == '+' || *d == '-') {
        neg = *d == '-';
        d++;
    }
    size_t nd = n - (size_t)(d - t);
    if (!digits_ok(d, nd, base)) return perr(p, "invalid number '%.*s'", (int)n, t);
    if (base == 10 && nd > 1 && d[0] == '0')
        return perr(p, "invalid number '%.*s' (leading zeros are not allowed)", (int)n, t);
    uint64_t limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX, v = 0;
    for (size_t i = 0; i < nd; i++) {
        if (d[i] == '_') continue;
        uint64_t dig = (uint64_t)hexval((unsigned char)d[i]);
        if (v > (limit - dig) / (uint64_t)base)
            return perr(p, "integer '%.*s' does not fit in 64 bits", (int)n, t);
        v = v * (uint64_t)base + dig;
    }
    *out = neg ? (v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v) : (int64_t)v;
    return 0;
}

static int parse_float_token(Parser *p, const char *t, size_t n, double *out) {
    const char *s = t, *e = t + n;
    if (s < e && (*s == '+' || *s == '-')) s++;
    size_t rest = (size_t)(e - s);
    if ((rest == 3 && memcmp(s, "inf", 3) == 0) || (rest == 3 && memcmp(s, "nan", 3) == 0)) {
        double v = s[0] == 'i' ? INFINITY : NAN;
        *out = t[0] == '-' ? -v : v;
        return 0;
    }
    /* integer part */
    const char *ip = s;
    while (s < e && (is_digit(*s) || *s == '_'))
        s++;
    size_t ni = (size_t)(s - ip);
    int ok = digits_ok(ip, ni, 10) && !(ni > 1 && ip[0] == '0');
    int has_frac = 0, has_exp = 0;
    if (ok && s < e && *s == '.') {
        s++;
        const char *fp = s;
        while (s < e && (is_digit(*s) || *s == '_'))
            s++;
        ok = digits_ok(fp, (size_t)(s - fp), 10);
        has_frac = 1;
    }
    if (ok && s < e && (*s == 'e' || *s == 'E')) {
        s++;
        if (s < e && (*s == '+' || *s == '-')) s++;
        const char *xp = s;
        while (s < e && (is_digit(*s) || *s == '_'))
            s++;
        ok = digits_ok(xp, (size_t)(s - xp), 10);
        has_exp = 1;
    }
    if (!ok || s != e || !(has_frac || has_exp)) return perr(p, "invalid number '%.*s'", (int)n, t);
    char buf[128];
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (t[i] == '_') continue;
        if (o + 1 >= sizeof buf) return perr(p, "number '%.40s...' is too long", t);
        buf[o++] = t[i];
    }
    buf[o] = 0;
    errno = 0;
    double v = strtod(buf, NULL);
    if (errno == ERANGE && isinf(v)) return perr(p, "float '%.*s' is out of range", (int)n, t);
    *out = v;
    return 0;
}

static int parse_bare_value(Parser *p, TomlValue **out) {
    const char *t = p->s;
    while (p->s < p->end && is_token_char((unsigned char)*p->s))
        p->s++;
    size_t n = (size_t)(p->s - t);
    int line = p->line;
    if (n == 0) {
        int c = peek(p);
        if (c < 0 || c == '\n' || c == '\r' || c == '#') return perr(p, "expected a value");
        if (c >= 0x20 && c < 0x7F) return perr(p, "expected a value, found '%c'", c);
        return perr(p, "expected a value, found byte 0x%02X", c);
    }
    /* A date-time such as 1979-05-27T07:32:00 or 07:32:00. */
    if (memchr(t, ':', n) || (n >= 5 && is_digit(t[0]) && is_digit(t[1]) && is_digit(t[2]) &&
                              is_digit(t[3]) && t[4] == '-'))
        return perr(p, "dates and times are not supported ('%.*s')", (int)n, t);
    if ((n == 4 && memcmp(t, "true", 4) == 0) || (n == 5 && memcmp(t, "false", 5) == 0)) {
        TomlValue *v = new_value(TOML_BOOL, line);
        v->b = t[0] == 't';
        *out = v;
        return 0;
    }
    int special = n == 3 && (memcmp(t, "inf", 3) == 0 || memcmp(t, "nan", 3) == 0);
    if (!special && !is_digit(t[0]) && t[0] != '+' && t[0] != '-')
        return perr(p, "expected a value, found '%.*s' (strings need quotes)", (int)n, t);
    int is_float = 0;
    int hex = n > 2 && t[0] == '0' && (t[1] == 'x' || t[1] == 'o' || t[1] == 'b');
    if (!hex)
        for (size_t i = 0; i < n; i++)
            if (t[i] == '.' || t[i] == 'e' || t[i] == 'E' || t[i] == 'i' || t[i] == 'n')
                is_float = 1;
    if (is_float) {
        double f = 0;
        TRY(parse_float_token(p, t, n, &f));
        TomlValue *v = new_value(TOML_FLOAT, line);
        v->f = f;
        *out = v;
        return 0;
    }
    int64_t i = 0;
    TRY(parse_int_token(p, t, n, &i));
    TomlValue *v = new_value(TOML_INT, line);
    v->i = i;
    *out = v;
    return 0;
}

/* ---- values, arrays, inline tables ---- */

static int parse_value(Parser *p, TomlValue **out);
static int parse_value_of(Parser *p, const Key *k, TomlValue **out);

/* Puts val at key path k under table t, creating dotted tables on the way. Takes ownership
 * of the key parts and val (freed on error). */
static int insert_dotted(Parser *p, TomlValue *t, Key *k, TomlValue *val, int line) {
    char name[512];
    for (int i = 0; i < k->n - 1; i++) {
        TomlKeyVal *e = table_find(t, k->part[i]);
        if (!e) {
            TomlValue *sub = new_value(TOML_TABLE, line);
            sub->flags = TF_DOTTED;
            table_add(t, k->part[i], line, sub);
            k->part[i] = NULL;
            t = sub;
            continue;
        }
        TomlValue *ev = e->value;
        if (ev->type != TOML_TABLE || !(ev->flags & TF_DOTTED) || (ev->flags & TF_INLINE)) {
            key_join(k, i + 1, name, sizeof name);
            perr(p, "cannot add keys to \"%s\": it was already defined on line %d as %s", name,
                 e->line, ev->type == TOML_TABLE ? "a table" : toml_type_name(ev->type));
            goto fail;
        }
        t = ev;
    }
    TomlKeyVal *e = table_find(t, k->part[k->n - 1]);
    if (e) {
        key_join(k, k->n, name, sizeof name);
        if (p->table[0])
            perr(p, "duplicate key \"%s\" in [%s] (first defined on line %d)", name, p->table,
                 e->line);
        else
            perr(p, "duplicate key \"%s\" (first defined on line %d)", name, e->line);
        goto fail;
    }
    table_add(t, k->part[k->n - 1], line, val);
    k->part[k->n - 1] = NULL;
    key_free(k);
    return 0;
fail:
    key_free(k);
    toml_free(val);
    return -1;
}

static void mark_inline(TomlValue *t) {
    t->flags |= TF_INLINE;
    for (int i = 0; i < t->n; i++)
        if (t->kv[i].value->type == TOML_TABLE && (t->kv[i].value->flags & TF_DOTTED))
            mark_inline(t->kv[i].value);
}

static int parse_array(Parser *p, TomlValue **out) {
    TomlValue *a = new_value(TOML_ARRAY, p->line);
    int start_line = p->line;
    p->s++; /* [ */
    for (;;) {
        if (skip_blank(p) != 0) goto fail;
        if (peek(p) == ']') {
            p->s++;
            break;
        }
        if (peek(p) < 0) {
            p->line = start_line;
            perr(p, "unterminated array (no closing ']')");
            goto fail;
        }
        TomlValue *v;
        if (parse_value(p, &v) != 0) goto fail;
        array_add(a, v);
        if (skip_blank(p) != 0) goto fail;
        if (peek(p) == ',') {
            p->s++;
            continue;
        }
        if (peek(p) == ']') {
            p->s++;
            break;
        }
        if (peek(p) < 0) {
            p->line = start_line;
            perr(p, "unterminated array (no closing ']')");
        } else {
            perr(p, "expected ',' or ']' in an array");
        }
        goto fail;
    }
    *out = a;
    return 0;
fail:
    toml_free(a);
    return -1;
}

static int parse_inline_table(Parser *p, TomlValue **out) {
    TomlValue *t = new_value(TOML_TABLE, p->line);
    p->s++; /* { */
    skip_ws(p);
    if (peek(p) == '}') {
        p->s++;
        goto done;
    }
    for (;;) {
        skip_ws(p);
        Key k;
        int line = p->line;
        if (parse_key(p, &k) != 0) goto fail;
        if (peek(p) != '=') {
            char name[512];
            key_join(&k, k.n, name, sizeof name);
            key_free(&k);
            perr(p, "expected '=' after key \"%s\"", name);
            goto fail;
        }
        p->s++;
        skip_ws(p);
        TomlValue *v;
        if (parse_value_of(p, &k, &v) != 0) {
            key_free(&k);
            goto fail;
        }
        if (insert_dotted(p, t, &k, v, line) != 0) goto fail;
        skip_ws(p);
        if (peek(p) == ',') {
            p->s++;
            skip_ws(p);
            if (peek(p) == '}') {
                perr(p, "trailing comma in an inline table");
                goto fail;
            }
            continue;
        }
        if (peek(p) == '}') {
            p->s++;
            break;
        }
        perr(p, "expected ',' or '}' in an inline table (inline tables stay on one line)");
        goto fail;
    }
done:
    mark_inline(t);
    *out = t;
    return 0;
fail:
    toml_free(t);
    return -1;
}

static int parse_value(Parser *p, TomlValue **out) {
    int c = peek(p);
    int line = p->line;
    if (c == '"' || c == '\'') {
        char *s;
        TRY(parse_string(p, &s));
        TomlValue *v = new_value(TOML_STRING, line);
        v->s = s;
        *out = v;
        return 0;
    }
    if (c == '[' || c == '{') {
        if (p->depth >= TOML_MAX_DEPTH)
            return perr(p, "arrays or inline tables nested deeper than %d", TOML_MAX_DEPTH);
        p->depth++;
        int r = c == '[' ? parse_array(p, out) : parse_inline_table(p, out);
        p->depth--;
        return r;
    }
    return parse_bare_value(p, out);
}

/* parse_value with key k named in its error messages. */
static int parse_value_of(Parser *p, const Key *k, TomlValue **out) {
    char saved[sizeof p->key];
    memcpy(saved, p->key, sizeof saved);
    key_join(k, k->n, p->key, sizeof p->key);
    int r = parse_value(p, out);
    memcpy(p->key, saved, sizeof saved);
    return r;
}

/* ---- documents ---- */

/* Checks the whole text is UTF-8 without NUL bytes, so later stages need not. */
static int check_text(Parser *p) {
    const unsigned char *s = (const unsigned char *)p->s, *e = (const unsigned char *)p->end;
    int line = 1;
    while (s < e) {
        unsigned c = *s;
        if (c == '\n') line++;
        if (c == 0) {
            if (p->line > 0) p->line = line;
            return perr(p, "NUL byte in the file");
        }
        if (c < 0x80) {
            s++;
            continue;
        }
        int n = c >= 0xF0 && c <= 0xF4   ? 4
                : c >= 0xE0 && c <= 0xEF ? 3
                : c >= 0xC2 && c <= 0xDF ? 2
                                         : 0;
        int ok = n > 0 && e - s >= n;
        unsigned cp = n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
        for (int i = 1; ok && i < n; i++) {
            if ((s[i] & 0xC0) != 0x80) ok = 0;
            cp = (cp << 6) | (s[i] & 0x3F);
        }
        if (ok && ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
                   (n == 4 && (cp < 0x10000 || cp > 0x10FFFF))))
            ok = 0;
        if (!ok) {
            if (p->line > 0) p->line = line;
            return perr(p, "invalid UTF-8 (byte 0x%02X)", c);
        }
        s += n;
    }
    return 0;
}

/* Handles "[a.b]" or "[[a.b]]"; sets *cur to the table that following keys go into. */
static int parse_header(Parser *p, TomlValue *root, TomlValue **cur) {
    int aot = peek_at(p, 1) == '[';
    int line = p->line;
    p->s += aot ? 2 : 1;
    skip_ws(p);
    Key k;
    TRY(parse_key(p, &k));
    char name[512];
    key_join(&k, k.n, name, sizeof name);
    if (peek(p) != ']' || (aot && peek_at(p, 1) != ']')) {
        key_free(&k);
        return perr(p, "expected '%s' to close the table header [%s", aot ? "]]" : "]", name);
    }
    p->s += aot ? 2 : 1;
    TomlValue *t = root;
    for (int i = 0; i < k.n - 1; i++) {
        TomlKeyVal *e = table_find(t, k.part[i]);
        if (!e) {
            TomlValue *sub = new_value(TOML_TABLE, line);
            table_add(t, k.part[i], line, sub);
            k.part[i] = NULL;
            t = sub;
            continue;
        }
        TomlValue *ev = e->value;
        if (ev->type == TOML_ARRAY && (ev->flags & TF_AOT)) {
            t = ev->items[ev->n - 1];
        } else if (ev->type == TOML_TABLE && !(ev->flags & TF_INLINE)) {
            t = ev;
        } else {
            char part[512];
            key_join(&k, i + 1, part, sizeof part);
            key_free(&k);
            return perr(p,
                        "table [%s] cannot be opened: \"%s\" was already defined on line %d as %s",
                        name, part, e->line,
                        ev->type == TOML_TABLE ? "an inline table" : toml_type_name(ev->type));
        }
    }
    char *last = k.part[k.n - 1];
    TomlKeyVal *e = table_find(t, last);
    if (aot) {
        TomlValue *arr;
        if (!e) {
            arr = new_value(TOML_ARRAY, line);
            arr->flags = TF_AOT;
            table_add(t, last, line, arr);
            k.part[k.n - 1] = NULL;
        } else if (e->value->type == TOML_ARRAY && (e->value->flags & TF_AOT)) {
            arr = e->value;
        } else {
            key_free(&k);
            return perr(p, "[[%s]] cannot be an array of tables: it was already defined on line %d",
                        name, e->line);
        }
        TomlValue *elem = new_value(TOML_TABLE, line);
        elem->flags = TF_DEFINED;
        array_add(arr, elem);
        *cur = elem;
    } else {
        if (!e) {
            TomlValue *sub = new_value(TOML_TABLE, line);
            sub->flags = TF_DEFINED;
            table_add(t, last, line, sub);
            k.part[k.n - 1] = NULL;
            *cur = sub;
        } else if (e->value->type == TOML_TABLE &&
                   !(e->value->flags & (TF_DEFINED | TF_DOTTED | TF_INLINE))) {
            /* Created implicitly by an earlier [last.child] header: now defined. */
            e->value->flags |= TF_DEFINED;
            e->value->line = line;
            e->line = line;
            *cur = e->value;
        } else {
            key_free(&k);
            if (e->value->type == TOML_TABLE)
                return perr(p, "duplicate table [%s] (first defined on line %d)", name, e->line);
            return perr(p, "table [%s] cannot be opened: it was already defined on line %d as %s",
                        name, e->line, toml_type_name(e->value->type));
        }
    }
    snprintf(p->table, sizeof p->table, "%s", name);
    key_free(&k);
    return 0;
}

int toml_parse(TomlValue **root_out, const char *text, size_t len, const char *filename, Err *err) {
    Parser p = {.s = text, .end = text + len, .file = filename, .line = 1, .err = err};
    *root_out = NULL;
    TRY(check_text(&p));
    p.line = 1;
    TomlValue *root = new_value(TOML_TABLE, 1);
    root->flags = TF_DEFINED;
    TomlValue *cur = root;
    for (;;) {
        skip_ws(&p);
        skip_comment(&p);
        int nl = eat_newline(&p);
        if (nl < 0) goto fail;
        if (nl) continue;
        if (peek(&p) < 0) break;
        if (peek(&p) == '[') {
            if (parse_header(&p, root, &cur) != 0) goto fail;
        } else {
            Key k;
            int line = p.line;
            if (parse_key(&p, &k) != 0) goto fail;
            if (peek(&p) != '=') {
                char name[512];
                key_join(&k, k.n, name, sizeof name);
                key_free(&k);
                perr(&p, "expected '=' after key \"%s\"", name);
                goto fail;
            }
            p.s++;
            skip_ws(&p);
            TomlValue *v;
            if (parse_value_of(&p, &k, &v) != 0) {
                key_free(&k);
                goto fail;
            }
            if (insert_dotted(&p, cur, &k, v, line) != 0) goto fail;
        }
        skip_ws(&p);
        skip_comment(&p);
        nl = eat_newline(&p);
        if (nl < 0) goto fail;
        if (nl == 0 && peek(&p) >= 0) {
            int c = peek(&p);
            if (c >= 0x20 && c < 0x7F)
                perr(&p, "expected the end of the line, found '%c'", c);
            else
                perr(&p, "expected the end of the line, found byte 0x%02X", c);
            goto fail;
        }
    }
    *root_out = root;
    return 0;
fail:
    toml_free(root);
    return -1;
}

static int toml_parse_file_in(TomlValue **root, const char *path, Err *err) {
    char *text;
    size_t len;
    TRY(fs_read_all(path, &text, &len, err));
    int r = toml_parse(root, text, len, path, err);
    free(text);
    return r;
}

int toml_parse_file(TomlValue **root, const char *path, Err *err) {
    size_t scope = err_oom_push("reading %s", path);
    int r = toml_parse_file_in(root, path, err);
    err_oom_pop(scope);
    return r;
}

int toml_parse_value(TomlValue **out, const char *text, const char *origin, Err *err) {
    size_t len = strlen(text);
    Parser p = {.s = text, .end = text + len, .file = origin, .line = 0, .err = err};
    *out = NULL;
    TRY(check_text(&p));
    skip_ws(&p);
    TomlValue *v;
    TRY(parse_value(&p, &v));
    skip_ws(&p);
    if (p.s != p.end) {
        toml_free(v);
        return perr(&p, "unexpected text after the value: '%.40s'", p.s);
    }
    *out = v;
    return 0;
}
