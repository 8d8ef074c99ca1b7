/* Reference GEMM: straightforward loops, parallel over rows of C. A faster backend replaces
 * the body behind the same interface (see the CPU performance work). */
#include "ops/gemm.h"

void gemm_f32(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < M; i++) {
        float *c = C + (long)i * ldc;
        if (beta == 0.0f)
            for (int j = 0; j < N; j++) c[j] = 0.0f;
        else if (beta != 1.0f)
            for (int j = 0; j < N; j++) c[j] *= beta;
        for (int k = 0; k < K; k++) {
            float a = alpha * (ta ? A[(long)k * lda + i] : A[(long)i * lda + k]);
            if (!tb) {
                const float *b = B + (long)k * ldb;
                for (int j = 0; j < N; j++) c[j] += a * b[j];
            } else {
                for (int j = 0; j < N; j++) c[j] += a * B[(long)j * ldb + k];
            }
        }
    }
}
