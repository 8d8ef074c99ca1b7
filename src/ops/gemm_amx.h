/* C[M,N] = alpha * op(A) op(B) + beta * C on AMX tiles: A and B bf16 bit patterns (row-major,
 * op(X) = X or X^T by ta / tb, row strides lda / ldb), accumulation and C fp32, the flags and
 * beta rules of ops/gemm.h. Results depend on the shape only, not on the thread count: every
 * element of C is summed by one thread in a fixed order (32-value tile steps within blocks of
 * 1024, blocks in order). scratch: GEMM_AMX_SCRATCH_BYTES for the packed
 * blocks of A (each thread packs its B panels on its own stack, 64 KiB). Returns 0, or -1 (C
 * untouched) without AMX or for an empty problem. */
#ifndef QT_GEMM_AMX_H
#define QT_GEMM_AMX_H

#include <stddef.h>
#include <stdint.h>

#define GEMM_AMX_SCRATCH_BYTES ((size_t)1 << 20) /* within gemm.h's GEMM_BF16_SCRATCH_BYTES */

/* 1 when the CPU has AMX-BF16 and AMX-TILE and Linux lets this process use the tile state
 * (asked once; the answer is kept). */
int gemm_amx_ready(void);

/* Loads the tile configuration the kernel uses on the calling thread: palette 1, tiles 0-7
 * each 16 rows x 64 bytes (a 16 x 16 fp32 accumulator, or 16 rows of 32 bf16 values). Needs
 * gemm_amx_ready(); release with _tile_release(). */
void gemm_amx_configure(void);

int gemm_amx_bf16(int ta, int tb, int M, int N, int K, float alpha, const uint16_t *A, int lda,
                  const uint16_t *B, int ldb, float beta, float *C, int ldc, void *scratch);

#endif
