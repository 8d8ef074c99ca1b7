/* loss "loss_chunked": lm_head + cross-entropy LOSS_CHUNK tokens at a time, so only a
 * (LOSS_CHUNK, V) block of logits exists (155 MiB at V = 151,936 instead of N x V). Forward
 * keeps the per-token log-sum-exp; backward recomputes each chunk's logits, turns them into
 * dlogits in place and runs the projection's backward on the chunk (dx rows written, dW
 * accumulated). Costs one extra lm_head GEMM per step for the recompute. */
#include "kernels/kernels.h"
#include "ops/cross_entropy.h"

static long chunk_rows(long N) {
    return N < LOSS_CHUNK ? N : LOSS_CHUNK;
}

static double chunked_forward(float *losses, float *lse, float *logits, const float *x,
                              const float *w, const int32_t *targets, const LinearOp *proj, long N,
                              int D, int V) {
    if (!targets) return 0.0; /* logits are not kept: nothing to compute */
    for (long n0 = 0; n0 < N; n0 += LOSS_CHUNK) {
        long n = N - n0 < LOSS_CHUNK ? N - n0 : LOSS_CHUNK;
        proj->forward(logits, x + n0 * D, w, n, D, V);
        cross_entropy_forward(losses + n0, lse + n0, logits, targets + n0, n, V);
    }
    /* The sum over all tokens in token order, as the reference adds them. */
    double sum = 0.0;
    for (long n = 0; n < N; n++)
        if (targets[n] != CE_IGNORE) sum += losses[n];
    return sum;
}

static void chunked_backward(float *dx, float *dw, float *logits, const float *x, const float *w,
                             const int32_t *targets, const float *lse, const LinearOp *proj, long N,
                             int D, int V, float scale) {
    for (long n0 = 0; n0 < N; n0 += LOSS_CHUNK) {
        long n = N - n0 < LOSS_CHUNK ? N - n0 : LOSS_CHUNK;
        proj->forward(logits, x + n0 * D, w, n, D, V);
        cross_entropy_backward(logits, logits, lse + n0, targets + n0, n, V, scale);
        proj->backward(dx + n0 * D, dw, logits, x + n0 * D, w, n, D, V, 0.0f);
    }
}

static long chunked_workspace(long N, int V) {
    return chunk_rows(N) * V;
}

const LmHeadLossOp loss_chunked = {{"loss_chunked", OP_LM_HEAD_LOSS, "cpu", 0},
                                   chunked_forward,
                                   chunked_backward,
                                   chunked_workspace};
