/* Fuzz target for the tokenizer.json loader: any bytes either load or fail with an error
 * sentence that names the file; the fast vocab/merges reader and the all-jansson path must
 * agree on success and on the ids of a fixed text. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"
#include "text/tokjson.h"

static const char text[] = "Hello world, it's 2024!\n\n  \xe4\xb8\xad\xe6\x96\x87 <|endoftext|>";

/* Encodes the fixed text; returns its ids (n in *n) or NULL when encoding failed. */
static uint32_t *encode(const Tokenizer *t, size_t *n) {
    Err err;
    IdVec ids = {0};
    if (tokenizer_encode(t, text, sizeof text - 1, &ids, &err) != 0) __builtin_trap();
    for (size_t i = 0; i < ids.n; i++)
        if (ids.ids[i] >= tokenizer_vocab_size(t)) __builtin_trap();
    char *out;
    size_t len;
    if (tokenizer_decode(t, ids.ids, ids.n, &out, &len, &err) == 0) free(out);
    *n = ids.n;
    return ids.ids;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Err err, err2;
    Tokenizer *t = tokenizer_load_mem((const char *)data, size, "fuzz.json", &err);
    Tokenizer *j = tokenizer_load_mem_jansson((const char *)data, size, "fuzz.json", &err2);
    if (!t != !j) __builtin_trap();
    if (!t) {
        if (!strstr(err.msg, "fuzz.json") || !strstr(err2.msg, "fuzz.json")) __builtin_trap();
        return 0;
    }
    if (tokenizer_vocab_size(t) != tokenizer_vocab_size(j)) __builtin_trap();
    size_t n1, n2;
    uint32_t *a = encode(t, &n1), *b = encode(j, &n2);
    if (n1 != n2 || (n1 && memcmp(a, b, n1 * sizeof *a) != 0)) __builtin_trap();
    free(a);
    free(b);
    tokenizer_free(t);
    tokenizer_free(j);
    return 0;
}
