/* SwiGLU feed-forward: out = (silu(x W1^T) * (x W3^T)) W2^T, silu(a) = a / (1 + exp(-a)).
 * Saves h1 = x W1^T, h3 = x W3^T and g = silu(h1) * h3 for backward.
 * N rows, D model dim, F ffn dim. */
#ifndef QT_OP_SWIGLU_H
#define QT_OP_SWIGLU_H

#include <stdint.h>

#include "ops/op.h"

typedef void (*SwigluForwardFn)(float *out,      /* (N, D) */
                                float *h1,       /* (N, F) saved */
                                float *h3,       /* (N, F) saved */
                                float *g,        /* (N, F) saved */
                                const float *x,  /* (N, D) */
                                const float *w1, /* (F, D) */
                                const float *w3, /* (F, D) */
                                const float *w2, /* (D, F) */
                                float *ws,       /* workspace_floats(N, D, F), or NULL */
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
                                 float *ws,         /* workspace_floats(N, D, F), or NULL */
                                 long N, int D, int F);

/* Mixed precision: w1b, w3b, w2b are bf16 copies of the weights; x, g, dout, dh1 and dh3 are
 * cast to bf16 in scratch (at least N * (2D + 2F) values) before each product, which
 * accumulates in fp32. h1, h3, g, the gate and every gradient stay fp32. */
typedef void (*SwigluBf16ForwardFn)(float *out,          /* (N, D) */
                                    float *h1,           /* (N, F) saved */
                                    float *h3,           /* (N, F) saved */
                                    float *g,            /* (N, F) saved */
                                    const float *x,      /* (N, D) */
                                    const uint16_t *w1b, /* (F, D) */
                                    const uint16_t *w3b, /* (F, D) */
                                    const uint16_t *w2b, /* (D, F) */
                                    uint16_t *scratch,   /* (N * (2D + 2F)) */
                                    long N, int D, int F);
typedef void (*SwigluBf16BackwardFn)(float *dx, float *dw1, float *dw3, float *dw2, float *dh1,
                                     float *dh3, const float *dout, const float *x, const float *h1,
                                     const float *h3, const float *g, const uint16_t *w1b,
                                     const uint16_t *w3b, const uint16_t *w2b, uint16_t *scratch,
                                     long N, int D, int F);

/* Floats of fp32 workspace forward and backward need for N rows (contents not kept between
 * calls); the model takes it from its activation arena, so steps allocate nothing. */
typedef long (*SwigluWorkspaceFn)(long N, int D, int F);

typedef struct SwigluOp {
    OpHeader h;
    SwigluForwardFn forward;
    SwigluBackwardFn backward;
    SwigluWorkspaceFn workspace_floats; /* NULL: none (ws may be NULL) */
    /* NULL when the implementation has no bf16 path (the model then runs it in fp32). */
    SwigluBf16ForwardFn forward_bf16;
    SwigluBf16BackwardFn backward_bf16;
} SwigluOp;

void swiglu_forward(float *out, float *h1, float *h3, float *g, const float *x, const float *w1,
                    const float *w3, const float *w2, float *ws, long N, int D, int F);
void swiglu_backward(float *dx, float *dw1, float *dw3, float *dw2, float *dh1, float *dh3,
                     const float *dout, const float *x, const float *h1, const float *h3,
                     const float *g, const float *w1, const float *w3, const float *w2, float *ws,
                     long N, int D, int F);
extern const SwigluOp swiglu_reference;

#endif
