/* loss "loss_chunked": lm_head + cross-entropy LOSS_CHUNK tokens at a time, so only a
 * (LOSS_CHUNK, V) block of logits exists (155 MiB at V = 151,936 instead of N x V), in fp32
 * or, with the bf16 weight copy, through the projection's bf16 path (the log-sum-exp and the
 * softmax stay fp32 either way).
 *
 * Training calls forward_backward: per chunk, the logits, then in one pass over each row its
 * max, exp(l - max) in place, their sum (lse and loss from it) and the dlogits from the same
 * exponentials, then the projection's backward on the chunk (dx rows written, dW accumulated;
 * in bf16 dW waits for all chunks, see fused_bf16): three projections per step, one exp per
 * logit, no fp32 logits kept beyond a chunk. Forward and backward apart
 * (evaluation, or a caller that learns the scale only after the forward) keep the per-token
 * log-sum-exp and recompute each chunk's logits in backward: one projection more. */
#include <math.h>

#include "kernels/cpu_ops.h"
#include "kernels/cpu_simd.h"
#include "kernels/kernels.h"
#include "kernels/loss_amx.h"
#include "ops/cross_entropy.h"
#include "ops/gemm.h"

/* Exponentials are summed in fp32 over blocks of this many and the block sums in double, as
 * cross_entropy_cpu does, so a row's sum depends on V alone. */
#define ROW_BLOCK 2048

static long chunk_rows(long N) {
    return N < LOSS_CHUNK ? N : LOSS_CHUNK;
}

static double chunked_forward(float *losses, float *lse, float *logits, const float *x,
                              const float *w, const uint16_t *wb, uint16_t *scratch,
                              const int32_t *targets, const LinearOp *proj, long N, int D, int V) {
    if (!targets) return 0.0; /* logits are not kept: nothing to compute */
    for (long n0 = 0; n0 < N; n0 += LOSS_CHUNK) {
        long n = N - n0 < LOSS_CHUNK ? N - n0 : LOSS_CHUNK;
        lm_head_proj_forward(logits, x + n0 * D, w, wb, scratch, proj, n, D, V);
        cross_entropy_cpu.forward(losses + n0, lse + n0, logits, targets + n0, n, V);
    }
    return cross_entropy_valid_sum(losses, targets, N);
}

static void chunked_backward(float *dx, float *dw, float *logits, const float *x, const float *w,
                             const uint16_t *wb, uint16_t *scratch, const int32_t *targets,
                             const float *lse, const LinearOp *proj, long N, int D, int V,
                             float scale) {
    for (long n0 = 0; n0 < N; n0 += LOSS_CHUNK) {
        long n = N - n0 < LOSS_CHUNK ? N - n0 : LOSS_CHUNK;
        lm_head_proj_forward(logits, x + n0 * D, w, wb, scratch, proj, n, D, V);
        cross_entropy_cpu.backward(logits, logits, lse + n0, targets + n0, n, V, scale);
        lm_head_proj_backward(dx + n0 * D, dw, logits, x + n0 * D, w, wb, scratch, proj, n, D, V);
    }
}

/* One row's loss and lse; its logits l become the dlogits of loss * scale in place. */
static void row_loss_grad(float *l, int32_t t, int V, float scale, float *loss, float *lse) {
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int j = 0; j < V; j++)
        m = l[j] > m ? l[j] : m;
    float lt = t == CE_IGNORE ? 0.0f : l[t];
    double s = 0.0;
    for (int j0 = 0; j0 < V; j0 += ROW_BLOCK) {
        int c = V - j0 < ROW_BLOCK ? V - j0 : ROW_BLOCK;
        float *b = l + j0, bs = 0.0f;
#pragma omp simd
        for (int j = 0; j < c; j++)
            b[j] -= m;
        simd_exp(b, b, c);
#pragma omp simd reduction(+ : bs)
        for (int j = 0; j < c; j++)
            bs += b[j];
        s += bs;
    }
    double z = m + log(s);
    *lse = (float)z;
    *loss = t == CE_IGNORE ? 0.0f : (float)(z - lt);
    /* softmax * scale = exp(l - m) * (scale / s); an ignored target contributes nothing. */
    float k = t == CE_IGNORE ? 0.0f : (float)(scale / s);
#pragma omp simd
    for (int j = 0; j < V; j++)
        l[j] *= k;
    if (t != CE_IGNORE) l[t] -= scale;
}

/* The chunk's loss, lse and (in place) dlogits, rows over threads. */
static void chunk_loss_grad(float *logits, const int32_t *targets, long n, int V, float scale,
                            float *losses, float *lse) {
#pragma omp parallel for schedule(static)
    for (long r = 0; r < n; r++)
        row_loss_grad(logits + r * V, targets[r], V, scale, &losses[r], &lse[r]);
}

/* bf16: the products go to gemm_bf16 directly, with scratch laid out as linear_cpu lays it,
 * xb (N, D) then db (N, V): each chunk's dlogits are rounded to bf16 into their rows of db
 * (the fp32 logits never exist beyond the chunk), dx is written per chunk, and dW gets one
 * product over all N tokens at the end. Per-chunk dW products (K = LOSS_CHUNK) would each
 * read and write the whole fp32 (V, D) gradient (bench/README.md "LM head"). */
static double fused_bf16(float *losses, float *lse, float *dx, float *dw, float *logits,
                         const float *x, const uint16_t *wb, uint16_t *scratch,
                         const int32_t *targets, long N, int D, int V, float scale) {
    if (loss_amx_usable(wb, N, D, V))
        return loss_amx_fused(losses, lse, dx, dw, logits, x, wb, scratch, targets, N, D, V, scale);
    uint16_t *xb = scratch, *db = scratch + N * D;
    for (long n0 = 0; n0 < N; n0 += LOSS_CHUNK) {
        long n = N - n0 < LOSS_CHUNK ? N - n0 : LOSS_CHUNK;
        simd_f32_to_bf16(xb + n0 * D, x + n0 * D, n * D);
        gemm_bf16(0, 1, (int)n, V, D, 1.0f, xb + n0 * D, D, wb, D, 0.0f, logits, V);
        chunk_loss_grad(logits, targets + n0, n, V, scale, losses + n0, lse + n0);
        simd_f32_to_bf16(db + n0 * V, logits, n * V);
        gemm_bf16(0, 0, (int)n, D, V, 1.0f, db + n0 * V, V, wb, D, 0.0f, dx + n0 * D, D);
    }
    gemm_bf16(1, 0, V, D, (int)N, 1.0f, db, V, xb, D, 1.0f, dw, D);
    return cross_entropy_valid_sum(losses, targets, N);
}

static double chunked_forward_backward(float *losses, float *lse, float *dx, float *dw,
                                       float *logits, const float *x, const float *w,
                                       const uint16_t *wb, uint16_t *scratch,
                                       const int32_t *targets, const LinearOp *proj, long N, int D,
                                       int V, float scale) {
    if (wb && proj->backward_bf16)
        return fused_bf16(losses, lse, dx, dw, logits, x, wb, scratch, targets, N, D, V, scale);
    for (long n0 = 0; n0 < N; n0 += LOSS_CHUNK) {
        long n = N - n0 < LOSS_CHUNK ? N - n0 : LOSS_CHUNK;
        proj->forward(logits, x + n0 * D, w, n, D, V);
        chunk_loss_grad(logits, targets + n0, n, V, scale, losses + n0, lse + n0);
        proj->backward(dx + n0 * D, dw, logits, x + n0 * D, w, n, D, V, 0.0f);
    }
    return cross_entropy_valid_sum(losses, targets, N);
}

static long chunked_workspace(long N, int D, int V) {
    long amx = loss_amx_workspace_floats(N, D, V), chunk = chunk_rows(N) * V;
    return amx > chunk ? amx : chunk;
}

const LmHeadLossOp loss_chunked = {{"loss_chunked", OP_LM_HEAD_LOSS, "cpu", 0},
                                   chunked_forward,
                                   chunked_backward,
                                   chunked_workspace,
                                   chunked_forward_backward};
