/* The one GEMM interface every matmul goes through (forward and both backward products).
 * Row-major: C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C, where op(X) is X or X^T
 * (ta / tb). lda, ldb, ldc are row strides of A, B, C as stored. beta = 1 accumulates, which
 * parameter gradients use; beta = 0 never reads C (NaN or garbage there does not leak in).
 *
 * Backends (chosen once, logged once; QT_GEMM=auto|dnnl|sgemm|ref forces one for debugging):
 *   auto   the default: fp32 through dnnl_sgemm, bf16 through oneDNN matmul primitives. On
 *          the model's real products sgemm is as fast as matmul or faster, and matmul falls
 *          to 20-30% of peak when a row stride is a multiple of 4 KiB (w2's dX and dW with
 *          F = 3072: bench/README.md "GEMM"); matmul is the only route to AMX for bf16.
 *   dnnl   oneDNN matmul primitives, cached per (dtype, shape, transposition, strides, alpha,
 *          beta); fp32 and bf16 (bf16 needs AVX512_BF16 or oneDNN's AVX-512 emulation).
 *   sgemm  oneDNN's dnnl_sgemm (fp32 only; bf16 goes through the fp32 conversion fallback).
 *   ref    the plain loops below (gemm_f32_ref); the numerical truth in tests.
 * Results are bitwise reproducible run to run for a fixed thread count and fixed shapes, also
 * across buffer alignment (tests/test_gemm.c checks it); a different OMP_NUM_THREADS may change
 * the summation order and so the last bits (measured: oneDNN bf16 and dnnl_sgemm do, see
 * bench/README.md). Thread-safe: any number of threads may call concurrently. */
#ifndef QT_GEMM_H
#define QT_GEMM_H

#include <stdint.h>

void gemm_f32(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc);

/* A and B hold bf16 bit patterns; accumulation and C are fp32. Same flags and beta rules. */
void gemm_bf16(int ta, int tb, int M, int N, int K, float alpha, const uint16_t *A, int lda,
               const uint16_t *B, int ldb, float beta, float *C, int ldc);

/* Plain loops, parallel over rows of C: slow, obviously correct. */
void gemm_f32_ref(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, float beta, float *C, int ldc);

/* Selects a backend by name ("auto", "dnnl", "sgemm", "ref") for tests and benchmarks; returns -1
 * for an unknown name. Not thread-safe against concurrent GEMMs. */
int gemm_set_backend(const char *name);
/* The active backend's one-line description, e.g. "oneDNN 2.6.3 matmul (fp32, bf16)". */
const char *gemm_backend_name(void);

#endif
