/* Fuzzes a layout.json slice entry (train/shard_slice.h): any bytes must parse to a checked
 * slice or give a clean error, and a slice that parses is copied back whole from itself
 * without reading past its data. */
#include <stdint.h>
#include <stdlib.h>

#include "train/shard_slice.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *j = json_loadb((const char *)data, size, 0, NULL);
    if (!j) return 0;
    ShardSlice s;
    Err err;
    if (shard_slice_from_json(j, &s, "fuzz", "w", &err) == 0 && s.numel <= 4096) {
        float *in = calloc((size_t)s.numel, sizeof *in),
              *out = calloc((size_t)s.numel, sizeof *out);
        ShardSource src = {s, in, "fuzz"};
        if (shard_copy(&s, out, &src, 1, "w", &err) != 0) abort(); /* a slice holds itself */
        free(in), free(out);
    }
    json_decref(j);
    return 0;
}
