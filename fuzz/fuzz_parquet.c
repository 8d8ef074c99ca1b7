/* libFuzzer target: arbitrary bytes as a Parquet file, read for its "text" column. Every input
 * must open and read, or fail with a sentence naming the file; every value read must lie
 * inside the input or inside a buffer the reader owns (ASan checks the reads). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/parquet.h"

static volatile size_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Parquet *pq;
    Err err;
    if (parquet_open(&pq, data, size, "fuzz.parquet", "text", &err) != 0) {
        if (strncmp(err.msg, "fuzz.parquet: ", 14) != 0) abort();
        return 0;
    }
    size_t sum = 0;
    for (int g = 0; g < parquet_row_groups(pq); g++) {
        const ParquetStr *v;
        int64_t n;
        if (parquet_read_group(pq, g, &v, &n, &err) != 0) {
            if (strncmp(err.msg, "fuzz.parquet: ", 14) != 0) abort();
            break;
        }
        for (int64_t i = 0; i < n; i++)
            for (size_t k = 0; k < v[i].n; k++)
                sum += (unsigned char)v[i].p[k];
    }
    parquet_close(pq);
    sink = sum; /* every byte was read; the sink keeps the loop */
    return 0;
}
