/* Global-norm gradient clipping with a thread-count-independent reduction. */
#include "train/clip.h"

#include <math.h>
#include <stdlib.h>

#include "core/err.h"

/* Elements per partial sum: big enough to amortise scheduling, small enough to balance. */
#define CLIP_CHUNK 65536
#define CLIP_LANES 16
/* Chunks whose partial sums are computed in one parallel pass (their sums live on the stack, so
 * a training step allocates nothing here); the partials are still added in chunk order. */
#define CLIP_BATCH 256

double grad_sum_squares(const GradRef *grads, int n) {
    double total = 0.0;
    for (int t = 0; t < n; t++) {
        const float *g = grads[t].g;
        size_t len = grads[t].n;
        long nchunks = (long)((len + CLIP_CHUNK - 1) / CLIP_CHUNK);
        for (long c0 = 0; c0 < nchunks; c0 += CLIP_BATCH) {
            long c1 = c0 + CLIP_BATCH < nchunks ? c0 + CLIP_BATCH : nchunks;
            double partial[CLIP_BATCH];
#pragma omp parallel for schedule(static)
            for (long c = c0; c < c1; c++) {
                size_t lo = (size_t)c * CLIP_CHUNK;
                size_t hi = lo + CLIP_CHUNK < len ? lo + CLIP_CHUNK : len;
                /* CLIP_LANES running sums in a fixed order (one running sum cannot be vectorised
                 * without reordering it), added pairwise at the end. */
                double lane[CLIP_LANES] = {0};
                size_t i = lo;
                for (; i + CLIP_LANES <= hi; i += CLIP_LANES)
                    for (int l = 0; l < CLIP_LANES; l++)
                        lane[l] += (double)g[i + l] * (double)g[i + l];
                for (; i < hi; i++)
                    lane[0] += (double)g[i] * (double)g[i];
                for (int w = CLIP_LANES / 2; w > 0; w /= 2)
                    for (int l = 0; l < w; l++)
                        lane[l] += lane[l + w];
                partial[c - c0] = lane[0];
            }
            for (long c = c0; c < c1; c++)
                total += partial[c - c0];
        }
    }
    return total;
}

double grad_global_norm(const GradRef *grads, int n) {
    return sqrt(grad_sum_squares(grads, n));
}

float grad_clip_coef(double total_norm, double max_norm) {
    if (!isfinite(total_norm) || !(max_norm > 0)) return 1.0f;
    float coef = (float)max_norm / ((float)total_norm + 1e-6f);
    return coef < 1.0f ? coef : 1.0f;
}

float grad_clip_scale(const GradRef *grads, int n, double total_norm, double max_norm) {
    float coef = grad_clip_coef(total_norm, max_norm);
    if (coef >= 1.0f) return 1.0f;
    for (int t = 0; t < n; t++) {
        float *g = grads[t].g;
        long len = (long)grads[t].n;
#pragma omp parallel for schedule(static)
        for (long i = 0; i < len; i++)
            g[i] *= coef;
    }
    return coef;
}

double grad_clip(const GradRef *grads, int n, double max_norm, int *finite) {
    double norm = grad_global_norm(grads, n);
    *finite = isfinite(norm) != 0;
    grad_clip_scale(grads, n, norm, max_norm);
    return norm;
}
