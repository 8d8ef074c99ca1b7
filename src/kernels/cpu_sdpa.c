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
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include <immintrin.h>

#include "core/err.h"
#include "kernels/cpu_ops.h"
#include "kernels/cpu_peak.h"
#include "kernels/cpu_simd.h"
#include "ops/gemm.h"
#include "ops/gemm_amx.h"
#include "ops/op_profile.h"

#define SDPA_BQ 64
#define SDPA_BK 256
#define SDPA_MR 6  /* rows of a micro-tile */
#define SDPA_NV 4  /* 16-float vectors across a micro-tile */
#define SDPA_NP 64 /* its columns: SDPA_NV * 16, also the keys of a transposed panel */

/* The op profile's GEMM column (ops/op_profile.h) for attention's products: while op calls are
 * timed, each thread adds the seconds it spends in the product calls (scores with their key
 * panel, rows_times_keys, keys_times_rows, in fp32, bf16 pairs or AMX tiles, with their alpha and
 * C rows, as gemm_f32's and gemm_amx's are counted); the entry adds the threads' mean once the
 * parallel region ends. The casts, transposes, softmax and gradient rows stay outside it.
 * Without AVX-512 the fp32 products are gemm_f32 calls, which count themselves outside a
 * parallel region and are not timed here (no second count on one thread). */
#define TILE_TIMED(timed, tiles, call)                                                             \
    do {                                                                                           \
        double t_ = (timed) ? omp_get_wtime() : 0;                                                 \
        call;                                                                                      \
        if (timed) (tiles) += omp_get_wtime() - t_;                                                \
    } while (0)

/* The micro-kernels' shared parts (mm_tile_avx512_mv, fp32, and mm2_tile_mv, bf16 pairs): the
 * mask of the last of V vectors for n columns, zeroed accumulators, and the tile's end C[i][16v
 * ...] = alpha * c[i][v] (+ C when acc; without acc C is never read). Inlined with constant M
 * and V, so c stays in registers. */
SIMD_AVX512 static inline __attribute__((always_inline)) __mmask16 tile_last(int n, const int V) {
    return (__mmask16)(n - 16 * (V - 1) >= 16 ? 0xffffu : (1u << (n - 16 * (V - 1))) - 1u);
}

SIMD_AVX512 static inline __attribute__((always_inline)) void
tile_zero(const int M, const int V, __m512 c[SDPA_MR][SDPA_NV]) {
#pragma GCC unroll 8
    for (int i = 0; i < M; i++)
#pragma GCC unroll 4
        for (int v = 0; v < V; v++)
            c[i][v] = _mm512_setzero_ps();
}

SIMD_AVX512 static inline __attribute__((always_inline)) void
tile_end(const int M, const int V, __mmask16 last, __m512 c[SDPA_MR][SDPA_NV], float alpha, int acc,
         float *C, long ldc) {
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

/* The dispatch to a micro-kernel with constant rows M <= SDPA_MR and vectors V <= SDPA_NV:
 * switch (MM_TILE_CASE(m, V)) { MM_TILE_CASES } with TILE(M, V) defined at the call. */
#define MM_TILE_CASE(m, V) (((m)-1) * SDPA_NV + (V)-1)
#define MM_CASE(M, V_)                                                                             \
    case MM_TILE_CASE(M, V_):                                                                      \
        TILE(M, V_);                                                                               \
        break;
#define MM_ROW(M) MM_CASE(M, 1) MM_CASE(M, 2) MM_CASE(M, 3) MM_CASE(M, 4)
#define MM_TILE_CASES MM_ROW(1) MM_ROW(2) MM_ROW(3) MM_ROW(4) MM_ROW(5) MM_ROW(6)

/* M rows by V vectors of accumulators (M * V <= 24 of the 32 registers, V more for a row of B);
 * the last vector is masked to n. Inlined with constant M and V, so the loops unroll onto
 * registers. */
SIMD_AVX512 static inline __attribute__((always_inline)) void
mm_tile_avx512_mv(const int M, const int V, int n, int kn, float alpha, const float *A, long sai,
                  long sak, const float *B, long ldb, int acc, float *C, long ldc) {
    __m512 c[SDPA_MR][SDPA_NV];
    __mmask16 last = tile_last(n, V);
    tile_zero(M, V, c);
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
    tile_end(M, V, last, c, alpha, acc, C, ldc);
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
#define TILE(M, V_) mm_tile_avx512_mv(M, V_, w, kn, alpha, A, sai, sak, Bc, ldb, acc, Cc, ldc)
        switch (MM_TILE_CASE(m, V)) { MM_TILE_CASES }
#undef TILE
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
        gemm_f32_varying(0, 1, bk->nq, bhi - blo, bk->E, alpha, x, (int)xs, keys + (long)blo * ks,
                         (int)ks, 0.0f, S + blo, SDPA_BK);
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

/* The online softmax's step for row i once a chunk's max mx (over the row's running max) and sum
 * of exp(s - mx) are known: the running sum rescaled and grown, the max moved, and the output so
 * far (ot, row stride qs, E values) rescaled to the new max. */
static inline void move_row(int i, float mx, float sum, int E, float *mrow, float *lrow, float *ot,
                            long qs, int first) {
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

/* The online softmax over one chunk of keys: each of the block's rows of S (row stride ld)
 * becomes exp(s - the running max), zero outside the row's keys; the row's max and sum (mrow,
 * lrow) move on and its output so far (ot, row stride qs) is rescaled to the new max. */
static void softmax_chunk(const Block *bk, float *S, long ld, float *mrow, float *lrow, float *ot,
                          long qs, int first) {
    for (int i = 0; i < bk->nq; i++) {
        float *sr = S + (long)i * ld;
        int lo, hi, nk = bk->nk;
        row_range(bk->start, bk->t0, bk->s0, nk, i, &lo, &hi);
        float mx = simd_max(sr + lo, hi - lo, mrow[i]);
        if (mx == -INFINITY) { /* no key of this chunk, none before */
            memset(sr, 0, (size_t)nk * sizeof *sr);
            continue;
        }
        float sum = simd_exp_sum(sr + lo, sr + lo, hi - lo, mx);
        memset(sr, 0, (size_t)lo * sizeof *sr);
        memset(sr + hi, 0, (size_t)(nk - hi) * sizeof *sr);
        move_row(i, mx, sum, bk->E, mrow, lrow, ot, qs, first);
    }
}

/* The end of a block: each output row (acc, row stride as) divided by its sum into ot (row
 * stride qs; may be acc), its log-sum-exp to lse (stride 1). */
static void finish_block(float *ot, long qs, const float *acc, long as, int nq, int E,
                         const float *mrow, const float *lrow, float *lse) {
    for (int i = 0; i < nq; i++) {
        float inv = 1.0f / lrow[i], *orow = ot + i * qs;
        const float *arow = acc + i * as;
#pragma omp simd
        for (int e = 0; e < E; e++)
            orow[e] = arow[e] * inv;
        lse[i] = mrow[i] + logf(lrow[i]);
    }
}

/* Backward, per block: D_t = dO_t . O_t (= sum_s p_s dP_s) and z_t, the row's log-sum-exp. */
static void block_rows(float *Dt, float *z, const float *dot, const float *ot, long qs, int nq,
                       int E, const float *lse) {
    for (int i = 0; i < nq; i++) {
        Dt[i] = simd_dot(dot + i * qs, ot + i * qs, E);
        z[i] = lse[i];
    }
}

/* Backward, per (batch, kv head): its T rows of dK and dV (row stride ks, E values) set to 0
 * before the query heads and blocks add into them. */
static void clear_head_rows(float *dkb, float *dvb, int T, long ks, int E) {
    for (int t = 0; t < T; t++) {
        memset(dkb + (long)t * ks, 0, (size_t)E * sizeof(float));
        memset(dvb + (long)t * ks, 0, (size_t)E * sizeof(float));
    }
}

/* Backward, per chunk: the block's rows of P (scores in, stride ld) become exp(s - z) and of dS
 * (dP in) P (dP - D) scale, both zero outside each row's keys (masked keys have P = 0, hence
 * dS = 0). */
static void grad_chunk(const Block *bk, float *P, float *dS, long ld, const float *z,
                       const float *Dt, float scale) {
    for (int i = 0; i < bk->nq; i++) {
        float *pr = P + (long)i * ld, *dsr = dS + (long)i * ld;
        int lo, hi, nk = bk->nk;
        row_range(bk->start, bk->t0, bk->s0, nk, i, &lo, &hi);
        simd_exp_sum(pr + lo, pr + lo, hi - lo, z[i]);
        float di = Dt[i];
#pragma omp simd
        for (int j = lo; j < hi; j++)
            dsr[j] = pr[j] * (dsr[j] - di) * scale;
        memset(pr, 0, (size_t)lo * sizeof *pr);
        memset(pr + hi, 0, (size_t)(nk - hi) * sizeof *pr);
        memset(dsr, 0, (size_t)lo * sizeof *dsr);
        memset(dsr + hi, 0, (size_t)(nk - hi) * sizeof *dsr);
    }
}

static void cpu_sdpa_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                             const int32_t *doc, int B, int T, int H, int K, int E) {
    const float scale = (float)(1.0 / sqrt((double)E));
    const int rep = H / K, nblk = (T + SDPA_BQ - 1) / SDPA_BQ;
    const long qs = (long)H * E, ks = (long)K * E; /* token strides */
    const long units = (long)B * H * nblk;
    const int avx = simd_avx512_active(), timed = avx && prof_timing();
    double tiles = 0;
#pragma omp parallel reduction(+ : tiles)
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
                TILE_TIMED(timed, tiles, scores(&bk, S, qt, qs, kb + (long)s0 * ks, ks, KP, scale));
                softmax_chunk(&bk, S, SDPA_BK, mrow, lrow, ot, qs, first);
                /* O (+)= P V over the chunk's keys */
                TILE_TIMED(timed, tiles,
                           rows_times_keys(&bk, S, vb + (long)s0 * ks, ks, ot, qs, !first));
            }
            finish_block(ot, qs, ot, qs, nq, E, mrow, lrow, lse + ((long)b * H + h) * T + t0);
        }
    }
    if (timed) prof_gemm_add(tiles / omp_get_max_threads());
}

static void cpu_sdpa_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                              const float *k, const float *v, const float *out, const float *lse,
                              const int32_t *doc, int B, int T, int H, int K, int E) {
    const float scale = (float)(1.0 / sqrt((double)E));
    const int rep = H / K;
    const long qs = (long)H * E, ks = (long)K * E;
    const int avx = simd_avx512_active(), timed = avx && prof_timing();
    double tiles = 0;
#pragma omp parallel reduction(+ : tiles)
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
                clear_head_rows(dkb, dvb, T, ks, E);
                for (int h = kh * rep; h < (kh + 1) * rep; h++)
                    for (int t0 = 0; t0 < T; t0 += SDPA_BQ) {
                        int nq = T - t0 < SDPA_BQ ? T - t0 : SDPA_BQ;
                        long qoff = ((long)b * T + t0) * qs + (long)h * E;
                        const float *qt = q + qoff, *dot = dout + qoff, *ot = out + qoff;
                        float *dqt = dq + qoff;
                        block_starts(start, db, t0, nq);
                        block_rows(Dt, z, dot, ot, qs, nq, E, lse + ((long)b * H + h) * T + t0);
                        int kend = t0 + nq, first = 1;
                        for (int s0 = start[0]; s0 < kend; s0 += SDPA_BK, first = 0) {
                            int nk = kend - s0 < SDPA_BK ? kend - s0 : SDPA_BK;
                            const float *kc = kb + (long)s0 * ks, *vc = vb + (long)s0 * ks;
                            Block bk = {start, t0, nq, s0, nk, E, avx};
                            TILE_TIMED(timed, tiles, {
                                scores(&bk, P, qt, qs, kc, ks, KP, scale);
                                scores(&bk, dS, dot, qs, vc, ks, VP, 1.0f);
                            });
                            grad_chunk(&bk, P, dS, SDPA_BK, z, Dt, scale);
                            /* dv += P^T dout, dk += dS^T q, dq (+)= dS K over the chunk */
                            TILE_TIMED(timed, tiles, {
                                keys_times_rows(&bk, P, dot, qs, dvb + (long)s0 * ks, ks);
                                keys_times_rows(&bk, dS, qt, qs, dkb + (long)s0 * ks, ks);
                                rows_times_keys(&bk, dS, kc, ks, dqt, qs, !first);
                            });
                        }
                    }
            }
    }
    if (timed) prof_gemm_add(tiles / omp_get_max_threads());
}

/* ---- bf16 products (mixed precision: SdpaOp.forward_bf16 / backward_bf16) ----
 *
 * The same softmax, skips and thread split as above (on blocks of SDPA2_BQ rows against chunks
 * of SDPA2_BK keys), with every product on vdpbf16ps: a 32-bit lane holds a pair of bf16 values
 * adjacent along the reduction, and one instruction adds both products to an fp32 accumulator
 * (twice the FMA's work per instruction, at the same rate on CPUs that run it at full rate).
 * The operands are cast to bf16 (round to nearest even) in pair layouts:
 *   rows:        a row's values in order, so a pair is two neighbours along the row (Q, dO, P
 *                and dS as left operands reduced along their rows);
 *   row pairs:   rows 2r and 2r+1 interleaved value by value (V and K as right operands
 *                reduced over keys; Q and dO reduced over query rows), a missing odd row zero;
 *   key panels:  SDPA_NP keys' pairs transposed (K and V as right operands of the scores,
 *                reduced along head_dim): the pair rows of "rows" turned into columns.
 * K and V are cast once per call into the caller's scratch (key panels at key multiples of
 * SDPA_NP, row pairs at even keys), in parallel over (batch, kv head, panel); so the key chunks
 * start at a multiple of SDPA_NP at or before the block's first visible key. Q, dO, P and dS
 * are cast per block on the thread's stack; P and dS after the fp32 softmax, zero outside each
 * row's keys, so the pairs that round a key or query range out to even bounds add nothing.
 * head_dim must be even and at most SDPA_BF16_MAX_HEAD_DIM (the stack tiles); otherwise, and
 * without AVX512_BF16 or AVX-512 in use, the calls compute in fp32 (the functions above). */
#define SDPA2_BQ 128 /* query rows of a block */
#define SDPA2_BK 128 /* keys of a chunk */
/* Row stride of a block's own accumulators (O forward, dQ backward): not a multiple of 4 KiB,
 * unlike the heads' rows in q / out (H E floats), whose tiles' 16 rows fell in one L1 set. */
#define SDPA2_ACC_LD (SDPA_BF16_MAX_HEAD_DIM + 16)
#define SIMD_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

static int bf16_applies(int E) {
    return simd_avx512_active() && cpu_has_avx512_bf16() && E % 2 == 0 &&
           E <= SDPA_BF16_MAX_HEAD_DIM;
}

/* The 32-bit pair at p (two bf16 values), read without an aliasing cast. */
static inline uint32_t pair_at(const uint16_t *p) {
    uint32_t w;
    memcpy(&w, p, sizeof w);
    return w;
}

/* As mm_tile_avx512_mv with pairs: C[i][0:n] (+)= alpha * sum_{p < kp} A(i, p) . B[p][0:n],
 * where A(i, p) is the pair at A + i*sai + p*sak and row p of B holds n pairs (2n values) from
 * B + p*ldb (strides in bf16 values). */
SIMD_AVX512_BF16 static inline __attribute__((always_inline)) void
mm2_tile_mv(const int M, const int V, int n, int kp, float alpha, const uint16_t *A, long sai,
            long sak, const uint16_t *B, long ldb, int acc, float *C, long ldc) {
    __m512 c[SDPA_MR][SDPA_NV];
    __mmask16 last = tile_last(n, V);
    tile_zero(M, V, c);
    for (int p = 0; p < kp; p++) {
        __m512i b[SDPA_NV];
        const uint16_t *bp = B + p * ldb;
#pragma GCC unroll 4
        for (int v = 0; v < V; v++)
            b[v] = v < V - 1 ? _mm512_loadu_si512(bp + 32 * v)
                             : _mm512_maskz_loadu_epi32(last, bp + 32 * v);
        const uint16_t *ap = A + p * sak;
#pragma GCC unroll 8
        for (int i = 0; i < M; i++) {
            __m512i a = _mm512_set1_epi32((int)pair_at(ap + i * sai));
#pragma GCC unroll 4
            for (int v = 0; v < V; v++)
                c[i][v] = _mm512_dpbf16_ps(c[i][v], (__m512bh)a, (__m512bh)b[v]);
        }
    }
    tile_end(M, V, last, c, alpha, acc, C, ldc);
}

/* mm_tile_avx512 with pairs: m <= SDPA_MR rows, n columns in micro-tiles of SDPA_NP. */
SIMD_AVX512_BF16 static void mm2_tile(int m, int n, int kp, float alpha, const uint16_t *A,
                                      long sai, long sak, const uint16_t *B, long ldb, int acc,
                                      float *C, long ldc) {
    for (int c0 = 0; c0 < n; c0 += SDPA_NP) {
        int w = n - c0 < SDPA_NP ? n - c0 : SDPA_NP, V = (w + 15) / 16;
        const uint16_t *Bc = B + 2 * c0;
        float *Cc = C + c0;
#define TILE(M, V_) mm2_tile_mv(M, V_, w, kp, alpha, A, sai, sak, Bc, ldb, acc, Cc, ldc)
        switch (MM_TILE_CASE(m, V)) { MM_TILE_CASES }
#undef TILE
    }
}

/* "rows": dst[r][0:n] = bf16(src[r][0:n]) for r < rows (row strides ldd, lds), and a zero after
 * an odd n so the last pair is whole. */
SIMD_AVX512_BF16 static void cast_rows(uint16_t *dst, long ldd, const float *src, long lds,
                                       int rows, int n) {
    for (int r = 0; r < rows; r++) {
        const float *s = src + r * lds;
        uint16_t *d = dst + r * ldd;
        for (int c = 0; c < n; c += 16) {
            __mmask16 k = (__mmask16)(n - c >= 16 ? 0xffffu : (1u << (n - c)) - 1u);
            __m256bh y = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(k, s + c));
            _mm256_mask_storeu_epi16(d + c, k, (__m256i)y);
        }
        if (n % 2) d[n] = 0;
    }
}

/* softmax_chunk followed by cast_rows into Pw (row stride SDPA2_BK), in one pass over each
 * row, bitwise the same: S holds the scores not yet scaled (scores_* with alpha 1), scaled here
 * as scale_cols does; the row's max and sum of exponentials are taken in simd_max's and
 * simd_exp_sum's order (their AVX-512 paths, which the caller checks are active), and the
 * exponentials go to Pw as bf16 without being stored in fp32. S is read twice instead of being
 * scaled, read, rewritten, zeroed and read again (0.6B: the forward's softmax work, outside
 * the tile products, was more than half of its time; bench/README.md). */
SIMD_AVX512_BF16 static void softmax_cast_chunk(const Block *bk, const float *S, float scale,
                                                float *mrow, float *lrow, float *ot, long qs,
                                                int first, uint16_t *Pw) {
    const __m512 vs = _mm512_set1_ps(scale);
    for (int i = 0; i < bk->nq; i++) {
        const float *sr = S + (long)i * SDPA2_BK;
        uint16_t *d = Pw + (long)i * SDPA2_BK;
        int lo, hi, nk = bk->nk, j;
        row_range(bk->start, bk->t0, bk->s0, nk, i, &lo, &hi);
        __m512 vm = _mm512_set1_ps(mrow[i]);
        for (j = lo; j + 16 <= hi; j += 16)
            vm = _mm512_max_ps(vm, _mm512_mul_ps(vs, _mm512_loadu_ps(sr + j)));
        if (j < hi) {
            __mmask16 t = (__mmask16)((1u << (hi - j)) - 1u);
            vm = _mm512_mask_max_ps(vm, t, vm, _mm512_mul_ps(vs, _mm512_maskz_loadu_ps(t, sr + j)));
        }
        float mx = _mm512_reduce_max_ps(vm);
        if (nk % 2) d[nk] = 0;
        if (mx == -INFINITY) { /* no key of this chunk, none before */
            memset(d, 0, (size_t)nk * sizeof *d);
            continue;
        }
        memset(d, 0, (size_t)lo * sizeof *d);
        memset(d + hi, 0, (size_t)(nk - hi) * sizeof *d);
        __m512 sh = _mm512_set1_ps(mx), sum = _mm512_setzero_ps();
        for (j = lo; j + 16 <= hi; j += 16) {
            __m512 e = simd_exp16(_mm512_sub_ps(_mm512_mul_ps(vs, _mm512_loadu_ps(sr + j)), sh));
            sum = _mm512_add_ps(sum, e);
            _mm256_storeu_si256((void *)(d + j), (__m256i)_mm512_cvtneps_pbh(e));
        }
        if (j < hi) {
            __mmask16 t = (__mmask16)((1u << (hi - j)) - 1u);
            __m512 e =
                simd_exp16(_mm512_sub_ps(_mm512_mul_ps(vs, _mm512_maskz_loadu_ps(t, sr + j)), sh));
            sum = _mm512_mask_add_ps(sum, t, sum, e);
            _mm256_mask_storeu_epi16(d + j, t, (__m256i)_mm512_cvtneps_pbh(e));
        }
        move_row(i, mx, _mm512_reduce_add_ps(sum), bk->E, mrow, lrow, ot, qs, first);
    }
}

/* "row pairs": pair row r2 of dst (stride ldd) holds, for each of the n columns, the pair
 * (bf16 src[2 r2][c], bf16 src[2 r2 + 1][c]); the second is zero past the last of rows. */
SIMD_AVX512_BF16 static void cast_row_pairs(uint16_t *dst, long ldd, const float *src, long lds,
                                            int rows, int n) {
    for (int r = 0; r < rows; r += 2) {
        const float *s0 = src + r * lds, *s1 = s0 + lds;
        uint16_t *d = dst + (r / 2) * ldd;
        for (int c = 0; c < n; c += 16) {
            __mmask16 k = (__mmask16)(n - c >= 16 ? 0xffffu : (1u << (n - c)) - 1u);
            __m256bh lo = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(k, s0 + c));
            __m256bh hi = _mm512_cvtneps_pbh(r + 1 < rows ? _mm512_maskz_loadu_ps(k, s1 + c)
                                                          : _mm512_setzero_ps());
            __m512i w = _mm512_or_si512(_mm512_cvtepu16_epi32((__m256i)lo),
                                        _mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)hi), 16));
            _mm512_mask_storeu_epi32(d + 2 * c, k, w);
        }
    }
}

/* "key panel": panel pair row e2 (stride 2 * SDPA_NP values) holds, for keys j < w of x (row
 * stride ld), the pair (x[j][2 e2], x[j][2 e2 + 1]) in bf16; tmp holds the w keys cast as rows
 * first (SDPA_NP x E values). */
SIMD_AVX512_BF16 static void cast_key_panel(uint16_t *panel, uint16_t *tmp, const float *x, long ld,
                                            int w, int E) {
    int E2 = E / 2, w16 = w / 16 * 16, e16 = E2 / 16 * 16;
    cast_rows(tmp, E, x, ld, w, E);
    /* Pairs are 32-bit, so a 16 x 16 block of them transposes as floats do (bits moved, never
     * computed on). */
    for (int j = 0; j < w16; j += 16)
        for (int e = 0; e < e16; e += 16)
            transpose16_avx512((float *)(void *)(panel + 2 * (e * SDPA_NP + j)), SDPA_NP,
                               (const float *)(const void *)(tmp + 2 * ((long)j * E2 + e)), E2);
    for (int j = 0; j < w; j++)
        for (int e = j < w16 ? e16 : 0; e < E2; e++)
            memcpy(panel + 2 * (e * SDPA_NP + j), tmp + 2 * ((long)j * E2 + e), 2 * sizeof *tmp);
}

/* The bf16 scores: S[i][j] = alpha * x_i . key j as scores() does, x_i cast as rows (xw, row
 * stride E), the chunk's keys as key panels (panels: the chunk's first). */
static void scores_bf16(const Block *bk, float *S, const uint16_t *xw, const uint16_t *panels,
                        float alpha) {
    int blo, bhi, E = bk->E;
    group_range(bk->start, bk->t0, bk->s0, bk->nk, 0, bk->nq, &blo, &bhi);
    for (int jp = blo / SDPA_NP * SDPA_NP; jp < bhi; jp += SDPA_NP) {
        int w = bk->nk - jp < SDPA_NP ? bk->nk - jp : SDPA_NP;
        const uint16_t *panel = panels + (long)(jp / SDPA_NP) * E * SDPA_NP;
        for (int i0 = 0; i0 < bk->nq; i0 += SDPA_MR) {
            int m = bk->nq - i0 < SDPA_MR ? bk->nq - i0 : SDPA_MR, lo, hi;
            group_range(bk->start, bk->t0, bk->s0, bk->nk, i0, m, &lo, &hi);
            lo = lo > jp ? lo : jp;
            hi = hi < jp + w ? hi : jp + w;
            if (lo < hi)
                mm2_tile(m, hi - lo, E / 2, alpha, xw + (long)i0 * E, E, 2, panel + 2 * (lo - jp),
                         2 * SDPA_NP, 0, S + (long)i0 * SDPA2_BK + lo, SDPA2_BK);
        }
    }
}

/* Casts x (B, T, K, E; the keys or the values) into the scratch layouts wanted (either may be
 * NULL): panels, for each (b, kv head) ceil(T / SDPA_NP) key panels of E * SDPA_NP values;
 * pairs, for each (b, kv head) its T keys as row pairs (pair row stride 2E), (b, kv head) apart
 * by ceil(T / SDPA_NP) * SDPA_NP * E values. */
static void cast_keys(uint16_t *panels, uint16_t *pairs, const float *x, int B, int T, int K,
                      int E) {
    const int np = (T + SDPA_NP - 1) / SDPA_NP;
    const long ks = (long)K * E, per = (long)np * SDPA_NP * E;
    const long units = (long)B * K * np;
#pragma omp parallel
    {
        _Alignas(64) uint16_t tmp[SDPA_NP * SDPA_BF16_MAX_HEAD_DIM];
#pragma omp for schedule(static)
        for (long u = 0; u < units; u++) {
            int b = (int)(u / ((long)K * np)), kh = (int)(u / np % K), p = (int)(u % np);
            int j0 = p * SDPA_NP, w = T - j0 < SDPA_NP ? T - j0 : SDPA_NP;
            const float *xs = x + ((long)b * T + j0) * ks + (long)kh * E;
            long bh = ((long)b * K + kh) * per;
            uint16_t *pan = panels ? panels + bh + (long)p * E * SDPA_NP : NULL;
            uint16_t *pr = pairs ? pairs + bh + (long)j0 * E : NULL;
            if (pan) cast_key_panel(pan, tmp, xs, ks, w, E);
            if (pr) cast_row_pairs(pr, 2L * E, xs, ks, w, E);
            if (w < SDPA_NP) { /* the last panel's keys past T: zeros for the AMX tiles */
                int w2 = w + w % 2;
                for (int e2 = 0; pan && e2 < E / 2; e2++)
                    memset(pan + 2 * (e2 * SDPA_NP + w), 0, 2 * (size_t)(SDPA_NP - w) * 2);
                if (pr) memset(pr + (long)w2 * E, 0, (size_t)(SDPA_NP - w2) * E * 2);
            }
        }
    }
}

/* C (+)= A X as rows_times_keys: A's rows cast as rows (aw, row stride SDPA2_BK), X's keys as
 * row pairs (xp: the chunk's first, pair row stride 2E); each row group's keys rounded out to
 * whole pairs. */
static void rows_times_keys_bf16(const Block *bk, const uint16_t *aw, const uint16_t *xp, float *C,
                                 long cs, int acc) {
    for (int i0 = 0; i0 < bk->nq; i0 += SDPA_MR) {
        int m = bk->nq - i0 < SDPA_MR ? bk->nq - i0 : SDPA_MR, lo, hi;
        group_range(bk->start, bk->t0, bk->s0, bk->nk, i0, m, &lo, &hi);
        lo -= lo % 2;
        if (lo < hi)
            mm2_tile(m, bk->E, (hi - lo + 1) / 2, 1.0f, aw + (long)i0 * SDPA2_BK + lo, SDPA2_BK, 2,
                     xp + (long)lo * bk->E, 2L * bk->E, acc, C + i0 * cs, cs);
        else if (!acc)
            for (int i = 0; i < m; i++)
                memset(C + (i0 + i) * cs, 0, (size_t)bk->E * sizeof *C);
    }
}

/* C += A^T X as keys_times_rows: A (P or dS) as row pairs (ap, pair row stride 2 SDPA2_BK), X (dO
 * or Q) as row pairs (xp, pair row stride 2E), from the pair that holds the first row that sees
 * the key group. */
static void keys_times_rows_bf16(const Block *bk, const uint16_t *ap, const uint16_t *xp, float *C,
                                 long ks) {
    int nq2 = (bk->nq + 1) / 2;
    for (int s = 0; s < bk->nk && bk->s0 + s - bk->t0 < bk->nq; s += SDPA_MR) {
        int m = bk->nk - s < SDPA_MR ? bk->nk - s : SDPA_MR;
        int p0 = bk->s0 + s - bk->t0 > 0 ? (bk->s0 + s - bk->t0) / 2 : 0;
        mm2_tile(m, bk->E, nq2 - p0, 1.0f, ap + (long)p0 * 2 * SDPA2_BK + 2 * s, 2, 2L * SDPA2_BK,
                 xp + (long)p0 * 2 * bk->E, 2L * bk->E, 1, C + (long)s * ks, ks);
    }
}

/* ---- the bf16 route's products on AMX tiles (where gemm_amx_ready and E % 32 == 0) ----
 *
 * The layouts above are the tiles' own: "rows" are A tiles (16 rows of 32 values along the
 * reduction, at the layout's row stride), "row pairs" and "key panels" B tiles in VNNI order
 * (16 pair rows of 16 columns at the pair-row stride), so tiles load straight from them. The
 * only new layout is P and dS transposed (keys as rows, query rows along them) for dK and dV,
 * made from their row pairs by 16 x 16 transposes of the 32-bit pairs. Reductions run in steps
 * of 32 over ranges rounded out to whole steps: the values past a range are zero on one side
 * (P and dS outside each row's keys, and the pads zeroed below) and finite on the other. Tiles
 * of C cover 16 x 16 outputs; a partial group of rows goes through a buffer, so nothing past
 * the block's rows is written. Tile registers: 0-3 C, 4-5 A, 6-7 B (gemm_amx_configure). */
#define AMX_TILES __attribute__((target("amx-tile,amx-bf16")))

static int amx_applies(int E) {
    return E % 32 == 0 && gemm_amx_ready();
}

/* C (mr x nr tiles of 16 x 16, mr, nr <= 2; row stride ldc floats) (+)= A B over `steps`
 * steps of 32: A tile r of step s at A + r 16 lda + 32 s (lda values), B tile c of step s at
 * B + 16 s ldb + 32 c (ldb values per pair row, 2 per column). */
static void amx_group(int mr, int nr, int steps, const uint16_t *A, long lda, const uint16_t *B,
                      long ldb, float *C, long ldc, int acc) {
    gemm_amx_group(mr, nr, steps, (GemmAmxTiles){A, lda, 32, 16 * lda},
                   (GemmAmxTiles){B, ldb, 16 * ldb, 32}, C, ldc, acc);
}

/* One group of up to 32 rows of C (row stride ldc) (+)= A B as amx_group over all of C's ncol
 * columns (a multiple of 16): in place when the group is 16 or 32 whole rows, else through buf
 * (32 x ncol floats; A's rows past `rows` are read, their products dropped). */
static void amx_rows(int rows, int ncol, int steps, const uint16_t *A, long lda, const uint16_t *B,
                     long ldb, float *C, long ldc, int acc, float *buf) {
    float *dst = C;
    long ld = ldc;
    int whole = rows == 16 || rows == 32, mr = rows > 16 ? 2 : 1;
    if (!whole) {
        dst = buf, ld = ncol;
        for (int i = 0; i < rows; i++)
            memcpy(buf + (long)i * ncol, C + i * ldc, (size_t)ncol * sizeof *C);
    }
    for (int c = 0; c < ncol; c += 32)
        amx_group(mr, ncol - c >= 32 ? 2 : 1, steps, A, lda, B + 2 * c, ldb, dst + c, ld, acc);
    if (!whole)
        for (int i = 0; i < rows; i++)
            memcpy(C + i * ldc, buf + (long)i * ncol, (size_t)ncol * sizeof *C);
}

/* S[i][c0:c1] *= alpha for rows i < rows (row stride SDPA2_BK; c0, c1 multiples of 16). */
SIMD_AVX512 static void scale_cols(float *S, int rows, int c0, int c1, float alpha) {
    __m512 a = _mm512_set1_ps(alpha);
    for (int i = 0; i < rows; i++)
        for (int c = c0; c < c1; c += 16) {
            float *x = S + (long)i * SDPA2_BK + c;
            _mm512_storeu_ps(x, _mm512_mul_ps(a, _mm512_loadu_ps(x)));
        }
}

/* x[i][c0:c1] = 0 for rows i < rows (row stride ld): the pads of a bf16 operand reduced over
 * its columns in steps of 32. */
static void zero_cols(uint16_t *x, long ld, int rows, int c0, int c1) {
    if (c0 < c1)
        for (int i = 0; i < rows; i++)
            memset(x + i * ld + c0, 0, (size_t)(c1 - c0) * sizeof *x);
}

/* scores_bf16 on tiles: per 32 rows, the key tiles (16 keys, within one panel) that any of
 * them sees, up to the chunk's keys rounded to 16; S's rows past nq and keys past each row's
 * range get values nobody reads. */
static void scores_amx(const Block *bk, float *S, const uint16_t *xw, const uint16_t *panels,
                       float alpha) {
    int E = bk->E, nk16 = (bk->nk + 15) / 16 * 16;
    for (int i0 = 0; i0 < bk->nq; i0 += 32) {
        int m = bk->nq - i0 < 32 ? bk->nq - i0 : 32, lo, hi;
        group_range(bk->start, bk->t0, bk->s0, bk->nk, i0, m, &lo, &hi);
        if (lo >= hi) continue;
        int j1 = (hi + 15) / 16 * 16;
        j1 = j1 < nk16 ? j1 : nk16;
        for (int j = lo / 16 * 16; j < j1; j += 32) {
            int nr = j + 16 < j1 && (j + 16) % SDPA_NP ? 2 : 1;
            const uint16_t *panel = panels + (long)(j / SDPA_NP) * E * SDPA_NP;
            amx_group(m > 16 ? 2 : 1, nr, E / 32, xw + (long)i0 * E, E, panel + 2 * (j % SDPA_NP),
                      2 * SDPA_NP, S + (long)i0 * SDPA2_BK + j, SDPA2_BK, 0);
            if (nr == 1 && j + 16 < j1) j -= 16; /* the next panel starts a new pair */
        }
        if (alpha != 1.0f) scale_cols(S + (long)i0 * SDPA2_BK, m, lo / 16 * 16, j1, alpha);
    }
}

/* rows_times_keys_bf16 on tiles (aw: rows of P or dS with their columns from nk to the next
 * 32 zeroed; xp: the chunk's keys as row pairs, finite past the chunk). */
static void rows_times_keys_amx(const Block *bk, const uint16_t *aw, const uint16_t *xp, float *C,
                                long cs, int acc, float *buf) {
    for (int i0 = 0; i0 < bk->nq; i0 += 32) {
        int m = bk->nq - i0 < 32 ? bk->nq - i0 : 32, lo, hi;
        group_range(bk->start, bk->t0, bk->s0, bk->nk, i0, m, &lo, &hi);
        lo = lo / 32 * 32;
        if (lo < hi)
            amx_rows(m, bk->E, (hi - lo + 31) / 32, aw + (long)i0 * SDPA2_BK + lo, SDPA2_BK,
                     xp + (long)lo * bk->E, 2L * bk->E, C + i0 * cs, cs, acc, buf);
        else if (!acc)
            for (int i = 0; i < m; i++)
                memset(C + (i0 + i) * cs, 0, (size_t)bk->E * sizeof *C);
    }
}

/* at: the chunk's keys as rows of the block's P or dS (row stride SDPA2_BQ, query rows along
 * them), from their row pairs ap (pair row stride 2 SDPA2_BK): the 32-bit pairs transposed, and
 * the query rows from nq to the next 32 zeroed. */
SIMD_AVX512 static void transpose_pairs(uint16_t *at, const uint16_t *ap, int nq, int nk) {
    int nq2 = (nq + 1) / 2, nq32 = (nq + 31) / 32 * 32;
    for (int k0 = 0; k0 < nk; k0 += 16)
        for (int p0 = 0; p0 < nq2; p0 += 16)
            transpose16_avx512((float *)(void *)(at + (long)k0 * SDPA2_BQ + 2 * p0), SDPA2_BQ / 2,
                               (const float *)(const void *)(ap + 2L * p0 * SDPA2_BK + 2 * k0),
                               SDPA2_BK);
    for (int k = 0; k < (nk + 15) / 16 * 16; k++)
        for (int i = 2 * nq2 > nq ? nq : 2 * nq2; i < nq32; i++)
            at[(long)k * SDPA2_BQ + i] = 0;
}

/* keys_times_rows_bf16 on tiles: C (the chunk's keys' rows, stride ks) += A^T X with A^T as
 * at (keys as rows) and X (dO or Q) as row pairs xp (zero past nq to the next 32), per 32 keys
 * from the 32-row step that holds the first row that sees them. */
static void keys_times_rows_amx(const Block *bk, const uint16_t *at, const uint16_t *xp, float *C,
                                long ks, float *buf) {
    int nq32 = (bk->nq + 31) / 32 * 32;
    for (int s = 0; s < bk->nk && bk->s0 + s - bk->t0 < bk->nq; s += 32) {
        int m = bk->nk - s < 32 ? bk->nk - s : 32;
        int i0 = bk->s0 + s - bk->t0 > 0 ? (bk->s0 + s - bk->t0) / 32 * 32 : 0;
        amx_rows(m, bk->E, (nq32 - i0) / 32, at + (long)s * SDPA2_BQ + i0, SDPA2_BQ,
                 xp + (long)i0 * bk->E, 2L * bk->E, C + (long)s * ks, ks, 1, buf);
    }
}

static void cpu_sdpa_forward_bf16(float *out, float *lse, const float *q, const float *k,
                                  const float *v, const int32_t *doc, int B, int T, int H, int K,
                                  int E, uint16_t *scratch) {
    if (!bf16_applies(E)) {
        cpu_sdpa_forward(out, lse, q, k, v, doc, B, T, H, K, E);
        return;
    }
    const float scale = (float)(1.0 / sqrt((double)E));
    const int rep = H / K, nblk = (T + SDPA2_BQ - 1) / SDPA2_BQ;
    const long qs = (long)H * E, per = (T + SDPA_NP - 1L) / SDPA_NP * SDPA_NP * E;
    const long units = (long)B * H * nblk;
    uint16_t *kpan = scratch, *vpair = scratch + (long)B * K * per;
    cast_keys(kpan, NULL, k, B, T, K, E);
    cast_keys(NULL, vpair, v, B, T, K, E);
    const int amx = amx_applies(E), timed = prof_timing();
    const int fused = simd_avx512_active(); /* softmax_cast_chunk keeps its vector order */
    double tiles = 0;
#pragma omp parallel reduction(+ : tiles)
    {
        _Alignas(64) float S[SDPA2_BQ * SDPA2_BK], buf[32 * SDPA_BF16_MAX_HEAD_DIM];
        _Alignas(64) uint16_t Qw[SDPA2_BQ * SDPA_BF16_MAX_HEAD_DIM], Pw[SDPA2_BQ * SDPA2_BK];
        _Alignas(64) float O[SDPA2_BQ * SDPA2_ACC_LD];
        if (amx) gemm_amx_configure();
#pragma omp for schedule(dynamic, 1)
        for (long u = 0; u < units; u++) {
            int b = (int)(u / ((long)H * nblk)), h = (int)(u / nblk % H);
            int t0 = (int)(u % nblk) * SDPA2_BQ, nq = T - t0 < SDPA2_BQ ? T - t0 : SDPA2_BQ;
            const int32_t *db = doc ? doc + (long)b * T : NULL;
            long bh = ((long)b * K + h / rep) * per;
            const float *qt = q + ((long)b * T + t0) * qs + (long)h * E;
            float *ot = out + ((long)b * T + t0) * qs + (long)h * E;
            int start[SDPA2_BQ];
            float mrow[SDPA2_BQ], lrow[SDPA2_BQ];
            block_starts(start, db, t0, nq);
            cast_rows(Qw, E, qt, qs, nq, E);
            for (int i = 0; i < nq; i++)
                mrow[i] = -INFINITY, lrow[i] = 0.0f;
            int kend = t0 + nq, first = 1;
            for (int s0 = start[0] / SDPA_NP * SDPA_NP; s0 < kend; s0 += SDPA2_BK, first = 0) {
                int nk = kend - s0 < SDPA2_BK ? kend - s0 : SDPA2_BK;
                Block bk = {start, t0, nq, s0, nk, E, 1};
                const uint16_t *kp = kpan + bh + (long)s0 * E, *vp = vpair + bh + (long)s0 * E;
                float alpha = fused ? 1.0f : scale;
                TILE_TIMED(timed, tiles, {
                    if (amx)
                        scores_amx(&bk, S, Qw, kp, alpha);
                    else
                        scores_bf16(&bk, S, Qw, kp, alpha);
                });
                if (fused) {
                    softmax_cast_chunk(&bk, S, scale, mrow, lrow, O, SDPA2_ACC_LD, first, Pw);
                } else {
                    softmax_chunk(&bk, S, SDPA2_BK, mrow, lrow, O, SDPA2_ACC_LD, first);
                    cast_rows(Pw, SDPA2_BK, S, SDPA2_BK, nq, nk);
                }
                if (amx) zero_cols(Pw, SDPA2_BK, nq, nk + nk % 2, (nk + 31) / 32 * 32);
                TILE_TIMED(timed, tiles, {
                    if (amx)
                        rows_times_keys_amx(&bk, Pw, vp, O, SDPA2_ACC_LD, !first, buf);
                    else
                        rows_times_keys_bf16(&bk, Pw, vp, O, SDPA2_ACC_LD, !first);
                });
            }
            finish_block(ot, qs, O, SDPA2_ACC_LD, nq, E, mrow, lrow,
                         lse + ((long)b * H + h) * T + t0);
        }
        if (amx) gemm_amx_release();
    }
    if (timed) prof_gemm_add(tiles / omp_get_max_threads());
}

static void cpu_sdpa_backward_bf16(float *dq, float *dk, float *dv, const float *dout,
                                   const float *q, const float *k, const float *v, const float *out,
                                   const float *lse, const int32_t *doc, int B, int T, int H, int K,
                                   int E, uint16_t *scratch) {
    if (!bf16_applies(E)) {
        cpu_sdpa_backward(dq, dk, dv, dout, q, k, v, out, lse, doc, B, T, H, K, E);
        return;
    }
    const float scale = (float)(1.0 / sqrt((double)E));
    const int rep = H / K;
    const long qs = (long)H * E, ks = (long)K * E;
    const long per = (T + SDPA_NP - 1L) / SDPA_NP * SDPA_NP * E;
    uint16_t *kpan = scratch, *vpan = scratch + (long)B * K * per,
             *kpair = vpan + (long)B * K * per;
    cast_keys(kpan, kpair, k, B, T, K, E);
    cast_keys(vpan, NULL, v, B, T, K, E);
    const int amx = amx_applies(E), timed = prof_timing();
    double tiles = 0;
#pragma omp parallel reduction(+ : tiles)
    {
        enum { QE = SDPA2_BQ * SDPA_BF16_MAX_HEAD_DIM, PK = SDPA2_BQ * SDPA2_BK };
        /* Page-aligned: with 64-byte alignment the tiles' place within a page followed the
         * stack's random start, and one process in two ran this loop 1.2-1.4x slower (the
         * same inputs; bench/README.md, "sdpa cpu in bf16"), as the tiles' addresses fell
         * against the 4 KiB-strided dK / dV rows and the cast keys. */
        _Alignas(4096) float P[2 * SDPA2_BQ * SDPA2_BK];
        float *dS = P + SDPA2_BQ * SDPA2_BK;
        /* rows: Q, dO, dS; row pairs: Q, dO, P, dS */
        _Alignas(4096) uint16_t Qw[QE], dOw[QE], dSw[PK], Qp[QE], dOp[QE], Pp[PK], dSp[PK];
        /* with AMX: P and dS transposed (keys as rows), and a buffer for partial row groups */
        _Alignas(4096) uint16_t Pt[PK], dSt[PK];
        _Alignas(64) float buf[32 * SDPA_BF16_MAX_HEAD_DIM], dQ[SDPA2_BQ * SDPA2_ACC_LD];
        if (amx) gemm_amx_configure();
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int b = 0; b < B; b++)
            for (int kh = 0; kh < K; kh++) {
                const int32_t *db = doc ? doc + (long)b * T : NULL;
                long bh = ((long)b * K + kh) * per;
                float *dkb = dk + (long)b * T * ks + (long)kh * E;
                float *dvb = dv + (long)b * T * ks + (long)kh * E;
                int start[SDPA2_BQ];
                float Dt[SDPA2_BQ], z[SDPA2_BQ];
                clear_head_rows(dkb, dvb, T, ks, E);
                for (int h = kh * rep; h < (kh + 1) * rep; h++)
                    for (int t0 = 0; t0 < T; t0 += SDPA2_BQ) {
                        int nq = T - t0 < SDPA2_BQ ? T - t0 : SDPA2_BQ;
                        long qoff = ((long)b * T + t0) * qs + (long)h * E;
                        const float *qt = q + qoff, *dot = dout + qoff, *ot = out + qoff;
                        float *dqt = dq + qoff;
                        block_starts(start, db, t0, nq);
                        block_rows(Dt, z, dot, ot, qs, nq, E, lse + ((long)b * H + h) * T + t0);
                        cast_rows(Qw, E, qt, qs, nq, E);
                        cast_rows(dOw, E, dot, qs, nq, E);
                        cast_row_pairs(Qp, 2L * E, qt, qs, nq, E);
                        cast_row_pairs(dOp, 2L * E, dot, qs, nq, E);
                        if (amx) { /* the pair rows past nq to the next 32: zeros */
                            int p1 = (nq + 1) / 2, p2 = (nq + 31) / 32 * 16;
                            memset(Qp + 2L * p1 * E, 0, (size_t)(p2 - p1) * 2 * E * 2);
                            memset(dOp + 2L * p1 * E, 0, (size_t)(p2 - p1) * 2 * E * 2);
                        }
                        int kend = t0 + nq, first = 1;
                        for (int s0 = start[0] / SDPA_NP * SDPA_NP; s0 < kend;
                             s0 += SDPA2_BK, first = 0) {
                            int nk = kend - s0 < SDPA2_BK ? kend - s0 : SDPA2_BK;
                            Block bk = {start, t0, nq, s0, nk, E, 1};
                            const uint16_t *kp = kpan + bh + (long)s0 * E,
                                           *vp = vpan + bh + (long)s0 * E,
                                           *kr = kpair + bh + (long)s0 * E;
                            TILE_TIMED(timed, tiles, {
                                if (amx) {
                                    scores_amx(&bk, P, Qw, kp, scale);
                                    scores_amx(&bk, dS, dOw, vp, 1.0f);
                                } else {
                                    scores_bf16(&bk, P, Qw, kp, scale);
                                    scores_bf16(&bk, dS, dOw, vp, 1.0f);
                                }
                            });
                            grad_chunk(&bk, P, dS, SDPA2_BK, z, Dt, scale);
                            cast_row_pairs(Pp, 2L * SDPA2_BK, P, SDPA2_BK, nq, nk);
                            cast_row_pairs(dSp, 2L * SDPA2_BK, dS, SDPA2_BK, nq, nk);
                            cast_rows(dSw, SDPA2_BK, dS, SDPA2_BK, nq, nk);
                            if (amx) {
                                transpose_pairs(Pt, Pp, nq, nk);
                                transpose_pairs(dSt, dSp, nq, nk);
                                zero_cols(dSw, SDPA2_BK, nq, nk + nk % 2, (nk + 31) / 32 * 32);
                            }
                            TILE_TIMED(timed, tiles, {
                                if (amx) {
                                    keys_times_rows_amx(&bk, Pt, dOp, dvb + (long)s0 * ks, ks, buf);
                                    keys_times_rows_amx(&bk, dSt, Qp, dkb + (long)s0 * ks, ks, buf);
                                    rows_times_keys_amx(&bk, dSw, kr, dQ, SDPA2_ACC_LD, !first,
                                                        buf);
                                } else {
                                    keys_times_rows_bf16(&bk, Pp, dOp, dvb + (long)s0 * ks, ks);
                                    keys_times_rows_bf16(&bk, dSp, Qp, dkb + (long)s0 * ks, ks);
                                    rows_times_keys_bf16(&bk, dSw, kr, dQ, SDPA2_ACC_LD, !first);
                                }
                            });
                        }
                        for (int i = 0; i < nq; i++)
                            memcpy(dqt + i * qs, dQ + i * SDPA2_ACC_LD, (size_t)E * sizeof *dQ);
                    }
            }
        if (amx) gemm_amx_release();
    }
    if (timed) prof_gemm_add(tiles / omp_get_max_threads());
}

const char *cpu_head_dim_supports(const OpRun *run) {
    return run->spec->head_dim <= SDPA_MAX_HEAD_DIM
               ? NULL
               : "head_dim must be at most 256 (the tiles live on the stack)";
}

const SdpaOp sdpa_cpu = {
    .h = {.name = "cpu", .kind = OP_SDPA, .device = "cpu", .supports = cpu_head_dim_supports},
    .forward = cpu_sdpa_forward,
    .backward = cpu_sdpa_backward,
    .forward_bf16 = cpu_sdpa_forward_bf16,
    .backward_bf16 = cpu_sdpa_backward_bf16};
