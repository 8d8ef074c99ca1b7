/* AVX-512 building blocks for the non-GEMM ops (softmax, SiLU / SwiGLU, RMSNorm, dot, axpy),
 * each with a portable scalar twin chosen at run time when the CPU lacks AVX-512. They are
 * meant to be called from inside the ops in src/ops (which own the math and the backward
 * passes); bench/README.md, section "CPU SIMD helpers", says how to wire them in and what
 * they gain.
 *
 * Numerics: simd_exp is within 2 ulp of the correctly rounded exp over the whole float range (NaN
 * -> NaN, -inf -> 0, +inf and overflow -> inf). Reductions (dot, row sums, sums of squares) add in
 * a fixed order that depends only on n, never on threads or alignment, so results are
 * bitwise reproducible; the order differs from a left-to-right scalar loop, so they match the
 * scalar twins to rounding, not bit for bit. Row functions are serial; the _rows variants
 * split rows over OpenMP threads (each row computed by one thread in the same order). */
#ifndef QT_CPU_SIMD_H
#define QT_CPU_SIMD_H

#include <immintrin.h>
#include <stdint.h>

/* The instruction sets simd_avx512_active checks for: the target attribute of a function that
 * uses AVX-512 intrinsics in a file built without -march=native; call it only when
 * simd_avx512_active() says so. */
#define SIMD_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

/* simd_exp's 16 lanes, for AVX-512 code that keeps its values in registers.
 * exp(x) = 2^k * exp(r), k = round(x / ln2), r = x - k ln2 (two-part ln2 keeps r exact to
 * ~1 ulp), exp(r) on |r| <= ln2/2 by its degree-7 Taylor polynomial (truncation < 1e-8
 * relative), 2^k applied by scalef, which also produces subnormals, 0 and inf. Clamping x to
 * [-104, 89] keeps k finite (results there are already 0 or inf); max/min take x as their
 * second operand so a NaN passes through. */
SIMD_AVX512 static inline __m512 simd_exp16(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
    x = _mm512_min_ps(_mm512_set1_ps(89.0f), x);
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.428606765330187045e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, k);
}

/* 1 when the AVX-512 paths are in use (CPU has AVX-512 F, BW and VL, and QT_SIMD is not
 * "scalar"). */
int simd_avx512_active(void);
/* Forces the scalar (0) or the AVX-512 (1, when the CPU has it) paths; for tests. */
void simd_force(int avx512);

/* y[i] = exp(x[i]); y may alias x. */
void simd_exp(float *y, const float *x, long n);
/* y[i] = exp(x[i] - shift); returns sum y[i]. y may alias x. (An online softmax's step.) */
float simd_exp_sum(float *y, const float *x, long n, float shift);
/* Returns max(init, x[0], ..., x[n-1]). */
float simd_max(const float *x, long n, float init);
/* Returns sum a[i] * b[i]. */
float simd_dot(const float *a, const float *b, long n);
/* y[i] += a * x[i]. */
void simd_axpy(float *y, float a, const float *x, long n);

/* One row: y = softmax(x * scale) over n elements (y may alias x). scale folds the attention
 * 1/sqrt(E) in. A row of all -inf gives NaN, like torch. */
void simd_softmax_row(float *y, const float *x, int n, float scale);
/* rows x n matrix, row stride ld for both x and y, rows split over threads. */
void simd_softmax_rows(float *y, const float *x, int rows, int n, int ld, float scale);

/* y[i] = x[i] * sigmoid(x[i]). */
void simd_silu(float *y, const float *x, long n);
/* out[i] = silu(gate[i]) * up[i]  (the SwiGLU FFN's elementwise step). */
void simd_swiglu(float *out, const float *gate, const float *up, long n);

/* RMSNorm of T rows of D: rstd[t] = 1 / sqrt(mean(x[t]^2) + eps); out[t] = x[t] * rstd[t] * w.
 * out may alias x; rstd may be NULL. Rows split over threads. */
void simd_rmsnorm_rows(float *out, float *rstd, const float *x, const float *w, int T, int D,
                       float eps);

/* dst[i] = bf16(src[i]) with round-to-nearest-even, bit-identical to core/dtype.h's
 * f32_to_bf16 (NaN stays NaN, subnormals are rounded, not flushed as vcvtneps2bf16 would),
 * and the exact widening back. Large n is split over threads. For the per-step bf16 copies
 * of weights and activations in mixed precision. */
void simd_f32_to_bf16(uint16_t *dst, const float *src, long n);
/* The same on the calling thread only: for a chunk a caller's own parallel loop just wrote and
 * still has in cache. */
void simd_f32_to_bf16_here(uint16_t *dst, const float *src, long n);
void simd_bf16_to_f32(float *dst, const uint16_t *src, long n);
/* Writes src as a matmul weight's bf16 copy in the layout of the bf16 path: bf16 at copy, or,
 * when copy is the handle of a widened copy (ops/gemm.h), the bf16-rounded values as fp32. */
void simd_bf16_weight_copy(uint16_t *copy, const float *src, long n);
/* The same on the calling thread, the copy already told apart: the widened values at wide
 * (gemm_widened_values of the copy's handle), or bf16 at bf16 when wide is NULL. For writers
 * that split the work themselves, such as AdamW writing each run of weights it has just
 * updated. */
void simd_bf16_weight_copy_serial(uint16_t *bf16, float *wide, const float *src, long n);
/* x[0..n) = 0 on the calling thread; from SIMD_ZERO_STREAM_MIN values on with non-temporal
 * stores where AVX-512 is active: the lines go to memory without being read first (a plain
 * memset of a gradient larger than the caches reads every line it writes), while smaller
 * ranges stay in the caches for the writer that follows. */
#define SIMD_ZERO_STREAM_MIN (1L << 18)
void simd_zero_stream(float *x, long n);

#endif
