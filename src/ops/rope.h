/* Rotary position embedding, rotate-half convention of HF Qwen3: for head vector x of
 * length E with halves x1, x2 and frequencies inv_freq[i] = theta^(-2i/E), i < E/2,
 * angle = pos * inv_freq[i]: out1 = x1 cos - x2 sin, out2 = x2 cos + x1 sin.
 * Positions are explicit per token so packed documents restart at 0.
 * N tokens, NH heads per token, E head dim (even). */
#ifndef QT_OP_ROPE_H
#define QT_OP_ROPE_H

#include <stdint.h>

#include "ops/op.h"

typedef void (*RopeForwardFn)(float *out,               /* (N, NH, E) */
                              const float *x,           /* (N, NH, E) */
                              const int32_t *positions, /* (N) */
                              long N, int NH, int E, double theta);
/* The rotation is orthogonal, so backward rotates dout by the negative angle. */
typedef void (*RopeBackwardFn)(float *dx,                /* (N, NH, E) written */
                               const float *dout,        /* (N, NH, E) */
                               const int32_t *positions, /* (N) */
                               long N, int NH, int E, double theta);

typedef struct RopeOp {
    OpHeader h;
    RopeForwardFn forward;
    RopeBackwardFn backward;
} RopeOp;

void rope_forward(float *out, const float *x, const int32_t *positions, long N, int NH, int E,
                  double theta);
void rope_backward(float *dx, const float *dout, const int32_t *positions, long N, int NH, int E,
                   double theta);
extern const RopeOp rope_reference;

#endif
