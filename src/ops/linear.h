/* Linear layer without bias, torch layout: out = x W^T with W (O, I). All products go
 * through gemm_f32. N rows, I inputs, O outputs. */
#ifndef QT_OP_LINEAR_H
#define QT_OP_LINEAR_H

#include <stdint.h>

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

/* Mixed precision (training.mixed_precision_param = "bfloat16"): wb is the bf16 copy of W,
 * x and dout are cast to bf16 into scratch (at least N * (I + O) values) and the products
 * accumulate in fp32; out, dx and dw stay fp32 with the same write / accumulate rules. */
typedef void (*LinearBf16ForwardFn)(float *out,         /* (N, O) */
                                    const float *x,     /* (N, I) */
                                    const uint16_t *wb, /* (O, I) bf16 */
                                    uint16_t *scratch,  /* (N * (I + O)) */
                                    long N, int I, int O);
typedef void (*LinearBf16BackwardFn)(float *dx,          /* (N, I) */
                                     float *dw,          /* (O, I) accumulated */
                                     const float *dout,  /* (N, O) */
                                     const float *x,     /* (N, I) */
                                     const uint16_t *wb, /* (O, I) bf16 */
                                     uint16_t *scratch,  /* (N * (I + O)) */
                                     long N, int I, int O, float dx_beta);

typedef struct LinearOp {
    OpHeader h;
    LinearForwardFn forward;
    LinearBackwardFn backward;
    /* NULL when the implementation has no bf16 path (the model then runs it in fp32). */
    LinearBf16ForwardFn forward_bf16;
    LinearBf16BackwardFn backward_bf16;
} LinearOp;

void linear_forward(float *out, const float *x, const float *w, long N, int I, int O);
void linear_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                     long N, int I, int O, float dx_beta);
extern const LinearOp linear_reference;

#endif
