/* feed_forward "swiglu_fused": the gate and up projections as one GEMM against the stacked
 * weight [w1; w3] (2F, D), the activation fused into the pass that splits its (N, 2F) result
 * into h1, h3 and g, and the backward's two input-side products also as one GEMM each
 * (dx = [dh1 | dh3] [w1; w3], d[w1; w3] = [dh1 | dh3]^T x).
 *
 * Layout choice: parameters stay w1 and w3 (checkpoint keys do not change); the stacked
 * weight, the (N, 2F) product and the stacked weight gradient live in the op's workspace
 * (fused_workspace), which the model takes from its activation arena, rebuilt from w1 and w3 on
 * every call. */
#include <math.h>
#include <string.h>

#include "kernels/kernels.h"
#include "ops/gemm.h"

/* Backward's need, the larger: (2F, D) stacked weight, (N, 2F) stacked [dh1 | dh3], (2F, D)
 * stacked weight gradient; forward uses the first two as (2F, D) weight and (N, 2F) product. */
static long fused_workspace(long N, int D, int F) {
    return (long)4 * F * D + N * 2 * F;
}

static void stack_rows(float *w13, const float *w1, const float *w3, long F, long D) {
    memcpy(w13, w1, (size_t)(F * D) * sizeof(float));
    memcpy(w13 + F * D, w3, (size_t)(F * D) * sizeof(float));
}

static void fused_forward(float *out, float *h1, float *h3, float *g, const float *x,
                          const float *w1, const float *w3, const float *w2, float *ws, long N,
                          int D, int F) {
    float *w13 = ws; /* (2F, D) then (N, 2F) */
    float *h13 = w13 + (long)2 * F * D;
    stack_rows(w13, w1, w3, F, D);
    gemm_f32(0, 1, (int)N, 2 * F, D, 1.0f, x, D, w13, D, 0.0f, h13, 2 * F);
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++) {
        const float *a = h13 + n * 2 * F, *u = a + F;
        float *o1 = h1 + n * F, *o3 = h3 + n * F, *og = g + n * F;
        for (int j = 0; j < F; j++) {
            o1[j] = a[j];
            o3[j] = u[j];
            og[j] = a[j] / (1.0f + expf(-a[j])) * u[j];
        }
    }
    gemm_f32(0, 1, (int)N, D, F, 1.0f, g, F, w2, F, 0.0f, out, D);
}

static void fused_backward(float *dx, float *dw1, float *dw3, float *dw2, float *dh1, float *dh3,
                           const float *dout, const float *x, const float *h1, const float *h3,
                           const float *g, const float *w1, const float *w3, const float *w2,
                           float *ws, long N, int D, int F) {
    (void)dh3; /* the stacked (N, 2F) gradient lives in the workspace */
    float *w13 = ws;
    float *dh13 = w13 + (long)2 * F * D, *dw13 = dh13 + N * 2 * F;
    stack_rows(w13, w1, w3, F, D);
    if (dw2) gemm_f32(1, 0, D, F, (int)N, 1.0f, dout, D, g, F, 1.0f, dw2, F);
    gemm_f32(0, 0, (int)N, F, D, 1.0f, dout, D, w2, F, 0.0f, dh1, F); /* dg */
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++) {
        const float *dg = dh1 + n * F, *a1 = h1 + n * F, *a3 = h3 + n * F;
        float *d1 = dh13 + n * 2 * F, *d3 = d1 + F;
        for (int j = 0; j < F; j++) {
            float a = a1[j], sig = 1.0f / (1.0f + expf(-a));
            d3[j] = dg[j] * a * sig;
            d1[j] = dg[j] * a3[j] * sig * (1.0f + a * (1.0f - sig));
        }
    }
    gemm_f32(0, 0, (int)N, D, 2 * F, 1.0f, dh13, 2 * F, w13, D, 0.0f, dx, D);
    if (!dw1) return;
    gemm_f32(1, 0, 2 * F, D, (int)N, 1.0f, dh13, 2 * F, x, D, 0.0f, dw13, D);
    long FD = (long)F * D;
#pragma omp parallel for schedule(static)
    for (long i = 0; i < FD; i++) {
        dw1[i] += dw13[i];
        dw3[i] += dw13[FD + i];
    }
}

const SwigluOp swiglu_fused = {.h = {"swiglu_fused", OP_SWIGLU, "cpu", 0},
                               .forward = fused_forward,
                               .backward = fused_backward,
                               .workspace_floats = fused_workspace};
