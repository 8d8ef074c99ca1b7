/* UTF-8 validation, repair and character classes for the tokenizer. */
#include "text/utf8.h"

#include <pthread.h>
#include <string.h>

#include "core/err.h"
#include "text/unicode_classes.h"

int utf8_is_space(uint32_t cp) {
    /* The White_Space property (Unicode 6.3 and later), which Oniguruma's and Rust's \s use;
     * PCRE2's \s would also take U+180E. */
    if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
    if (cp < 0x85) return 0;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

static uint8_t bmp_class[0x10000]; // classes of U+0000..U+FFFF, filled once
static pthread_once_t bmp_once = PTHREAD_ONCE_INIT;

static void fill_bmp(void) {
    for (uint32_t cp = 0; cp < 0x80; cp++) {
        uint8_t k = UC_OTHER;
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z')
            k = UC_LETTER;
        else if (cp >= '0' && cp <= '9')
            k = UC_NUMBER;
        else if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D))
            k = UC_SPACE;
        bmp_class[cp] = k;
    }
    for (size_t i = 0; i < UNICODE_CLASS_N_RANGES; i++) {
        const UnicodeRange *r = &UNICODE_CLASS_RANGES[i];
        for (uint32_t cp = r->first; cp <= r->last && cp < 0x10000; cp++)
            bmp_class[cp] = r->cls;
    }
}

/* Classes follow HF tokenizers' regex engine (tables in unicode_classes.c), not utf8proc,
 * whose Unicode version is older. */
int utf8_class(uint32_t cp) {
    if (cp < 0x10000) {
        pthread_once(&bmp_once, fill_bmp);
        return bmp_class[cp];
    }
    size_t lo = 0, hi = UNICODE_CLASS_N_RANGES;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const UnicodeRange *r = &UNICODE_CLASS_RANGES[mid];
        if (cp < r->first)
            hi = mid;
        else if (cp > r->last)
            lo = mid + 1;
        else
            return r->cls;
    }
    return UC_OTHER;
}

int utf8_encode(char *out, uint32_t cp) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of the well-formed sequence at s[i] (0 when it is not one); *bad receives how many
 * bytes the maximal invalid subpart spans when it is not. */
static int seq_len(const uint8_t *s, size_t len, size_t i, size_t *bad) {
    uint8_t c = s[i];
    if (c < 0x80) return 1;
    int need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        need = 1;
    else if (c == 0xE0)
        need = 2, lo = 0xA0;
    else if (c >= 0xE1 && c <= 0xEC)
        need = 2;
    else if (c == 0xED)
        need = 2, hi = 0x9F;
    else if (c >= 0xEE && c <= 0xEF)
        need = 2;
    else if (c == 0xF0)
        need = 3, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3)
        need = 3;
    else if (c == 0xF4)
        need = 3, hi = 0x8F;
    else {
        *bad = 1;
        return 0;
    }
    size_t k = 1;
    for (int j = 0; j < need; j++, k++) {
        if (i + k >= len) break;
        uint8_t b = s[i + k];
        if (j == 0 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) break;
        if (j == need - 1) return need + 1;
    }
    *bad = k;
    return 0;
}

size_t utf8_valid_prefix(const char *str, size_t len) {
    const uint8_t *s = (const uint8_t *)str;
    size_t i = 0, bad;
    while (i < len) {
        while (i + 8 <= len) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= len) break;
        int n = seq_len(s, len, i, &bad);
        if (n == 0) return i;
        i += (size_t)n;
    }
    return len;
}

size_t utf8_repair_into(const char *str, size_t len, char *out, size_t *final, size_t *final_out) {
    const uint8_t *s = (const uint8_t *)str;
    size_t i = 0, o = 0, bad;
    *final = len;
    while (i < len) {
        int n = seq_len(s, len, i, &bad);
        if (n > 0) {
            memcpy(out + o, s + i, (size_t)n);
            o += (size_t)n;
            i += (size_t)n;
            continue;
        }
        /* A sequence that only the end of s cut short: more bytes may complete it. */
        if (s[i] >= 0xC2 && s[i] <= 0xF4 && i + bad == len && *final == len) {
            *final = i;
            *final_out = o;
        }
        o += (size_t)utf8_encode(out + o, 0xFFFD);
        i += bad;
    }
    if (*final == len) *final_out = o;
    return o;
}

char *utf8_repair(const char *str, size_t len, size_t *out_len) {
    char *out = xmalloc(len * 3 + 1);
    size_t final, final_out;
    *out_len = utf8_repair_into(str, len, out, &final, &final_out);
    out[*out_len] = 0;
    return out;
}
