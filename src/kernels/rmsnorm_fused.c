/* rmsnorm "rmsnorm_fused": RMSNorm rows with the AVX-512 helpers, plus the two fusions the
 * model uses when an op provides them (ops/rmsnorm.h):
 *   forward_add   at ffn_norm: xmid = x + attention and its norm in one pass over the rows;
 *   backward_acc  at attention_norm and ffn_norm: dx added straight into the residual-stream
 *                 gradient instead of a scratch buffer and a separate add.
 * On other instances (q_norm, k_norm, norm) it runs the plain forward/backward rows.
 * Row statistics are fp32 SIMD sums (the reference sums in double). */
#include <math.h>

#include "kernels/cpu_simd.h"
#include "kernels/kernels.h"

static void fused_forward(float *out, float *rstd, const float *x, const float *w, long R, int C,
                          float eps) {
    simd_rmsnorm_rows(out, rstd, x, w, (int)R, C, eps);
}

static void fused_forward_add(float *xsum, float *out, float *rstd, const float *a, const float *b,
                              const float *w, long R, int C, float eps) {
#pragma omp parallel for schedule(static)
    for (long r = 0; r < R; r++) {
        const float *ar = a + r * C, *br = b + r * C;
        float *sr = xsum + r * C, *o = out + r * C;
        for (int j = 0; j < C; j++)
            sr[j] = ar[j] + br[j];
        float rs = 1.0f / sqrtf(simd_dot(sr, sr, C) / (float)C + eps);
        rstd[r] = rs;
        for (int j = 0; j < C; j++)
            o[j] = w[j] * (sr[j] * rs);
    }
}

/* acc 0 writes dx (never reading it), 1 adds into it. */
static void backward_rows(float *dx, float *dw, const float *dout, const float *x, const float *w,
                          const float *rstd, long R, int C, int acc) {
#pragma omp parallel for schedule(static)
    for (long r = 0; r < R; r++) {
        const float *xr = x + r * C, *dr = dout + r * C;
        float gx = 0.0f;
        for (int j = 0; j < C; j++)
            gx += w[j] * dr[j] * xr[j];
        float rs = rstd[r], c = gx / (float)C * rs * rs * rs;
        float *o = dx + r * C;
        for (int j = 0; j < C; j++)
            o[j] = (acc ? o[j] : 0.0f) + (rs * w[j] * dr[j] - xr[j] * c);
    }
    if (!dw) return;
#pragma omp parallel for schedule(static)
    for (int j = 0; j < C; j++) {
        float sum = 0.0f;
        for (long r = 0; r < R; r++)
            sum += dout[r * C + j] * (x[r * C + j] * rstd[r]);
        dw[j] += sum;
    }
}

static void fused_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                           const float *rstd, long R, int C) {
    backward_rows(dx, dw, dout, x, w, rstd, R, C, 0);
}

static void fused_backward_acc(float *dx, float *dw, const float *dout, const float *x,
                               const float *w, const float *rstd, long R, int C) {
    backward_rows(dx, dw, dout, x, w, rstd, R, C, 1);
}

const RmsnormOp rmsnorm_fused = {{"rmsnorm_fused", OP_RMSNORM, "cpu", 0},
                                 fused_forward,
                                 fused_backward,
                                 fused_forward_add,
                                 fused_backward_acc};
