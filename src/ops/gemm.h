/* The one GEMM interface every matmul goes through (forward and both backward products).
 * Row-major: C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C, where op(X) is X or X^T
 * (ta / tb). lda, ldb, ldc are row strides of A, B, C as stored. beta = 1 accumulates, which
 * parameter gradients use. */
#ifndef QT_GEMM_H
#define QT_GEMM_H

void gemm_f32(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc);

#endif
