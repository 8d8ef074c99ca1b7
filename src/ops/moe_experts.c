/* The two implementations of the "moe.experts" op: reference (per-token matvecs) and grouped
 * (expert-sorted rows, one GEMM per expert). See ops/moe_experts.h for the maths. */
#include "ops/moe_experts.h"

#include <math.h>
#include <string.h>

#include "ops/gemm.h"

long moe_experts_saved_floats(long N, int k, int D, int F) {
    return N * k * (2L * F + D);
}

long moe_experts_scratch_floats(long N, int k, int D, int F) {
    return N * k * (2L * D + 3L * F);
}

long moe_experts_saved_ints(long N, int k, int X) {
    return 2 * N * k + X + 1;
}

void moe_experts_bufs_place(MoeExpertsBufs *b, float *saved, int32_t *ints, float *scratch, long N,
                            int k, int D, int F, int X) {
    long A = N * k;
    (void)X;
    if (saved) {
        b->h1 = saved;
        b->h3 = b->h1 + A * F;
        b->y = b->h3 + A * F;
    }
    if (ints) {
        b->order = ints;
        b->row = b->order + A;
        b->offsets = b->row + A;
    }
    if (scratch) {
        b->xs = scratch;
        b->dxs = b->xs + A * D;
        b->g = b->dxs + A * D;
        b->dh1 = b->g + A * F;
        b->dh3 = b->dh1 + A * F;
    }
}

static inline float silu(float a) {
    return a / (1.0f + expf(-a));
}

/* dh1 = dg * h3 * silu'(h1), dh3 = dg * silu(h1); dg arrives in dh1. */
static inline void swiglu_grad(float *dh1, float *dh3, const float *h1, const float *h3, long n) {
    for (long i = 0; i < n; i++) {
        float a = h1[i], sig = 1.0f / (1.0f + expf(-a)), dg = dh1[i];
        dh3[i] = dg * a * sig;
        dh1[i] = dg * h3[i] * sig * (1.0f + a * (1.0f - sig));
    }
}

/* ---- reference: per token, per chosen expert ---- */

/* y (R) = W (R, C) v (C) */
static void matvec(float *y, const float *W, const float *v, int R, int C) {
    for (int r = 0; r < R; r++) {
        const float *w = W + (long)r * C;
        float s = 0.0f;
        for (int c = 0; c < C; c++)
            s += w[c] * v[c];
        y[r] = s;
    }
}

static void reference_forward(float *out, MoeExpertsBufs *b, const float *x, const int32_t *idx,
                              const float *gw, const float *w1, const float *w3, const float *w2,
                              long N, int k, int D, int F, int X) {
    (void)X;
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++) {
        float *o = out + n * D;
        memset(o, 0, (size_t)D * sizeof(float));
        for (int j = 0; j < k; j++) {
            long a = n * k + j, e = idx[a];
            float *h1 = b->h1 + a * F, *h3 = b->h3 + a * F, *g = b->g + a * F, *y = b->y + a * D;
            matvec(h1, w1 + e * F * D, x + n * D, F, D);
            matvec(h3, w3 + e * F * D, x + n * D, F, D);
            for (int f = 0; f < F; f++)
                g[f] = silu(h1[f]) * h3[f];
            matvec(y, w2 + e * D * F, g, D, F);
            for (int d = 0; d < D; d++)
                o[d] += gw[a] * y[d];
        }
    }
}

static void reference_backward(float *dx, float *dgw, float *dw1, float *dw3, float *dw2,
                               MoeExpertsBufs *b, const float *dout, const float *x,
                               const int32_t *idx, const float *gw, const float *w1,
                               const float *w3, const float *w2, long N, int k, int D, int F,
                               int X) {
    /* Pass 1, per token: gate-weight gradients, dh1 / dh3 per assignment, dx. */
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++) {
        const float *dy = dout + n * D;
        float *dxn = dx + n * D;
        memset(dxn, 0, (size_t)D * sizeof(float));
        for (int j = 0; j < k; j++) {
            long a = n * k + j, e = idx[a];
            const float *y = b->y + a * D, *W2 = w2 + e * D * F;
            const float *W1 = w1 + e * F * D, *W3 = w3 + e * F * D;
            float s = 0.0f;
            for (int d = 0; d < D; d++)
                s += dy[d] * y[d];
            dgw[a] = s;
            float *dh1 = b->dh1 + a * F, *dh3 = b->dh3 + a * F, *g = b->g + a * F;
            const float *h1 = b->h1 + a * F, *h3 = b->h3 + a * F;
            for (int f = 0; f < F; f++) /* g is scratch: recompute it for pass 2 */
                g[f] = silu(h1[f]) * h3[f];
            for (int f = 0; f < F; f++) {
                float acc = 0.0f; /* dg[f] = gw * sum_d dout[d] W2[d, f] */
                for (int d = 0; d < D; d++)
                    acc += dy[d] * W2[(long)d * F + f];
                dh1[f] = gw[a] * acc;
            }
            swiglu_grad(dh1, dh3, h1, h3, F);
            for (int f = 0; f < F; f++)
                for (int d = 0; d < D; d++)
                    dxn[d] += dh1[f] * W1[(long)f * D + d] + dh3[f] * W3[(long)f * D + d];
        }
    }
    if (!dw1) return;
        /* Pass 2, per expert: weight gradients from its assignments in assignment order. */
#pragma omp parallel for schedule(dynamic)
    for (int e = 0; e < X; e++) {
        float *D1 = dw1 + (long)e * F * D, *D3 = dw3 + (long)e * F * D, *D2 = dw2 + (long)e * D * F;
        for (long a = 0; a < N * k; a++) {
            if (idx[a] != e) continue;
            const float *xn = x + (a / k) * D, *dy = dout + (a / k) * D;
            const float *dh1 = b->dh1 + a * F, *dh3 = b->dh3 + a * F, *g = b->g + a * F;
            for (int f = 0; f < F; f++)
                for (int d = 0; d < D; d++) {
                    D1[(long)f * D + d] += dh1[f] * xn[d];
                    D3[(long)f * D + d] += dh3[f] * xn[d];
                }
            for (int d = 0; d < D; d++)
                for (int f = 0; f < F; f++)
                    D2[(long)d * F + f] += gw[a] * dy[d] * g[f];
        }
    }
}

const MoeExpertsOp moe_experts_reference = {
    {"reference", OP_MOE_EXPERTS, "cpu", 0}, reference_forward, reference_backward};

/* ---- grouped: sort by expert, one GEMM per expert ---- */

/* Stable counting sort of the assignments by expert, so rows of one expert keep token order. */
static void sort_by_expert(MoeExpertsBufs *b, const int32_t *idx, long A, int X) {
    int32_t *off = b->offsets;
    memset(off, 0, (size_t)(X + 1) * sizeof(int32_t));
    for (long a = 0; a < A; a++)
        off[idx[a] + 1]++;
    for (int e = 0; e < X; e++)
        off[e + 1] += off[e];
    /* off[e] is expert e's fill cursor here; afterwards it is the end of e, so shift. */
    for (long a = 0; a < A; a++) {
        int32_t r = off[idx[a]]++;
        b->row[a] = r;
        b->order[r] = (int32_t)a;
    }
    for (int e = X; e > 0; e--)
        off[e] = off[e - 1];
    off[0] = 0;
}

static void gather_rows(float *xs, const MoeExpertsBufs *b, const float *x, long A, int k, int D) {
#pragma omp parallel for schedule(static)
    for (long r = 0; r < A; r++)
        memcpy(xs + r * D, x + (long)(b->order[r] / k) * D, (size_t)D * sizeof(float));
}

static void grouped_forward(float *out, MoeExpertsBufs *b, const float *x, const int32_t *idx,
                            const float *gw, const float *w1, const float *w3, const float *w2,
                            long N, int k, int D, int F, int X) {
    long A = N * k;
    sort_by_expert(b, idx, A, X);
    gather_rows(b->xs, b, x, A, k, D);
    for (int e = 0; e < X; e++) {
        long o = b->offsets[e];
        int c = b->offsets[e + 1] - b->offsets[e];
        if (c == 0) continue;
        gemm_f32_varying(0, 1, c, F, D, 1.0f, b->xs + o * D, D, w1 + (long)e * F * D, D, 0.0f,
                         b->h1 + o * F, F);
        gemm_f32_varying(0, 1, c, F, D, 1.0f, b->xs + o * D, D, w3 + (long)e * F * D, D, 0.0f,
                         b->h3 + o * F, F);
    }
#pragma omp parallel for schedule(static)
    for (long i = 0; i < A * F; i++)
        b->g[i] = silu(b->h1[i]) * b->h3[i];
    for (int e = 0; e < X; e++) {
        long o = b->offsets[e];
        int c = b->offsets[e + 1] - b->offsets[e];
        if (c == 0) continue;
        gemm_f32_varying(0, 1, c, D, F, 1.0f, b->g + o * F, F, w2 + (long)e * D * F, F, 0.0f,
                         b->y + o * D, D);
    }
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++) {
        float *on = out + n * D;
        memset(on, 0, (size_t)D * sizeof(float));
        for (int j = 0; j < k; j++) {
            const float *y = b->y + (long)b->row[n * k + j] * D;
            float w = gw[n * k + j];
            for (int d = 0; d < D; d++)
                on[d] += w * y[d];
        }
    }
}

static void grouped_backward(float *dx, float *dgw, float *dw1, float *dw3, float *dw2,
                             MoeExpertsBufs *b, const float *dout, const float *x,
                             const int32_t *idx, const float *gw, const float *w1, const float *w3,
                             const float *w2, long N, int k, int D, int F, int X) {
    (void)idx;
    long A = N * k;
    /* Per row: dgw from the saved y, and the weighted output gradient dy (in dxs for now). */
#pragma omp parallel for schedule(static)
    for (long r = 0; r < A; r++) {
        long a = b->order[r];
        const float *dy = dout + (a / k) * D, *y = b->y + r * D;
        float *dys = b->dxs + r * D, s = 0.0f;
        for (int d = 0; d < D; d++) {
            s += dy[d] * y[d];
            dys[d] = gw[a] * dy[d];
        }
        dgw[a] = s;
    }
    gather_rows(b->xs, b, x, A, k, D);
#pragma omp parallel for schedule(static)
    for (long i = 0; i < A * F; i++)
        b->g[i] = silu(b->h1[i]) * b->h3[i];
    for (int e = 0; e < X; e++) {
        long o = b->offsets[e];
        int c = b->offsets[e + 1] - b->offsets[e];
        if (c == 0) continue;
        float *dys = b->dxs + o * D, *dh1 = b->dh1 + o * F, *dh3 = b->dh3 + o * F;
        const float *xs = b->xs + o * D, *W1 = w1 + (long)e * F * D, *W3 = w3 + (long)e * F * D;
        const float *W2 = w2 + (long)e * D * F;
        if (dw2)
            gemm_f32_varying(1, 0, D, F, c, 1.0f, dys, D, b->g + o * F, F, 1.0f,
                             dw2 + (long)e * D * F, F);
        gemm_f32_varying(0, 0, c, F, D, 1.0f, dys, D, W2, F, 0.0f, dh1, F);
        swiglu_grad(dh1, dh3, b->h1 + o * F, b->h3 + o * F, (long)c * F);
        if (dw1) {
            gemm_f32_varying(1, 0, F, D, c, 1.0f, dh1, F, xs, D, 1.0f, dw1 + (long)e * F * D, D);
            gemm_f32_varying(1, 0, F, D, c, 1.0f, dh3, F, xs, D, 1.0f, dw3 + (long)e * F * D, D);
        }
        /* dy is used up; the rows' input gradients replace it. */
        gemm_f32_varying(0, 0, c, D, F, 1.0f, dh1, F, W1, D, 0.0f, dys, D);
        gemm_f32_varying(0, 0, c, D, F, 1.0f, dh3, F, W3, D, 1.0f, dys, D);
    }
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++) {
        float *dxn = dx + n * D;
        memset(dxn, 0, (size_t)D * sizeof(float));
        for (int j = 0; j < k; j++) {
            const float *src = b->dxs + (long)b->row[n * k + j] * D;
            for (int d = 0; d < D; d++)
                dxn[d] += src[d];
        }
    }
}

const MoeExpertsOp moe_experts_grouped = {
    {"experts_grouped", OP_MOE_EXPERTS, "cpu", 0}, grouped_forward, grouped_backward};
