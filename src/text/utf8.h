/* UTF-8 helpers shared by the tokenizer: decoding of already-validated text, character classes
 * for the pre-tokenizer patterns, and lossy repair of invalid UTF-8 (one U+FFFD per maximal
 * invalid subpart, as Rust's String::from_utf8_lossy and Python's errors="replace" do). */
#ifndef QT_UTF8_H
#define QT_UTF8_H

#include <stddef.h>
#include <stdint.h>

#include "text/unicode_classes.h" /* the UC_* classes */

/* Class of a code point, as HF tokenizers' regex engine sees it (see unicode_classes.c). */
int utf8_class(uint32_t cp);
/* 1 when cp has the White_Space property. */
int utf8_is_space(uint32_t cp);

/* Decodes the code point at s[i] of valid UTF-8 text; *w receives its length in bytes. */
static inline uint32_t utf8_decode(const uint8_t *s, size_t i, int *w) {
    uint32_t c = s[i];
    if (c < 0x80) {
        *w = 1;
        return c;
    }
    if (c < 0xE0) {
        *w = 2;
        return ((c & 0x1F) << 6) | (s[i + 1] & 0x3F);
    }
    if (c < 0xF0) {
        *w = 3;
        return ((c & 0x0F) << 12) | ((uint32_t)(s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
    }
    *w = 4;
    return ((c & 0x07) << 18) | ((uint32_t)(s[i + 1] & 0x3F) << 12) |
           ((uint32_t)(s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
}

/* Writes cp as UTF-8 into out (room for 4 bytes); returns the byte count. */
int utf8_encode(char *out, uint32_t cp);

/* Length of the valid UTF-8 prefix of s[0..len). */
size_t utf8_valid_prefix(const char *s, size_t len);
/* Writes s[0..len) with every maximal invalid subpart replaced by U+FFFD into out (room for
 * 3 * len bytes, no NUL written) and returns the length written. *final receives how many bytes
 * of s no byte appended to s could repair differently: all but a trailing prefix of a
 * well-formed sequence (at most 3 bytes, written as the last U+FFFD), which more bytes may
 * complete; *final_out the length of their repair. */
size_t utf8_repair_into(const char *s, size_t len, char *out, size_t *final, size_t *final_out);
/* Copies s[0..len) into a malloc'd buffer with every maximal invalid subpart replaced by
 * U+FFFD; *out_len receives the new length (a NUL follows it). */
char *utf8_repair(const char *s, size_t len, size_t *out_len);

#endif
