/* linear "cpu": the default CPU linear layer. fp32 is the reference's three GEMMs; the bf16
 * path (mixed precision) casts the activation and the incoming gradient to bf16 and multiplies
 * them with the bf16 weight copy through gemm_bf16 (fp32 accumulation and outputs). */
#include "kernels/cpu_ops.h"
#include "kernels/cpu_simd.h"
#include "ops/gemm.h"

static void cpu_linear_forward_bf16(float *out, const float *x, const uint16_t *wb,
                                    uint16_t *scratch, long N, int I, int O) {
    uint16_t *xb = scratch; /* (N, I) */
    simd_f32_to_bf16(xb, x, N * I);
    gemm_bf16(0, 1, (int)N, O, I, 1.0f, xb, I, wb, I, 0.0f, out, O);
}

static void cpu_linear_backward_bf16(float *dx, float *dw, const float *dout, const float *x,
                                     const uint16_t *wb, uint16_t *scratch, long N, int I, int O,
                                     float dx_beta) {
    uint16_t *xb = scratch;         /* (N, I) */
    uint16_t *db = scratch + N * I; /* (N, O) */
    simd_f32_to_bf16(db, dout, N * O);
    if (dx) gemm_bf16(0, 0, (int)N, I, O, 1.0f, db, O, wb, I, dx_beta, dx, I);
    if (!dw) return;
    simd_f32_to_bf16(xb, x, N * I);
    gemm_bf16(1, 0, O, I, (int)N, 1.0f, db, O, xb, I, 1.0f, dw, I);
}

const LinearOp linear_cpu = {.h = {.name = "cpu", .kind = OP_LINEAR, .device = "cpu"},
                             .forward = linear_forward,
                             .backward = linear_backward,
                             .forward_bf16 = cpu_linear_forward_bf16,
                             .backward_bf16 = cpu_linear_backward_bf16};
