/* Reference embedding: row gather forward, scatter-add backward. */
#include "ops/embedding.h"

#include <omp.h>
#include <string.h>

void embedding_forward(float *out, const int32_t *tokens, const float *table, long N, int D) {
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++)
        memcpy(out + n * D, table + (long)tokens[n] * D, (size_t)D * sizeof(float));
}

void embedding_backward(float *dtable, const float *dout, const int32_t *tokens, long N, int D) {
    /* Threads split the columns, and each adds tokens in order: repeated tokens are summed in
     * the same order whatever the thread count. */
#pragma omp parallel
    {
        int tid = omp_get_thread_num(), nt = omp_get_num_threads();
        int lo = (int)((long)D * tid / nt), hi = (int)((long)D * (tid + 1) / nt);
        for (long n = 0; n < N; n++) {
            float *dst = dtable + (long)tokens[n] * D;
            const float *src = dout + n * D;
            for (int j = lo; j < hi; j++)
                dst[j] += src[j];
        }
    }
}

const EmbeddingOp embedding_reference = {
    {"reference", OP_EMBEDDING, "cpu", 0}, embedding_forward, embedding_backward};
