/* Token embedding: a row gather forward, a scatter-add backward.
 * N tokens, D model dim, V vocab. */
#ifndef QT_OP_EMBEDDING_H
#define QT_OP_EMBEDDING_H

#include <stdint.h>

#include "ops/op.h"

/* out[n,:] = table[tokens[n],:]. tokens must be in [0, V) (checked by the caller). */
typedef void (*EmbeddingForwardFn)(float *out,            /* (N, D) */
                                   const int32_t *tokens, /* (N) */
                                   const float *table,    /* (V, D) */
                                   long N, int D);
/* dtable[tokens[n],:] += dout[n,:]. */
typedef void (*EmbeddingBackwardFn)(float *dtable,         /* (V, D) accumulated */
                                    const float *dout,     /* (N, D) */
                                    const int32_t *tokens, /* (N) */
                                    long N, int D);

typedef struct EmbeddingOp {
    OpHeader h;
    EmbeddingForwardFn forward;
    EmbeddingBackwardFn backward;
} EmbeddingOp;

void embedding_forward(float *out, const int32_t *tokens, const float *table, long N, int D);
void embedding_backward(float *dtable, const float *dout, const int32_t *tokens, long N, int D);
extern const EmbeddingOp embedding_reference;

#endif
