/* Fuzzes the prompt-file splitter (qtitan generate --prompt-file, [sample] prompt_file):
 * arbitrary bytes must split into non-blank prompts, each a whole line of the input (less
 * one CR before its end) in order, or fail with a sentence naming the file. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/prompt_lines.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    PromptLines p;
    Err err;
    err.msg[0] = 0;
    if (prompt_lines_split(&p, (const char *)data, size, "fuzz.txt", &err) != 0) {
        if (strncmp(err.msg, "fuzz.txt", 8) != 0 || p.n != 0 || p.data) abort();
        return 0;
    }
    if (p.n < 1) abort();
    size_t at = 0; /* where the previous prompt ended in the input */
    for (int i = 0; i < p.n; i++) {
        const char *t = p.text[i];
        size_t l = strlen(t), off = (size_t)(t - p.data);
        if (off < at || off + l > size || memcmp(t, data + off, l) != 0) abort();
        if (strchr(t, '\n') || strspn(t, " \t") == l) abort();
        /* A prompt ends at its line end: "\n", "\r\n", a CR at the end, or the end. */
        size_t e = off + l;
        if (e < size && data[e] == '\r') e++;
        if (e < size && data[e] != '\n') abort();
        at = e;
    }
    prompt_lines_free(&p);
    return 0;
}
