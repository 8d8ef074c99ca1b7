/* rope "cpu": the default CPU RoPE. Per token the cos / sin of every frequency are computed once
 * (the reference recomputes them for each head), then each head is rotated with vector code.
 * Angles and products are formed exactly as in ops/rope.c, so the output is bitwise the
 * reference's. */
#include <math.h>

#include "kernels/cpu_ops.h"

static void rotate(float *out, const float *x, const int32_t *positions, long N, int NH, int E,
                   const RopeFreqs *f, float sign) {
    int half = E / 2;
    const float *inv = f->inv_freq;
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++) {
        float c[SDPA_MAX_HEAD_DIM / 2], s[SDPA_MAX_HEAD_DIM / 2];
        float pos = (float)positions[n];
        for (int i = 0; i < half; i++) {
            float a = pos * inv[i];
            c[i] = cosf(a) * f->scale;
            s[i] = sign * (sinf(a) * f->scale);
        }
        for (int h = 0; h < NH; h++) {
            const float *xv = x + (n * NH + h) * E;
            float *o = out + (n * NH + h) * E;
#pragma omp simd
            for (int i = 0; i < half; i++) {
                float x1 = xv[i], x2 = xv[i + half];
                o[i] = x1 * c[i] - x2 * s[i];
                o[i + half] = x2 * c[i] + x1 * s[i];
            }
        }
    }
}

static void cpu_rope_forward(float *out, const float *x, const int32_t *positions, long N, int NH,
                             int E, const RopeFreqs *f) {
    rotate(out, x, positions, N, NH, E, f, 1.0f);
}

static void cpu_rope_backward(float *dx, const float *dout, const int32_t *positions, long N,
                              int NH, int E, const RopeFreqs *f) {
    rotate(dx, dout, positions, N, NH, E, f, -1.0f);
}

const RopeOp rope_cpu = {
    .h = {.name = "cpu", .kind = OP_ROPE, .device = "cpu", .supports = cpu_head_dim_supports},
    .forward = cpu_rope_forward,
    .backward = cpu_rope_backward};
