/* RMSNorm over rows: out = w * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps), as HF Qwen3
 * (normalise in fp32, then scale by the weight). Also used per head for q_norm / k_norm with
 * rows of length E (N*H rows). R rows, C columns. */
#ifndef QT_OP_RMSNORM_H
#define QT_OP_RMSNORM_H

#include "ops/op.h"

typedef void (*RmsnormForwardFn)(float *out,     /* (R, C) */
                                 float *rstd,    /* (R) saved for backward */
                                 const float *x, /* (R, C) */
                                 const float *w, /* (C) */
                                 long R, int C, float eps);
typedef void (*RmsnormBackwardFn)(float *dx,         /* (R, C) written */
                                  float *dw,         /* (C) accumulated */
                                  const float *dout, /* (R, C) */
                                  const float *x,    /* (R, C) */
                                  const float *w,    /* (C) */
                                  const float *rstd, /* (R) */
                                  long R, int C);

/* Residual add fused with the norm: xsum = a + b, out = norm(xsum) in one pass (xsum may
 * alias a). The model uses it at ffn_norm (xmid = x + attention) when an op provides it. */
typedef void (*RmsnormAddForwardFn)(float *xsum,    /* (R, C) */
                                    float *out,     /* (R, C) */
                                    float *rstd,    /* (R) */
                                    const float *a, /* (R, C) */
                                    const float *b, /* (R, C) */
                                    const float *w, /* (C) */
                                    long R, int C, float eps);

typedef struct RmsnormOp {
    OpHeader h;
    RmsnormForwardFn forward;
    RmsnormBackwardFn backward;
    /* Optional fusions (NULL in the reference; the model then adds separately): */
    RmsnormAddForwardFn forward_add;
    /* As backward, but dx accumulates (+=) into the residual-stream gradient. */
    RmsnormBackwardFn backward_acc;
} RmsnormOp;

void rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, long R, int C,
                     float eps);
void rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                      const float *rstd, long R, int C);
extern const RmsnormOp rmsnorm_reference;

#endif
