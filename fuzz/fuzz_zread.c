/* Fuzz target for the compressed-input reader: arbitrary bytes as a .gz stream and as a .zst
 * stream (the first byte picks which) must decode or fail with a sentence naming the input,
 * never crash, hang or read out of bounds. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/zread.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const char *name = data[0] & 1 ? "input.jsonl.zst" : "input.jsonl.gz";
    FILE *f = fmemopen((void *)(data + 1), size - 1 ? size - 1 : 1, "rb");
    if (!f) return 0;
    if (size == 1) fseek(f, 0, SEEK_END);
    ZRead *z;
    Err err;
    if (zread_open_stream(&z, f, name, &err) != 0) return 0;
    char buf[4096];
    size_t got = 0, total = 0;
    int rc;
    /* A few bytes can stand for gigabytes: stop early, the decoder's state is what is tested. */
    while ((rc = zread_read(z, buf, sizeof buf, &got, &err)) == 0 && got > 0 && total < (1u << 26))
        total += got;
    if (rc != 0 && !strstr(err.msg, name)) abort(); /* every error names the input */
    zread_close(z);
    return 0;
}
