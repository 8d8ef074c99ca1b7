/* Mixture-of-experts expert layer (Qwen3-MoE, dropless, no shared experts): token n goes to
 * its k chosen experts idx[n, j] and
 *     out[n] = sum_{j = 0..k-1} gw[n, j] * SwiGLU_e(x[n]),  e = idx[n, j],
 *     SwiGLU_e(x) = W2[e] (silu(W1[e] x) * (W3[e] x)),
 * the sum taken in slot order j = 0, 1, ..., k-1 so results do not depend on threads.
 * Backward also returns the gradient of the gate weights gw (the router's path).
 *
 * Letters: N tokens, D model dim, F expert ffn dim, X experts, k experts per token (top_k).
 * An assignment is a (token, slot) pair, numbered a = n * k + j; there are N * k of them.
 *
 * Implementations:
 *   reference  per token, per chosen expert, plain matvec SwiGLU (the numerical truth);
 *   grouped    assignments sorted by expert (stable), one contiguous gemm_f32 per expert
 *              for each product, forward and backward. */
#ifndef QT_OP_MOE_EXPERTS_H
#define QT_OP_MOE_EXPERTS_H

#include <stdint.h>

#include "ops/op.h"

/* Buffers the caller sizes from the maximum N (moe_experts_bufs_floats / _ints). The saved
 * ones carry forward's state to the backward of the same implementation; their row order is
 * the implementation's own (assignment order for reference, sorted by expert for grouped). */
typedef struct MoeExpertsBufs {
    /* saved */
    float *h1;        /* (N*k, F) W1 x per assignment */
    float *h3;        /* (N*k, F) W3 x per assignment */
    float *y;         /* (N*k, D) unweighted expert output per assignment */
    int32_t *order;   /* (N*k) row r holds assignment order[r] (grouped) */
    int32_t *row;     /* (N*k) assignment a sits in row row[a] (grouped) */
    int32_t *offsets; /* (X+1) rows of expert e: offsets[e] .. offsets[e+1]-1 (grouped) */
    /* scratch, free between calls */
    float *xs;  /* (N*k, D) */
    float *dxs; /* (N*k, D) */
    float *g;   /* (N*k, F) */
    float *dh1; /* (N*k, F) */
    float *dh3; /* (N*k, F) */
} MoeExpertsBufs;

typedef void (*MoeExpertsForwardFn)(float *out,         /* (N, D) written */
                                    MoeExpertsBufs *b,  /* saved filled, scratch used */
                                    const float *x,     /* (N, D) */
                                    const int32_t *idx, /* (N, k) expert ids in [0, X) */
                                    const float *gw,    /* (N, k) gate weights */
                                    const float *w1,    /* (X, F, D) */
                                    const float *w3,    /* (X, F, D) */
                                    const float *w2,    /* (X, D, F) */
                                    long N, int k, int D, int F, int X);
/* dx and dgw written; dw1, dw3, dw2 accumulated (+=). The saved buffers are left intact. */
typedef void (*MoeExpertsBackwardFn)(float *dx,          /* (N, D) */
                                     float *dgw,         /* (N, k) */
                                     float *dw1,         /* (X, F, D) */
                                     float *dw3,         /* (X, F, D) */
                                     float *dw2,         /* (X, D, F) */
                                     MoeExpertsBufs *b,  /* saved by forward; scratch used */
                                     const float *dout,  /* (N, D) */
                                     const float *x,     /* (N, D) */
                                     const int32_t *idx, /* (N, k) */
                                     const float *gw,    /* (N, k) */
                                     const float *w1,    /* (X, F, D) */
                                     const float *w3,    /* (X, F, D) */
                                     const float *w2,    /* (X, D, F) */
                                     long N, int k, int D, int F, int X);

typedef struct MoeExpertsOp {
    OpHeader h;
    MoeExpertsForwardFn forward;
    MoeExpertsBackwardFn backward;
} MoeExpertsOp;

/* Sizes of the buffers for up to N tokens: saved floats, scratch floats, saved int32s. */
long moe_experts_saved_floats(long N, int k, int D, int F);
long moe_experts_scratch_floats(long N, int k, int D, int F);
long moe_experts_saved_ints(long N, int k, int X);
/* Points the saved buffers into `saved` / `ints` and the scratch into `scratch` (either of
 * the float blocks may be NULL to set only the other half). */
void moe_experts_bufs_place(MoeExpertsBufs *b, float *saved, int32_t *ints, float *scratch, long N,
                            int k, int D, int F, int X);

extern const MoeExpertsOp moe_experts_reference;
extern const MoeExpertsOp moe_experts_grouped;

#endif
