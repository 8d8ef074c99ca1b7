/* Reference SwiGLU feed-forward: gemm_f32 for the three products, elementwise gate between. */
#include "ops/swiglu.h"

#include <math.h>

#include "ops/gemm.h"

static inline float silu(float a) {
    return a / (1.0f + expf(-a));
}

void swiglu_forward(float *out, float *h1, float *h3, float *g, const float *x, const float *w1,
                    const float *w3, const float *w2, float *ws, long N, int D, int F) {
    (void)ws;
    gemm_f32(0, 1, (int)N, F, D, 1.0f, x, D, w1, D, 0.0f, h1, F);
    gemm_f32(0, 1, (int)N, F, D, 1.0f, x, D, w3, D, 0.0f, h3, F);
#pragma omp parallel for schedule(static)
    for (long i = 0; i < N * F; i++)
        g[i] = silu(h1[i]) * h3[i];
    gemm_f32(0, 1, (int)N, D, F, 1.0f, g, F, w2, F, 0.0f, out, D);
}

void swiglu_backward(float *dx, float *dw1, float *dw3, float *dw2, float *dh1, float *dh3,
                     const float *dout, const float *x, const float *h1, const float *h3,
                     const float *g, const float *w1, const float *w3, const float *w2, float *ws,
                     long N, int D, int F) {
    (void)ws;
    if (dw2) gemm_f32(1, 0, D, F, (int)N, 1.0f, dout, D, g, F, 1.0f, dw2, F);
    /* dg = dout W2 lands in dh1, then splits into the two branches in place. */
    gemm_f32(0, 0, (int)N, F, D, 1.0f, dout, D, w2, F, 0.0f, dh1, F);
#pragma omp parallel for schedule(static)
    for (long i = 0; i < N * F; i++) {
        float a = h1[i], sig = 1.0f / (1.0f + expf(-a)), dg = dh1[i];
        dh3[i] = dg * a * sig;
        /* silu'(a) = sig * (1 + a * (1 - sig)) */
        dh1[i] = dg * h3[i] * sig * (1.0f + a * (1.0f - sig));
    }
    if (dw1) {
        gemm_f32(1, 0, F, D, (int)N, 1.0f, dh1, F, x, D, 1.0f, dw1, D);
        gemm_f32(1, 0, F, D, (int)N, 1.0f, dh3, F, x, D, 1.0f, dw3, D);
    }
    gemm_f32(0, 0, (int)N, D, F, 1.0f, dh1, F, w1, D, 0.0f, dx, D);
    gemm_f32(0, 0, (int)N, D, F, 1.0f, dh3, F, w3, D, 1.0f, dx, D);
}

const SwigluOp swiglu_reference = {.h = {.name = "reference", .kind = OP_SWIGLU, .device = "cpu"},
                                   .forward = swiglu_forward,
                                   .backward = swiglu_backward};
