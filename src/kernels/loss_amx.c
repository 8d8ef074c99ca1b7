/* loss_chunked's bf16 step on AMX tiles (kernels/loss_amx.h). N tokens (a multiple of 32),
 * Vp = V rounded up to 32, S = D / 32 reduction steps over the model dim, Ns = N / 32 over
 * tokens. The workspace holds:
 *
 *  xb   the tokens' inputs in bf16, N x D;
 *  tb   x^T as B tiles of the logits product (logits^T = W x^T): for each 16 tokens, S tiles;
 *  tv   x as B tiles of the dW product (dW = dlogits^T x): for each 16 columns of D, Ns tiles;
 *  pk, tmp  per thread, buf values each: a panel's rows of W as A tiles (step 1), a grad
 *       panel's dlogits as A tiles and as plain rows (step 3), rows of W as B tiles (step 4);
 *  m, s per token (rows of `panels`): each panel's maximum logit and sum of exp(logit - m);
 *  c    per panel (rows of N): scale * exp(m - lse) of each token, 0 for ignored targets;
 *  lt, gt  per token: the target's fp32 logit, and its dlogit scale * expm1(lt - lse);
 *
 * and the bf16 scratch E, Vp x N: exp(logit - m), vocab-major (row v, N tokens), from step 1;
 * step 3 replaces each grad panel's rows by its dlogits as the A tiles of step 4's product
 * (tile (vs, t16): tokens 16 t16 .., vocabulary 32 vs .., at (vs * N / 16 + t16) tiles), which
 * occupy the same values. Vocabulary rows past V are zeros in pk and E, left out of the
 * statistics, and never stored to dW. */
#include "kernels/loss_amx.h"

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stddef.h>

#include "core/dtype.h"
#include "core/timer.h"
#include "kernels/cpu_simd.h"
#include "ops/cross_entropy.h"
#include "ops/gemm.h"
#include "ops/gemm_amx.h"
#include "ops/op_profile.h"

#define TILE 512         /* bf16 values per tile: 16 rows of 32 */
#define BUF (256 * 1024) /* bf16 values of a panel's rows of W: 512 KiB, within L2 */
/* Step 1: reduction steps per block: the 32 tokens' B tiles of a block (16 KiB) stay in L1
 * while the panel's A tiles stream from L2 (prefetched a step ahead), where a whole D of B
 * tiles (64 KiB at D 1024) did not fit. 8 against a whole D: the pass 161-172 -> 137-145 ms
 * (bench/README.md, "LM head"); 4 and 16 no better; the same blocks in steps 3 and 4, whose C
 * rows are D apart in memory, were slower. */
#define STATS_KS 8
#define DX_KC 1024 /* step 4: vocabulary rows per block */
#define DX_DC 256  /* step 4: columns of D per chunk */
#define AMX_AVX512 __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))

typedef struct Layout {
    long vp, buf;
    int P, G, panels, S, Ns, threads;
    /* offsets in floats from the 64-byte aligned base */
    long xb, tb, tv, pk, m, s, c, lt, gt, floats;
} Layout;

static long up(long n, long k) {
    return (n + k - 1) / k * k;
}

/* Vocabulary rows per statistics panel: 256 at D <= 1024, fewer for wider models so a panel's
 * rows of W (P x D bf16) fit BUF and the core's L2. */
static int panel_rows(int D) {
    int p = 32 * (BUF / 32 / D);
    return p < 32 ? 32 : p > LOSS_AMX_PANEL ? LOSS_AMX_PANEL : p;
}

/* The per-thread buffers are sized for every processor (the thread count a parallel region
 * may use is capped at it), so the workspace does not change with OMP_NUM_THREADS. */
static Layout layout(long N, int D, int V) {
    Layout l = {.vp = up(V, 32), .S = D / 32, .P = panel_rows(D), .Ns = (int)(N / 32)};
    long w = (long)l.P * D, dx = (long)DX_KC * (D < DX_DC ? D : DX_DC);
    l.buf = w > dx ? w : dx;
    if (32 * N > l.buf) l.buf = 32 * N;
    l.G = 32; /* rows per grad panel: the largest multiple of 32 dividing P within buf / N */
    for (int g = 64; g <= l.P; g += 32)
        if (l.P % g == 0 && g * N <= l.buf) l.G = g;
    l.panels = (int)((l.vp + l.P - 1) / l.P);
    l.threads = omp_get_num_procs();
    long at = 0;
#define PLACE(field, floats) (l.field = at, at = up(at + (floats), 16))
    PLACE(xb, N * D / 2);
    PLACE(tb, N * D / 2);
    PLACE(tv, N * D / 2);
    PLACE(pk, (long)l.threads * l.buf); /* two buffers of buf bf16 values per thread */
    PLACE(m, N * l.panels);
    PLACE(s, N * l.panels);
    PLACE(c, N * l.panels);
    PLACE(lt, N);
    PLACE(gt, N);
#undef PLACE
    l.floats = at + 16; /* room to align the base */
    return l;
}

long loss_amx_workspace_floats(long N, int D, int V) {
    return layout(N > 0 ? up(N, 32) : 32, D > 0 ? D : 32, V > 0 ? V : 32).floats;
}

int loss_amx_usable(const uint16_t *wb, long N, int D, int V) {
    if (!wb || N <= 0 || N % 32 || D <= 0 || D % 32 || D > 8192 || V <= 0 || N > (1L << 24))
        return 0;
    return gemm_bf16_path() == GEMM_BF16_AMX && !gemm_widened_values(wb);
}

/* The threads of a parallel region here: at most one per processor (layout's buffers). */
static int threads(const Layout *l) {
    int t = omp_get_max_threads();
    return t < l->threads ? t : l->threads;
}

/* This thread's two buffers. */
static uint16_t *buffer(const Layout *l, float *ws, int which) {
    return (uint16_t *)(ws + l->pk) + (2L * omp_get_thread_num() + which) * l->buf;
}

static int rows_from(const Layout *l, long v0, int n) {
    return (int)(l->vp - v0 < n ? l->vp - v0 : n);
}

/* bf16 -> fp32 of 16 values, and 32 fp32 values -> bf16 (round to nearest even, as
 * f32_to_bf16). */
AMX_AVX512 static inline __m512 widen16(const uint16_t *p) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)p)), 16));
}

AMX_AVX512 static inline __m512i narrow32(__m512 lo, __m512 hi) {
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

/* The 32 tokens [n0, n0 + 32) against one panel's rows [v0, v0 + rows), of which the first
 * `valid` are vocabulary: cb holds their logits (row r, token j at r * 32 + j). Records each
 * token's panel maximum and sum, the target logits that fall in the panel, and E's rows
 * (non-temporal stores when E is 64-byte aligned: E is read back only in step 3). */
AMX_AVX512 static void panel_stats(const float *cb, long v0, int rows, int valid, long n0, int p,
                                   const Layout *l, float *ws, uint16_t *E, const int32_t *targets,
                                   long N) {
    float *m = ws + l->m, *s = ws + l->s, *lt = ws + l->lt;
    for (int j = 0; j < 32; j++) {
        int32_t t = targets[n0 + j];
        if (t != CE_IGNORE && t >= v0 && t < v0 + valid) lt[n0 + j] = cb[(t - v0) * 32 + j];
    }
    __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0;
    for (int r = 0; r < valid; r++) {
        m0 = _mm512_max_ps(m0, _mm512_load_ps(cb + r * 32));
        m1 = _mm512_max_ps(m1, _mm512_load_ps(cb + r * 32 + 16));
    }
    int stream = ((uintptr_t)E & 63) == 0;
    __m512 s0 = _mm512_setzero_ps(), s1 = s0;
    for (int r = 0; r < rows; r++) {
        __m512i e = _mm512_setzero_si512();
        if (r < valid) {
            __m512 e0 = simd_exp16(_mm512_sub_ps(_mm512_load_ps(cb + r * 32), m0));
            __m512 e1 = simd_exp16(_mm512_sub_ps(_mm512_load_ps(cb + r * 32 + 16), m1));
            s0 = _mm512_add_ps(s0, e0);
            s1 = _mm512_add_ps(s1, e1);
            e = narrow32(e0, e1);
        }
        void *dst = E + (v0 + r) * N + n0;
        if (stream)
            _mm512_stream_si512(dst, e);
        else
            _mm512_storeu_si512(dst, e);
    }
    _Alignas(64) float mv[32], sv[32];
    _mm512_store_ps(mv, m0);
    _mm512_store_ps(mv + 16, m1);
    _mm512_store_ps(sv, s0);
    _mm512_store_ps(sv + 16, s1);
    for (int j = 0; j < 32; j++) {
        m[(n0 + j) * l->panels + p] = mv[j];
        s[(n0 + j) * l->panels + p] = sv[j];
    }
}

/* Step 1: every panel's statistics and exponentials; the panel's rows of W packed once as A
 * tiles (row block q, step s at (q * S + s) tiles). */
AMX_AVX512 static double pass_stats(const Layout *l, float *ws, uint16_t *E, const uint16_t *wb,
                                    const int32_t *targets, long N, int D, int V, int timed) {
    const uint16_t *tb = (const uint16_t *)(ws + l->tb);
    int S = l->S;
    double tiles = 0;
#pragma omp parallel num_threads(threads(l)) reduction(+ : tiles)
    {
        _Alignas(64) float cb[LOSS_AMX_PANEL * 32];
        uint16_t *pk = buffer(l, ws, 0);
        gemm_amx_configure();
#pragma omp for schedule(dynamic, 1)
        for (int p = 0; p < l->panels; p++) {
            long v0 = (long)p * l->P;
            int rows = rows_from(l, v0, l->P), valid = (int)(V - v0 < rows ? V - v0 : rows);
            double t0 = timed ? omp_get_wtime() : 0;
            for (int r = 0; r < rows; r += 16)
                gemm_amx_pack_a(wb, 0, D, (int)(v0 + r), V, 0, D, S, pk + (long)r * D);
            for (long g = 0; g < l->Ns; g++) {
                for (int k0 = 0; k0 < S; k0 += STATS_KS) {
                    int ks = S - k0 < STATS_KS ? S - k0 : STATS_KS;
                    GemmAmxTiles bt = {tb + (2 * g * S + k0) * TILE, 32, TILE, (long)S * TILE};
                    for (int r = 0; r < rows; r += 32) {
                        GemmAmxTiles at = {pk + (long)r * D + (long)k0 * TILE, 32, TILE,
                                           (long)S * TILE};
                        gemm_amx_group_with(2, 2, ks, at, bt, cb + r * 32, 32, k0 > 0, 1);
                    }
                }
                if (timed) tiles += omp_get_wtime() - t0;
                panel_stats(cb, v0, rows, valid, g * 32, p, l, ws, E, targets, N);
                if (timed) t0 = omp_get_wtime();
            }
        }
        _mm_sfence();
        gemm_amx_release();
    }
    return tiles / threads(l);
}

/* Step 2: per token, the log-sum-exp over the panels, the loss, the panels' factors. */
static void combine(const Layout *l, float *ws, float *losses, float *lse, const int32_t *targets,
                    long N, float scale) {
    int P = l->panels;
    float *c = ws + l->c, *lt = ws + l->lt, *gt = ws + l->gt;
#pragma omp parallel for schedule(static) num_threads(threads(l))
    for (long n = 0; n < N; n++) {
        float *mn = ws + l->m + n * P, *sn = ws + l->s + n * P;
        float mx = simd_max(mn, P, -INFINITY);
        for (int p = 0; p < P; p++)
            mn[p] -= mx;
        simd_exp(mn, mn, P); /* exp(m_p - max) */
        double sum = 0.0;
        for (int p = 0; p < P; p++)
            sum += (double)sn[p] * mn[p];
        double z = mx + log(sum);
        int valid = targets[n] != CE_IGNORE;
        double k = valid ? scale / sum : 0.0; /* scale * exp(m_p - lse) = scale * f_p / sum */
        for (int p = 0; p < P; p++)
            c[(long)p * N + n] = (float)(k * mn[p]);
        lse[n] = (float)z;
        losses[n] = valid ? (float)(z - lt[n]) : 0.0f;
        gt[n] = valid ? (float)(scale * expm1(lt[n] - z)) : 0.0f;
    }
}

/* Step 3 for one grad panel, rows [v0, v0 + rows) of which `valid` are vocabulary: its
 * dlogits E * factor (the targets' from gt) as plain rows in tmp (row r at r * N) and as A
 * tiles in pk (row block q, token step s at (q * Ns + s) tiles). */
AMX_AVX512 static void panel_dlogits(uint16_t *pk, uint16_t *tmp, const uint16_t *E,
                                     const float *cp, const float *gt, const int32_t *targets,
                                     long v0, int rows, int valid, const Layout *l, long N) {
    for (int r = 0; r < rows; r++) {
        const uint16_t *e = E + (v0 + r) * N;
        uint16_t *dst = pk + (long)(r / 16) * l->Ns * TILE + (r % 16) * 32;
        for (int s = 0; s < l->Ns; s++) {
            long n = 32L * s;
            __m512i d = _mm512_setzero_si512();
            if (r < valid)
                d = narrow32(_mm512_mul_ps(widen16(e + n), _mm512_load_ps(cp + n)),
                             _mm512_mul_ps(widen16(e + n + 16), _mm512_load_ps(cp + n + 16)));
            _mm512_storeu_si512((void *)(tmp + r * N + n), d);
            _mm512_store_si512((void *)(dst + (long)s * TILE), d);
        }
    }
    for (long n = 0; n < N; n++) {
        int32_t t = targets[n];
        if (t == CE_IGNORE || t < v0 || t >= v0 + valid) continue;
        uint16_t g = f32_to_bf16(gt[n]);
        long r = t - v0;
        tmp[r * N + n] = g;
        pk[((r / 16) * l->Ns + n / 32) * TILE + (r % 16) * 32 + n % 32] = g;
    }
}

/* Step 3: per grad panel (G rows), the dlogits, dW's rows of the panel (+=), and the panel's
 * part of E rewritten as step 4's A tiles. */
AMX_AVX512 static double pass_grad(const Layout *l, float *ws, uint16_t *E, float *dw,
                                   const int32_t *targets, long N, int D, int V, int timed) {
    const uint16_t *tv = (const uint16_t *)(ws + l->tv);
    const float *gt = ws + l->gt;
    long grads = (l->vp + l->G - 1) / l->G;
    double tiles = 0;
#pragma omp parallel num_threads(threads(l)) reduction(+ : tiles)
    {
        _Alignas(64) float acc[32 * 32];
        uint16_t *pk = buffer(l, ws, 0), *tmp = buffer(l, ws, 1);
        gemm_amx_configure();
#pragma omp for schedule(dynamic, 1)
        for (long q = 0; q < grads; q++) {
            long v0 = q * l->G;
            int rows = rows_from(l, v0, l->G), valid = (int)(V - v0 < rows ? V - v0 : rows);
            const float *cp = ws + l->c + v0 / l->P * N;
            panel_dlogits(pk, tmp, E, cp, gt, targets, v0, rows, valid, l, N);
            double t0 = timed ? omp_get_wtime() : 0;
            for (int dp = 0; dp < D / 32; dp++) {
                GemmAmxTiles bt = {tv + 2L * dp * l->Ns * TILE, 32, TILE, (long)l->Ns * TILE};
                for (int r = 0; r < rows; r += 32) {
                    long v = v0 + r;
                    GemmAmxTiles at = {pk + (long)(r / 16) * l->Ns * TILE, 32, TILE,
                                       (long)l->Ns * TILE};
                    float *c = dw + v * D + 32 * dp;
                    if (v + 32 <= V) {
                        gemm_amx_group(2, 2, l->Ns, at, bt, c, D, 1);
                        continue;
                    }
                    gemm_amx_group(2, 2, l->Ns, at, bt, acc, 32, 0);
                    for (long i = 0; i < V - v; i++)
                        for (int j = 0; j < 32; j++)
                            c[i * D + j] += acc[i * 32 + j];
                }
            }
            for (int vs = 0; vs < rows / 32; vs++)
                for (long t = 0; t < N / 16; t++)
                    gemm_amx_pack_a(tmp, 1, (int)N, (int)(16 * t), (int)N, 32 * vs, rows, 1,
                                    E + ((v0 / 32 + vs) * (N / 16) + t) * TILE);
            if (timed) tiles += omp_get_wtime() - t0;
        }
        gemm_amx_release();
    }
    return tiles / threads(l);
}

/* Step 4: dX = dlogits W. Columns of D in chunks of DX_DC over threads (static, so a chunk
 * stays with its thread), vocabulary in blocks of DX_KC in order: the block's rows of W for the
 * chunk packed as B tiles, against E's A tiles, 2 x 2 tiles of dX accumulating in place. */
AMX_AVX512 static void pass_dx(const Layout *l, float *ws, const uint16_t *E, const uint16_t *wb,
                               float *dx, long N, int D, int V) {
    int chunks = (D + DX_DC - 1) / DX_DC;
#pragma omp parallel num_threads(threads(l))
    {
        uint16_t *bp = buffer(l, ws, 0);
        gemm_amx_configure();
        for (long kb = 0; kb < l->vp; kb += DX_KC) {
            int steps = (int)((l->vp - kb < DX_KC ? l->vp - kb : DX_KC) / 32);
#pragma omp for schedule(static) nowait
            for (int ch = 0; ch < chunks; ch++) {
                int c0 = ch * DX_DC, dc = D - c0 < DX_DC ? D - c0 : DX_DC;
                for (int j = 0; j < dc / 16; j++)
                    gemm_amx_pack_b(wb, 0, D, c0 + 16 * j, D, (int)kb, V, steps,
                                    bp + (long)j * steps * TILE);
                for (long tg = 0; tg < l->Ns; tg++) {
                    GemmAmxTiles at = {E + (kb / 32 * (N / 16) + 2 * tg) * TILE, 32, N / 16 * TILE,
                                       TILE};
                    for (int j = 0; j < dc / 32; j++) {
                        GemmAmxTiles bt = {bp + 2L * j * steps * TILE, 32, TILE,
                                           (long)steps * TILE};
                        gemm_amx_group(2, 2, steps, at, bt, dx + tg * 32 * D + c0 + 32 * j, D,
                                       kb > 0);
                    }
                }
            }
        }
        gemm_amx_release();
    }
}

double loss_amx_fused(float *losses, float *lse, float *dx, float *dw, float *ws, const float *x,
                      const uint16_t *wb, uint16_t *scratch, const int32_t *targets, long N, int D,
                      int V, float scale) {
    Layout l = layout(N, D, V);
    ws = (float *)(((uintptr_t)ws + 63) & ~(uintptr_t)63);
    uint16_t *xb = (uint16_t *)(ws + l.xb), *tb = (uint16_t *)(ws + l.tb);
    uint16_t *tv = (uint16_t *)(ws + l.tv), *E = scratch;
    simd_f32_to_bf16(xb, x, N * D);
    /* The op profile's GEMM column gets the tile products and their packing: all of step 4 and
     * the packs of x, the tile parts of steps 1 and 3 (averaged over the threads). */
    int timed = prof_timing();
    double t0 = timed ? now_seconds() : 0, tiles = 0;
#pragma omp parallel for schedule(static) num_threads(threads(&l))
    for (long g = 0; g < N / 16; g++)
        gemm_amx_pack_b(xb, 1, D, (int)(16 * g), (int)N, 0, D, l.S, tb + g * l.S * TILE);
#pragma omp parallel for schedule(static) num_threads(threads(&l))
    for (int g = 0; g < D / 16; g++)
        gemm_amx_pack_b(xb, 0, D, 16 * g, D, 0, (int)N, l.Ns, tv + (long)g * l.Ns * TILE);
    double t1 = timed ? now_seconds() : 0;
    tiles += pass_stats(&l, ws, E, wb, targets, N, D, V, timed);
    combine(&l, ws, losses, lse, targets, N, scale);
    tiles += pass_grad(&l, ws, E, dw, targets, N, D, V, timed);
    double t2 = timed ? now_seconds() : 0;
    pass_dx(&l, ws, E, wb, dx, N, D, V);
    if (timed) prof_gemm_add(t1 - t0 + tiles + now_seconds() - t2);
    return cross_entropy_valid_sum(losses, targets, N);
}
