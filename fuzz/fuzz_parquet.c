/* libFuzzer target: arbitrary bytes as a Parquet file, read for its "text" column and for the
 * conversations of its "messages" column and the rows of instruction / input / output columns.
 * Every input must read, or fail with a sentence naming the file; every value read must lie inside
 * the input or inside a buffer the reader owns (ASan checks the reads). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/parquet.h"

static volatile size_t sink;

static size_t touch(const ParquetStr *v) {
    size_t sum = 0;
    for (size_t k = 0; v->p && k < v->n; k++)
        sum += (unsigned char)v->p[k];
    return sum;
}

static int conversation(void *ctx, int64_t row, const ParquetStr *roles, const ParquetStr *contents,
                        const ParquetStr *reasonings, const json_t *const *tool_calls, int64_t n,
                        Err *err) {
    (void)row, (void)err;
    size_t *sum = ctx;
    for (int64_t i = 0; i < n; i++) {
        *sum += touch(&roles[i]) + touch(&contents[i]) + touch(&reasonings[i]);
        /* Tool calls are an array of calls (objects or nulls), each string read whole. */
        if (!tool_calls[i]) continue;
        if (!json_is_array(tool_calls[i])) abort();
        char *text = json_dumps(tool_calls[i], JSON_ENCODE_ANY);
        if (!text) abort();
        *sum += strlen(text);
        free(text);
    }
    return 0;
}

static int batch(void *ctx, const ParquetStr *v, int64_t n, Err *err) {
    (void)err;
    size_t *sum = ctx;
    for (int64_t i = 0; i < n; i++)
        *sum += touch(&v[i]);
    return 0;
}

static int row(void *ctx, int64_t r, const ParquetStr *vals, Err *err) {
    (void)r, (void)err;
    size_t *sum = ctx;
    for (int k = 0; k < 3; k++)
        *sum += touch(&vals[k]);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Parquet *pq;
    Err err;
    size_t sum = 0;
    /* Conversations under both list names (ShareGPT's "conversations" of {from, value}). */
    static const char *const lists[] = {"messages", "conversations"};
    for (int l = 0; l < 2; l++)
        if (parquet_read_conversations(data, size, "fuzz.parquet", lists[l], conversation, &sum,
                                       &err) != 0 &&
            strncmp(err.msg, "fuzz.parquet: ", 14) != 0)
            abort();
    const char *cols[3] = {"instruction", "input", "output"};
    const int required[3] = {1, 0, 1};
    if (parquet_read_rows(data, size, "fuzz.parquet", cols, required, 3, row, &sum, &err) != 0 &&
        strncmp(err.msg, "fuzz.parquet: ", 14) != 0)
        abort();
    if (parquet_open(&pq, data, size, "fuzz.parquet", "text", &err) != 0) {
        if (strncmp(err.msg, "fuzz.parquet: ", 14) != 0) abort();
        sink = sum;
        return 0;
    }
    for (int g = 0; g < parquet_row_groups(pq); g++)
        if (parquet_stream_group(pq, g, batch, &sum, &err) != 0 &&
            strncmp(err.msg, "fuzz.parquet: ", 14) != 0)
            abort();
    for (int g = 0; g < parquet_row_groups(pq); g++) {
        const ParquetStr *v;
        int64_t n;
        if (parquet_read_group(pq, g, &v, &n, &err) != 0) {
            if (strncmp(err.msg, "fuzz.parquet: ", 14) != 0) abort();
            break;
        }
        for (int64_t i = 0; i < n; i++)
            sum += touch(&v[i]);
    }
    parquet_close(pq);
    sink = sum; /* every byte was read; the sink keeps the loop */
    return 0;
}
