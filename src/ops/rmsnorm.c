/* Reference RMSNorm; row sums in double. */
#include "ops/rmsnorm.h"

#include <math.h>

void rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, long R, int C,
                     float eps) {
#pragma omp parallel for schedule(static)
    for (long r = 0; r < R; r++) {
        const float *xr = x + r * C;
        double ss = 0.0;
        for (int j = 0; j < C; j++)
            ss += (double)xr[j] * xr[j];
        float rs = 1.0f / sqrtf((float)(ss / C) + eps);
        rstd[r] = rs;
        float *o = out + r * C;
        /* HF order: normalise first, then scale by the weight. */
        for (int j = 0; j < C; j++)
            o[j] = w[j] * (xr[j] * rs);
    }
}

void rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                      const float *rstd, long R, int C) {
    /* y = x * rstd; d rstd / dx_j = -rstd^3 x_j / C, so
     * dx_j = rstd * g_j - x_j * rstd^3 * mean(g * x), g = w * dout. */
#pragma omp parallel for schedule(static)
    for (long r = 0; r < R; r++) {
        const float *xr = x + r * C, *dr = dout + r * C;
        double gx = 0.0;
        for (int j = 0; j < C; j++)
            gx += (double)w[j] * dr[j] * xr[j];
        float rs = rstd[r];
        float c = (float)(gx / C) * rs * rs * rs;
        float *o = dx + r * C;
        for (int j = 0; j < C; j++)
            o[j] = rs * w[j] * dr[j] - xr[j] * c;
    }
    if (!dw) return;
        /* Columns in parallel, rows in order: deterministic for any thread count. */
#pragma omp parallel for schedule(static)
    for (int j = 0; j < C; j++) {
        double acc = 0.0;
        for (long r = 0; r < R; r++)
            acc += (double)dout[r * C + j] * (x[r * C + j] * rstd[r]);
        dw[j] += (float)acc;
    }
}

const RmsnormOp rmsnorm_reference = {
    {"reference", OP_RMSNORM, "cpu", 0}, rmsnorm_forward, rmsnorm_backward, 0, 0};
