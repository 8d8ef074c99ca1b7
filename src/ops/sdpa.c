/* Reference causal GQA attention with optional document mask. Scores are recomputed rather
 * than stored: forward keeps only the log-sum-exp per query row, backward rebuilds each
 * probability from it, so memory stays O(T) per head. Work is split over (batch, kv head)
 * so each thread owns its dk/dv rows: no atomics and the same sums for any thread count. */
#include "ops/sdpa.h"

#include <math.h>
#include <string.h>

/* Eight partial sums in a fixed order: the compiler can vectorise them (one running sum
 * cannot be reordered), and the result still does not depend on threads. */
static inline float dot(const float *a, const float *b, int E) {
    float acc[8] = {0};
    int e = 0;
    for (; e + 8 <= E; e += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += a[e + j] * b[e + j];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; e < E; e++)
        s += a[e] * b[e];
    return s;
}

/* y += a * x; restrict lets the compiler vectorise (the buffers never overlap). */
static inline void axpy(float *restrict y, float a, const float *restrict x, int E) {
    for (int e = 0; e < E; e++)
        y[e] += a * x[e];
}

/* First key position query t may see: the start of its run of equal document ids, or 0. */
static inline int row_start(const int32_t *doc, int t) {
    if (!doc) return 0;
    int s = t;
    while (s > 0 && doc[s - 1] == doc[t])
        s--;
    return s;
}

void sdpa_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                  const int32_t *doc, int B, int T, int H, int K, int E) {
    float scale = (float)(1.0 / sqrt((double)E));
    int rep = H / K;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const int32_t *db = doc ? doc + (long)b * T : NULL;
            int kh = h / rep;
            for (int t = 0; t < T; t++) {
                const float *qt = q + (((long)b * T + t) * H + h) * E;
                float *o = out + (((long)b * T + t) * H + h) * E;
                int s0 = row_start(db, t);
                float m = -INFINITY;
                for (int s = s0; s <= t; s++) {
                    float sc = dot(qt, k + (((long)b * T + s) * K + kh) * E, E) * scale;
                    m = sc > m ? sc : m;
                }
                for (int e = 0; e < E; e++)
                    o[e] = 0.0f;
                double sum = 0.0;
                for (int s = s0; s <= t; s++) {
                    long kv = (((long)b * T + s) * K + kh) * E;
                    float p = expf(dot(qt, k + kv, E) * scale - m);
                    sum += p;
                    for (int e = 0; e < E; e++)
                        o[e] += p * v[kv + e];
                }
                float inv = (float)(1.0 / sum);
                for (int e = 0; e < E; e++)
                    o[e] *= inv;
                lse[((long)b * H + h) * T + t] = m + (float)log(sum);
            }
        }
}

void sdpa_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                   const float *k, const float *v, const float *out, const float *lse,
                   const int32_t *doc, int B, int T, int H, int K, int E) {
    float scale = (float)(1.0 / sqrt((double)E));
    int rep = H / K;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int kh = 0; kh < K; kh++) {
            const int32_t *db = doc ? doc + (long)b * T : NULL;
            for (int t = 0; t < T; t++) {
                long kv = (((long)b * T + t) * K + kh) * E;
                memset(dk + kv, 0, (size_t)E * sizeof(float));
                memset(dv + kv, 0, (size_t)E * sizeof(float));
            }
            for (int h = kh * rep; h < (kh + 1) * rep; h++)
                for (int t = 0; t < T; t++) {
                    long qi = (((long)b * T + t) * H + h) * E;
                    const float *qt = q + qi, *dot_ = dout + qi;
                    float *dqt = dq + qi;
                    float z = lse[((long)b * H + h) * T + t];
                    /* D_t = sum_s p_s dP_s = dout_t . out_t */
                    float Dt = dot(dot_, out + qi, E);
                    for (int e = 0; e < E; e++)
                        dqt[e] = 0.0f;
                    for (int s = row_start(db, t); s <= t; s++) {
                        long kv = (((long)b * T + s) * K + kh) * E;
                        float p = expf(dot(qt, k + kv, E) * scale - z);
                        float dp = dot(dot_, v + kv, E);
                        float ds = p * (dp - Dt) * scale;
                        axpy(dqt, ds, k + kv, E);
                        axpy(dk + kv, ds, qt, E);
                        axpy(dv + kv, p, dot_, E);
                    }
                }
        }
}

const SdpaOp sdpa_reference = {
    .h = {"reference", OP_SDPA, "cpu", 0}, .forward = sdpa_forward, .backward = sdpa_backward};
