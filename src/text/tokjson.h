/* Fast path for the two large values of a tokenizer.json, model.vocab and model.merges (most
 * of an 11 MB Qwen file): they are read by a strict scanner straight into flat arrays, and the
 * rest of the document, with those two values replaced by {} and [], goes through jansson.
 * Anything the scanner does not expect makes it decline, and the loader then parses the whole
 * file with jansson, which gives the exact error; so jansson remains the judge of the JSON. */
#ifndef QT_TOKJSON_H
#define QT_TOKJSON_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

typedef struct TokVocab {
    const char *s; // decoded token text (points into TokJson.blob or a jansson string)
    uint32_t len;
    int64_t id;
} TokVocab;

typedef struct TokMerge {
    const char *a, *b; // the two token texts
    uint32_t la, lb;
} TokMerge;

typedef struct TokJson {
    char *rest; // the document with model.vocab -> {} and model.merges -> [] (NUL-terminated)
    size_t rest_len;
    char *blob; // decoded strings
    TokVocab *vocab;
    size_t n_vocab;
    TokMerge *merges;
    size_t n_merges;
} TokJson;

/* Returns 1 and fills tj when the fast path applies, 0 when it declines (tj is then empty). */
int tokjson_split(TokJson *tj, const char *data, size_t len);
void tokjson_free(TokJson *tj);

/* The tokenizer loader with the whole file through jansson, for differential tests of the
 * fast path (defined in tokenizer.c). */
struct Tokenizer;
struct Tokenizer *tokenizer_load_mem_jansson(const char *data, size_t len, const char *name,
                                             Err *err);

#endif
