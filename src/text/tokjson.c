/* Strict scanner for model.vocab and model.merges of a tokenizer.json (see tokjson.h). It
 * accepts only well-formed JSON in those two values: strings with valid escapes and valid
 * UTF-8 (no NUL, no lone surrogates), integer ids, "a b" or ["a", "b"] merges; anything else
 * declines so that jansson reports it. */
#include "text/tokjson.h"

#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "text/utf8.h"

typedef struct Scan {
    const char *p, *end;
    char *blob; // output for decoded strings
    size_t blob_n;
} Scan;

static void ws(Scan *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t'))
        s->p++;
}

static int hex4(const char *p, uint32_t *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return 0;
        *v = *v << 4 | (uint32_t)d;
    }
    return 1;
}

/* Skips a string starting at '"' without decoding; 0 on malformed input. */
static int skip_string(Scan *s) {
    const char *p = s->p + 1;
    for (;;) {
        const char *q = memchr(p, '"', (size_t)(s->end - p));
        if (!q) return 0;
        /* The quote ends the string unless an odd number of backslashes precede it. */
        size_t bs = 0;
        while (q - bs > p && q[-1 - (ptrdiff_t)bs] == '\\')
            bs++;
        p = q + 1;
        if (bs % 2 == 0) {
            s->p = p;
            return 1;
        }
    }
}

/* Decodes a string at '"' into the blob; *out / *len receive it. 0 when it declines. */
static int read_string(Scan *s, const char **out, uint32_t *len) {
    if (s->p >= s->end || *s->p != '"') return 0;
    s->p++;
    char *o = s->blob + s->blob_n, *start = o;
    for (;;) {
        const char *q = s->p;
        while (q < s->end && *q != '"' && *q != '\\' && (uint8_t)*q >= 0x20)
            q++;
        if (q >= s->end) return 0;
        size_t n = (size_t)(q - s->p);
        if (utf8_valid_prefix(s->p, n) != n) return 0;
        memcpy(o, s->p, n);
        o += n;
        s->p = q + 1;
        if (*q == '"') break;
        if (*q != '\\' || s->p >= s->end) return 0;
        char e = *s->p++;
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) {
            *o++ = "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
            continue;
        }
        uint32_t cp, lo;
        if (e != 'u' || s->end - s->p < 4 || !hex4(s->p, &cp)) return 0;
        s->p += 4;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (s->end - s->p < 6 || s->p[0] != '\\' || s->p[1] != 'u' || !hex4(s->p + 2, &lo) ||
                lo < 0xDC00 || lo > 0xDFFF)
                return 0;
            s->p += 6;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if ((cp >= 0xDC00 && cp <= 0xDFFF) || cp == 0) {
            return 0;
        }
        o += utf8_encode(o, cp);
    }
    *out = start;
    *len = (uint32_t)(o - start);
    *o++ = 0;
    s->blob_n = (size_t)(o - s->blob);
    return 1;
}

/* Skips any value (structure only: jansson checks everything outside the two fast values). */
static int skip_value(Scan *s, int depth) {
    ws(s);
    if (s->p >= s->end || depth > 64) return 0;
    char c = *s->p;
    if (c == '"') return skip_string(s);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        s->p++;
        ws(s);
        if (s->p < s->end && *s->p == close) {
            s->p++;
            return 1;
        }
        for (;;) {
            if (c == '{') {
                ws(s);
                if (s->p >= s->end || *s->p != '"' || !skip_string(s)) return 0;
                ws(s);
                if (s->p >= s->end || *s->p++ != ':') return 0;
            }
            if (!skip_value(s, depth + 1)) return 0;
            ws(s);
            if (s->p >= s->end) return 0;
            if (*s->p == ',') {
                s->p++;
                continue;
            }
            if (*s->p++ != close) return 0;
            return 1;
        }
    }
    while (s->p < s->end && strchr(",]}: \t\r\n", *s->p) == NULL)
        s->p++;
    return 1;
}

static int read_vocab(Scan *s, TokJson *tj) {
    size_t cap = 1024;
    tj->vocab = xmalloc(cap * sizeof *tj->vocab);
    ws(s);
    if (s->p >= s->end || *s->p++ != '{') return 0;
    ws(s);
    if (s->p < s->end && *s->p == '}') {
        s->p++;
        return 1;
    }
    for (;;) {
        if (tj->n_vocab == cap) tj->vocab = xrealloc(tj->vocab, (cap *= 2) * sizeof *tj->vocab);
        TokVocab *v = &tj->vocab[tj->n_vocab++];
        ws(s);
        if (!read_string(s, &v->s, &v->len)) return 0;
        ws(s);
        if (s->p >= s->end || *s->p++ != ':') return 0;
        ws(s);
        /* Ids are small non-negative integers; anything else goes to jansson's error path. */
        int64_t id = 0;
        const char *d = s->p;
        while (s->p < s->end && *s->p >= '0' && *s->p <= '9' && s->p - d < 9)
            id = id * 10 + (*s->p++ - '0');
        if (s->p == d || (s->p - d > 1 && *d == '0')) return 0;
        v->id = id;
        ws(s);
        if (s->p >= s->end) return 0;
        char c = *s->p++;
        if (c == '}') return 1;
        if (c != ',') return 0;
    }
}

static int read_merges(Scan *s, TokJson *tj) {
    size_t cap = 1024;
    tj->merges = xmalloc(cap * sizeof *tj->merges);
    ws(s);
    if (s->p >= s->end || *s->p++ != '[') return 0;
    ws(s);
    if (s->p < s->end && *s->p == ']') {
        s->p++;
        return 1;
    }
    for (;;) {
        if (tj->n_merges == cap) tj->merges = xrealloc(tj->merges, (cap *= 2) * sizeof *tj->merges);
        TokMerge *m = &tj->merges[tj->n_merges++];
        ws(s);
        if (s->p < s->end && *s->p == '"') {
            const char *str;
            uint32_t n;
            if (!read_string(s, &str, &n)) return 0;
            const char *sp = memchr(str, ' ', n);
            /* Exactly one space with text on both sides; other shapes get jansson's error. */
            if (!sp || sp == str || sp + 1 == str + n ||
                memchr(sp + 1, ' ', n - (size_t)(sp - str) - 1))
                return 0;
            m->a = str;
            m->la = (uint32_t)(sp - str);
            m->b = sp + 1;
            m->lb = n - m->la - 1;
        } else {
            if (s->p >= s->end || *s->p++ != '[') return 0;
            ws(s);
            if (!read_string(s, &m->a, &m->la)) return 0;
            ws(s);
            if (s->p >= s->end || *s->p++ != ',') return 0;
            ws(s);
            if (!read_string(s, &m->b, &m->lb)) return 0;
            ws(s);
            if (s->p >= s->end || *s->p++ != ']') return 0;
        }
        ws(s);
        if (s->p >= s->end) return 0;
        char c = *s->p++;
        if (c == ']') return 1;
        if (c != ',') return 0;
    }
}

/* Finds the values of keys[0..n) in the object at s->p; their spans go to vs[] and ve[]. */
static int find_keys(Scan *s, const char *const *keys, int n, const char **vs, const char **ve) {
    ws(s);
    if (s->p >= s->end || *s->p++ != '{') return 0;
    for (int k = 0; k < n; k++)
        vs[k] = NULL;
    for (;;) {
        ws(s);
        if (s->p >= s->end || *s->p != '"') return 0;
        const char *key = s->p + 1;
        if (!skip_string(s)) return 0;
        size_t kl = (size_t)(s->p - 1 - key);
        ws(s);
        if (s->p >= s->end || *s->p++ != ':') return 0;
        ws(s);
        const char *start = s->p;
        if (!skip_value(s, 0)) return 0;
        for (int k = 0; k < n; k++) {
            if (strlen(keys[k]) != kl || memcmp(key, keys[k], kl) != 0) continue;
            if (vs[k]) return 0; /* a repeated key goes to jansson for its error */
            vs[k] = start;
            ve[k] = s->p;
        }
        ws(s);
        if (s->p >= s->end) return 0;
        char c = *s->p++;
        if (c == '}') break;
        if (c != ',') return 0;
    }
    for (int k = 0; k < n; k++)
        if (!vs[k]) return 0;
    return 1;
}

void tokjson_free(TokJson *tj) {
    free(tj->rest);
    free(tj->blob);
    free(tj->vocab);
    free(tj->merges);
    memset(tj, 0, sizeof *tj);
}

int tokjson_split(TokJson *tj, const char *data, size_t len) {
    memset(tj, 0, sizeof *tj);
    Scan s = {data, data + len, NULL, 0};
    const char *const top[1] = {"model"}, *const inner[2] = {"vocab", "merges"};
    const char *ms, *me, *spans[2], *ends[2];
    if (!find_keys(&s, top, 1, &ms, &me)) return 0;
    s.p = ms;
    s.end = me;
    if (!find_keys(&s, inner, 2, spans, ends)) return 0;
    const char *vs = spans[0], *ve = ends[0], *gs = spans[1], *ge = ends[1];
    /* Decoded strings are never longer than their JSON form (plus a NUL each). */
    s.blob = tj->blob = xmalloc((size_t)(ve - vs) + (size_t)(ge - gs) + 16);
    s.p = vs;
    s.end = ve;
    int ok = read_vocab(&s, tj);
    ws(&s);
    ok = ok && s.p == ve;
    s.p = gs;
    s.end = ge;
    ok = ok && read_merges(&s, tj);
    ws(&s);
    ok = ok && s.p == ge;
    if (!ok) {
        tokjson_free(tj);
        return 0;
    }
    /* The rest: the two spans become {} and [] (in file order). */
    const char *a = vs < gs ? vs : gs, *ae = vs < gs ? ve : ge, *b = vs < gs ? gs : vs,
               *be = vs < gs ? ge : ve;
    const char *ra = vs < gs ? "{}" : "[]", *rb = vs < gs ? "[]" : "{}";
    tj->rest = xmalloc(len + 8);
    size_t n = 0;
    memcpy(tj->rest + n, data, (size_t)(a - data));
    n += (size_t)(a - data);
    memcpy(tj->rest + n, ra, 2);
    n += 2;
    memcpy(tj->rest + n, ae, (size_t)(b - ae));
    n += (size_t)(b - ae);
    memcpy(tj->rest + n, rb, 2);
    n += 2;
    memcpy(tj->rest + n, be, (size_t)(data + len - be));
    n += (size_t)(data + len - be);
    tj->rest[n] = 0;
    tj->rest_len = n;
    return 1;
}
