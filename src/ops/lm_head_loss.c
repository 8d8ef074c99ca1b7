/* Reference lm_head + loss: the full (N, V) logits through proj, then cross_entropy. */
#include "ops/lm_head_loss.h"

#include "ops/cross_entropy.h"

void lm_head_proj_forward(float *logits, const float *x, const float *w, const uint16_t *wb,
                          uint16_t *scratch, const LinearOp *proj, long N, int D, int V) {
    if (wb && proj->forward_bf16)
        proj->forward_bf16(logits, x, wb, scratch, N, D, V);
    else
        proj->forward(logits, x, w, N, D, V);
}

void lm_head_proj_backward(float *dx, float *dw, const float *dlogits, const float *x,
                           const float *w, const uint16_t *wb, uint16_t *scratch,
                           const LinearOp *proj, long N, int D, int V) {
    if (wb && proj->backward_bf16)
        proj->backward_bf16(dx, dw, dlogits, x, wb, scratch, N, D, V, 0.0f);
    else
        proj->backward(dx, dw, dlogits, x, w, N, D, V, 0.0f);
}

static double lm_head_loss_forward(float *losses, float *lse, float *logits, const float *x,
                                   const float *w, const uint16_t *wb, uint16_t *scratch,
                                   const int32_t *targets, const LinearOp *proj, long N, int D,
                                   int V) {
    lm_head_proj_forward(logits, x, w, wb, scratch, proj, N, D, V);
    if (!targets) return 0.0;
    return cross_entropy_forward(losses, lse, logits, targets, N, V);
}

static void lm_head_loss_backward(float *dx, float *dw, float *logits, const float *x,
                                  const float *w, const uint16_t *wb, uint16_t *scratch,
                                  const int32_t *targets, const float *lse, const LinearOp *proj,
                                  long N, int D, int V, float scale) {
    cross_entropy_backward(logits, logits, lse, targets, N, V, scale); /* in place */
    lm_head_proj_backward(dx, dw, logits, x, w, wb, scratch, proj, N, D, V);
}

static long lm_head_loss_workspace(long N, int D, int V) {
    (void)D;
    return N * V;
}

const LmHeadLossOp lm_head_loss_reference = {{"reference", OP_LM_HEAD_LOSS, "cpu", 0},
                                             lm_head_loss_forward,
                                             lm_head_loss_backward,
                                             lm_head_loss_workspace,
                                             NULL};
