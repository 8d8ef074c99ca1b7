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

typedef struct RmsnormOp {
    OpHeader h;
    RmsnormForwardFn forward;
    RmsnormBackwardFn backward;
} RmsnormOp;

void rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, long R, int C,
                     float eps);
void rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                      const float *rstd, long R, int C);
extern const RmsnormOp rmsnorm_reference;

#endif
