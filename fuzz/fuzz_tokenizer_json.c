/* Fuzz target for the tokenizer.json loader: any bytes either load or fail with an error
 * sentence that names the file; a loaded tokenizer must encode and decode a fixed text. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Err err;
    Tokenizer *t = tokenizer_load_mem((const char *)data, size, "fuzz.json", &err);
    if (!t) {
        if (!strstr(err.msg, "fuzz.json")) __builtin_trap();
        return 0;
    }
    static const char text[] =
        "Hello world, it's 2024!\n\n  \xe4\xb8\xad\xe6\x96\x87 <|endoftext|>";
    IdVec ids = {0};
    if (tokenizer_encode(t, text, sizeof text - 1, &ids, &err) == 0) {
        for (size_t i = 0; i < ids.n; i++)
            if (ids.ids[i] >= tokenizer_vocab_size(t)) __builtin_trap();
        char *out;
        size_t len;
        if (tokenizer_decode(t, ids.ids, ids.n, &out, &len, &err) == 0) free(out);
    }
    idvec_free(&ids);
    tokenizer_free(t);
    return 0;
}
