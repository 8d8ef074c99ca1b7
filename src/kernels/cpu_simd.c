/* AVX-512 and scalar implementations behind kernels/cpu_simd.h. The AVX-512 functions carry
 * target attributes, so this file builds and runs correctly without -march=native; the choice
 * is made once at run time from CPUID (and QT_SIMD=scalar for debugging). */
#include "kernels/cpu_simd.h"

#include "core/dtype.h"
#include "ops/gemm.h"

#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_avx512;

/* F for the float paths, BW and VL for the 16-bit masked loads and stores (every AVX-512 CPU
 * since Skylake-SP has all three). */
static int has_avx512(void) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
}

static void init_once(void) {
    const char *env = getenv("QT_SIMD");
    g_avx512 = has_avx512() && !(env && strcmp(env, "scalar") == 0);
}

int simd_avx512_active(void) {
    pthread_once(&g_once, init_once);
    return g_avx512;
}

void simd_force(int avx512) {
    pthread_once(&g_once, init_once);
    g_avx512 = avx512 && has_avx512();
}

/* ---- scalar twins ----------------------------------------------------------------------- */

static void exp_scalar(float *y, const float *x, long n) {
    for (long i = 0; i < n; i++)
        y[i] = expf(x[i]);
}

static float exp_sum_scalar(float *y, const float *x, long n, float shift) {
    float s = 0;
    for (long i = 0; i < n; i++)
        s += y[i] = expf(x[i] - shift);
    return s;
}

static float max_scalar(const float *x, long n, float init) {
    for (long i = 0; i < n; i++)
        init = fmaxf(init, x[i]);
    return init;
}

static float dot_scalar(const float *a, const float *b, long n) {
    float s = 0;
    for (long i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static void axpy_scalar(float *y, float a, const float *x, long n) {
    for (long i = 0; i < n; i++)
        y[i] += a * x[i];
}

static void softmax_scalar(float *y, const float *x, int n, float scale) {
    float m = -INFINITY;
    for (int i = 0; i < n; i++)
        m = fmaxf(m, x[i] * scale);
    float s = 0;
    for (int i = 0; i < n; i++)
        s += y[i] = expf(x[i] * scale - m);
    float inv = 1.0f / s;
    for (int i = 0; i < n; i++)
        y[i] *= inv;
}

static void silu_scalar(float *y, const float *x, long n) {
    for (long i = 0; i < n; i++)
        y[i] = x[i] / (1.0f + expf(-x[i]));
}

static void swiglu_scalar(float *out, const float *gate, const float *up, long n) {
    for (long i = 0; i < n; i++)
        out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

static float sumsq_scalar(const float *x, int n) {
    float s = 0;
    for (int i = 0; i < n; i++)
        s += x[i] * x[i];
    return s;
}

static void scale_mul_scalar(float *out, const float *x, float r, const float *w, int n) {
    for (int i = 0; i < n; i++)
        out[i] = x[i] * r * w[i];
}

/* ---- AVX-512 ---------------------------------------------------------------------------- */

#define AVX512 SIMD_AVX512

/* Mask of the first n (< 16) lanes, for loop tails. */
AVX512 static inline __mmask16 tail(long n) {
    return (__mmask16)((1u << n) - 1u);
}

AVX512 static void exp_avx512(float *y, const float *x, long n) {
    long i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, simd_exp16(_mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 m = tail(n - i);
        _mm512_mask_storeu_ps(y + i, m, simd_exp16(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

AVX512 static float exp_sum_avx512(float *y, const float *x, long n, float shift) {
    __m512 sh = _mm512_set1_ps(shift), sum = _mm512_setzero_ps();
    long i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 e = simd_exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), sh));
        _mm512_storeu_ps(y + i, e);
        sum = _mm512_add_ps(sum, e);
    }
    if (i < n) {
        __mmask16 t = tail(n - i);
        __m512 e = simd_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(t, x + i), sh));
        _mm512_mask_storeu_ps(y + i, t, e);
        sum = _mm512_mask_add_ps(sum, t, sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

AVX512 static float max_avx512(const float *x, long n, float init) {
    __m512 m = _mm512_set1_ps(init);
    long i = 0;
    for (; i + 16 <= n; i += 16)
        m = _mm512_max_ps(m, _mm512_loadu_ps(x + i));
    if (i < n) m = _mm512_mask_max_ps(m, tail(n - i), m, _mm512_maskz_loadu_ps(tail(n - i), x + i));
    return _mm512_reduce_max_ps(m);
}

/* Four 16-lane accumulators, combined in a fixed order: the sum depends only on n. */
AVX512 static float dot_avx512(const float *a, const float *b, long n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    long i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
    }
    for (; i + 16 <= n; i += 16)
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    if (i < n) {
        __mmask16 m = tail(n - i);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

AVX512 static void axpy_avx512(float *y, float a, const float *x, long n) {
    __m512 va = _mm512_set1_ps(a);
    long i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i,
                         _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = tail(n - i);
        _mm512_mask_storeu_ps(
            y + i, m,
            _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
}

AVX512 static void softmax_avx512(float *y, const float *x, int n, float scale) {
    __m512 vs = _mm512_set1_ps(scale), vm = _mm512_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 16 <= n; i += 16)
        vm = _mm512_max_ps(vm, _mm512_mul_ps(_mm512_loadu_ps(x + i), vs));
    if (i < n)
        vm = _mm512_mask_max_ps(vm, tail(n - i), vm,
                                _mm512_mul_ps(_mm512_maskz_loadu_ps(tail(n - i), x + i), vs));
    __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(vm)), sum = _mm512_setzero_ps();
    for (i = 0; i + 16 <= n; i += 16) {
        __m512 e = simd_exp16(_mm512_fmsub_ps(_mm512_loadu_ps(x + i), vs, m));
        _mm512_storeu_ps(y + i, e);
        sum = _mm512_add_ps(sum, e);
    }
    if (i < n) {
        __mmask16 t = tail(n - i);
        __m512 e = simd_exp16(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(t, x + i), vs, m));
        _mm512_mask_storeu_ps(y + i, t, e);
        sum = _mm512_mask_add_ps(sum, t, sum, e);
    }
    __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
    for (i = 0; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(y + i), inv));
    if (i < n) {
        __mmask16 t = tail(n - i);
        _mm512_mask_storeu_ps(y + i, t, _mm512_mul_ps(_mm512_maskz_loadu_ps(t, y + i), inv));
    }
}

/* silu(g) = g / (1 + exp(-g)); a division rather than a reciprocal estimate keeps it within a
 * couple of ulp of the scalar formula. */
AVX512 static inline __m512 silu16(__m512 g) {
    __m512 one = _mm512_set1_ps(1.0f);
    return _mm512_div_ps(g, _mm512_add_ps(one, simd_exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
}

AVX512 static void silu_avx512(float *y, const float *x, long n) {
    long i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, silu16(_mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 m = tail(n - i);
        _mm512_mask_storeu_ps(y + i, m, silu16(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

AVX512 static void swiglu_avx512(float *out, const float *gate, const float *up, long n) {
    long i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i,
                         _mm512_mul_ps(silu16(_mm512_loadu_ps(gate + i)), _mm512_loadu_ps(up + i)));
    if (i < n) {
        __mmask16 m = tail(n - i);
        _mm512_mask_storeu_ps(out + i, m,
                              _mm512_mul_ps(silu16(_mm512_maskz_loadu_ps(m, gate + i)),
                                            _mm512_maskz_loadu_ps(m, up + i)));
    }
}

AVX512 static float sumsq_avx512(const float *x, int n) {
    return dot_avx512(x, x, n);
}

AVX512 static void scale_mul_avx512(float *out, const float *x, float r, const float *w, int n) {
    __m512 vr = _mm512_set1_ps(r);
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), vr),
                                                _mm512_loadu_ps(w + i)));
    if (i < n) {
        __mmask16 m = tail(n - i);
        _mm512_mask_storeu_ps(out + i, m,
                              _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vr),
                                            _mm512_maskz_loadu_ps(m, w + i)));
    }
}

/* f32_to_bf16 on 16 lanes in integer arithmetic: add 0x7fff plus the lowest kept bit, keep
 * the top half; NaN keeps its top half with the quiet bit set. */
AVX512 static inline __m256i bf16_16(__m512 f) {
    __m512i u = _mm512_castps_si512(f);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan,
                              _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
}

AVX512 static void to_bf16_avx512(uint16_t *dst, const float *src, long n) {
    long i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i), bf16_16(_mm512_loadu_ps(src + i)));
    if (i < n) {
        __mmask16 m = tail(n - i);
        _mm256_mask_storeu_epi16(dst + i, m, bf16_16(_mm512_maskz_loadu_ps(m, src + i)));
    }
}

/* fp32 rounded to bf16 and widened back: bf16_16's rounding with the low half cleared. */
AVX512 static void round_bf16_avx512(float *dst, const float *src, long n) {
    for (long i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : tail(n - i);
        __m512i w = _mm512_cvtepu16_epi32(bf16_16(_mm512_maskz_loadu_ps(m, src + i)));
        _mm512_mask_storeu_ps(dst + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
    }
}

AVX512 static void from_bf16_avx512(float *dst, const uint16_t *src, long n) {
    long i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i)));
        _mm512_storeu_si512(dst + i, _mm512_slli_epi32(w, 16));
    }
    if (i < n) {
        __mmask16 m = tail(n - i);
        __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, src + i));
        _mm512_mask_storeu_ps(dst + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
    }
}

/* ---- dispatch --------------------------------------------------------------------------- */

void simd_exp(float *y, const float *x, long n) {
    if (simd_avx512_active())
        exp_avx512(y, x, n);
    else
        exp_scalar(y, x, n);
}

float simd_exp_sum(float *y, const float *x, long n, float shift) {
    return simd_avx512_active() ? exp_sum_avx512(y, x, n, shift) : exp_sum_scalar(y, x, n, shift);
}

float simd_max(const float *x, long n, float init) {
    return simd_avx512_active() ? max_avx512(x, n, init) : max_scalar(x, n, init);
}

float simd_dot(const float *a, const float *b, long n) {
    return simd_avx512_active() ? dot_avx512(a, b, n) : dot_scalar(a, b, n);
}

void simd_axpy(float *y, float a, const float *x, long n) {
    if (simd_avx512_active())
        axpy_avx512(y, a, x, n);
    else
        axpy_scalar(y, a, x, n);
}

void simd_softmax_row(float *y, const float *x, int n, float scale) {
    if (simd_avx512_active())
        softmax_avx512(y, x, n, scale);
    else
        softmax_scalar(y, x, n, scale);
}

void simd_softmax_rows(float *y, const float *x, int rows, int n, int ld, float scale) {
    int v = simd_avx512_active();
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        if (v)
            softmax_avx512(y + (long)r * ld, x + (long)r * ld, n, scale);
        else
            softmax_scalar(y + (long)r * ld, x + (long)r * ld, n, scale);
    }
}

void simd_silu(float *y, const float *x, long n) {
    if (simd_avx512_active())
        silu_avx512(y, x, n);
    else
        silu_scalar(y, x, n);
}

void simd_swiglu(float *out, const float *gate, const float *up, long n) {
    if (simd_avx512_active())
        swiglu_avx512(out, gate, up, n);
    else
        swiglu_scalar(out, gate, up, n);
}

/* Conversions go in chunks of 64K elements, one chunk per loop iteration, so the split over
 * threads never changes a result (each element is converted independently anyway). */
#define CONVERT_CHUNK 65536L

void simd_f32_to_bf16_here(uint16_t *dst, const float *src, long n) {
    if (simd_avx512_active())
        to_bf16_avx512(dst, src, n);
    else
        for (long i = 0; i < n; i++)
            dst[i] = f32_to_bf16(src[i]);
}

void simd_f32_to_bf16(uint16_t *dst, const float *src, long n) {
#pragma omp parallel for schedule(static) if (n > 4 * CONVERT_CHUNK)
    for (long c = 0; c < n; c += CONVERT_CHUNK)
        simd_f32_to_bf16_here(dst + c, src + c, n - c < CONVERT_CHUNK ? n - c : CONVERT_CHUNK);
}

AVX512 static void zero_stream_avx512(float *x, long n) {
    long i = 0;
    for (; i < n && ((uintptr_t)(x + i) & 63); i++)
        x[i] = 0.0f;
    __m512 z = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16)
        _mm512_stream_ps(x + i, z);
    _mm_sfence();
    for (; i < n; i++)
        x[i] = 0.0f;
}

void simd_zero_stream(float *x, long n) {
    if (n >= SIMD_ZERO_STREAM_MIN && simd_avx512_active())
        zero_stream_avx512(x, n);
    else
        memset(x, 0, (size_t)n * sizeof *x);
}

void simd_bf16_to_f32(float *dst, const uint16_t *src, long n) {
    int v = simd_avx512_active();
#pragma omp parallel for schedule(static) if (n > 4 * CONVERT_CHUNK)
    for (long c = 0; c < n; c += CONVERT_CHUNK) {
        long len = n - c < CONVERT_CHUNK ? n - c : CONVERT_CHUNK;
        if (v)
            from_bf16_avx512(dst + c, src + c, len);
        else
            for (long i = c; i < c + len; i++)
                dst[i] = bf16_to_f32(src[i]);
    }
}

void simd_bf16_weight_copy_serial(uint16_t *bf16, float *wide, const float *src, long n) {
    int v = simd_avx512_active();
    if (wide && v)
        round_bf16_avx512(wide, src, n);
    else if (wide)
        for (long i = 0; i < n; i++)
            wide[i] = bf16_to_f32(f32_to_bf16(src[i]));
    else if (v)
        to_bf16_avx512(bf16, src, n);
    else
        for (long i = 0; i < n; i++)
            bf16[i] = f32_to_bf16(src[i]);
}

void simd_bf16_weight_copy(uint16_t *copy, const float *src, long n) {
    float *wide = gemm_widened_values(copy);
#pragma omp parallel for schedule(static) if (n > 4 * CONVERT_CHUNK)
    for (long c = 0; c < n; c += CONVERT_CHUNK) {
        long len = n - c < CONVERT_CHUNK ? n - c : CONVERT_CHUNK;
        simd_bf16_weight_copy_serial(wide ? NULL : copy + c, wide ? wide + c : NULL, src + c, len);
    }
}

void simd_rmsnorm_rows(float *out, float *rstd, const float *x, const float *w, int T, int D,
                       float eps) {
    int v = simd_avx512_active();
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        const float *xt = x + (long)t * D;
        float ss = v ? sumsq_avx512(xt, D) : sumsq_scalar(xt, D);
        float r = 1.0f / sqrtf(ss / D + eps);
        if (rstd) rstd[t] = r;
        if (v)
            scale_mul_avx512(out + (long)t * D, xt, r, w, D);
        else
            scale_mul_scalar(out + (long)t * D, xt, r, w, D);
    }
}
