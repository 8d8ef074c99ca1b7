/* Reference linear layer: three gemm_f32 calls. */
#include "ops/linear.h"

#include "ops/gemm.h"

void linear_forward(float *out, const float *x, const float *w, long N, int I, int O) {
    gemm_f32(0, 1, (int)N, O, I, 1.0f, x, I, w, I, 0.0f, out, O);
}

void linear_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                     long N, int I, int O, float dx_beta) {
    if (dx) gemm_f32(0, 0, (int)N, I, O, 1.0f, dout, O, w, I, dx_beta, dx, I);
    if (dw) gemm_f32(1, 0, O, I, (int)N, 1.0f, dout, O, x, I, 1.0f, dw, I);
}

const LinearOp linear_reference = {.h = {.name = "reference", .kind = OP_LINEAR, .device = "cpu"},
                                   .forward = linear_forward,
                                   .backward = linear_backward};
