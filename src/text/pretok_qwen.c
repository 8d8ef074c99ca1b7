/* The Qwen2/Qwen3 pre-tokenizer pattern
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 *   \s*[\r\n]+|\s+(?!\S)|\s+
 * as a scanner that decides each match from the first alternative that succeeds, the way a
 * backtracking engine does, but without backtracking: every match is found in time linear in
 * its length, so long runs of one character or of newlines stay linear. Tested against PCRE2
 * running the same pattern (tests/test_tokenizer.c). */
#include "text/pretok.h"

#include <stdint.h>

#include "text/utf8.h"

const char PRETOK_QWEN_PATTERN[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char PRETOK_GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* Class of the character at s[i] (i < n); *w receives its length. */
static inline int class_at(const uint8_t *s, size_t i, int *w) {
    if (s[i] < 0x80) {
        *w = 1;
        return utf8_class(s[i]);
    }
    return utf8_class(utf8_decode(s, i, w));
}

/* End of the run of characters of class k starting at i. */
static size_t run_end(const uint8_t *s, size_t n, size_t i, int k) {
    int w;
    while (i < n && class_at(s, i, &w) == k)
        i += (size_t)w;
    return i;
}

/* Lower-cased ASCII letter at s[i] for the case-insensitive contractions; U+017F (long s)
 * folds to 's' under Unicode simple case folding, which Oniguruma applies. Returns 0 for
 * anything else; *w receives the byte length. */
static int fold_at(const uint8_t *s, size_t n, size_t i, int *w) {
    if (i >= n) return 0;
    *w = 1;
    if (s[i] < 0x80) return (s[i] >= 'A' && s[i] <= 'Z') ? s[i] + 32 : s[i];
    if (i + 1 < n && s[i] == 0xC5 && s[i + 1] == 0xBF) {
        *w = 2;
        return 's';
    }
    return 0;
}

/* End of a contraction ('s 't 're 've 'm 'll 'd in any case) at i, or 0. */
static size_t contraction(const uint8_t *s, size_t n, size_t i) {
    int w1, w2;
    int a = fold_at(s, n, i + 1, &w1);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 1 + (size_t)w1;
    int b = fold_at(s, n, i + 1 + (size_t)w1, &w2);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return i + 1 + (size_t)w1 + (size_t)w2;
    return 0;
}

static size_t newlines_end(const uint8_t *s, size_t n, size_t i) {
    while (i < n && (s[i] == '\r' || s[i] == '\n'))
        i++;
    return i;
}

int pretok_qwen(const char *text, size_t n, PieceFn fn, void *ctx) {
    const uint8_t *s = (const uint8_t *)text;
    size_t i = 0;
    while (i < n) {
        int w, w2;
        uint32_t c = s[i] < 0x80 ? (w = 1, s[i]) : utf8_decode(s, i, &w);
        int k = utf8_class(c);
        size_t next = i + (size_t)w, end = 0;
        if (c == '\'') end = contraction(s, n, i);
        if (end) {
        } else if (k == UC_LETTER) {
            end = run_end(s, n, next, UC_LETTER);
        } else if (c != '\r' && c != '\n' && k != UC_NUMBER && next < n &&
                   class_at(s, next, &w2) == UC_LETTER) {
            end = run_end(s, n, next, UC_LETTER);
        } else if (k == UC_NUMBER) {
            end = next;
        } else if (k == UC_OTHER) {
            end = newlines_end(s, n, run_end(s, n, next, UC_OTHER));
        } else if (c == ' ' && next < n && class_at(s, next, &w2) == UC_OTHER) {
            end = newlines_end(s, n, run_end(s, n, next, UC_OTHER));
        } else {
            /* A whitespace run [i, j): \s*[\r\n]+ ends after its last newline; otherwise
             * \s+(?!\S) leaves the last character for the next match unless the run ends the
             * text; a single character falls to \s+. */
            size_t j = i, last_nl = SIZE_MAX, last_start = i;
            while (j < n) {
                int cw;
                if (class_at(s, j, &cw) != UC_SPACE) break;
                if (s[j] == '\r' || s[j] == '\n') last_nl = j;
                last_start = j;
                j += (size_t)cw;
            }
            if (last_nl != SIZE_MAX)
                end = last_nl + 1;
            else if (j == n || last_start == i)
                end = j;
            else
                end = last_start;
        }
        if (fn(ctx, text + i, end - i) != 0) return -1;
        i = end;
    }
    return 0;
}
