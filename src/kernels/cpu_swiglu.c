/* feed_forward "cpu": the default CPU SwiGLU. The three products are the reference's GEMMs
 * (or, in mixed precision, gemm_bf16 on bf16 casts of the inputs and the bf16 weight copies);
 * the gate and its backward are vector loops with simd_exp, split over threads in fixed
 * chunks. */
#include "kernels/cpu_ops.h"
#include "kernels/cpu_simd.h"
#include "ops/gemm.h"

#define GATE_CHUNK 1024

/* g = silu(h1) * h3, and (gb not NULL) its bf16 cast, chunk by chunk while the chunk of g is in
 * cache: the bf16 path's one pass over g instead of a gate pass and a cast pass. */
static void gate_forward(float *g, uint16_t *gb, const float *h1, const float *h3, long n) {
#pragma omp parallel for schedule(static)
    for (long i0 = 0; i0 < n; i0 += GATE_CHUNK) {
        long c = n - i0 < GATE_CHUNK ? n - i0 : GATE_CHUNK;
        simd_swiglu(g + i0, h1 + i0, h3 + i0, c);
        if (gb) simd_f32_to_bf16_here(gb + i0, g + i0, c);
    }
}

/* For c values: d1 = dg * h3 * silu'(h1) and d3 = dg * silu(h1); d1 may be dg. d3 holds
 * exp(-h1) first. */
static inline void gate_backward_chunk(float *d1, float *d3, const float *dg, const float *h1,
                                       const float *h3, long c) {
    for (long i = 0; i < c; i++)
        d3[i] = -h1[i];
    simd_exp(d3, d3, c);
#pragma omp simd
    for (long i = 0; i < c; i++) {
        float a = h1[i], sig = 1.0f / (1.0f + d3[i]), d = dg[i];
        d3[i] = d * a * sig;
        /* silu'(a) = sig * (1 + a * (1 - sig)) */
        d1[i] = d * h3[i] * sig * (1.0f + a * (1.0f - sig));
    }
}

/* dh1 holds dg on entry; on exit dh1 = dg * h3 * silu'(h1) and dh3 = dg * silu(h1). */
static void gate_backward(float *dh1, float *dh3, const float *h1, const float *h3, long n) {
#pragma omp parallel for schedule(static)
    for (long i0 = 0; i0 < n; i0 += GATE_CHUNK) {
        long c = n - i0 < GATE_CHUNK ? n - i0 : GATE_CHUNK;
        gate_backward_chunk(dh1 + i0, dh3 + i0, dh1 + i0, h1 + i0, h3 + i0, c);
    }
}

/* gate_backward's two gradients cast to bf16 (b1, b3) without being stored in fp32: the bf16
 * products are their only readers. */
static void gate_backward_bf16(uint16_t *b1, uint16_t *b3, const float *dg, const float *h1,
                               const float *h3, long n) {
#pragma omp parallel for schedule(static)
    for (long i0 = 0; i0 < n; i0 += GATE_CHUNK) {
        long c = n - i0 < GATE_CHUNK ? n - i0 : GATE_CHUNK;
        float d1[GATE_CHUNK], d3[GATE_CHUNK];
        gate_backward_chunk(d1, d3, dg + i0, h1 + i0, h3 + i0, c);
        simd_f32_to_bf16_here(b1 + i0, d1, c);
        simd_f32_to_bf16_here(b3 + i0, d3, c);
    }
}

static void cpu_swiglu_forward(float *out, float *h1, float *h3, float *g, const float *x,
                               const float *w1, const float *w3, const float *w2, float *ws, long N,
                               int D, int F) {
    (void)ws;
    gemm_f32(0, 1, (int)N, F, D, 1.0f, x, D, w1, D, 0.0f, h1, F);
    gemm_f32(0, 1, (int)N, F, D, 1.0f, x, D, w3, D, 0.0f, h3, F);
    gate_forward(g, NULL, h1, h3, N * F);
    gemm_f32(0, 1, (int)N, D, F, 1.0f, g, F, w2, F, 0.0f, out, D);
}

static void cpu_swiglu_backward(float *dx, float *dw1, float *dw3, float *dw2, float *dh1,
                                float *dh3, const float *dout, const float *x, const float *h1,
                                const float *h3, const float *g, const float *w1, const float *w3,
                                const float *w2, float *ws, long N, int D, int F) {
    (void)ws;
    if (dw2) gemm_f32(1, 0, D, F, (int)N, 1.0f, dout, D, g, F, 1.0f, dw2, F);
    gemm_f32(0, 0, (int)N, F, D, 1.0f, dout, D, w2, F, 0.0f, dh1, F);
    gate_backward(dh1, dh3, h1, h3, N * F);
    if (dw1) {
        gemm_f32(1, 0, F, D, (int)N, 1.0f, dh1, F, x, D, 1.0f, dw1, D);
        gemm_f32(1, 0, F, D, (int)N, 1.0f, dh3, F, x, D, 1.0f, dw3, D);
    }
    gemm_f32(0, 0, (int)N, D, F, 1.0f, dh1, F, w1, D, 0.0f, dx, D);
    gemm_f32(0, 0, (int)N, D, F, 1.0f, dh3, F, w3, D, 1.0f, dx, D);
}

static void cpu_swiglu_forward_bf16(float *out, float *h1, float *h3, float *g, const float *x,
                                    const uint16_t *w1b, const uint16_t *w3b, const uint16_t *w2b,
                                    uint16_t *scratch, long N, int D, int F) {
    uint16_t *xb = scratch;         /* (N, D) */
    uint16_t *gb = scratch + N * D; /* (N, F) */
    simd_f32_to_bf16(xb, x, N * D);
    gemm_bf16(0, 1, (int)N, F, D, 1.0f, xb, D, w1b, D, 0.0f, h1, F);
    gemm_bf16(0, 1, (int)N, F, D, 1.0f, xb, D, w3b, D, 0.0f, h3, F);
    gate_forward(g, gb, h1, h3, N * F);
    gemm_bf16(0, 1, (int)N, D, F, 1.0f, gb, F, w2b, F, 0.0f, out, D);
}

static void cpu_swiglu_backward_bf16(float *dx, float *dw1, float *dw3, float *dw2, float *dh1,
                                     float *dh3, const float *dout, const float *x, const float *h1,
                                     const float *h3, const float *g, const uint16_t *w1b,
                                     const uint16_t *w3b, const uint16_t *w2b, uint16_t *scratch,
                                     long N, int D, int F) {
    uint16_t *xb = scratch;    /* (N, D) */
    uint16_t *db = xb + N * D; /* (N, D) */
    uint16_t *b1 = db + N * D; /* (N, F) g, then dh1 */
    uint16_t *b3 = b1 + N * F; /* (N, F) dh3 */
    (void)dh3; /* the gate's gradients go to b1, b3 in bf16 only (gate_backward_bf16) */
    simd_f32_to_bf16(db, dout, N * D);
    if (dw2) {
        simd_f32_to_bf16(b1, g, N * F);
        gemm_bf16(1, 0, D, F, (int)N, 1.0f, db, D, b1, F, 1.0f, dw2, F);
    }
    gemm_bf16(0, 0, (int)N, F, D, 1.0f, db, D, w2b, F, 0.0f, dh1, F);
    gate_backward_bf16(b1, b3, dh1, h1, h3, N * F);
    if (dw1) {
        simd_f32_to_bf16(xb, x, N * D);
        gemm_bf16(1, 0, F, D, (int)N, 1.0f, b1, F, xb, D, 1.0f, dw1, D);
        gemm_bf16(1, 0, F, D, (int)N, 1.0f, b3, F, xb, D, 1.0f, dw3, D);
    }
    gemm_bf16(0, 0, (int)N, D, F, 1.0f, b1, F, w1b, D, 0.0f, dx, D);
    gemm_bf16(0, 0, (int)N, D, F, 1.0f, b3, F, w3b, D, 1.0f, dx, D);
}

const SwigluOp swiglu_cpu = {.h = {.name = "cpu", .kind = OP_SWIGLU, .device = "cpu"},
                             .forward = cpu_swiglu_forward,
                             .backward = cpu_swiglu_backward,
                             .forward_bf16 = cpu_swiglu_forward_bf16,
                             .backward_bf16 = cpu_swiglu_backward_bf16};
