/* Table of pre-tokenizer classes for non-ASCII code points (generated into unicode_classes.c
 * by tools/tokenizer_fixtures.py from HF tokenizers' own behaviour). */
#ifndef QT_UNICODE_CLASSES_H
#define QT_UNICODE_CLASSES_H

#include <stddef.h>
#include <stdint.h>

/* Classes used by the Qwen/GPT-2 split patterns: \p{L}, \p{N}, \s (Unicode White_Space, as
 * Oniguruma's \s), and everything else. Defined here, below text/utf8.h, so the table does not
 * include its user. */
enum { UC_OTHER = 0, UC_LETTER = 1, UC_NUMBER = 2, UC_SPACE = 3 };

typedef struct UnicodeRange {
    uint32_t first, last; // inclusive
    uint8_t cls;          // UC_LETTER, UC_NUMBER or UC_SPACE
} UnicodeRange;

/* Sorted, non-overlapping. */
extern const UnicodeRange UNICODE_CLASS_RANGES[];
extern const size_t UNICODE_CLASS_N_RANGES;

#endif
