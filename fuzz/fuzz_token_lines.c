/* Fuzzes the token-id line parser (qtitan eval --tokens): arbitrary bytes must parse into ids
 * inside the vocabulary with consistent line offsets, or fail with a sentence naming the
 * file. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/token_lines.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = 0;
    TokenLines t;
    Err err;
    err.msg[0] = 0;
    if (token_lines_parse(&t, text, size, "fuzz.txt", 1000, 64, &err) == 0) {
        if (t.n < 1 || t.start[0] != 0 || t.start[t.n] != t.total) abort();
        for (int l = 0; l < t.n; l++)
            if (t.start[l + 1] <= t.start[l] || t.start[l + 1] - t.start[l] > 64) abort();
        for (long i = 0; i < t.total; i++)
            if (t.ids[i] < 0 || t.ids[i] >= 1000) abort();
        token_lines_free(&t);
    } else if (strncmp(err.msg, "fuzz.txt", 8) != 0) {
        abort();
    }
    free(text);
    return 0;
}
