/* sdpa "flash": causal GQA attention in FLASH_TILE x FLASH_TILE tiles with an online softmax,
 * so memory is linear in T (no (T, T) scores; per thread one tile of scores on the stack).
 * Forward keeps the row log-sum-exp; backward recomputes each tile's probabilities from it:
 * pass 1 (parallel over batch, KV head, key tile) accumulates dK and dV over the query heads of
 * the group and the query tiles that see the keys; pass 2 (parallel over batch, head, query
 * tile) accumulates dQ. The split keeps every gradient owned by one thread (no atomics) and
 * the sums in a fixed order (bitwise reproducible). Document mask: a query sees keys from the
 * start of its run of equal document ids (as the reference). */
#include <math.h>
#include <string.h>

#include "core/trace.h"
#include "kernels/cpu_simd.h"
#include "kernels/kernels.h"

#define BT FLASH_TILE

/* Start of the run of equal ids that holds t (0 without a mask). */
static int run_start(const int32_t *doc, int t) {
    if (!doc) return 0;
    while (t > 0 && doc[t - 1] == doc[t])
        t--;
    return t;
}

/* rs[i] = first visible key of query q0 + i, i < n. */
static void tile_starts(int *rs, const int32_t *doc, int q0, int n) {
    rs[0] = run_start(doc, q0);
    for (int i = 1; i < n; i++)
        rs[i] = doc && doc[q0 + i] != doc[q0 + i - 1] ? q0 + i : rs[i - 1];
}

/* S[i][j] = scale * q_i . k_j for the tile, -inf where masked. Returns 1 when any is visible. */
static int scores(float *S, const float *q, long qstride, const float *k, long kstride, int q0,
                  int k0, const int *rs, int E, float scale) {
    int any = 0;
    for (int i = 0; i < BT; i++) {
        int t = q0 + i;
        for (int j = 0; j < BT; j++) {
            int s = k0 + j;
            if (s > t || s < rs[i]) {
                S[i * BT + j] = -INFINITY;
                continue;
            }
            S[i * BT + j] = scale * simd_dot(q + (long)i * qstride, k + (long)j * kstride, E);
            any = 1;
        }
    }
    return any;
}

static void flash_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                          const int32_t *doc, int B, int T, int H, int K, int E) {
    float scale = (float)(1.0 / sqrt((double)E));
    int G = H / K, nt = T / BT;
    long qs = (long)H * E, ks = (long)K * E;
#pragma omp parallel for collapse(3) schedule(dynamic)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int qt = 0; qt < nt; qt++) {
                double t0 = trace_now(); /* each thread's tiles on its own track */
                float S[BT * BT], acc[BT * FLASH_MAX_HEAD_DIM], m[BT], l[BT];
                int rs[BT];
                const int32_t *db = doc ? doc + (long)b * T : NULL;
                int q0 = qt * BT, kh = h / G;
                const float *qb = q + ((long)b * T + q0) * qs + (long)h * E;
                tile_starts(rs, db, q0, BT);
                for (int i = 0; i < BT; i++) {
                    m[i] = -INFINITY;
                    l[i] = 0.0f;
                }
                memset(acc, 0, sizeof(float) * BT * (size_t)E);
                for (int kt = rs[0] / BT; kt <= qt; kt++) {
                    int k0 = kt * BT;
                    const float *kb = k + ((long)b * T + k0) * ks + (long)kh * E;
                    const float *vb = v + ((long)b * T + k0) * ks + (long)kh * E;
                    if (!scores(S, qb, qs, kb, ks, q0, k0, rs, E, scale)) continue;
                    for (int i = 0; i < BT; i++) {
                        float *Si = S + i * BT, mx = m[i];
                        for (int j = 0; j < BT; j++)
                            mx = Si[j] > mx ? Si[j] : mx;
                        if (mx == -INFINITY) continue; /* nothing visible in this tile yet */
                        float corr = expf(m[i] - mx);  /* 0 on the first visible tile */
                        float sum = 0.0f;
                        for (int j = 0; j < BT; j++) {
                            Si[j] = Si[j] == -INFINITY ? 0.0f : expf(Si[j] - mx);
                            sum += Si[j];
                        }
                        l[i] = l[i] * corr + sum;
                        m[i] = mx;
                        float *ai = acc + (long)i * E;
                        for (int e = 0; e < E; e++)
                            ai[e] *= corr;
                        for (int j = 0; j < BT; j++)
                            if (Si[j] != 0.0f) simd_axpy(ai, Si[j], vb + (long)j * ks, E);
                    }
                }
                for (int i = 0; i < BT; i++) {
                    float *o = out + ((long)b * T + q0 + i) * qs + (long)h * E;
                    float inv = 1.0f / l[i];
                    for (int e = 0; e < E; e++)
                        o[e] = acc[(long)i * E + e] * inv;
                    lse[((long)b * H + h) * T + q0 + i] = m[i] + logf(l[i]);
                }
                trace_span("sdpa_flash tile", NULL, "thread", t0, NULL);
            }
}

/* P = exp(S - lse) in place and dP - D into dS: dS = P * (dO v^T - D). */
static void probs_and_ds(float *S, float *dS, const float *dO, long qstride, const float *v,
                         long kstride, const float *lse_row, const float *Drow, int E) {
    for (int i = 0; i < BT; i++)
        for (int j = 0; j < BT; j++) {
            float *p = &S[i * BT + j];
            if (*p == -INFINITY) {
                *p = 0.0f;
                dS[i * BT + j] = 0.0f;
                continue;
            }
            *p = expf(*p - lse_row[i]);
            float dp = simd_dot(dO + (long)i * qstride, v + (long)j * kstride, E);
            dS[i * BT + j] = *p * (dp - Drow[i]);
        }
}

/* D[i] = dO_i . O_i for the query tile. */
static void row_d(float *D, const float *dO, const float *O, long qstride, int E) {
    for (int i = 0; i < BT; i++)
        D[i] = simd_dot(dO + (long)i * qstride, O + (long)i * qstride, E);
}

static void flash_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                           const float *k, const float *v, const float *out, const float *lse,
                           const int32_t *doc, int B, int T, int H, int K, int E) {
    float scale = (float)(1.0 / sqrt((double)E));
    int G = H / K, nt = T / BT;
    long qs = (long)H * E, ks = (long)K * E;

    /* Pass 1: dK, dV of key tile kt over every query tile that sees it. */
#pragma omp parallel for collapse(3) schedule(dynamic)
    for (int b = 0; b < B; b++)
        for (int kh = 0; kh < K; kh++)
            for (int kt = 0; kt < nt; kt++) {
                double t0 = trace_now(); /* each thread's tiles on its own track */
                float S[BT * BT], dS[BT * BT], D[BT];
                int rs[BT];
                const int32_t *db = doc ? doc + (long)b * T : NULL;
                int k0 = kt * BT;
                const float *kb = k + ((long)b * T + k0) * ks + (long)kh * E;
                const float *vb = v + ((long)b * T + k0) * ks + (long)kh * E;
                float *dkb = dk + ((long)b * T + k0) * ks + (long)kh * E;
                float *dvb = dv + ((long)b * T + k0) * ks + (long)kh * E;
                for (int j = 0; j < BT; j++) {
                    memset(dkb + (long)j * ks, 0, sizeof(float) * (size_t)E);
                    memset(dvb + (long)j * ks, 0, sizeof(float) * (size_t)E);
                }
                for (int qt = kt; qt < nt; qt++) {
                    int q0 = qt * BT;
                    tile_starts(rs, db, q0, BT);
                    /* Starts only grow with t: once past this key tile, no later query sees it. */
                    if (rs[0] > k0 + BT - 1) break;
                    for (int h = kh * G; h < (kh + 1) * G; h++) {
                        long qoff = ((long)b * T + q0) * qs + (long)h * E;
                        const float *lrow = lse + ((long)b * H + h) * T + q0;
                        if (!scores(S, q + qoff, qs, kb, ks, q0, k0, rs, E, scale)) continue;
                        row_d(D, dout + qoff, out + qoff, qs, E);
                        probs_and_ds(S, dS, dout + qoff, qs, vb, ks, lrow, D, E);
                        for (int i = 0; i < BT; i++)
                            for (int j = 0; j < BT; j++) {
                                if (S[i * BT + j] != 0.0f)
                                    simd_axpy(dvb + (long)j * ks, S[i * BT + j],
                                              dout + qoff + (long)i * qs, E);
                                if (dS[i * BT + j] != 0.0f)
                                    simd_axpy(dkb + (long)j * ks, scale * dS[i * BT + j],
                                              q + qoff + (long)i * qs, E);
                            }
                    }
                }
                trace_span("sdpa_flash dk dv tile", NULL, "thread", t0, NULL);
            }

            /* Pass 2: dQ of query tile qt over the key tiles it sees. */
#pragma omp parallel for collapse(3) schedule(dynamic)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int qt = 0; qt < nt; qt++) {
                double t0 = trace_now(); /* each thread's tiles on its own track */
                float S[BT * BT], dS[BT * BT], D[BT];
                int rs[BT];
                const int32_t *db = doc ? doc + (long)b * T : NULL;
                int q0 = qt * BT, kh = h / G;
                long qoff = ((long)b * T + q0) * qs + (long)h * E;
                const float *lrow = lse + ((long)b * H + h) * T + q0;
                float *dqb = dq + qoff;
                tile_starts(rs, db, q0, BT);
                for (int i = 0; i < BT; i++)
                    memset(dqb + (long)i * qs, 0, sizeof(float) * (size_t)E);
                row_d(D, dout + qoff, out + qoff, qs, E);
                for (int kt = rs[0] / BT; kt <= qt; kt++) {
                    int k0 = kt * BT;
                    const float *kb = k + ((long)b * T + k0) * ks + (long)kh * E;
                    const float *vb = v + ((long)b * T + k0) * ks + (long)kh * E;
                    if (!scores(S, q + qoff, qs, kb, ks, q0, k0, rs, E, scale)) continue;
                    probs_and_ds(S, dS, dout + qoff, qs, vb, ks, lrow, D, E);
                    for (int i = 0; i < BT; i++)
                        for (int j = 0; j < BT; j++)
                            if (dS[i * BT + j] != 0.0f)
                                simd_axpy(dqb + (long)i * qs, scale * dS[i * BT + j],
                                          kb + (long)j * ks, E);
                }
                trace_span("sdpa_flash dq tile", NULL, "thread", t0, NULL);
            }
}

static const char *flash_supports(const OpRun *run) {
    if (run->T % FLASH_TILE) return "seq_len must be a multiple of 64 (the flash tile)";
    if (run->spec && run->spec->head_dim > FLASH_MAX_HEAD_DIM)
        return "head_dim must be at most 256";
    return NULL;
}

const SdpaOp sdpa_flash = {.h = {"flash", OP_SDPA, "cpu", flash_supports},
                           .forward = flash_forward,
                           .backward = flash_backward};
