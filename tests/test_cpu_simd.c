/* Unit tests for kernels/cpu_simd.h: the AVX-512 paths and their scalar twins against double-
 * precision oracles (exp within 2 ulp of the correctly rounded value over the whole float
 * range, special values, reductions within a K-scaled bound), odd lengths that exercise the
 * masked tails, and bitwise reproducibility of the reductions across alignment. */
/* cmocka.h needs these four first. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/cpu_simd.h"

static int32_t ordered(float f) {
    int32_t i;
    memcpy(&i, &f, 4);
    return i < 0 ? INT32_MIN - i : i; /* monotone map of floats onto integers */
}

static long ulp_dist(float a, float b) {
    return labs((long)ordered(a) - (long)ordered(b));
}

static void fill(float *x, long n, float lo, float hi, Rng *r) {
    for (long i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * rng_uniform(r);
}

/* Runs body once per available path: scalar, then AVX-512 when the CPU has it. */
#define FOR_EACH_PATH(body)                                                                        \
    for (int path = 0; path < 2; path++) {                                                         \
        simd_force(path);                                                                          \
        if (path == 1 && !simd_avx512_active()) break;                                             \
        body                                                                                       \
    }                                                                                              \
    simd_force(1)

static void test_exp(void **state) {
    (void)state;
    enum { N = 200003 };
    float *x = malloc(N * 4), *y = malloc(N * 4);
    for (long i = 0; i < N; i++)
        x[i] = -110.0f + 200.0f * (float)i / N;
    x[0] = -INFINITY, x[1] = INFINITY, x[2] = NAN, x[3] = 0.0f, x[4] = -0.0f, x[5] = 88.7228f;
    x[6] = 88.7229f, x[7] = -87.4f, x[8] = -103.2f, x[9] = 1e-10f;
    FOR_EACH_PATH({
        memcpy(y, x, N * 4);
        simd_exp(y, y, N); /* in place */
        for (long i = 0; i < N; i++) {
            if (isnan(x[i])) {
                assert_true(isnan(y[i]));
                continue;
            }
            float want = (float)exp((double)x[i]);
            if (ulp_dist(y[i], want) > 2)
                fail_msg("path %d: exp(%.9g) = %.9g, want %.9g", path, x[i], y[i], want);
        }
    });
    free(x), free(y);
}

static void test_dot_axpy(void **state) {
    (void)state;
    Rng r;
    rng_seed(&r, 3, 0);
    const long ns[] = {0, 1, 15, 16, 17, 63, 64, 65, 1000, 4099};
    float *a = malloc(4100 * 4), *b = malloc(4100 * 4), *y = malloc(4100 * 4),
          *y0 = malloc(4100 * 4);
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        long n = ns[k];
        fill(a, 4100, -1, 1, &r);
        fill(b, 4100, -1, 1, &r);
        fill(y0, 4100, -1, 1, &r);
        double want = 0, abs = 0;
        for (long i = 0; i < n; i++)
            want += (double)a[i] * b[i], abs += fabs((double)a[i] * b[i]);
        FOR_EACH_PATH({
            float got = simd_dot(a, b, n);
            assert_true(fabs(got - want) <= (n + 2) * 0x1p-24 * abs + 1e-30);
            memcpy(y, y0, 4100 * 4);
            simd_axpy(y, -0.375f, a, n);
            for (long i = 0; i < 4100; i++) {
                double w = i < n ? (double)y0[i] - 0.375 * a[i] : y0[i];
                assert_true(fabs(y[i] - w) <= 0x1p-23 * (fabs(y0[i]) + fabs(0.375 * a[i])));
            }
        });
    }
    free(a), free(b), free(y), free(y0);
}

/* The online softmax's step: exp(x - shift) elementwise (the float difference, then exp within
 * 2 ulp) and its sum; the running max. Odd lengths reach the
 * masked tails; -inf entries (masked keys) give 0 and do not win the max. */
static void test_exp_sum_max(void **state) {
    (void)state;
    Rng r;
    rng_seed(&r, 5, 0);
    const long ns[] = {0, 1, 15, 16, 17, 63, 64, 65, 1000};
    float *x = malloc(1000 * 4), *y = malloc(1000 * 4);
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        long n = ns[k];
        fill(x, 1000, -20, 20, &r);
        if (n > 3) x[n / 2] = -INFINITY;
        double mx = -3.0, sum = 0;
        for (long i = 0; i < n; i++)
            mx = x[i] > mx ? x[i] : mx;
        for (long i = 0; i < n; i++)
            sum += exp((double)(x[i] - (float)mx));
        FOR_EACH_PATH({
            assert_true(simd_max(x, n, -3.0f) == (float)mx);
            float got = simd_exp_sum(y, x, n, (float)mx);
            for (long i = 0; i < n; i++) {
                float want = (float)exp((double)(x[i] - (float)mx));
                if (ulp_dist(y[i], want) > 2)
                    fail_msg("path %d: exp(%.9g - %.9g) = %.9g, want %.9g", path, x[i], mx, y[i],
                             want);
            }
            assert_true(fabs(got - sum) <= (n + 8) * 0x1p-23 * sum + 1e-30);
        });
    }
    free(x), free(y);
}

static void test_softmax(void **state) {
    (void)state;
    Rng r;
    rng_seed(&r, 5, 0);
    const int ns[] = {1, 3, 16, 17, 100, 1000};
    float x[1000], y[1000];
    double p[1000];
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        int n = ns[k];
        fill(x, n, -30, 30, &r);
        if (n > 3) x[n - 1] = x[n / 2] = -INFINITY; /* causal mask entries */
        const float scale = 0.088388f;
        double m = -INFINITY, s = 0;
        for (int i = 0; i < n; i++)
            m = fmax(m, (double)x[i] * scale);
        for (int i = 0; i < n; i++)
            s += p[i] = exp((double)x[i] * scale - m);
        FOR_EACH_PATH({
            simd_softmax_row(y, x, n, scale);
            for (int i = 0; i < n; i++)
                if (!(fabs(y[i] - p[i] / s) <= 2e-6 * p[i] / s + 1e-12))
                    fail_msg("path %d n %d: y[%d] = %.9g want %.9g", path, n, i, y[i], p[i] / s);
        });
    }
    /* a fully masked row is NaN on both paths, as in torch */
    for (int i = 0; i < 20; i++)
        x[i] = -INFINITY;
    FOR_EACH_PATH({
        simd_softmax_row(y, x, 20, 1.0f);
        assert_true(isnan(y[0]) && isnan(y[19]));
    });
    /* rows variant == row function applied per row, with a padded stride */
    float X[7 * 40], Y[7 * 40], Z[7 * 40];
    fill(X, 7 * 40, -5, 5, &r);
    memcpy(Y, X, sizeof X);
    memcpy(Z, X, sizeof X);
    simd_softmax_rows(Y, X, 7, 33, 40, 0.5f);
    for (int i = 0; i < 7; i++)
        simd_softmax_row(Z + i * 40, X + i * 40, 33, 0.5f);
    assert_memory_equal(Y, Z, sizeof Y);
}

static void test_silu_swiglu(void **state) {
    (void)state;
    enum { N = 5003 };
    Rng r;
    rng_seed(&r, 9, 0);
    float *g = malloc(N * 4), *u = malloc(N * 4), *y = malloc(N * 4);
    fill(g, N, -120, 120, &r);
    fill(u, N, -2, 2, &r);
    g[0] = 0, g[1] = -0.0f, g[2] = 1e-20f, g[3] = -88.0f, g[4] = 100.0f;
    FOR_EACH_PATH({
        simd_silu(y, g, N);
        for (long i = 0; i < N; i++) {
            double w = (double)g[i] / (1.0 + exp(-(double)g[i]));
            /* below ~1e-35 expf(-g) overflows first and gives -0: immaterial */
            if (!(fabs(y[i] - w) <= 1e-6 * fabs(w) + 1e-35))
                fail_msg("path %d: silu(%.9g) = %.9g want %.9g", path, g[i], y[i], w);
        }
        simd_swiglu(y, g, u, N);
        for (long i = 0; i < N; i++) {
            double w = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
            assert_true(fabs(y[i] - w) <= 1e-6 * fabs(w) + 1e-35);
        }
    });
    free(g), free(u), free(y);
}

static void test_rmsnorm(void **state) {
    (void)state;
    Rng r;
    rng_seed(&r, 13, 0);
    const int Ds[] = {1, 17, 128, 1024};
    enum { T = 5 };
    float x[T * 1024], w[1024], out[T * 1024], rstd[T];
    for (size_t k = 0; k < sizeof Ds / sizeof Ds[0]; k++) {
        int D = Ds[k];
        fill(x, T * D, -3, 3, &r);
        fill(w, D, 0.5f, 1.5f, &r);
        FOR_EACH_PATH({
            simd_rmsnorm_rows(out, rstd, x, w, T, D, 1e-6f);
            for (int t = 0; t < T; t++) {
                double ss = 0;
                for (int i = 0; i < D; i++)
                    ss += (double)x[t * D + i] * x[t * D + i];
                double rs = 1.0 / sqrt(ss / D + 1e-6);
                assert_true(fabs(rstd[t] - rs) <= 1e-6 * rs);
                for (int i = 0; i < D; i++) {
                    double want = x[t * D + i] * rs * w[i];
                    assert_true(fabs(out[t * D + i] - want) <= 2e-6 * fabs(want) + 1e-30);
                }
            }
        });
    }
    /* in place, no rstd */
    float ref[4 * 17];
    fill(x, 4 * 17, -3, 3, &r);
    simd_rmsnorm_rows(ref, NULL, x, w, 4, 17, 1e-6f);
    simd_rmsnorm_rows(x, NULL, x, w, 4, 17, 1e-6f);
    assert_memory_equal(ref, x, sizeof ref);
}

/* Reductions depend only on n: the same values at another alignment give the same bits. */
static void test_reduction_alignment(void **state) {
    (void)state;
    Rng r;
    rng_seed(&r, 17, 0);
    float *a = malloc(1003 * 4), *b = malloc(1003 * 4);
    fill(a, 1003, -1, 1, &r);
    fill(b, 1003, -1, 1, &r);
    float d0 = simd_dot(a, b, 1000);
    memmove(a + 3, a, 1000 * 4);
    memmove(b + 1, b, 1000 * 4);
    assert_true(simd_dot(a + 3, b + 1, 1000) == d0);
    free(a), free(b);
}

/* bf16 conversions agree bit for bit with core/dtype.h: every bf16 value widened, and fp32
 * patterns covering every exponent (subnormals, inf, NaN), exact ties and random bits. */
static void test_bf16_convert(void **state) {
    (void)state;
    enum { N = 65536 * 4 + 1000003 };
    uint32_t *bits = malloc((size_t)N * 4);
    uint16_t *h = malloc((size_t)N * 2), *hw = malloc((size_t)N * 2);
    float *f = malloc((size_t)N * 4);
    Rng r;
    rng_seed(&r, 23, 0);
    const uint32_t lows[4] = {0x0000, 0x8000, 0x7fff, 0x8001}; /* exact, tie, below, above */
    for (long i = 0; i < 65536 * 4; i++)
        bits[i] = (uint32_t)(i >> 2) << 16 | lows[i & 3];
    for (long i = 65536 * 4; i < N; i++)
        bits[i] = (uint32_t)rng_u64(&r);
    memcpy(f, bits, (size_t)N * 4);
    for (long i = 0; i < N; i++)
        hw[i] = f32_to_bf16(f[i]);
    FOR_EACH_PATH({
        memset(h, 0, (size_t)N * 2);
        simd_f32_to_bf16(h, f, N - 5); /* odd length: the masked tail */
        assert_memory_equal(h, hw, (size_t)(N - 5) * 2);
        assert_true(h[N - 5] == 0);
        for (long i = 0; i < 65536; i++)
            h[i] = (uint16_t)i;
        simd_bf16_to_f32(f, h, 65536 - 3);
        for (long i = 0; i < 65536 - 3; i++) {
            float w = bf16_to_f32((uint16_t)i);
            assert_memory_equal(&f[i], &w, 4);
        }
        memcpy(f, bits, (size_t)N * 4);
    });
    free(bits), free(h), free(hw), free(f);
}

/* simd_zero_stream clears exactly [x, x + n): short and streamed lengths, every start offset
 * within a cache line (the unaligned head), odd tails; the values around it untouched. */
static void test_zero_stream(void **state) {
    (void)state;
    const long lens[] = {
        0, 1, 17, SIMD_ZERO_STREAM_MIN - 1, SIMD_ZERO_STREAM_MIN, SIMD_ZERO_STREAM_MIN + 21};
    long cap = SIMD_ZERO_STREAM_MIN + 64;
    float *buf = aligned_alloc(64, (size_t)cap * sizeof *buf);
    FOR_EACH_PATH({
        for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++)
            for (int off = 0; off < 16; off += 3) {
                for (long i = 0; i < cap; i++)
                    buf[i] = 1.5f;
                simd_zero_stream(buf + 1 + off, lens[l]);
                for (long i = 0; i < cap; i++) {
                    int in = i >= 1 + off && i < 1 + off + lens[l];
                    if (buf[i] != (in ? 0.0f : 1.5f))
                        fail_msg("path %d n %ld offset %d: element %ld is %g", path, lens[l], off,
                                 i, buf[i]);
                }
            }
    });
    free(buf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_zero_stream),
        cmocka_unit_test(test_exp),
        cmocka_unit_test(test_dot_axpy),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_silu_swiglu),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_reduction_alignment),
        cmocka_unit_test(test_bf16_convert),
        cmocka_unit_test(test_exp_sum_max),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
