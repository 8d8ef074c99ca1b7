/* A growable byte string, always NUL-terminated after its n bytes (which may hold NUL). */
#ifndef QT_STRBUF_H
#define QT_STRBUF_H

#include <stddef.h>

typedef struct StrBuf {
    char *p; /* NULL until the first append */
    size_t n, cap;
} StrBuf;

void strbuf_add(StrBuf *b, const char *s, size_t n);
void strbuf_lit(StrBuf *b, const char *s);
void strbuf_printf(StrBuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* s (n bytes) as a JSON string literal, escaped as Python's json.dumps(ensure_ascii=False) and
 * serde_json escape it: backslash, quote and \b \f \n \r \t; other bytes below 0x20 as \u00XX;
 * everything else, UTF-8 included, as it is. */
void strbuf_json_string(StrBuf *b, const char *s, size_t n);
void strbuf_free(StrBuf *b);

#endif
