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

/* The bf16 entries (optional; SdpaOp.forward_bf16 / backward_bf16): the same calls, for mixed
 * precision. The products (Q K^T, P V and the backward's four) take bf16 operands with fp32
 * accumulation, as torch's autocast runs attention; the softmax, the log-sum-exp and every
 * output stay fp32. scratch: SDPA_BF16_SCRATCH(B, T, K, E) bf16 values the call may overwrite
 * (three casts of the keys or values, each in whole panels of 64 keys: kernels/cpu_sdpa.c's
 * layouts, the one implementation with these entries). The model calls them when it trains in
 * bf16 on native bf16 products (docs/training.md, Mixed precision); an implementation may compute
 * in fp32 where its bf16 products do not apply. */
#define SDPA_BF16_SCRATCH(B, T, K, E) (3L * (B) * (K) * (E) * (((long)(T) + 63) / 64 * 64))
typedef void (*SdpaForwardBf16Fn)(float *out, float *lse, const float *q, const float *k,
                                  const float *v, const int32_t *doc, int B, int T, int H, int K,
                                  int E, uint16_t *scratch);
typedef void (*SdpaBackwardBf16Fn)(float *dq, float *dk, float *dv, const float *dout,
                                   const float *q, const float *k, const float *v, const float *out,
                                   const float *lse, const int32_t *doc, int B, int T, int H, int K,
                                   int E, uint16_t *scratch);

typedef struct SdpaOp {
    OpHeader h;
    SdpaForwardFn forward;
    SdpaBackwardFn backward;
    SdpaForwardBf16Fn forward_bf16;
    SdpaBackwardBf16Fn backward_bf16;
} SdpaOp;

void sdpa_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                  const int32_t *doc, int B, int T, int H, int K, int E);
void sdpa_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                   const float *k, const float *v, const float *out, const float *lse,
                   const int32_t *doc, int B, int T, int H, int K, int E);
extern const SdpaOp sdpa_reference;

#endif
