/* Pre-tokenizer splits: the Qwen2/Qwen3 pattern as a hand-written linear-time scanner, and any
 * other Split pattern through PCRE2 (UTF + UCP). Both take valid UTF-8 and report the pieces
 * (matches and the gaps between them, the "Isolated" behaviour) in order. */
#ifndef QT_PRETOK_H
#define QT_PRETOK_H

#include <stddef.h>

#include "core/err.h"

/* The split pattern of the Qwen2/Qwen3 tokenizer.json, as written there. */
extern const char PRETOK_QWEN_PATTERN[];
/* The GPT-2 pattern that ByteLevel(use_regex=true) applies. */
extern const char PRETOK_GPT2_PATTERN[];

/* Receives one piece s[0..len); returns 0 to go on or -1 to stop with an error. */
typedef int (*PieceFn)(void *ctx, const char *s, size_t len);

/* Splits s[0..len) with the Qwen pattern (ends of pieces only; the pattern matches every
 * character, so there are no gaps). Linear in len. */
int pretok_qwen(const char *s, size_t len, PieceFn fn, void *ctx);

typedef struct PretokRegex PretokRegex;
/* Compiles an Oniguruma-style pattern for PCRE2; `what` names the source in errors. */
PretokRegex *pretok_regex_compile(const char *pattern, const char *what, Err *err);
void pretok_regex_free(PretokRegex *re);
/* Splits with the regex: matches and the non-empty gaps between them, in order. */
int pretok_regex_split(const PretokRegex *re, const char *s, size_t len, PieceFn fn, void *ctx,
                       Err *err);

#endif
