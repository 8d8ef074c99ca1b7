/* Causal scaled-dot-product attention with grouped KV heads (GQA) and an optional document
 * mask: query token t attends key s when s <= t and, with doc ids, s lies in t's document, a
 * maximal run of equal ids in the row (packed documents do not see each other). Scale 1/sqrt(E).
 * Head h reads KV head h / (H/K). Tensors are token-major as the projections produce them. B batch,
 * T sequence, H query heads, K kv heads, E head dim. */
#ifndef QT_OP_SDPA_H
#define QT_OP_SDPA_H

#include <stdint.h>

#include "ops/op.h"

typedef void (*SdpaForwardFn)(float *out,         /* (B, T, H, E) */
                              float *lse,         /* (B, H, T) log-sum-exp of scaled scores */
                              const float *q,     /* (B, T, H, E) */
                              const float *k,     /* (B, T, K, E) */
                              const float *v,     /* (B, T, K, E) */
                              const int32_t *doc, /* (B, T) document ids, or NULL */
                              int B, int T, int H, int K, int E);
/* Gradients are written (=). */
typedef void (*SdpaBackwardFn)(float *dq,          /* (B, T, H, E) */
                               float *dk,          /* (B, T, K, E) */
                               float *dv,          /* (B, T, K, E) */
                               const float *dout,  /* (B, T, H, E) */
                               const float *q,     /* (B, T, H, E) */
                               const float *k,     /* (B, T, K, E) */
                               const float *v,     /* (B, T, K, E) */
                               const float *out,   /* (B, T, H, E) */
                               const float *lse,   /* (B, H, T) */
                               const int32_t *doc, /* (B, T) or NULL */
                               int B, int T, int H, int K, int E);

typedef struct SdpaOp {
    OpHeader h;
    SdpaForwardFn forward;
    SdpaBackwardFn backward;
} SdpaOp;

void sdpa_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                  const int32_t *doc, int B, int T, int H, int K, int E);
void sdpa_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                   const float *k, const float *v, const float *out, const float *lse,
                   const int32_t *doc, int B, int T, int H, int K, int E);
extern const SdpaOp sdpa_reference;

#endif
