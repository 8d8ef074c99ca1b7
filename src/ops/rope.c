/* Reference rotate-half RoPE. Frequencies and angles are computed in fp32 in the same order
 * as HF (inv_freq = 1 / theta^(2i/E), angle = float(pos) * inv_freq) so they round alike. */
#include "ops/rope.h"

#include <math.h>

static inline float inv_freq(int i, int E, double theta) {
    return 1.0f / powf((float)theta, (float)(2 * i) / (float)E);
}

/* sign = +1 rotates by +angle (forward), -1 by -angle (backward). */
static void rope_rotate(float *out, const float *x, const int32_t *positions, long N, int NH, int E,
                        double theta, float sign) {
    int half = E / 2;
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++) {
        float pos = (float)positions[n];
        for (int i = 0; i < half; i++) {
            float a = pos * inv_freq(i, E, theta);
            float c = cosf(a), s = sign * sinf(a);
            for (int h = 0; h < NH; h++) {
                const float *xv = x + (n * NH + h) * E;
                float *o = out + (n * NH + h) * E;
                float x1 = xv[i], x2 = xv[i + half];
                o[i] = x1 * c - x2 * s;
                o[i + half] = x2 * c + x1 * s;
            }
        }
    }
}

void rope_forward(float *out, const float *x, const int32_t *positions, long N, int NH, int E,
                  double theta) {
    rope_rotate(out, x, positions, N, NH, E, theta, 1.0f);
}

void rope_backward(float *dx, const float *dout, const int32_t *positions, long N, int NH, int E,
                   double theta) {
    rope_rotate(dx, dout, positions, N, NH, E, theta, -1.0f);
}

const RopeOp rope_reference = {{"reference", OP_ROPE, "cpu", 0}, rope_forward, rope_backward};
