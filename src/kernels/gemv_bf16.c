/* bf16 matrix-vector products behind kernels/gemv_bf16.h. The vector paths carry target
 * attributes, so the file builds without -march=native and picks its path from CPUID. */
#include "kernels/gemv_bf16.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "kernels/cpu_peak.h"
#include "kernels/cpu_simd.h"

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_best, g_path;

static void init_once(void) {
    g_best = !simd_avx512_active()   ? GEMV_SCALAR
             : cpu_has_avx512_bf16() ? GEMV_AVX512_BF16
                                     : GEMV_AVX512;
    g_path = g_best;
}

int gemv_bf16_path(void) {
    pthread_once(&g_once, init_once);
    return g_path;
}

void gemv_bf16_force(int p) {
    pthread_once(&g_once, init_once);
    g_path = p < g_best ? p : g_best;
}

/* Each weight row is its own stream (GEMV_ROWS of them per thread, 2 KB apart at I = 1024),
 * which the hardware prefetcher follows less well than one sequential read: prefetching 512
 * bytes ahead on every row measured 1.3-1.7 GB/s against 0.9-1.1 without, lm_head's shape on the
 * shared 2-core machine of bench/README.md (loaded, noisy; a plain read loop gave 1.3-2.4). The
 * prefetch past a row's end lands in the next row or past the matrix, which never faults. */
#define GEMV_PREFETCH 256 /* bf16 values */

/* One block: WR weight rows (w, stride I) against R activation rows (x, stride I), out[r * ldo
 * + j]. WR and R are constants at every call, so the accumulators stay in registers. */
#define INLINE static inline __attribute__((always_inline))
#define AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define AVX512 SIMD_AVX512

INLINE AVX512BF16 void block_dpbf16(float *out, long ldo, const uint16_t *w, const uint16_t *x,
                                    int I, int WR, int R) {
    __m512 acc[GEMV_ROWS][GEMV_ROWS];
    for (int j = 0; j < WR; j++)
        for (int r = 0; r < R; r++)
            acc[j][r] = _mm512_setzero_ps();
    for (int i = 0; i < I; i += 32) {
        /* The tail reads zeros past I: 0 * 0 adds nothing. */
        __mmask32 m = I - i >= 32 ? (__mmask32)~0u : (__mmask32)((1u << (I - i)) - 1);
        __m512i xv[GEMV_ROWS];
        for (int r = 0; r < R; r++)
            xv[r] = _mm512_maskz_loadu_epi16(m, x + (long)r * I + i);
        for (int j = 0; j < WR; j++) {
            _mm_prefetch((const char *)(w + (long)j * I + i + GEMV_PREFETCH), _MM_HINT_T0);
            __m512i wv = _mm512_maskz_loadu_epi16(m, w + (long)j * I + i);
            for (int r = 0; r < R; r++)
                acc[j][r] = _mm512_dpbf16_ps(acc[j][r], (__m512bh)wv, (__m512bh)xv[r]);
        }
    }
    for (int j = 0; j < WR; j++)
        for (int r = 0; r < R; r++)
            out[r * ldo + j] = _mm512_reduce_add_ps(acc[j][r]);
}

INLINE AVX512 __m512 widen(__mmask16 m, const uint16_t *p) {
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

INLINE AVX512 void block_fma(float *out, long ldo, const uint16_t *w, const uint16_t *x, int I,
                             int WR, int R) {
    __m512 acc[GEMV_ROWS][GEMV_ROWS];
    for (int j = 0; j < WR; j++)
        for (int r = 0; r < R; r++)
            acc[j][r] = _mm512_setzero_ps();
    for (int i = 0; i < I; i += 16) {
        __mmask16 m = I - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (I - i)) - 1);
        __m512 xv[GEMV_ROWS];
        for (int r = 0; r < R; r++)
            xv[r] = widen(m, x + (long)r * I + i);
        for (int j = 0; j < WR; j++) {
            _mm_prefetch((const char *)(w + (long)j * I + i + GEMV_PREFETCH), _MM_HINT_T0);
            __m512 wv = widen(m, w + (long)j * I + i);
            for (int r = 0; r < R; r++)
                acc[j][r] = _mm512_fmadd_ps(wv, xv[r], acc[j][r]);
        }
    }
    for (int j = 0; j < WR; j++)
        for (int r = 0; r < R; r++)
            out[r * ldo + j] = _mm512_reduce_add_ps(acc[j][r]);
}

static void block_scalar(float *out, long ldo, const uint16_t *w, const uint16_t *x, int I, int WR,
                         int R) {
    for (int j = 0; j < WR; j++)
        for (int r = 0; r < R; r++) {
            float acc = 0.0f;
            for (int i = 0; i < I; i++)
                acc += bf16_to_f32(w[(long)j * I + i]) * bf16_to_f32(x[(long)r * I + i]);
            out[r * ldo + j] = acc;
        }
}

/* Rows o..o+WR of one part against every activation row, GEMV_ROWS rows at a time. */
#define ROWS_OF(fn, attr)                                                                          \
    attr static void rows_##fn(const GemvPart *p, long o, int WR, const uint16_t *xb, long n,      \
                               int I) {                                                            \
        const uint16_t *w = p->w + o * I;                                                          \
        for (long r = 0; r < n; r += GEMV_ROWS) {                                                  \
            float *out = p->out + r * p->O + o;                                                    \
            const uint16_t *x = xb + r * I;                                                        \
            int R = n - r < GEMV_ROWS ? (int)(n - r) : GEMV_ROWS;                                  \
            if (WR == GEMV_ROWS) {                                                                 \
                switch (R) {                                                                       \
                case 1:                                                                            \
                    fn(out, p->O, w, x, I, GEMV_ROWS, 1);                                          \
                    break;                                                                         \
                case 2:                                                                            \
                    fn(out, p->O, w, x, I, GEMV_ROWS, 2);                                          \
                    break;                                                                         \
                case 3:                                                                            \
                    fn(out, p->O, w, x, I, GEMV_ROWS, 3);                                          \
                    break;                                                                         \
                default:                                                                           \
                    fn(out, p->O, w, x, I, GEMV_ROWS, GEMV_ROWS);                                  \
                    break;                                                                         \
                }                                                                                  \
            } else {                                                                               \
                for (int j = 0; j < WR; j++)                                                       \
                    for (int k = 0; k < R; k++)                                                    \
                        fn(out + (long)k * p->O + j, p->O, w + (long)j * I, x + (long)k * I, I, 1, \
                           1);                                                                     \
            }                                                                                      \
        }                                                                                          \
    }
ROWS_OF(block_dpbf16, AVX512BF16)
ROWS_OF(block_fma, AVX512)
ROWS_OF(block_scalar, )

void gemv_bf16(const GemvPart *parts, int nparts, const uint16_t *xb, long n, int I) {
    int path = gemv_bf16_path();
    long blocks = 0;
    for (int p = 0; p < nparts; p++)
        blocks += (parts[p].O + GEMV_ROWS - 1) / GEMV_ROWS;
#pragma omp parallel for schedule(static)
    for (long b = 0; b < blocks; b++) {
        int p = 0;
        long first = b; /* block index within part p */
        while (first >= (parts[p].O + GEMV_ROWS - 1) / GEMV_ROWS) {
            first -= (parts[p].O + GEMV_ROWS - 1) / GEMV_ROWS;
            p++;
        }
        long o = first * GEMV_ROWS;
        int WR = parts[p].O - o < GEMV_ROWS ? (int)(parts[p].O - o) : GEMV_ROWS;
        if (path == GEMV_AVX512_BF16)
            rows_block_dpbf16(&parts[p], o, WR, xb, n, I);
        else if (path == GEMV_AVX512)
            rows_block_fma(&parts[p], o, WR, xb, n, I);
        else
            rows_block_scalar(&parts[p], o, WR, xb, n, I);
    }
}
