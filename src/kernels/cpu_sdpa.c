/* sdpa "cpu": the default CPU attention. Same math as the reference (ops/sdpa.c), computed on
 * blocks of SDPA_BQ query rows of one head against chunks of up to SDPA_BK keys. With AVX-512
 * the six products (scores Q K^T, output P V, and in backward dP = dO V^T, dQ = dS K,
 * dK = dS^T Q, dV = P^T dO) run on one register-blocked micro-kernel (mm_tile_avx512: up to
 * SDPA_MR rows by SDPA_NP columns) that reads the token-major tensors in place through their row
 * strides; for Q K^T and dO V^T a panel of SDPA_NP keys of K or V is first copied transposed. At
 * these sizes (64 x 128 x 128 at head_dim 128) oneDNN's sgemm per block ran at about 65% of the
 * fp32 peak, the micro-kernel at about 88% (bench/README.md, "sdpa cpu: a micro-kernel for the
 * products"); without AVX-512 the products are still such GEMMs (ops/gemm.h, whose oneDNN picks
 * the CPU's vector width). The kernel skips work per micro-tile:
 * scores whose keys no row of the tile sees (past the causal diagonal, before the rows' document
 * start), and in the other products the keys or queries the tile would multiply by zero. The
 * forward keeps a running max and sum per row across chunks (online softmax), so no T x T matrix is
 * stored whatever the sequence length.
 *
 * Threads: forward is parallel over (batch, head, query block); backward over (batch, kv head),
 * so each thread owns its dK / dV rows and walks the kv head's query heads and blocks in order.
 * Each unit is computed by one thread in a fixed order (GEMMs run single-threaded inside the
 * parallel region), so the result does not depend on the thread count (tests/test_cpu_ops.c
 * checks it bitwise). Each thread keeps its scratch on its stack (scores SDPA_BQ x SDPA_BK
 * floats forward, twice that backward, and one or two key panels of SDPA_NP x head_dim: at most
 * 128 / 256 KiB), so a call allocates nothing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <immintrin.h>

#include "core/err.h"
#include "kernels/cpu_ops.h"
#include "kernels/cpu_simd.h"
#include "ops/gemm.h"

#define SDPA_BQ 64
#define SDPA_BK 256
#define SDPA_MR 6  /* rows of a micro-tile */
#define SDPA_NV 4  /* 16-float vectors across a micro-tile */
#define SDPA_NP 64 /* its columns: SDPA_NV * 16, also the keys of a transposed panel */

/* M rows by V vectors of accumulators (M * V <= 24 of the 32 registers, V more for a row of B);
 * the last vector is masked to n. Inlined with constant M and V, so the loops unroll onto
 * registers. */
SIMD_AVX512 static inline __attribute__((always_inline)) void
mm_tile_avx512_mv(const int M, const int V, int n, int kn, float alpha, const float *A, long sai,
                  long sak, const float *B, long ldb, int acc, float *C, long ldc) {
    __m512 c[SDPA_MR][SDPA_NV];
    __mmask16 last =
        (__mmask16)(n - 16 * (V - 1) >= 16 ? 0xffffu : (1u << (n - 16 * (V - 1))) - 1u);
#pragma GCC unroll 8
    for (int i = 0; i < M; i++)
#pragma GCC unroll 4
        for (int v = 0; v < V; v++)
            c[i][v] = _mm512_setzero_ps();
    for (int p = 0; p < kn; p++) {
        __m512 b[SDPA_NV];
        const float *bp = B + p * ldb;
#pragma GCC unroll 4
        for (int v = 0; v < V; v++)
            b[v] =
                v < V - 1 ? _mm512_loadu_ps(bp + 16 * v) : _mm512_maskz_loadu_ps(last, bp + 16 * v);
        const float *ap = A + p * sak;
#pragma GCC unroll 8
        for (int i = 0; i < M; i++) {
            __m512 a = _mm512_set1_ps(ap[i * sai]);
#pragma GCC unroll 4
            for (int v = 0; v < V; v++)
                c[i][v] = _mm512_fmadd_ps(a, b[v], c[i][v]);
        }
    }
    __m512 al = _mm512_set1_ps(alpha);
#pragma GCC unroll 8
    for (int i = 0; i < M; i++)
#pragma GCC unroll 4
        for (int v = 0; v < V; v++) {
            float *cp = C + i * ldc + 16 * v;
            __mmask16 k = v < V - 1 ? (__mmask16)0xffffu : last;
            __m512 r = acc ? _mm512_fmadd_ps(c[i][v], al, _mm512_maskz_loadu_ps(k, cp))
                           : _mm512_mul_ps(c[i][v], al);
            _mm512_mask_storeu_ps(cp, k, r);
        }
}

/* C[i][0:n] = alpha * sum_{p < kn} A[i*sai + p*sak] * B[p*ldb + 0:n] (+ C[i][0:n] when acc)
 * for rows i < m <= SDPA_MR; A is read with any strides (row-major, or transposed for dK, dV),
 * B and C are row-major. Without acc, C is never read. */
SIMD_AVX512 static void mm_tile_avx512(int m, int n, int kn, float alpha, const float *A, long sai,
                                       long sak, const float *B, long ldb, int acc, float *C,
                                       long ldc) {
    for (int c0 = 0; c0 < n; c0 += SDPA_NP) {
        int w = n - c0 < SDPA_NP ? n - c0 : SDPA_NP, V = (w + 15) / 16;
        const float *Bc = B + c0;
        float *Cc = C + c0;
        switch ((m - 1) * SDPA_NV + V - 1) {
#define MM_CASE(M, V_)                                                                             \
    case (M - 1) * SDPA_NV + V_ - 1:                                                               \
        mm_tile_avx512_mv(M, V_, w, kn, alpha, A, sai, sak, Bc, ldb, acc, Cc, ldc);                \
        break;
#define MM_ROW(M) MM_CASE(M, 1) MM_CASE(M, 2) MM_CASE(M, 3) MM_CASE(M, 4)
            MM_ROW(1) MM_ROW(2) MM_ROW(3) MM_ROW(4) MM_ROW(5) MM_ROW(6)
#undef MM_ROW
#undef MM_CASE
        }
    }
}

/* dst[c][r] = src[r][c] for a 16 x 16 block (row strides lds, ldd): pairs, then quads within
 * 128-bit lanes, then the lanes. */
SIMD_AVX512 static void transpose16_avx512(float *dst, long ldd, const float *src, long lds) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++)
        r[i] = _mm512_loadu_ps(src + i * lds);
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    /* r[4i+k], lane L: rows 4i .. 4i+3 of column 4L+k */
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xee);
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int k = 0; k < 4; k++) {
        __m512 u0 = _mm512_shuffle_f32x4(r[k], r[4 + k], 0x88);
        __m512 u1 = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0x88);
        __m512 u2 = _mm512_shuffle_f32x4(r[k], r[4 + k], 0xdd);
        __m512 u3 = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0xdd);
        _mm512_storeu_ps(dst + k * ldd, _mm512_shuffle_f32x4(u0, u1, 0x88));
        _mm512_storeu_ps(dst + (4 + k) * ldd, _mm512_shuffle_f32x4(u2, u3, 0x88));
        _mm512_storeu_ps(dst + (8 + k) * ldd, _mm512_shuffle_f32x4(u0, u1, 0xdd));
        _mm512_storeu_ps(dst + (12 + k) * ldd, _mm512_shuffle_f32x4(u2, u3, 0xdd));
    }
}

/* panel[e][j] = x[j*ld + e] for the w <= SDPA_NP rows of x from one head (E values each): a
 * panel of keys turned into the row-major right operand of Q K^T. */
SIMD_AVX512 static void pack_panel(float *panel, const float *x, long ld, int w, int E) {
    int w16 = w / 16 * 16, e16 = E / 16 * 16;
    for (int j = 0; j < w16; j += 16)
        for (int e = 0; e < e16; e += 16)
            transpose16_avx512(panel + e * SDPA_NP + j, SDPA_NP, x + j * ld + e, ld);
    for (int j = 0; j < w; j++)
        for (int e = j < w16 ? e16 : 0; e < E; e++)
            panel[e * SDPA_NP + j] = x[j * ld + e];
}

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

/* Keys [lo, hi) of row i within the chunk of nk keys from s0, with 0 <= lo <= hi <= nk (empty
 * when the row's document starts after the chunk or the row ends before it). */
static void row_range(const int *start, int t0, int s0, int nk, int i, int *lo, int *hi) {
    int a = start[i] - s0, b = t0 + i + 1 - s0;
    *lo = a < 0 ? 0 : a > nk ? nk : a;
    *hi = b < *lo ? *lo : b > nk ? nk : b;
}

/* Keys [lo, hi) that rows i0 .. i0+m-1 see within the chunk: the first row's lo, the last row's
 * hi (both never decrease along a block). */
static void group_range(const int *start, int t0, int s0, int nk, int i0, int m, int *lo, int *hi) {
    int unused;
    row_range(start, t0, s0, nk, i0, lo, &unused);
    row_range(start, t0, s0, nk, i0 + m - 1, &unused, hi);
}

/* One block of query rows against one chunk of keys: rows t0 .. t0+nq-1 (start: their document
 * starts), keys s0 .. s0+nk-1; avx: whether the micro-kernel runs, else the library GEMM takes
 * the whole block (ops/gemm.h, single-threaded inside the parallel region). */
typedef struct Block {
    const int *start;
    int t0, nq, s0, nk, E, avx;
} Block;

/* S[i][j] = alpha * x_i . key j (S row stride SDPA_BK) for the block's rows x_i (row stride xs)
 * and the chunk's keys (row stride ks), at least where each row sees the key: micro-tile by
 * micro-tile through a transposed panel of SDPA_NP keys. */
static void scores(const Block *bk, float *S, const float *x, long xs, const float *keys, long ks,
                   float *panel, float alpha) {
    int blo, bhi;
    group_range(bk->start, bk->t0, bk->s0, bk->nk, 0, bk->nq, &blo, &bhi);
    if (!bk->avx) {
        gemm_f32(0, 1, bk->nq, bhi - blo, bk->E, alpha, x, (int)xs, keys + (long)blo * ks, (int)ks,
                 0.0f, S + blo, SDPA_BK);
        return;
    }
    for (int jp = blo / SDPA_NP * SDPA_NP; jp < bhi; jp += SDPA_NP) {
        int w = bk->nk - jp < SDPA_NP ? bk->nk - jp : SDPA_NP;
        pack_panel(panel, keys + (long)jp * ks, ks, w, bk->E);
        for (int i0 = 0; i0 < bk->nq; i0 += SDPA_MR) {
            int m = bk->nq - i0 < SDPA_MR ? bk->nq - i0 : SDPA_MR, lo, hi;
            group_range(bk->start, bk->t0, bk->s0, bk->nk, i0, m, &lo, &hi);
            lo = lo > jp ? lo : jp;
            hi = hi < jp + w ? hi : jp + w;
            if (lo < hi)
                mm_tile_avx512(m, hi - lo, bk->E, alpha, x + i0 * xs, xs, 1, panel + (lo - jp),
                               SDPA_NP, 0, S + (long)i0 * SDPA_BK + lo, SDPA_BK);
        }
    }
}

/* C (+)= A X: the block's rows of A (row stride SDPA_BK, zero outside each row's keys) times the
 * chunk's rows of X (V for O, K for dQ; row stride ks), over the keys each row group sees. */
static void rows_times_keys(const Block *bk, const float *A, const float *X, long ks, float *C,
                            long cs, int acc) {
    if (!bk->avx) {
        gemm_f32(0, 0, bk->nq, bk->E, bk->nk, 1.0f, A, SDPA_BK, X, (int)ks, acc ? 1.0f : 0.0f, C,
                 (int)cs);
        return;
    }
    for (int i0 = 0; i0 < bk->nq; i0 += SDPA_MR) {
        int m = bk->nq - i0 < SDPA_MR ? bk->nq - i0 : SDPA_MR, lo, hi;
        group_range(bk->start, bk->t0, bk->s0, bk->nk, i0, m, &lo, &hi);
        mm_tile_avx512(m, bk->E, hi - lo, 1.0f, A + (long)i0 * SDPA_BK + lo, SDPA_BK, 1,
                       X + (long)lo * ks, ks, acc, C + i0 * cs, cs);
    }
}

/* C += A^T X: for each key of the chunk (rows of C, stride ks), the block's rows of A (P or dS)
 * times the rows of X (dO or Q; row stride xs), from the first row that sees the key group. */
static void keys_times_rows(const Block *bk, const float *A, const float *X, long xs, float *C,
                            long ks) {
    if (!bk->avx) {
        gemm_f32(1, 0, bk->nk, bk->E, bk->nq, 1.0f, A, SDPA_BK, X, (int)xs, 1.0f, C, (int)ks);
        return;
    }
    for (int s = 0; s < bk->nk && bk->s0 + s - bk->t0 < bk->nq; s += SDPA_MR) {
        int m = bk->nk - s < SDPA_MR ? bk->nk - s : SDPA_MR;
        int p0 = bk->s0 + s - bk->t0 > 0 ? bk->s0 + s - bk->t0 : 0;
        mm_tile_avx512(m, bk->E, bk->nq - p0, 1.0f, A + (long)p0 * SDPA_BK + s, 1, SDPA_BK,
                       X + p0 * xs, xs, 1, C + (long)s * ks, ks);
    }
}

static void cpu_sdpa_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                             const int32_t *doc, int B, int T, int H, int K, int E) {
    const float scale = (float)(1.0 / sqrt((double)E));
    const int rep = H / K, nblk = (T + SDPA_BQ - 1) / SDPA_BQ;
    const long qs = (long)H * E, ks = (long)K * E; /* token strides */
    const long units = (long)B * H * nblk;
    const int avx = simd_avx512_active();
#pragma omp parallel
    {
        _Alignas(64) float S[SDPA_BQ * SDPA_BK], KP[SDPA_MAX_HEAD_DIM * SDPA_NP];
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
                Block bk = {start, t0, nq, s0, nk, E, avx};
                scores(&bk, S, qt, qs, kb + (long)s0 * ks, ks, KP, scale);
                for (int i = 0; i < nq; i++) {
                    float *sr = S + (long)i * SDPA_BK;
                    int lo, hi;
                    row_range(start, t0, s0, nk, i, &lo, &hi);
                    float mx = simd_max(sr + lo, hi - lo, mrow[i]);
                    if (mx == -INFINITY) { /* no key of this chunk, none before */
                        memset(sr, 0, (size_t)nk * sizeof *sr);
                        continue;
                    }
                    float sum = simd_exp_sum(sr + lo, sr + lo, hi - lo, mx);
                    memset(sr, 0, (size_t)lo * sizeof *sr);
                    memset(sr + hi, 0, (size_t)(nk - hi) * sizeof *sr);
                    float corr = expf(mrow[i] - mx);
                    lrow[i] = lrow[i] * corr + sum;
                    mrow[i] = mx;
                    if (!first && corr != 1.0f) {
                        float *orow = ot + i * qs;
#pragma omp simd
                        for (int e = 0; e < E; e++)
                            orow[e] *= corr;
                    }
                }
                /* O (+)= P V over the chunk's keys */
                rows_times_keys(&bk, S, vb + (long)s0 * ks, ks, ot, qs, !first);
            }
            for (int i = 0; i < nq; i++) {
                float inv = 1.0f / lrow[i], *orow = ot + i * qs;
#pragma omp simd
                for (int e = 0; e < E; e++)
                    orow[e] *= inv;
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
    const int avx = simd_avx512_active();
#pragma omp parallel
    {
        _Alignas(64) float P[2 * SDPA_BQ * SDPA_BK], KP[2 * SDPA_MAX_HEAD_DIM * SDPA_NP];
        float *dS = P + SDPA_BQ * SDPA_BK; /* dP, then dS in place */
        float *VP = KP + SDPA_MAX_HEAD_DIM * SDPA_NP;
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
                            Block bk = {start, t0, nq, s0, nk, E, avx};
                            scores(&bk, P, qt, qs, kc, ks, KP, scale);
                            scores(&bk, dS, dot, qs, vc, ks, VP, 1.0f);
                            for (int i = 0; i < nq; i++) {
                                float *pr = P + (long)i * SDPA_BK, *dsr = dS + (long)i * SDPA_BK;
                                int lo, hi;
                                row_range(start, t0, s0, nk, i, &lo, &hi);
                                simd_exp_sum(pr + lo, pr + lo, hi - lo, z[i]);
                                float di = Dt[i];
#pragma omp simd
                                for (int j = lo; j < hi; j++)
                                    dsr[j] = pr[j] * (dsr[j] - di) * scale;
                                /* Masked keys have P = 0, hence dS = 0. */
                                memset(pr, 0, (size_t)lo * sizeof *pr);
                                memset(pr + hi, 0, (size_t)(nk - hi) * sizeof *pr);
                                memset(dsr, 0, (size_t)lo * sizeof *dsr);
                                memset(dsr + hi, 0, (size_t)(nk - hi) * sizeof *dsr);
                            }
                            /* dv += P^T dout, dk += dS^T q, dq (+)= dS K over the chunk */
                            keys_times_rows(&bk, P, dot, qs, dvb + (long)s0 * ks, ks);
                            keys_times_rows(&bk, dS, qt, qs, dkb + (long)s0 * ks, ks);
                            rows_times_keys(&bk, dS, kc, ks, dqt, qs, !first);
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
