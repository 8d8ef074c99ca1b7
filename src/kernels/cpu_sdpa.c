/* sdpa "cpu": the default CPU attention. Same math as the reference (ops/sdpa.c), computed on
 * blocks of SDPA_BQ query rows of one head against chunks of up to SDPA_BK keys, so that the
 * four kinds of products (scores Q K^T, output P V, and in backward dP = dO V^T, dQ = dS K,
 * dK = dS^T Q, dV = P^T dO) are GEMMs (ops/gemm.h) reading the token-major tensors in place
 * through their row strides; only the softmax and the masks are vector loops. Chunks past the
 * causal diagonal or before the block's earliest document start are skipped, and the forward
 * keeps a running max and sum per row across chunks (online softmax), so no T x T matrix is
 * stored whatever the sequence length.
 *
 * Threads: forward is parallel over (batch, head, query block); backward over (batch, kv head),
 * so each thread owns its dK / dV rows and walks the kv head's query heads and blocks in order.
 * Each unit is computed by one thread, whose GEMMs run single-threaded inside the parallel
 * region, so the result does not depend on the thread count (tests/test_cpu_ops.c checks it
 * bitwise). Each thread keeps its score scratch (SDPA_BQ x SDPA_BK floats forward, twice that
 * backward: 64 / 128 KiB) on its stack, so a call allocates nothing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "kernels/cpu_ops.h"
#include "kernels/cpu_simd.h"
#include "ops/gemm.h"

#define SDPA_BQ 64
#define SDPA_BK 256

/* Rows t0 .. t0+nq-1 of a block: start[i] is the first key row t0+i may see (its document's
 * first token, or 0). Starts never decrease along a row, so start[0] bounds the block. */
static void block_starts(int *start, const int32_t *db, int t0, int nq) {
    int s = 0;
    if (db) {
        s = t0;
        while (s > 0 && db[s - 1] == db[t0])
            s--;
    }
    for (int i = 0; i < nq; i++) {
        int t = t0 + i;
        if (db && i > 0 && db[t - 1] != db[t]) s = t;
        start[i] = s;
    }
}

static float row_max(const float *x, int lo, int hi, float init) {
    float m = init;
#pragma omp simd reduction(max : m)
    for (int j = lo; j < hi; j++)
        m = x[j] > m ? x[j] : m;
    return m;
}

static float row_sum(const float *x, int lo, int hi) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int j = lo; j < hi; j++)
        s += x[j];
    return s;
}

/* Keys [lo, hi) of row i within the chunk of nk keys from s0, with 0 <= lo <= hi <= nk (empty
 * when the row's document starts after the chunk or the row ends before it). */
static void row_range(const int *start, int t0, int s0, int nk, int i, int *lo, int *hi) {
    int a = start[i] - s0, b = t0 + i + 1 - s0;
    *lo = a < 0 ? 0 : a > nk ? nk : a;
    *hi = b < *lo ? *lo : b > nk ? nk : b;
}

static void cpu_sdpa_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                             const int32_t *doc, int B, int T, int H, int K, int E) {
    const float scale = (float)(1.0 / sqrt((double)E));
    const int rep = H / K, nblk = (T + SDPA_BQ - 1) / SDPA_BQ;
    const long qs = (long)H * E, ks = (long)K * E; /* token strides */
    const long units = (long)B * H * nblk;
#pragma omp parallel
    {
        _Alignas(64) float S[SDPA_BQ * SDPA_BK];
#pragma omp for schedule(dynamic, 1)
        for (long u = 0; u < units; u++) {
            int b = (int)(u / ((long)H * nblk)), h = (int)(u / nblk % H);
            int t0 = (int)(u % nblk) * SDPA_BQ, nq = T - t0 < SDPA_BQ ? T - t0 : SDPA_BQ;
            const int32_t *db = doc ? doc + (long)b * T : NULL;
            const float *kb = k + (long)b * T * ks + (long)(h / rep) * E;
            const float *vb = v + (long)b * T * ks + (long)(h / rep) * E;
            const float *qt = q + ((long)b * T + t0) * qs + (long)h * E;
            float *ot = out + ((long)b * T + t0) * qs + (long)h * E;
            int start[SDPA_BQ];
            float mrow[SDPA_BQ], lrow[SDPA_BQ];
            block_starts(start, db, t0, nq);
            for (int i = 0; i < nq; i++)
                mrow[i] = -INFINITY, lrow[i] = 0.0f;
            int kend = t0 + nq, first = 1;
            for (int s0 = start[0]; s0 < kend; s0 += SDPA_BK, first = 0) {
                int nk = kend - s0 < SDPA_BK ? kend - s0 : SDPA_BK;
                gemm_f32(0, 1, nq, nk, E, scale, qt, (int)qs, kb + (long)s0 * ks, (int)ks, 0.0f, S,
                         SDPA_BK);
                for (int i = 0; i < nq; i++) {
                    float *sr = S + (long)i * SDPA_BK;
                    int lo, hi;
                    row_range(start, t0, s0, nk, i, &lo, &hi);
                    float mx = row_max(sr, lo, hi, mrow[i]);
                    if (mx == -INFINITY) { /* no key of this chunk, none before */
                        memset(sr, 0, (size_t)nk * sizeof *sr);
                        continue;
                    }
                    for (int j = 0; j < lo; j++)
                        sr[j] = -INFINITY;
                    for (int j = hi; j < nk; j++)
                        sr[j] = -INFINITY;
#pragma omp simd
                    for (int j = 0; j < nk; j++)
                        sr[j] -= mx;
                    simd_exp(sr, sr, nk);
                    float corr = expf(mrow[i] - mx), sum = row_sum(sr, lo, hi);
                    lrow[i] = lrow[i] * corr + sum;
                    mrow[i] = mx;
                    if (!first && corr != 1.0f)
                        for (int e = 0; e < E; e++)
                            ot[i * qs + e] *= corr;
                }
                /* O (+)= P V over the chunk's keys */
                gemm_f32(0, 0, nq, E, nk, 1.0f, S, SDPA_BK, vb + (long)s0 * ks, (int)ks,
                         first ? 0.0f : 1.0f, ot, (int)qs);
            }
            for (int i = 0; i < nq; i++) {
                float inv = 1.0f / lrow[i];
                for (int e = 0; e < E; e++)
                    ot[i * qs + e] *= inv;
                lse[((long)b * H + h) * T + t0 + i] = mrow[i] + logf(lrow[i]);
            }
        }
    }
}

static void cpu_sdpa_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                              const float *k, const float *v, const float *out, const float *lse,
                              const int32_t *doc, int B, int T, int H, int K, int E) {
    const float scale = (float)(1.0 / sqrt((double)E));
    const int rep = H / K;
    const long qs = (long)H * E, ks = (long)K * E;
#pragma omp parallel
    {
        _Alignas(64) float P[2 * SDPA_BQ * SDPA_BK];
        float *dS = P + SDPA_BQ * SDPA_BK; /* dP, then dS in place */
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int b = 0; b < B; b++)
            for (int kh = 0; kh < K; kh++) {
                const int32_t *db = doc ? doc + (long)b * T : NULL;
                const float *kb = k + (long)b * T * ks + (long)kh * E;
                const float *vb = v + (long)b * T * ks + (long)kh * E;
                float *dkb = dk + (long)b * T * ks + (long)kh * E;
                float *dvb = dv + (long)b * T * ks + (long)kh * E;
                int start[SDPA_BQ];
                float Dt[SDPA_BQ], z[SDPA_BQ];
                for (int t = 0; t < T; t++) {
                    memset(dkb + (long)t * ks, 0, (size_t)E * sizeof(float));
                    memset(dvb + (long)t * ks, 0, (size_t)E * sizeof(float));
                }
                for (int h = kh * rep; h < (kh + 1) * rep; h++)
                    for (int t0 = 0; t0 < T; t0 += SDPA_BQ) {
                        int nq = T - t0 < SDPA_BQ ? T - t0 : SDPA_BQ;
                        long qoff = ((long)b * T + t0) * qs + (long)h * E;
                        const float *qt = q + qoff, *dot = dout + qoff, *ot = out + qoff;
                        float *dqt = dq + qoff;
                        block_starts(start, db, t0, nq);
                        for (int i = 0; i < nq; i++) {
                            /* D_t = sum_s p_s dP_s = dout_t . out_t */
                            Dt[i] = simd_dot(dot + i * qs, ot + i * qs, E);
                            z[i] = lse[((long)b * H + h) * T + t0 + i];
                        }
                        int kend = t0 + nq, first = 1;
                        for (int s0 = start[0]; s0 < kend; s0 += SDPA_BK, first = 0) {
                            int nk = kend - s0 < SDPA_BK ? kend - s0 : SDPA_BK;
                            const float *kc = kb + (long)s0 * ks, *vc = vb + (long)s0 * ks;
                            gemm_f32(0, 1, nq, nk, E, scale, qt, (int)qs, kc, (int)ks, 0.0f, P,
                                     SDPA_BK);
                            gemm_f32(0, 1, nq, nk, E, 1.0f, dot, (int)qs, vc, (int)ks, 0.0f, dS,
                                     SDPA_BK);
                            for (int i = 0; i < nq; i++) {
                                float *pr = P + (long)i * SDPA_BK, *dsr = dS + (long)i * SDPA_BK;
                                int lo, hi;
                                row_range(start, t0, s0, nk, i, &lo, &hi);
#pragma omp simd
                                for (int j = 0; j < nk; j++)
                                    pr[j] -= z[i];
                                simd_exp(pr, pr, nk);
                                /* Masked keys have P = 0, hence dS = 0. */
                                for (int j = 0; j < lo; j++)
                                    pr[j] = 0.0f;
                                for (int j = hi; j < nk; j++)
                                    pr[j] = 0.0f;
                                float di = Dt[i];
#pragma omp simd
                                for (int j = 0; j < nk; j++)
                                    dsr[j] = pr[j] * (dsr[j] - di) * scale;
                            }
                            /* dv += P^T dout, dk += dS^T q, dq (+)= dS K over the chunk */
                            gemm_f32(1, 0, nk, E, nq, 1.0f, P, SDPA_BK, dot, (int)qs, 1.0f,
                                     dvb + (long)s0 * ks, (int)ks);
                            gemm_f32(1, 0, nk, E, nq, 1.0f, dS, SDPA_BK, qt, (int)qs, 1.0f,
                                     dkb + (long)s0 * ks, (int)ks);
                            gemm_f32(0, 0, nq, E, nk, 1.0f, dS, SDPA_BK, kc, (int)ks,
                                     first ? 0.0f : 1.0f, dqt, (int)qs);
                        }
                    }
            }
    }
}

const char *cpu_head_dim_supports(const OpRun *run) {
    return run->spec->head_dim <= SDPA_MAX_HEAD_DIM
               ? NULL
               : "head_dim must be at most 256 (the tiles live on the stack)";
}

const SdpaOp sdpa_cpu = {
    .h = {.name = "cpu", .kind = OP_SDPA, .device = "cpu", .supports = cpu_head_dim_supports},
    .forward = cpu_sdpa_forward,
    .backward = cpu_sdpa_backward};
