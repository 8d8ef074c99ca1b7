/* sdpa "cpu": the default CPU attention. Same math as the reference (ops/sdpa.c), computed in
 * tiles of SDPA_BQ query rows by SDPA_BK keys: the key (or value) tile is transposed once so
 * the score tile is a run of vector FMAs over keys, exponentials go through simd_exp, and
 * tiles past the causal diagonal or before the earliest document start of the query tile are
 * skipped. Forward uses an online softmax (running max and sum per row), so nothing of size T
 * is stored. Forward is parallel over (batch, head); backward over (batch, kv head) so each
 * thread owns its dk / dv rows. Every output is summed in a fixed order by one thread: the
 * result does not depend on the thread count. */
#include <math.h>
#include <string.h>

#include "kernels/cpu_ops.h"
#include "kernels/cpu_simd.h"

#define SDPA_BQ 16
#define SDPA_BK 64

/* S[i][j] = sum_e A[i][e] * Bt[e][j] for i < nq, j < SDPA_BK (A row i at a + i * lda). */
static void tile_dots(float S[SDPA_BQ][SDPA_BK], const float *a, long lda, int nq, const float *Bt,
                      int E) {
    for (int i = 0; i < nq; i++) {
        const float *ai = a + i * lda;
        float acc[SDPA_BK] = {0};
        for (int e = 0; e < E; e++) {
            float x = ai[e];
            const float *b = Bt + (long)e * SDPA_BK;
#pragma omp simd
            for (int j = 0; j < SDPA_BK; j++)
                acc[j] = fmaf(x, b[j], acc[j]);
        }
        memcpy(S[i], acc, sizeof acc);
    }
}

/* Bt[e][j] = rows[j][e] for j < nk (row j at x + j * ld); zero columns past nk. */
static void transpose_tile(float *Bt, const float *x, long ld, int nk, int E) {
    for (int j = 0; j < SDPA_BK; j++)
        for (int e = 0; e < E; e++)
            Bt[(long)e * SDPA_BK + j] = j < nk ? x[j * ld + e] : 0.0f;
}

/* y[0:E] += a * x[0:E] */
static inline void axpy_e(float *restrict y, float a, const float *restrict x, int E) {
#pragma omp simd
    for (int e = 0; e < E; e++)
        y[e] = fmaf(a, x[e], y[e]);
}

/* Query rows t0 .. t0+nq-1 see keys [start[i], t0+i]; the key range of the whole tile. */
static void tile_rows(int *start, const int32_t *db, int t0, int nq, int *cur_start) {
    for (int i = 0; i < nq; i++) {
        int t = t0 + i;
        if (db && t > 0 && db[t - 1] != db[t]) *cur_start = t;
        start[i] = db ? *cur_start : 0;
    }
}

static void cpu_sdpa_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                             const int32_t *doc, int B, int T, int H, int K, int E) {
    float scale = (float)(1.0 / sqrt((double)E));
    int rep = H / K;
    long qs = (long)H * E, ks = (long)K * E; /* token strides */
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const int32_t *db = doc ? doc + (long)b * T : NULL;
            const float *kb = k + (long)b * T * ks + (long)(h / rep) * E;
            const float *vb = v + (long)b * T * ks + (long)(h / rep) * E;
            float Kt[SDPA_MAX_HEAD_DIM * SDPA_BK];
            float S[SDPA_BQ][SDPA_BK];
            float O[SDPA_BQ][SDPA_MAX_HEAD_DIM];
            float mrow[SDPA_BQ], lrow[SDPA_BQ];
            int start[SDPA_BQ], cur_start = 0;
            for (int t0 = 0; t0 < T; t0 += SDPA_BQ) {
                int nq = T - t0 < SDPA_BQ ? T - t0 : SDPA_BQ;
                const float *qt = q + ((long)b * T + t0) * qs + (long)h * E;
                tile_rows(start, db, t0, nq, &cur_start);
                for (int i = 0; i < nq; i++) {
                    mrow[i] = -INFINITY;
                    lrow[i] = 0.0f;
                    memset(O[i], 0, (size_t)E * sizeof(float));
                }
                int kend = t0 + nq; /* exclusive */
                for (int s0 = start[0] / SDPA_BK * SDPA_BK; s0 < kend; s0 += SDPA_BK) {
                    int nk = kend - s0 < SDPA_BK ? kend - s0 : SDPA_BK;
                    transpose_tile(Kt, kb + (long)s0 * ks, ks, nk, E);
                    tile_dots(S, qt, qs, nq, Kt, E);
                    for (int i = 0; i < nq; i++) {
                        int lo = start[i] - s0, hi = t0 + i + 1 - s0; /* keys [lo, hi) */
                        if (lo < 0) lo = 0;
                        if (hi > nk) hi = nk;
                        if (lo >= hi) continue;
                        float *sr = S[i];
                        float mx = mrow[i];
                        for (int j = lo; j < hi; j++) {
                            sr[j] *= scale;
                            mx = sr[j] > mx ? sr[j] : mx;
                        }
                        for (int j = lo; j < hi; j++)
                            sr[j] -= mx;
                        simd_exp(sr + lo, sr + lo, hi - lo);
                        float corr = expf(mrow[i] - mx), sum = 0.0f;
                        for (int j = lo; j < hi; j++)
                            sum += sr[j];
                        lrow[i] = lrow[i] * corr + sum;
                        mrow[i] = mx;
                        if (corr != 1.0f)
                            for (int e = 0; e < E; e++)
                                O[i][e] *= corr;
                        for (int j = lo; j < hi; j++)
                            axpy_e(O[i], sr[j], vb + (long)(s0 + j) * ks, E);
                    }
                }
                for (int i = 0; i < nq; i++) {
                    float inv = 1.0f / lrow[i];
                    float *o = out + ((long)b * T + t0 + i) * qs + (long)h * E;
                    for (int e = 0; e < E; e++)
                        o[e] = O[i][e] * inv;
                    lse[((long)b * H + h) * T + t0 + i] = mrow[i] + logf(lrow[i]);
                }
            }
        }
}

static void cpu_sdpa_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                              const float *k, const float *v, const float *out, const float *lse,
                              const int32_t *doc, int B, int T, int H, int K, int E) {
    float scale = (float)(1.0 / sqrt((double)E));
    int rep = H / K;
    long qs = (long)H * E, ks = (long)K * E;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int kh = 0; kh < K; kh++) {
            const int32_t *db = doc ? doc + (long)b * T : NULL;
            const float *kb = k + (long)b * T * ks + (long)kh * E;
            const float *vb = v + (long)b * T * ks + (long)kh * E;
            float *dkb = dk + (long)b * T * ks + (long)kh * E;
            float *dvb = dv + (long)b * T * ks + (long)kh * E;
            float Kt[SDPA_MAX_HEAD_DIM * SDPA_BK], Vt[SDPA_MAX_HEAD_DIM * SDPA_BK];
            float P[SDPA_BQ][SDPA_BK], dP[SDPA_BQ][SDPA_BK];
            float Dt[SDPA_BQ], z[SDPA_BQ];
            int start[SDPA_BQ];
            for (int t = 0; t < T; t++) {
                memset(dkb + (long)t * ks, 0, (size_t)E * sizeof(float));
                memset(dvb + (long)t * ks, 0, (size_t)E * sizeof(float));
            }
            for (int h = kh * rep; h < (kh + 1) * rep; h++) {
                int cur_start = 0;
                for (int t0 = 0; t0 < T; t0 += SDPA_BQ) {
                    int nq = T - t0 < SDPA_BQ ? T - t0 : SDPA_BQ;
                    long qoff = ((long)b * T + t0) * qs + (long)h * E;
                    const float *qt = q + qoff, *dot = dout + qoff, *ot = out + qoff;
                    float *dqt = dq + qoff;
                    tile_rows(start, db, t0, nq, &cur_start);
                    for (int i = 0; i < nq; i++) {
                        /* D_t = sum_s p_s dP_s = dout_t . out_t */
                        float d = 0.0f;
                        for (int e = 0; e < E; e++)
                            d += dot[i * qs + e] * ot[i * qs + e];
                        Dt[i] = d;
                        z[i] = lse[((long)b * H + h) * T + t0 + i];
                        memset(dqt + i * qs, 0, (size_t)E * sizeof(float));
                    }
                    int kend = t0 + nq;
                    for (int s0 = start[0] / SDPA_BK * SDPA_BK; s0 < kend; s0 += SDPA_BK) {
                        int nk = kend - s0 < SDPA_BK ? kend - s0 : SDPA_BK;
                        transpose_tile(Kt, kb + (long)s0 * ks, ks, nk, E);
                        transpose_tile(Vt, vb + (long)s0 * ks, ks, nk, E);
                        tile_dots(P, qt, qs, nq, Kt, E);
                        tile_dots(dP, dot, qs, nq, Vt, E);
                        for (int i = 0; i < nq; i++) {
                            int lo = start[i] - s0, hi = t0 + i + 1 - s0;
                            if (lo < 0) lo = 0;
                            if (hi > nk) hi = nk;
                            if (lo >= hi) continue;
                            float *pr = P[i], *dpr = dP[i];
                            for (int j = lo; j < hi; j++)
                                pr[j] = pr[j] * scale - z[i];
                            simd_exp(pr + lo, pr + lo, hi - lo);
                            for (int j = lo; j < hi; j++) {
                                float ds = pr[j] * (dpr[j] - Dt[i]) * scale;
                                const float *kj = kb + (long)(s0 + j) * ks;
                                axpy_e(dqt + i * qs, ds, kj, E);
                                axpy_e(dkb + (long)(s0 + j) * ks, ds, qt + i * qs, E);
                                axpy_e(dvb + (long)(s0 + j) * ks, pr[j], dot + i * qs, E);
                            }
                        }
                    }
                }
            }
        }
}

const SdpaOp sdpa_cpu = {.h = {.name = "cpu", .kind = OP_SDPA, .device = "cpu"},
                         .forward = cpu_sdpa_forward,
                         .backward = cpu_sdpa_backward};
