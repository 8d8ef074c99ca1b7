/* Global-norm gradient clipping with a thread-count-independent reduction. */
#include "train/clip.h"

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>

#include "core/err.h"

/* Elements per partial sum: big enough to amortise scheduling, small enough to balance. */
#define CLIP_CHUNK 65536
#define CLIP_LANES 16
/* Chunks whose partial sums are computed in one parallel pass (their sums live on the stack, so
 * a training step allocates nothing here); the partials are still added in chunk order. */
#define CLIP_BATCH 256
/* Elements copied out at a time from a device that is not host-visible: a multiple of
 * CLIP_LANES dividing CLIP_CHUNK, so each chunk's lanes see the same values in the same order. */
#define CLIP_STAGE 4096
_Static_assert(CLIP_LANES == 16, "lanes_add_avx512 keeps 16 lanes in two registers");

/* lanes_add's whole groups of CLIP_LANES with the 16 running sums in two AVX-512 registers:
 * the same products and sums in the same order as the loop below, without its store and
 * reload of every lane per group (the loop ran at 15 GB/s, a third of the bandwidth). Returns
 * the elements it took. */
__attribute__((target("avx512f"))) static size_t lanes_add_avx512(double *lane, const float *g,
                                                                  size_t n) {
    __m512d lo = _mm512_loadu_pd(lane), hi = _mm512_loadu_pd(lane + 8);
    size_t i = 0;
    for (; i + CLIP_LANES <= n; i += CLIP_LANES) {
        __m512d a = _mm512_cvtps_pd(_mm256_loadu_ps(g + i));
        __m512d b = _mm512_cvtps_pd(_mm256_loadu_ps(g + i + 8));
        lo = _mm512_add_pd(lo, _mm512_mul_pd(a, a));
        hi = _mm512_add_pd(hi, _mm512_mul_pd(b, b));
    }
    _mm512_storeu_pd(lane, lo);
    _mm512_storeu_pd(lane + 8, hi);
    return i;
}

/* Adds the squares of g[0..n) (n a multiple of CLIP_LANES but for the last piece of a chunk)
 * into the chunk's lanes. */
static void lanes_add(double *lane, const float *g, size_t n) {
    size_t i = __builtin_cpu_supports("avx512f") ? lanes_add_avx512(lane, g, n) : 0;
    for (; i + CLIP_LANES <= n; i += CLIP_LANES)
        for (int l = 0; l < CLIP_LANES; l++)
            lane[l] += (double)g[i + l] * (double)g[i + l];
    for (; i < n; i++)
        lane[0] += (double)g[i] * (double)g[i];
}

static double lanes_sum(double *lane) {
    for (int w = CLIP_LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++)
            lane[l] += lane[l + w];
    return lane[0];
}

/* The same sum for a tensor on a device that is not host-visible, through the copy-out path. */
static double staged_sum_squares(const Device *d, const float *g, size_t len) {
    float stage[CLIP_STAGE];
    double total = 0.0;
    for (size_t lo = 0; lo < len; lo += CLIP_CHUNK) {
        size_t hi = lo + CLIP_CHUNK < len ? lo + CLIP_CHUNK : len;
        double lane[CLIP_LANES] = {0};
        for (size_t i = lo; i < hi; i += CLIP_STAGE) {
            size_t m = hi - i < CLIP_STAGE ? hi - i : CLIP_STAGE;
            lanes_add(lane, device_host_view(d, stage, g + i, m * sizeof *g), m);
        }
        total += lanes_sum(lane);
    }
    return total;
}

double grad_sum_squares(const GradRef *grads, int n) {
    double total = 0.0;
    for (int t = 0; t < n; t++) {
        const float *g = grads[t].g;
        size_t len = grads[t].n;
        if (grads[t].device && !grads[t].device->host_visible) {
            total += staged_sum_squares(grads[t].device, g, len);
            continue;
        }
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
                lanes_add(lane, g + lo, hi - lo);
                partial[c - c0] = lanes_sum(lane);
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
        const Device *d = grads[t].device;
        if (d && !d->host_visible) {
            float stage[CLIP_STAGE];
            for (long i = 0; i < len; i += CLIP_STAGE) {
                size_t m = (size_t)(len - i < CLIP_STAGE ? len - i : CLIP_STAGE);
                d->to_host(stage, g + i, m * sizeof *g);
                for (size_t k = 0; k < m; k++)
                    stage[k] *= coef;
                d->from_host(g + i, stage, m * sizeof *g);
            }
            continue;
        }
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
