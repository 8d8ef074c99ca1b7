/* Linear layer without bias, torch layout: out = x W^T with W (O, I). All products go
 * through gemm_f32. N rows, I inputs, O outputs. */
#ifndef QT_OP_LINEAR_H
#define QT_OP_LINEAR_H

#include "ops/op.h"

typedef void (*LinearForwardFn)(float *out,     /* (N, O) */
                                const float *x, /* (N, I) */
                                const float *w, /* (O, I) */
                                long N, int I, int O);
/* dx = dx_beta * dx + dout W (dx_beta 0 writes, 1 adds: q, k and v share one input);
 * dw += dout^T x. */
typedef void (*LinearBackwardFn)(float *dx,         /* (N, I) */
                                 float *dw,         /* (O, I) accumulated */
                                 const float *dout, /* (N, O) */
                                 const float *x,    /* (N, I) */
                                 const float *w,    /* (O, I) */
                                 long N, int I, int O, float dx_beta);

typedef struct LinearOp {
    OpHeader h;
    LinearForwardFn forward;
    LinearBackwardFn backward;
} LinearOp;

void linear_forward(float *out, const float *x, const float *w, long N, int I, int O);
void linear_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                     long N, int I, int O, float dx_beta);
extern const LinearOp linear_reference;

#endif
