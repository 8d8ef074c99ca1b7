/* The model's output: projection to the vocabulary (the lm_head linear) and cross-entropy,
 * as one op kind so an implementation may schedule them together, e.g. in token chunks so the
 * (N, V) logits never exist at once (kernels/loss_chunked.c). The module instance `loss` holds
 * this op; the projection itself still goes through the `lm_head` instance's LinearOp, which
 * is passed in as proj. N tokens, D model dim, V vocab. */
#ifndef QT_OP_LM_HEAD_LOSS_H
#define QT_OP_LM_HEAD_LOSS_H

#include <stdint.h>

#include "ops/linear.h"
#include "ops/op.h"

/* Mixed precision: every function takes wb, the bf16 copy of w, and scratch, the bf16
 * scratch of LinearOp's bf16 path (at least N * (D + V) values); wb non-NULL runs the
 * projection through proj's bf16 path (when it has one), NULL runs it in fp32.
 *
 * Writes losses and lse for the tokens and returns the sum of losses over valid targets
 * (token order, deterministic). targets NULL: logits only (an implementation that does not
 * keep logits computes nothing and returns 0). logits is the op's workspace of
 * workspace_floats(N, V) floats; the reference leaves the full (N, V) logits there. */
typedef double (*LmHeadLossForwardFn)(float *losses,          /* (N) */
                                      float *lse,             /* (N) saved */
                                      float *logits,          /* workspace */
                                      const float *x,         /* (N, D) */
                                      const float *w,         /* (V, D) */
                                      const uint16_t *wb,     /* (V, D) bf16, or NULL */
                                      uint16_t *scratch,      /* bf16 scratch, or NULL */
                                      const int32_t *targets, /* (N) or NULL */
                                      const LinearOp *proj, long N, int D, int V);
/* Backward of loss = sum of valid losses * scale: dx written, dw accumulated (+=). logits is
 * the workspace as forward left it (the reference overwrites it with dlogits). */
typedef void (*LmHeadLossBackwardFn)(float *dx,              /* (N, D) */
                                     float *dw,              /* (V, D) */
                                     float *logits,          /* workspace */
                                     const float *x,         /* (N, D) */
                                     const float *w,         /* (V, D) */
                                     const uint16_t *wb,     /* (V, D) bf16, or NULL */
                                     uint16_t *scratch,      /* bf16 scratch, or NULL */
                                     const int32_t *targets, /* (N) */
                                     const float *lse,       /* (N) */
                                     const LinearOp *proj, long N, int D, int V, float scale);
/* Forward and backward at once, when the caller knows the loss scale before the forward (the
 * trainer does: it counts the step's valid targets first): losses and lse written, the sum
 * returned as forward does, dx written and dw accumulated as backward does. An implementation
 * that has it never needs the logits again, so it keeps no more of them than one chunk and
 * runs the projection three times, not four as a chunked forward-then-backward must. */
typedef double (*LmHeadLossFusedFn)(float *losses, float *lse, float *dx, float *dw, float *logits,
                                    const float *x, const float *w, const uint16_t *wb,
                                    uint16_t *scratch, const int32_t *targets, const LinearOp *proj,
                                    long N, int D, int V, float scale);
/* Floats of workspace the op needs for N tokens (the model sizes its logits buffer by it). */
typedef long (*LmHeadLossWorkspaceFn)(long N, int D, int V);

typedef struct LmHeadLossOp {
    OpHeader h;
    LmHeadLossForwardFn forward;
    LmHeadLossBackwardFn backward;
    LmHeadLossWorkspaceFn workspace_floats;
    LmHeadLossFusedFn forward_backward; /* NULL: the model runs forward, then backward */
} LmHeadLossOp;

/* The projection as every implementation runs it: proj's bf16 path when wb is non-NULL and
 * proj has one, else fp32 (the LinearOp rules: logits written, dx written, dw accumulated). */
void lm_head_proj_forward(float *logits, const float *x, const float *w, const uint16_t *wb,
                          uint16_t *scratch, const LinearOp *proj, long N, int D, int V);
void lm_head_proj_backward(float *dx, float *dw, const float *dlogits, const float *x,
                           const float *w, const uint16_t *wb, uint16_t *scratch,
                           const LinearOp *proj, long N, int D, int V);

extern const LmHeadLossOp lm_head_loss_reference;

#endif
