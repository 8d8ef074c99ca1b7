/* Reference rotate-half RoPE, and the frequencies of plain, linear and YaRN RoPE. Frequencies,
 * ramps and angles are computed in fp32 in the same order as transformers'
 * modeling_rope_utils (inv_freq = 1 / theta^(2i/E), angle = float(pos) * inv_freq), so they
 * round alike; the ramp's bounds are computed in double as its Python floats are. */
#include "ops/rope.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

void rope_freqs_plain(RopeFreqs *f, double theta, int E) {
    f->scale = 1.0f;
    for (int i = 0; i < E / 2 && i < ROPE_MAX_HALF; i++)
        f->inv_freq[i] = 1.0f / powf((float)theta, (float)(2 * i) / (float)E);
}

/* YaRN's attention factor for a context scale: 0.1 m ln(scale) + 1, 1 when scale <= 1. */
static double yarn_mscale(double scale, double m) {
    return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0;
}

/* The dim at which a frequency makes `rotations` turns over the original context. */
static double yarn_correction_dim(double rotations, int E, double theta, int orig) {
    return E * log(orig / (rotations * 2 * M_PI)) / (2 * log(theta));
}

void rope_freqs(RopeFreqs *f, const ModelSpec *s) {
    int E = s->head_dim, half = E / 2;
    const RopeScaling *r = &s->rope_scaling;
    rope_freqs_plain(f, s->rope_theta, E);
    if (r->type == ROPE_LINEAR) {
        for (int i = 0; i < half; i++)
            f->inv_freq[i] /= (float)r->factor;
    } else if (r->type == ROPE_YARN) {
        double lo = yarn_correction_dim(r->beta_fast, E, s->rope_theta, r->original_max_seq_len);
        double hi = yarn_correction_dim(r->beta_slow, E, s->rope_theta, r->original_max_seq_len);
        if (r->truncate) lo = floor(lo), hi = ceil(hi);
        lo = fmax(lo, 0), hi = fmin(hi, E - 1);
        if (lo == hi) hi += 0.001;
        for (int i = 0; i < half; i++) {
            float pos_freq = powf((float)s->rope_theta, (float)(2 * i) / (float)E);
            float extrapolated = 1.0f / pos_freq;
            float interpolated = 1.0f / ((float)r->factor * pos_freq);
            float ramp = ((float)i - (float)lo) / (float)(hi - lo);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            float keep = 1.0f - ramp; /* the share of the extrapolated (unscaled) frequency */
            f->inv_freq[i] = interpolated * (1.0f - keep) + extrapolated * keep;
        }
        double attn = r->attention_factor;
        if (attn == 0)
            attn =
                r->mscale != 0 && r->mscale_all_dim != 0
                    ? yarn_mscale(r->factor, r->mscale) / yarn_mscale(r->factor, r->mscale_all_dim)
                    : yarn_mscale(r->factor, 1);
        f->scale = (float)attn;
    }
}

void rope_describe(char *out, size_t cap, const ModelSpec *s) {
    const RopeScaling *r = &s->rope_scaling;
    const char *name = model_spec_rope_name(r->type);
    if (r->type == ROPE_PLAIN) {
        snprintf(out, cap, "%s", "");
    } else if (r->type == ROPE_LINEAR) {
        snprintf(out, cap, "%s, factor %g", name, r->factor);
    } else {
        RopeFreqs *f = malloc(sizeof *f);
        rope_freqs(f, s);
        snprintf(out, cap, "%s, factor %g over %d positions, attention factor %.4g", name,
                 r->factor, r->original_max_seq_len, f->scale);
        free(f);
    }
}

/* sign = +1 rotates by +angle (forward), -1 by -angle (backward). */
static void rope_rotate(float *out, const float *x, const int32_t *positions, long N, int NH, int E,
                        const RopeFreqs *f, float sign) {
    int half = E / 2;
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++) {
        float pos = (float)positions[n];
        for (int i = 0; i < half; i++) {
            float a = pos * f->inv_freq[i];
            float c = cosf(a) * f->scale, s = sign * (sinf(a) * f->scale);
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
                  const RopeFreqs *f) {
    rope_rotate(out, x, positions, N, NH, E, f, 1.0f);
}

void rope_backward(float *dx, const float *dout, const int32_t *positions, long N, int NH, int E,
                   const RopeFreqs *f) {
    rope_rotate(dx, dout, positions, N, NH, E, f, -1.0f);
}

const RopeOp rope_reference = {{"reference", OP_ROPE, "cpu", 0}, rope_forward, rope_backward};
