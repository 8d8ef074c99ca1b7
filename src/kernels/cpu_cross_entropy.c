/* cross_entropy "cpu": the default CPU loss. Rows are split over threads; within a row the max,
 * the exponentials (simd_exp) and their sum run over chunks of CE_CHUNK logits with vector
 * code, and the sum adds chunk totals in order, so a row's result depends only on V. The sum
 * is fp32 per chunk and double across chunks (the reference is double throughout). */
#include <math.h>

#include "kernels/cpu_ops.h"
#include "kernels/cpu_simd.h"

#define CE_CHUNK 2048

static float row_max(const float *l, int V) {
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int j = 0; j < V; j++)
        m = l[j] > m ? l[j] : m;
    return m;
}

static double cpu_ce_forward(float *losses, float *lse, const float *logits, const int32_t *targets,
                             long N, int V) {
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++) {
        const float *l = logits + n * V;
        float m = row_max(l, V);
        float buf[CE_CHUNK];
        double s = 0.0;
        for (int j0 = 0; j0 < V; j0 += CE_CHUNK) {
            int c = V - j0 < CE_CHUNK ? V - j0 : CE_CHUNK;
#pragma omp simd
            for (int j = 0; j < c; j++)
                buf[j] = l[j0 + j] - m;
            simd_exp(buf, buf, c);
            float cs = 0.0f;
#pragma omp simd reduction(+ : cs)
            for (int j = 0; j < c; j++)
                cs += buf[j];
            s += cs;
        }
        double z = m + log(s);
        lse[n] = (float)z;
        losses[n] = targets[n] == CE_IGNORE ? 0.0f : (float)(z - l[targets[n]]);
    }
    return cross_entropy_valid_sum(losses, targets, N);
}

static void cpu_ce_backward(float *dlogits, const float *logits, const float *lse,
                            const int32_t *targets, long N, int V, float scale) {
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++) {
        const float *l = logits + n * V;
        float *d = dlogits + n * V;
        int t = targets[n];
        if (t == CE_IGNORE) {
            for (int j = 0; j < V; j++)
                d[j] = 0.0f;
            continue;
        }
        float z = lse[n];
        /* dlogits may alias logits: each element is read before it is written. */
        for (int j0 = 0; j0 < V; j0 += CE_CHUNK) {
            int c = V - j0 < CE_CHUNK ? V - j0 : CE_CHUNK;
            for (int j = 0; j < c; j++)
                d[j0 + j] = l[j0 + j] - z;
            simd_exp(d + j0, d + j0, c);
#pragma omp simd
            for (int j = 0; j < c; j++)
                d[j0 + j] *= scale;
        }
        d[t] -= scale;
    }
}

const CrossEntropyOp cross_entropy_cpu = {
    .h = {.name = "cpu", .kind = OP_CROSS_ENTROPY, .device = "cpu"},
    .forward = cpu_ce_forward,
    .backward = cpu_ce_backward};
