/* rmsnorm "cpu": the default CPU RMSNorm. Rows are split over threads and each row's sums run
 * as fixed-order vector reductions in fp32 (the reference sums in double); the weight gradient
 * splits columns over threads and adds rows in order in double, a block of columns at a time.
 * Results do not depend on the thread count. It provides both fusions of ops/rmsnorm.h: the
 * residual add inside the forward pass over the rows (forward_add) and dx added into the
 * residual stream's gradient (backward_acc), each bitwise what the separate add gives. */
#include <math.h>
#include <omp.h>

#include "kernels/cpu_ops.h"

/* One row: o = w * (x * rstd); returns rstd. */
static inline float norm_row(float *o, const float *xr, const float *w, int C, float eps) {
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int j = 0; j < C; j++)
        ss += xr[j] * xr[j];
    float rs = 1.0f / sqrtf(ss / (float)C + eps);
#pragma omp simd
    for (int j = 0; j < C; j++)
        o[j] = w[j] * (xr[j] * rs);
    return rs;
}

static void cpu_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, long R,
                                int C, float eps) {
#pragma omp parallel for schedule(static)
    for (long r = 0; r < R; r++)
        rstd[r] = norm_row(out + r * C, x + r * C, w, C, eps);
}

/* xsum = a + b (xsum may be a), then its norm, row by row while the row is in cache. */
static void cpu_rmsnorm_forward_add(float *xsum, float *out, float *rstd, const float *a,
                                    const float *b, const float *w, long R, int C, float eps) {
#pragma omp parallel for schedule(static)
    for (long r = 0; r < R; r++) {
        const float *ar = a + r * C, *br = b + r * C;
        float *sr = xsum + r * C;
#pragma omp simd
        for (int j = 0; j < C; j++)
            sr[j] = ar[j] + br[j];
        rstd[r] = norm_row(out + r * C, sr, w, C, eps);
    }
}

/* Columns per block of the weight gradient: one block's double sums (2 KiB) stay in L1. */
#define DW_BLOCK 256

/* dw += sum over rows of dout * (x * rstd). Each thread sums its own run of columns (a multiple
 * of 16) over all rows, so it reads whole 64-byte lines of every row; each column's sum is the
 * same whatever the split. */
static void weight_grad(float *dw, const float *dout, const float *x, const float *rstd, long R,
                        int C) {
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

/* dx written (acc 0, never read) or added to (acc 1); dw accumulated when not NULL. */
static void backward_rows(float *dx, float *dw, const float *dout, const float *x, const float *w,
                          const float *rstd, long R, int C, int acc) {
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
        if (acc) {
#pragma omp simd
            for (int j = 0; j < C; j++)
                o[j] += rs * w[j] * dr[j] - xr[j] * c;
        } else {
#pragma omp simd
            for (int j = 0; j < C; j++)
                o[j] = rs * w[j] * dr[j] - xr[j] * c;
        }
    }
    if (dw) weight_grad(dw, dout, x, rstd, R, C);
}

static void cpu_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x,
                                 const float *w, const float *rstd, long R, int C) {
    backward_rows(dx, dw, dout, x, w, rstd, R, C, 0);
}

static void cpu_rmsnorm_backward_acc(float *dx, float *dw, const float *dout, const float *x,
                                     const float *w, const float *rstd, long R, int C) {
    backward_rows(dx, dw, dout, x, w, rstd, R, C, 1);
}

const RmsnormOp rmsnorm_cpu = {.h = {.name = "cpu", .kind = OP_RMSNORM, .device = "cpu"},
                               .forward = cpu_rmsnorm_forward,
                               .backward = cpu_rmsnorm_backward,
                               .forward_add = cpu_rmsnorm_forward_add,
                               .backward_acc = cpu_rmsnorm_backward_acc};
