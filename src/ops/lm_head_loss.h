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

/* Writes losses and lse for the tokens and returns the sum of losses over valid targets
 * (token order, deterministic). targets NULL: logits only (an implementation that does not
 * keep logits computes nothing and returns 0). logits is the op's workspace of
 * workspace_floats(N, V) floats; the reference leaves the full (N, V) logits there. */
typedef double (*LmHeadLossForwardFn)(float *losses,          /* (N) */
                                      float *lse,             /* (N) saved */
                                      float *logits,          /* workspace */
                                      const float *x,         /* (N, D) */
                                      const float *w,         /* (V, D) */
                                      const int32_t *targets, /* (N) or NULL */
                                      const LinearOp *proj, long N, int D, int V);
/* Backward of loss = sum of valid losses * scale: dx written, dw accumulated (+=). logits is
 * the workspace as forward left it (the reference overwrites it with dlogits). */
typedef void (*LmHeadLossBackwardFn)(float *dx,              /* (N, D) */
                                     float *dw,              /* (V, D) */
                                     float *logits,          /* workspace */
                                     const float *x,         /* (N, D) */
                                     const float *w,         /* (V, D) */
                                     const int32_t *targets, /* (N) */
                                     const float *lse,       /* (N) */
                                     const LinearOp *proj, long N, int D, int V, float scale);
/* Floats of workspace the op needs for N tokens (the model sizes its logits buffer by it). */
typedef long (*LmHeadLossWorkspaceFn)(long N, int V);

typedef struct LmHeadLossOp {
    OpHeader h;
    LmHeadLossForwardFn forward;
    LmHeadLossBackwardFn backward;
    LmHeadLossWorkspaceFn workspace_floats;
} LmHeadLossOp;

extern const LmHeadLossOp lm_head_loss_reference;

#endif
