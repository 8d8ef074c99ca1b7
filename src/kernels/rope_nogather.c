/* rope "rope_nogather": RoPE for rows whose positions are 0..T-1. The angles of position t
 * are computed once and applied to that position in every row, instead of gathering each
 * token's position from the table and recomputing cos/sin per token (the reference). Valid
 * only when positions never restart inside a row: supports() rejects document-masked packing.
 * The op interface passes N = B*T tokens; T is the first restart of the table (one row is
 * read once, never per token). */
#include <math.h>

#include "kernels/kernels.h"

static long row_length(const int32_t *positions, long N) {
    for (long n = 1; n < N; n++)
        if (positions[n] == 0) return n;
    return N;
}

static void rotate(float *out, const float *x, const int32_t *positions, long N, int NH, int E,
                   const RopeFreqs *f, float sign) {
    int half = E / 2;
    long T = row_length(positions, N);
    const float *inv = f->inv_freq;
#pragma omp parallel for schedule(static)
    for (long t = 0; t < T; t++) {
        float c[512], s[512];
        for (int i = 0; i < half; i++) {
            float a = (float)t * inv[i];
            c[i] = cosf(a) * f->scale;
            s[i] = sign * (sinf(a) * f->scale);
        }
        /* Every row shares the angles of position t. */
        for (long n = t; n < N; n += T)
            for (int h = 0; h < NH; h++) {
                const float *xv = x + (n * NH + h) * E;
                float *o = out + (n * NH + h) * E;
                for (int i = 0; i < half; i++) {
                    float x1 = xv[i], x2 = xv[i + half];
                    o[i] = x1 * c[i] - x2 * s[i];
                    o[i + half] = x2 * c[i] + x1 * s[i];
                }
            }
    }
}

static void nogather_forward(float *out, const float *x, const int32_t *positions, long N, int NH,
                             int E, const RopeFreqs *f) {
    rotate(out, x, positions, N, NH, E, f, 1.0f);
}

static void nogather_backward(float *dx, const float *dout, const int32_t *positions, long N,
                              int NH, int E, const RopeFreqs *f) {
    rotate(dx, dout, positions, N, NH, E, f, -1.0f);
}

static const char *nogather_supports(const OpRun *run) {
    if (run->document_mask)
        return "positions must run 0..seq_len-1 in every row, but training.document_mask = true "
               "restarts them at each packed document";
    if (run->spec && run->spec->head_dim > 1024) return "head_dim must be at most 1024";
    return NULL;
}

const RopeOp rope_nogather = {
    {"rope_nogather", OP_ROPE, "cpu", nogather_supports}, nogather_forward, nogather_backward};
