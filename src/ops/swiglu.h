/* SwiGLU feed-forward: out = (silu(x W1^T) * (x W3^T)) W2^T, silu(a) = a / (1 + exp(-a)).
 * Saves h1 = x W1^T, h3 = x W3^T and g = silu(h1) * h3 for backward.
 * N rows, D model dim, F ffn dim. */
#ifndef QT_OP_SWIGLU_H
#define QT_OP_SWIGLU_H

#include "ops/op.h"

typedef void (*SwigluForwardFn)(float *out,      /* (N, D) */
                                float *h1,       /* (N, F) saved */
                                float *h3,       /* (N, F) saved */
                                float *g,        /* (N, F) saved */
                                const float *x,  /* (N, D) */
                                const float *w1, /* (F, D) */
                                const float *w3, /* (F, D) */
                                const float *w2, /* (D, F) */
                                long N, int D, int F);
/* dx written; dw1, dw3, dw2 accumulated; dh1, dh3 are scratch the caller provides. */
typedef void (*SwigluBackwardFn)(float *dx,         /* (N, D) */
                                 float *dw1,        /* (F, D) */
                                 float *dw3,        /* (F, D) */
                                 float *dw2,        /* (D, F) */
                                 float *dh1,        /* (N, F) scratch */
                                 float *dh3,        /* (N, F) scratch */
                                 const float *dout, /* (N, D) */
                                 const float *x,    /* (N, D) */
                                 const float *h1,   /* (N, F) */
                                 const float *h3,   /* (N, F) */
                                 const float *g,    /* (N, F) */
                                 const float *w1,   /* (F, D) */
                                 const float *w3,   /* (F, D) */
                                 const float *w2,   /* (D, F) */
                                 long N, int D, int F);

typedef struct SwigluOp {
    OpHeader h;
    SwigluForwardFn forward;
    SwigluBackwardFn backward;
} SwigluOp;

void swiglu_forward(float *out, float *h1, float *h3, float *g, const float *x, const float *w1,
                    const float *w3, const float *w2, long N, int D, int F);
void swiglu_backward(float *dx, float *dw1, float *dw3, float *dw2, float *dh1, float *dh3,
                     const float *dout, const float *x, const float *h1, const float *h3,
                     const float *g, const float *w1, const float *w3, const float *w2, long N,
                     int D, int F);
extern const SwigluOp swiglu_reference;

#endif
