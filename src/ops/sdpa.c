/* Reference causal GQA attention with optional document mask. Scores are recomputed rather
 * than stored: forward keeps only the log-sum-exp per query row, backward rebuilds each
 * probability from it, so memory stays O(T) per head. Work is split over (batch, kv head)
 * so each thread owns its dk/dv rows: no atomics and the same sums for any thread count. */
#include "ops/sdpa.h"

#include <math.h>
#include <string.h>

static inline float dot(const float *a, const float *b, int E) {
    float s = 0.0f;
    for (int e = 0; e < E; e++)
        s += a[e] * b[e];
    return s;
}

/* First key position query t may see: its document's start (scanning back), or 0. */
static inline int row_start(const int32_t *doc, int t) {
    if (!doc) return 0;
    int s = t;
    while (s > 0 && doc[s - 1] == doc[t])
        s--;
    return s;
}

/* A key inside [start, t] belongs to t's document unless ids repeat non-contiguously, which
 * the mask still honours by testing each id. */
static inline int visible(const int32_t *doc, int s, int t) {
    return !doc || doc[s] == doc[t];
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
                    if (!visible(db, s, t)) continue;
                    float sc = dot(qt, k + (((long)b * T + s) * K + kh) * E, E) * scale;
                    m = sc > m ? sc : m;
                }
                for (int e = 0; e < E; e++)
                    o[e] = 0.0f;
                double sum = 0.0;
                for (int s = s0; s <= t; s++) {
                    if (!visible(db, s, t)) continue;
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
                        if (!visible(db, s, t)) continue;
                        long kv = (((long)b * T + s) * K + kh) * E;
                        float p = expf(dot(qt, k + kv, E) * scale - z);
                        float dp = dot(dot_, v + kv, E);
                        float ds = p * (dp - Dt) * scale;
                        for (int e = 0; e < E; e++) {
                            dqt[e] += ds * k[kv + e];
                            dk[kv + e] += ds * qt[e];
                            dv[kv + e] += p * dot_[e];
                        }
                    }
                }
        }
}

const SdpaOp sdpa_reference = {{"reference", OP_SDPA, "cpu", 0}, sdpa_forward, sdpa_backward};
