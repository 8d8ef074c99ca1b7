/* sdpa "cpu": the default CPU attention. Same math as the reference (ops/sdpa.c), computed in
 * tiles of SDPA_BQ query rows by SDPA_BK keys: the key (or value) tile is transposed once so
 * the score tile is a run of vector FMAs over keys, exponentials go through simd_exp, and
 * tiles past the causal diagonal or before the earliest document start of the query tile are
 * skipped. Forward uses an online softmax (running max and sum per row), so nothing of size T
 * is stored. Forward is parallel over (batch, head); backward over (batch, kv head) so each
 * thread owns its dk / dv rows. Every output is summed in a fixed order by one thread: the
 * result does not depend on the thread count. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu_ops.h"
#include "kernels/cpu_simd.h"

#define SDPA_BQ 16
#define SDPA_BK 64

/* The two products of a tile, each with an AVX-512 version (4 rows x 64 columns of
 * accumulators in registers) and a portable one. Both add the same terms in the same order
 * with fused multiply-adds, so they agree bitwise; the AVX-512 ones need E % 16 == 0. */

/* S[i][0:BK] = sum_e A[i][e] * Bt[e][0:BK] for i < nq (A row i at a + i * lda). */
static void dots_portable(float S[SDPA_BQ][SDPA_BK], const float *a, long lda, int nq,
                          const float *Bt, int E) {
    for (int i = 0; i < nq; i++) {
        const float *ai = a + i * lda;
        for (int j = 0; j < SDPA_BK; j++)
            S[i][j] = 0.0f;
        for (int e = 0; e < E; e++) {
            float x = ai[e];
            const float *b = Bt + (long)e * SDPA_BK;
#pragma omp simd
            for (int j = 0; j < SDPA_BK; j++)
                S[i][j] = fmaf(x, b[j], S[i][j]);
        }
    }
}

/* C[r][0:E] += sum_{j < J} W[r][j] * X[j][0:E] for r < R, j in order (row strides ldc, ldw,
 * ldx). */
static void acc_rows_portable(float *C, long ldc, int R, const float *W, int ldw, int J,
                              const float *X, long ldx, int E) {
    for (int r = 0; r < R; r++) {
        float *c = C + r * ldc;
        for (int j = 0; j < J; j++) {
            float w = W[r * ldw + j];
            const float *x = X + j * ldx;
#pragma omp simd
            for (int e = 0; e < E; e++)
                c[e] = fmaf(w, x[e], c[e]);
        }
    }
}

__attribute__((target("avx512f"))) static void
dots_avx512(float S[SDPA_BQ][SDPA_BK], const float *a, long lda, int nq, const float *Bt, int E) {
    int i = 0;
    for (; i + 4 <= nq; i += 4) {
        const float *a0 = a + i * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
        __m512 c[4][4];
        for (int r = 0; r < 4; r++)
            for (int v = 0; v < 4; v++)
                c[r][v] = _mm512_setzero_ps();
        for (int e = 0; e < E; e++) {
            const float *b = Bt + (long)e * SDPA_BK;
            __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
            __m512 b2 = _mm512_loadu_ps(b + 32), b3 = _mm512_loadu_ps(b + 48);
            __m512 x[4] = {_mm512_set1_ps(a0[e]), _mm512_set1_ps(a1[e]), _mm512_set1_ps(a2[e]),
                           _mm512_set1_ps(a3[e])};
            for (int r = 0; r < 4; r++) {
                c[r][0] = _mm512_fmadd_ps(x[r], b0, c[r][0]);
                c[r][1] = _mm512_fmadd_ps(x[r], b1, c[r][1]);
                c[r][2] = _mm512_fmadd_ps(x[r], b2, c[r][2]);
                c[r][3] = _mm512_fmadd_ps(x[r], b3, c[r][3]);
            }
        }
        for (int r = 0; r < 4; r++)
            for (int v = 0; v < 4; v++)
                _mm512_storeu_ps(&S[i + r][16 * v], c[r][v]);
    }
    if (i < nq) dots_portable(S + i, a + i * lda, lda, nq - i, Bt, E);
}

__attribute__((target("avx512f"))) static void acc_rows_avx512(float *C, long ldc, int R,
                                                               const float *W, int ldw, int J,
                                                               const float *X, long ldx, int E) {
    int r = 0;
    for (; r + 4 <= R; r += 4) {
        int e0 = 0;
        for (; e0 + 64 <= E; e0 += 64) {
            __m512 c[4][4];
            for (int k = 0; k < 4; k++)
                for (int v = 0; v < 4; v++)
                    c[k][v] = _mm512_loadu_ps(C + (r + k) * ldc + e0 + 16 * v);
            for (int j = 0; j < J; j++) {
                const float *x = X + j * ldx + e0;
                __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
                __m512 x2 = _mm512_loadu_ps(x + 32), x3 = _mm512_loadu_ps(x + 48);
                for (int k = 0; k < 4; k++) {
                    __m512 w = _mm512_set1_ps(W[(r + k) * ldw + j]);
                    c[k][0] = _mm512_fmadd_ps(w, x0, c[k][0]);
                    c[k][1] = _mm512_fmadd_ps(w, x1, c[k][1]);
                    c[k][2] = _mm512_fmadd_ps(w, x2, c[k][2]);
                    c[k][3] = _mm512_fmadd_ps(w, x3, c[k][3]);
                }
            }
            for (int k = 0; k < 4; k++)
                for (int v = 0; v < 4; v++)
                    _mm512_storeu_ps(C + (r + k) * ldc + e0 + 16 * v, c[k][v]);
        }
        for (; e0 < E; e0 += 16) {
            __m512 c[4];
            for (int k = 0; k < 4; k++)
                c[k] = _mm512_loadu_ps(C + (r + k) * ldc + e0);
            for (int j = 0; j < J; j++) {
                __m512 x0 = _mm512_loadu_ps(X + j * ldx + e0);
                for (int k = 0; k < 4; k++)
                    c[k] = _mm512_fmadd_ps(_mm512_set1_ps(W[(r + k) * ldw + j]), x0, c[k]);
            }
            for (int k = 0; k < 4; k++)
                _mm512_storeu_ps(C + (r + k) * ldc + e0, c[k]);
        }
    }
    if (r < R) acc_rows_portable(C + r * ldc, ldc, R - r, W + r * ldw, ldw, J, X, ldx, E);
}

static void tile_dots(float S[SDPA_BQ][SDPA_BK], const float *a, long lda, int nq, const float *Bt,
                      int E) {
    if (E % 16 == 0 && simd_avx512_active())
        dots_avx512(S, a, lda, nq, Bt, E);
    else
        dots_portable(S, a, lda, nq, Bt, E);
}

static void acc_rows(float *C, long ldc, int R, const float *W, int ldw, int J, const float *X,
                     long ldx, int E) {
    if (E % 16 == 0 && simd_avx512_active())
        acc_rows_avx512(C, ldc, R, W, ldw, J, X, ldx, E);
    else
        acc_rows_portable(C, ldc, R, W, ldw, J, X, ldx, E);
}

/* Bt[e][j] = rows[j][e] for j < nk (row j at x + j * ld); zero columns past nk. */
static void transpose_tile(float *Bt, const float *x, long ld, int nk, int E) {
    for (int j = 0; j < SDPA_BK; j++)
        for (int e = 0; e < E; e++)
            Bt[(long)e * SDPA_BK + j] = j < nk ? x[j * ld + e] : 0.0f;
}

/* Query rows t0 .. t0+nq-1 see keys [start[i], t0+i]; the key range of the whole tile. */
static void tile_rows(int *start, const int32_t *db, int t0, int nq, int *cur_start) {
    for (int i = 0; i < nq; i++) {
        int t = t0 + i;
        if (db && t > 0 && db[t - 1] != db[t]) *cur_start = t;
        start[i] = db ? *cur_start : 0;
    }
}

/* Causal and document bounds of each row within a tile of nk keys from s0: row i sees keys
 * [lo[i], hi[i]); every other score of the row becomes -inf (its weight exp(-inf) = 0). */
static void mask_tile(float S[SDPA_BQ][SDPA_BK], const int *start, int t0, int s0, int nq, int nk,
                      int lo[SDPA_BQ], int hi[SDPA_BQ]) {
    for (int i = 0; i < nq; i++) {
        lo[i] = start[i] - s0 > 0 ? start[i] - s0 : 0;
        hi[i] = t0 + i + 1 - s0 < nk ? t0 + i + 1 - s0 : nk;
        for (int j = 0; j < SDPA_BK; j++)
            if (j < lo[i] || j >= hi[i]) S[i][j] = -INFINITY;
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
            int start[SDPA_BQ], lo[SDPA_BQ], hi[SDPA_BQ], cur_start = 0;
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
                    mask_tile(S, start, t0, s0, nq, nk, lo, hi);
                    for (int i = 0; i < nq; i++) {
                        float *sr = S[i];
                        if (lo[i] >= hi[i]) { /* no key of this tile */
                            for (int j = 0; j < nk; j++)
                                sr[j] = 0.0f;
                            continue;
                        }
                        float mx = mrow[i];
                        for (int j = lo[i]; j < hi[i]; j++) {
                            sr[j] *= scale;
                            mx = sr[j] > mx ? sr[j] : mx;
                        }
                        for (int j = 0; j < nk; j++)
                            sr[j] -= mx;
                        simd_exp(sr, sr, nk);
                        float corr = expf(mrow[i] - mx), sum = 0.0f;
                        for (int j = lo[i]; j < hi[i]; j++)
                            sum += sr[j];
                        lrow[i] = lrow[i] * corr + sum;
                        mrow[i] = mx;
                        if (corr != 1.0f)
                            for (int e = 0; e < E; e++)
                                O[i][e] *= corr;
                    }
                    /* O += P V over the tile's keys */
                    acc_rows(&O[0][0], SDPA_MAX_HEAD_DIM, nq, &S[0][0], SDPA_BK, nk,
                             vb + (long)s0 * ks, ks, E);
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
            float P[SDPA_BQ][SDPA_BK], dS[SDPA_BQ][SDPA_BK];
            float PT[SDPA_BK][SDPA_BQ], dST[SDPA_BK][SDPA_BQ];
            float Dt[SDPA_BQ], z[SDPA_BQ];
            int start[SDPA_BQ], lo[SDPA_BQ], hi[SDPA_BQ];
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
                        tile_dots(dS, dot, qs, nq, Vt, E); /* dP, then dS in place */
                        mask_tile(P, start, t0, s0, nq, nk, lo, hi);
                        for (int i = 0; i < nq; i++) {
                            float *pr = P[i], *dsr = dS[i];
                            for (int j = 0; j < nk; j++)
                                pr[j] = pr[j] * scale - z[i];
                            simd_exp(pr, pr, nk);
                            /* Masked entries have P = 0, hence dS = 0. */
                            for (int j = 0; j < nk; j++) {
                                dsr[j] = pr[j] * (dsr[j] - Dt[i]) * scale;
                                PT[j][i] = pr[j];
                                dST[j][i] = dsr[j];
                            }
                        }
                        /* dq += dS K, dk += dS^T q, dv += P^T dout over the tile */
                        acc_rows(dqt, qs, nq, &dS[0][0], SDPA_BK, nk, kb + (long)s0 * ks, ks, E);
                        acc_rows(dkb + (long)s0 * ks, ks, nk, &dST[0][0], SDPA_BQ, nq, qt, qs, E);
                        acc_rows(dvb + (long)s0 * ks, ks, nk, &PT[0][0], SDPA_BQ, nq, dot, qs, E);
                    }
                }
            }
        }
}

const SdpaOp sdpa_cpu = {.h = {.name = "cpu", .kind = OP_SDPA, .device = "cpu"},
                         .forward = cpu_sdpa_forward,
                         .backward = cpu_sdpa_backward};
