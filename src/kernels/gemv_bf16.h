/* Matrix-vector products for decode: a few rows of activations against bf16 weights. At one
 * token per sequence the weights are far larger than the caches and each is used by a handful
 * of rows only, so decode runs at the speed the weights stream from memory; a GEMM library
 * tuned for large M loses much of that at M = 1-4. This reads every weight once per call
 * (blocks of GEMV_ROWS weight rows stay in L1 while all activation rows pass over them), in
 * one OpenMP region over the output rows of all the products that share an input (q, k and
 * v; w1 and w3).
 *
 * Paths, chosen once at run time: AVX512_BF16 (vdpbf16ps, pairs of bf16 products added into
 * fp32), AVX-512F (bf16 widened to fp32, FMA), scalar. All accumulate exact bf16 x bf16
 * products in fp32; only the order of the additions differs between paths. */
#ifndef QT_GEMV_BF16_H
#define QT_GEMV_BF16_H

#include <stdint.h>

/* Weight rows per block: each block's rows stay in L1 while every activation row uses them. */
#define GEMV_ROWS 4

typedef struct GemvPart {
    const uint16_t *w; /* (O, I) bf16, torch layout */
    float *out;        /* (n, O) */
    int O;
} GemvPart;

/* For each part p: p.out[r * p.O + o] = sum_i xb[r * I + i] * p.w[o * I + i] for r < n and
 * o < p.O; xb is (n, I) bf16. Output rows of all parts are split over the threads. */
void gemv_bf16(const GemvPart *parts, int nparts, const uint16_t *xb, long n, int I);

enum { GEMV_SCALAR, GEMV_AVX512, GEMV_AVX512_BF16 };
/* The path in use: the best the CPU has, unless QT_SIMD=scalar or gemv_bf16_force. */
int gemv_bf16_path(void);
/* Uses path p, or the best the CPU has below it; for tests. */
void gemv_bf16_force(int p);

#endif
