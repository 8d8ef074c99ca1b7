/* rmsnorm "cpu": the default CPU RMSNorm. Rows are split over threads and each row's sums run
 * as fixed-order vector reductions in fp32 (the reference sums in double); the weight gradient
 * splits columns over threads and adds rows in order in double, a block of columns at a time.
 * Results do not depend on the thread count. */
#include <math.h>
#include <omp.h>

#include "kernels/cpu_ops.h"

static void cpu_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, long R,
                                int C, float eps) {
#pragma omp parallel for schedule(static)
    for (long r = 0; r < R; r++) {
        const float *xr = x + r * C;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int j = 0; j < C; j++)
            ss += xr[j] * xr[j];
        float rs = 1.0f / sqrtf(ss / (float)C + eps);
        rstd[r] = rs;
        float *o = out + r * C;
#pragma omp simd
        for (int j = 0; j < C; j++)
            o[j] = w[j] * (xr[j] * rs);
    }
}

/* Columns per block of the weight gradient: one block's double sums (2 KiB) stay in L1. */
#define DW_BLOCK 256

static void cpu_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x,
                                 const float *w, const float *rstd, long R, int C) {
    /* dx_j = rstd * g_j - x_j * rstd^3 * mean(g * x), g = w * dout (see ops/rmsnorm.c). */
#pragma omp parallel for schedule(static)
    for (long r = 0; r < R; r++) {
        const float *xr = x + r * C, *dr = dout + r * C;
        float gx = 0.0f;
#pragma omp simd reduction(+ : gx)
        for (int j = 0; j < C; j++)
            gx += w[j] * dr[j] * xr[j];
        float rs = rstd[r];
        float c = gx / (float)C * rs * rs * rs;
        float *o = dx + r * C;
#pragma omp simd
        for (int j = 0; j < C; j++)
            o[j] = rs * w[j] * dr[j] - xr[j] * c;
    }
    if (!dw) return;
        /* Each thread sums its own run of columns (a multiple of 16) over all rows, so it reads
         * whole 64-byte lines of every row; each column's sum is the same whatever the split. */
#pragma omp parallel
    {
        int nt = omp_get_num_threads(), t = omp_get_thread_num();
        int per = ((C + nt - 1) / nt + 15) / 16 * 16;
        int c0 = t * per, c1 = c0 + per < C ? c0 + per : C;
        for (int j0 = c0; j0 < c1; j0 += DW_BLOCK) {
            int nj = c1 - j0 < DW_BLOCK ? c1 - j0 : DW_BLOCK;
            double acc[DW_BLOCK] = {0};
            for (long r = 0; r < R; r++) {
                const float *dr = dout + r * C + j0, *xr = x + r * C + j0;
                float rs = rstd[r];
#pragma omp simd
                for (int j = 0; j < nj; j++)
                    acc[j] += (double)dr[j] * (xr[j] * rs);
            }
            for (int j = 0; j < nj; j++)
                dw[j0 + j] += (float)acc[j];
        }
    }
}

const RmsnormOp rmsnorm_cpu = {.h = {.name = "cpu", .kind = OP_RMSNORM, .device = "cpu"},
                               .forward = cpu_rmsnorm_forward,
                               .backward = cpu_rmsnorm_backward};
