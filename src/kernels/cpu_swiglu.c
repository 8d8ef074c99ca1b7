/* feed_forward "cpu": the default CPU SwiGLU. The three products are the reference's GEMMs
 * (or, in mixed precision, gemm_bf16 on bf16 casts of the inputs and the bf16 weight copies);
 * the gate and its backward are vector loops with simd_exp, split over threads in fixed
 * chunks. */
#include "kernels/cpu_ops.h"
#include "kernels/cpu_simd.h"
#include "ops/gemm.h"

#define GATE_CHUNK 1024

/* g = silu(h1) * h3 */
static void gate_forward(float *g, const float *h1, const float *h3, long n) {
#pragma omp parallel for schedule(static)
    for (long i0 = 0; i0 < n; i0 += GATE_CHUNK) {
        long c = n - i0 < GATE_CHUNK ? n - i0 : GATE_CHUNK;
        simd_swiglu(g + i0, h1 + i0, h3 + i0, c);
    }
}

/* dh1 holds dg on entry; on exit dh1 = dg * h3 * silu'(h1) and dh3 = dg * silu(h1). */
static void gate_backward(float *dh1, float *dh3, const float *h1, const float *h3, long n) {
#pragma omp parallel for schedule(static)
    for (long i0 = 0; i0 < n; i0 += GATE_CHUNK) {
        long c = n - i0 < GATE_CHUNK ? n - i0 : GATE_CHUNK;
        float e[GATE_CHUNK];
        for (long i = 0; i < c; i++)
            e[i] = -h1[i0 + i];
        simd_exp(e, e, c);
#pragma omp simd
        for (long i = 0; i < c; i++) {
            float a = h1[i0 + i], sig = 1.0f / (1.0f + e[i]), dg = dh1[i0 + i];
            dh3[i0 + i] = dg * a * sig;
            /* silu'(a) = sig * (1 + a * (1 - sig)) */
            dh1[i0 + i] = dg * h3[i0 + i] * sig * (1.0f + a * (1.0f - sig));
        }
    }
}

static void cpu_swiglu_forward(float *out, float *h1, float *h3, float *g, const float *x,
                               const float *w1, const float *w3, const float *w2, float *ws, long N,
                               int D, int F) {
    (void)ws;
    gemm_f32(0, 1, (int)N, F, D, 1.0f, x, D, w1, D, 0.0f, h1, F);
    gemm_f32(0, 1, (int)N, F, D, 1.0f, x, D, w3, D, 0.0f, h3, F);
    gate_forward(g, h1, h3, N * F);
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
    gate_forward(g, h1, h3, N * F);
    simd_f32_to_bf16(gb, g, N * F);
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
    simd_f32_to_bf16(db, dout, N * D);
    if (dw2) {
        simd_f32_to_bf16(b1, g, N * F);
        gemm_bf16(1, 0, D, F, (int)N, 1.0f, db, D, b1, F, 1.0f, dw2, F);
    }
    gemm_bf16(0, 0, (int)N, F, D, 1.0f, db, D, w2b, F, 0.0f, dh1, F);
    gate_backward(dh1, dh3, h1, h3, N * F);
    simd_f32_to_bf16(b1, dh1, N * F);
    simd_f32_to_bf16(b3, dh3, N * F);
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
