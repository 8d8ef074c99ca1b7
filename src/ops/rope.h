/* Rotary position embedding, rotate-half convention of HF Qwen3: for head vector x of
 * length E with halves x1, x2, frequencies inv_freq[i] (i < E/2) and a scale c (RopeFreqs),
 * angle = pos * inv_freq[i]: out1 = x1 cos' - x2 sin', out2 = x2 cos' + x1 sin', where
 * cos' = c cos(angle), sin' = c sin(angle). Plain RoPE has inv_freq[i] = theta^(-2i/E), c = 1;
 * rope_freqs gives the scaled kinds a model's spec names (linear, YaRN).
 * Positions are explicit per token so packed documents restart at 0.
 * N tokens, NH heads per token, E head dim (even). */
#ifndef QT_OP_ROPE_H
#define QT_OP_ROPE_H

#include <stddef.h>
#include <stdint.h>

#include "core/model_spec.h"
#include "ops/op.h"

#define ROPE_MAX_HALF 2048 /* head_dim <= 4096, model_spec_validate's bound */

/* What a RoPE kernel rotates by, computed once per model in fp32 as transformers computes its
 * inv_freq and attention scaling (so they round alike). */
typedef struct RopeFreqs {
    float scale; /* cos and sin are multiplied by it: YaRN's attention factor, else 1 */
    float inv_freq[ROPE_MAX_HALF];
} RopeFreqs;

/* The frequencies of s's RoPE (rope_theta, rope_scaling) at head dim s->head_dim. */
void rope_freqs(RopeFreqs *f, const ModelSpec *s);
/* "yarn, factor 4 over 32768 positions, attention factor 1.139" for a scaled RoPE (the line
 * inspect and plan print), "" for plain RoPE. */
void rope_describe(char *out, size_t cap, const ModelSpec *s);
/* Plain RoPE of base theta at head dim E. */
void rope_freqs_plain(RopeFreqs *f, double theta, int E);

typedef void (*RopeForwardFn)(float *out,               /* (N, NH, E) */
                              const float *x,           /* (N, NH, E) */
                              const int32_t *positions, /* (N) */
                              long N, int NH, int E, const RopeFreqs *f);
/* The rotation is orthogonal up to the scale c, so backward rotates dout by the negative angle
 * with the same c (the transpose of c R(a) is c R(-a)). */
typedef void (*RopeBackwardFn)(float *dx,                /* (N, NH, E) written */
                               const float *dout,        /* (N, NH, E) */
                               const int32_t *positions, /* (N) */
                               long N, int NH, int E, const RopeFreqs *f);

typedef struct RopeOp {
    OpHeader h;
    RopeForwardFn forward;
    RopeBackwardFn backward;
} RopeOp;

void rope_forward(float *out, const float *x, const int32_t *positions, long N, int NH, int E,
                  const RopeFreqs *f);
void rope_backward(float *dx, const float *dout, const int32_t *positions, long N, int NH, int E,
                   const RopeFreqs *f);
extern const RopeOp rope_reference;

#endif
