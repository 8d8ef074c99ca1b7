/* Cross-entropy of logits against next-token targets; target -100 (CE_IGNORE) is skipped.
 * The loss is sum over valid tokens / divisor; the divisor is the caller's (the local valid
 * count, or the global one under gradient accumulation and data parallel).
 * N tokens, V vocab. */
#ifndef QT_OP_CROSS_ENTROPY_H
#define QT_OP_CROSS_ENTROPY_H

#include <stdint.h>

#include "core/ignore_target.h"
#include "ops/op.h"

/* losses[n] = logsumexp(logits[n]) - logits[n, targets[n]] (0 for ignored tokens). Returns
 * the sum over valid tokens, added in token order so it is deterministic. Valid targets are
 * in [0, V) (checked by the caller). */
typedef double (*CrossEntropyForwardFn)(float *losses,          /* (N) */
                                        float *lse,             /* (N) saved */
                                        const float *logits,    /* (N, V) */
                                        const int32_t *targets, /* (N) */
                                        long N, int V);
/* dlogits = (softmax(logits) - onehot(target)) * scale, zero rows for ignored tokens,
 * scale = dloss / divisor. dlogits may be the logits buffer itself (in place). */
typedef void (*CrossEntropyBackwardFn)(float *dlogits,         /* (N, V) written */
                                       const float *logits,    /* (N, V) */
                                       const float *lse,       /* (N) */
                                       const int32_t *targets, /* (N) */
                                       long N, int V, float scale);

typedef struct CrossEntropyOp {
    OpHeader h;
    CrossEntropyForwardFn forward;
    CrossEntropyBackwardFn backward;
} CrossEntropyOp;

/* The sum of the losses of valid targets over N tokens, added in token order (what every
 * forward returns, so implementations that compute losses their own way agree with it). */
double cross_entropy_valid_sum(const float *losses, const int32_t *targets, long N);
double cross_entropy_forward(float *losses, float *lse, const float *logits, const int32_t *targets,
                             long N, int V);
void cross_entropy_backward(float *dlogits, const float *logits, const float *lse,
                            const int32_t *targets, long N, int V, float scale);
extern const CrossEntropyOp cross_entropy_reference;

#endif
