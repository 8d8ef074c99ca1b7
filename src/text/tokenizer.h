/* Byte-level BPE tokenizer loaded from an HF tokenizer.json (Qwen2/Qwen3, GPT-2 style).
 * Encoding gives the same ids as HF `tokenizers` encode(text, add_special_tokens=False). */
#ifndef QT_TOKENIZER_H
#define QT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "text/idvec.h"

typedef struct Tokenizer Tokenizer;

/* path: a tokenizer.json file or a directory holding one. */
Tokenizer *tokenizer_load(const char *path, Err *err);
/* The same from len bytes of tokenizer.json text; `name` stands for the file in errors and is
 * what tokenizer_path returns. */
Tokenizer *tokenizer_load_mem(const char *data, size_t len, const char *name, Err *err);
void tokenizer_free(Tokenizer *t);
/* The merge table of a loaded tokenizer (text/bpe.h; tests compare the two merge algorithms on
 * it). */
const struct Bpe *tokenizer_bpe(const Tokenizer *t);
/* Appends the ids of text[0..len) to out. Thread-safe for concurrent calls on one tokenizer. */
int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, IdVec *out, Err *err);
/* Decodes ids into a malloc'd UTF-8 string (*len excludes the NUL). */
int tokenizer_decode(const Tokenizer *t, const uint32_t *ids, size_t n, char **text, size_t *len,
                     Err *err);
/* Decoding one id at a time: after each push, text is what tokenizer_decode gives for all the
 * ids pushed so far. Only the bytes that can still change are redone, and the buffers grow
 * geometrically, so a push costs the new token's bytes and allocates nothing once they are
 * large enough. */
typedef struct DecodeStream {
    char *text;   /* NUL-terminated (malloc'd) */
    size_t len;   /* bytes of text */
    size_t final; /* text[0..final) stays as it is whatever ids come next; text[final..len) is
                   * empty or the U+FFFD of a character that the bytes pushed so far cut short */
    size_t cap;
    char *raw; /* the decoded bytes behind text[final..len) */
    size_t raw_len, raw_cap;
    size_t n; /* ids pushed */
} DecodeStream;

/* An empty stream with room for reserve bytes of text. */
void decode_stream_init(DecodeStream *s, size_t reserve);
/* Appends id's text (an id without a token is an error, as in tokenizer_decode). */
int decode_stream_push(DecodeStream *s, const Tokenizer *t, uint32_t id, Err *err);
void decode_stream_free(DecodeStream *s);
/* Number of ids (regular + added tokens), i.e. the smallest embedding size that fits. */
uint32_t tokenizer_vocab_size(const Tokenizer *t);
/* 1 when id has a token (ids below the vocab size may still be holes). */
int tokenizer_has_id(const Tokenizer *t, uint32_t id);
/* Id of a token string (regular or added), or -1. */
int64_t tokenizer_token_id(const Tokenizer *t, const char *token);
/* Hash of the tokenizer.json bytes: the dataset cache is valid only for the same hash. */
uint64_t tokenizer_hash(const Tokenizer *t);
/* Path of the tokenizer.json that was loaded. */
const char *tokenizer_path(const Tokenizer *t);

#endif
