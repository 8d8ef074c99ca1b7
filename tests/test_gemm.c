/* Unit tests for ops/gemm.h: every backend (oneDNN matmul, dnnl_sgemm, reference loops) against
 * a double-accumulating oracle written here, over all transposition flags, alpha, beta, odd and
 * degenerate shapes and padded strides; bf16 against the same oracle on bf16-rounded inputs,
 * also with widened weight copies and operands cut into widened blocks;
 * beta = 0 never reading C; and bitwise-identical results on repeated calls. The AMX tile kernel
 * (ops/gemm_amx.h, auto's bf16 path where the CPU has AMX) also across its blocks and thread
 * counts. */
/* cmocka.h needs these four first. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/rng.h"
#include "ops/gemm.h"
#include "ops/gemm_amx.h"

/* Fills n floats uniformly in [-1, 1); bf16 callers round them afterwards. */
static void fill(float *x, size_t n, Rng *r) {
    for (size_t i = 0; i < n; i++)
        x[i] = 2.0f * rng_uniform(r) - 1.0f;
}

/* The oracle: C = alpha op(A) op(B) + beta C in double, plus the sum of absolute terms that
 * bounds fp32 rounding error (err <= ~K * 2^-24 * that sum for any summation order). */
static void oracle(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *B, int ldb, float beta, const float *C0, int ldc, double *out,
                   double *absum) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0, a = 0;
            for (int k = 0; k < K; k++) {
                double x = ta ? A[(long)k * lda + i] : A[(long)i * lda + k];
                double y = tb ? B[(long)j * ldb + k] : B[(long)k * ldb + j];
                s += x * y;
                a += fabs(x * y);
            }
            double c = beta == 0.0f ? 0.0 : (double)beta * C0[(long)i * ldc + j];
            out[(long)i * N + j] = (double)alpha * s + c;
            absum[(long)i * N + j] = fabs((double)alpha) * a + fabs(c);
        }
}

/* bf16 modes of check_case beyond 0 (fp32) and 1 (bf16 values): A, or B, passed as the handle
 * of a registered widened copy (ops/gemm.h), as the model passes its weights. */
enum { WIDE_A = 2, WIDE_B = 3, PACKED_B = 4 };

/* The handle of a widened copy of the n bf16 values at h (registered; *wide to free). */
static const uint16_t *widened(const uint16_t *h, size_t n, float **wide) {
    *wide = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
        (*wide)[i] = bf16_to_f32(h[i]);
    const uint16_t *handle = gemm_widened_register(*wide, n);
    assert_non_null(handle);
    assert_true(gemm_widened_values(handle + n - 1) == *wide + n - 1);
    assert_null(gemm_widened_values(h));
    return handle;
}

/* Runs one problem through the active backend (fp32 or a bf16 mode) with padded strides and
 * checks every element of C, and that the padding of C was left alone. */
static void check_case(int bf16, int ta, int tb, int M, int N, int K, float alpha, float beta,
                       int pad, Rng *r) {
    int arows = ta ? K : M, acols = ta ? M : K, brows = tb ? N : K, bcols = tb ? K : N;
    /* a prepacked weight is registered whole: no padding */
    int lda = acols + pad, ldb = bcols + (bf16 == PACKED_B ? 0 : pad), ldc = N + pad;
    float *A = calloc((size_t)arows * lda + 1, 4), *B = calloc((size_t)brows * ldb + 1, 4);
    float *C = calloc((size_t)M * ldc + 1, 4), *C0 = calloc((size_t)M * ldc + 1, 4);
    uint16_t *Ah = calloc((size_t)arows * lda + 1, 2), *Bh = calloc((size_t)brows * ldb + 1, 2);
    double *want = calloc((size_t)M * N + 1, 8), *bound = calloc((size_t)M * N + 1, 8);
    fill(A, (size_t)arows * lda, r);
    fill(B, (size_t)brows * ldb, r);
    fill(C0, (size_t)M * ldc, r);
    if (bf16) {
        for (size_t i = 0; i < (size_t)arows * lda; i++)
            A[i] = bf16_to_f32(Ah[i] = f32_to_bf16(A[i]));
        for (size_t i = 0; i < (size_t)brows * ldb; i++)
            B[i] = bf16_to_f32(Bh[i] = f32_to_bf16(B[i]));
    }
    memcpy(C, C0, (size_t)M * ldc * 4);
    if (beta == 0.0f) /* beta = 0 must not read C: poison the part it writes */
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++)
                C[(long)i * ldc + j] = NAN;
    oracle(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C0, ldc, want, bound);
    float *wide = NULL;
    const uint16_t *a = bf16 == WIDE_A ? widened(Ah, (size_t)arows * lda, &wide) : Ah;
    const uint16_t *b = bf16 == WIDE_B ? widened(Bh, (size_t)brows * ldb, &wide) : Bh;
    uint16_t *packs = NULL;
    if (bf16 == PACKED_B) { /* packed from the values, then the values spoilt: only the packs
                             * can give the right product */
        packs = aligned_alloc(64, (gemm_bf16_packed_values(brows, bcols) * 2 + 63) / 64 * 64);
        assert_int_equal(gemm_bf16_pack_register(Bh, brows, bcols, packs), 0);
        gemm_bf16_weight_written(Bh);
        for (size_t i = 0; i < (size_t)brows * ldb; i++)
            Bh[i] = f32_to_bf16(NAN);
    }
    if (bf16)
        gemm_bf16(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, C, ldc);
    else
        gemm_f32(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            double got = C[(long)i * ldc + j], w = want[(long)i * N + j];
            double tol = (K + 4) * 0x1p-23 * bound[(long)i * N + j] + 1e-30;
            if (!(fabs(got - w) <= tol))
                fail_msg("%s ta=%d tb=%d M=%d N=%d K=%d alpha=%g beta=%g pad=%d: C[%d,%d]=%.9g "
                         "want %.9g (tol %.3g) backend %s",
                         bf16 ? "bf16" : "f32", ta, tb, M, N, K, alpha, beta, pad, i, j, got, w,
                         tol, gemm_backend_name());
        }
        for (int j = N; j < ldc; j++)
            assert_true(C[(long)i * ldc + j] == C0[(long)i * ldc + j]);
    }
    if (wide) gemm_widened_unregister(wide);
    if (packs) gemm_bf16_pack_unregister(Bh, (size_t)brows * ldb * 2);
    free(wide), free(packs);
    free(A), free(B), free(C), free(C0), free(Ah), free(Bh), free(want), free(bound);
}

static const int dims[][3] = {{1, 1, 1},    {3, 17, 63}, {17, 65, 129}, {63, 1, 65},
                              {1, 129, 17}, {65, 63, 3}, {129, 17, 1},  {40, 72, 1000}};

static void sweep(int bf16) {
    const float alphas[] = {1.0f, -0.75f};
    const float betas[] = {0.0f, 1.0f, 0.5f};
    Rng r;
    rng_seed(&r, 7, 0);
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
        for (int t = 0; t < 4; t++)
            for (int a = 0; a < 2; a++)
                for (int b = 0; b < 3; b++)
                    check_case(bf16, t >> 1, t & 1, dims[d][0], dims[d][1], dims[d][2], alphas[a],
                               betas[b], (int)(d + t + b) % 3 * 5, &r);
}

static void run_backend(const char *name, int bf16) {
    assert_int_equal(gemm_set_backend(name), 0);
    sweep(bf16);
}

static void test_dnnl_f32(void **s) {
    (void)s, run_backend("dnnl", 0);
}
static void test_dnnl_bf16(void **s) {
    (void)s, run_backend("dnnl", 1);
}
static void test_sgemm_f32(void **s) {
    (void)s, run_backend("sgemm", 0);
}
static void test_sgemm_bf16(void **s) {
    (void)s, run_backend("sgemm", 1);
}
static void test_auto_f32(void **s) {
    (void)s, run_backend("auto", 0);
}
static void test_auto_bf16(void **s) {
    (void)s, run_backend("auto", 1);
}
static void test_ref_f32(void **s) {
    (void)s, run_backend("ref", 0);
}
static void test_ref_bf16(void **s) {
    (void)s, run_backend("ref", 1);
}

/* bf16 reductions past 16384 are cut into K chunks summed into C (gemm.c): every transposition,
 * an uneven last chunk, beta = 0 (not reading C), 1 and 0.5 (applied once, not per chunk). */
static void test_bf16_long_k(void **state) {
    (void)state;
    Rng r;
    rng_seed(&r, 9, 0);
    const char *names[] = {"auto", "dnnl"};
    for (int b = 0; b < 2; b++) {
        assert_int_equal(gemm_set_backend(names[b]), 0);
        for (int t = 0; t < 4; t++)
            check_case(1, t >> 1, t & 1, 5 + t, 7, 40001, t == 3 ? -0.5f : 1.0f,
                       t == 0   ? 0.0f
                       : t == 1 ? 1.0f
                                : 0.5f,
                       t, &r);
    }
}

/* The AMX tile kernel past its blocks (512 rows of op(A), 1024 values of K), with partial
 * tiles at every edge, both orientations (M > N runs transposed), every transposition, alpha,
 * beta and padded strides: through auto, which takes it for K <= 16384 where the CPU has AMX.
 * Then the same product on 1 and on 2 threads, bit for bit (each element of C is summed by one
 * thread in a fixed order). Skipped without AMX. */
static void test_amx_blocks(void **state) {
    (void)state;
    if (!gemm_amx_ready()) skip();
    assert_int_equal(gemm_set_backend("auto"), 0);
    assert_false(gemm_bf16_widens());
    assert_non_null(strstr(gemm_backend_name(), "AMX tiles"));
    Rng r;
    rng_seed(&r, 17, 0);
    for (int t = 0; t < 4; t++) {
        check_case(1, t >> 1, t & 1, 530, 77, 2085, t == 3 ? -0.5f : 1.0f,
                   t == 0   ? 0.0f
                   : t == 1 ? 1.0f
                            : 0.5f,
                   t, &r);
        check_case(1, t >> 1, t & 1, 45, 610, 1100, 1.0f, t & 1 ? 1.0f : 0.0f, t + 1, &r);
    }
    const int M = 600, N = 96, K = 1056;
    uint16_t *A = malloc((size_t)M * K * 2), *B = malloc((size_t)K * N * 2);
    float *C1 = malloc((size_t)M * N * 4), *C2 = malloc((size_t)M * N * 4);
    for (long i = 0; i < (long)M * K; i++)
        A[i] = f32_to_bf16(rng_uniform(&r) - 0.5f);
    for (long i = 0; i < (long)K * N; i++)
        B[i] = f32_to_bf16(rng_uniform(&r) - 0.5f);
    void *scratch = malloc(GEMM_AMX_SCRATCH_BYTES);
    int was = omp_get_max_threads();
    for (int t = 0; t < 4; t++) {
        int ta = t >> 1, tb = t & 1, lda = ta ? M : K, ldb = tb ? K : N;
        omp_set_num_threads(1);
        assert_int_equal(gemm_amx_bf16(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C1, N, scratch),
                         0);
        omp_set_num_threads(2);
        assert_int_equal(gemm_amx_bf16(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C2, N, scratch),
                         0);
        assert_memory_equal(C1, C2, (size_t)M * N * 4);
    }
    omp_set_num_threads(was);
    free(A), free(B), free(C1), free(C2), free(scratch);
}

/* Weights prepacked for the AMX path (ops/gemm.h): every shape of the sweep and long
 * reductions, op(B) = W^T and W, each read from its packed form (the weight's values are
 * spoilt after packing); the same product as the unpacked kernel bit for bit where that one
 * does not swap its operands; a weight written again reads its new values once
 * gemm_bf16_weight_written says so; unregistered, the weight is read as it is. Skipped where
 * the bf16 path is not AMX (tests run it once more with the tiles emulated). */
static void test_amx_prepacked(void **state) {
    (void)state;
    assert_int_equal(gemm_set_backend("auto"), 0);
    if (!gemm_bf16_prepacks()) skip();
    sweep(PACKED_B);
    Rng r;
    rng_seed(&r, 23, 0);
    for (int tb = 0; tb < 2; tb++) {
        check_case(PACKED_B, 0, tb, 5, 40, 17000, 1.0f, 1.0f, 1, &r);
        check_case(PACKED_B, 1, tb, 70, 33, 2100, 0.5f, 0.0f, 3, &r);
        check_case(PACKED_B, 0, tb, 600, 50, 300, 1.0f, 0.0f, 0, &r); /* M > N */
    }
    const int M = 64, N = 96, K = 1056; /* W (N, K) for tb 1, (K, N) for tb 0 */
    uint16_t *A = malloc((size_t)M * K * 2), *W = malloc((size_t)K * N * 2);
    uint16_t *packs = aligned_alloc(64, (gemm_bf16_packed_values(N, K) * 2 + 63) / 64 * 64);
    float *C1 = malloc((size_t)M * N * 4), *C2 = malloc((size_t)M * N * 4);
    void *scratch = malloc(GEMM_AMX_SCRATCH_BYTES);
    for (long i = 0; i < (long)M * K; i++)
        A[i] = f32_to_bf16(rng_uniform(&r) - 0.5f);
    for (int tb = 0; tb < 2; tb++) {
        int rows = tb ? N : K, cols = tb ? K : N;
        for (long i = 0; i < (long)K * N; i++)
            W[i] = f32_to_bf16(rng_uniform(&r) - 0.5f);
        assert_int_equal(gemm_bf16_pack_register(W, rows, cols, packs), 0);
        gemm_bf16_weight_written(W);
        gemm_bf16(0, tb, M, N, K, 1.0f, A, K, W, cols, 0.0f, C1, N);
        assert_int_equal(gemm_amx_bf16(0, tb, M, N, K, 1.0f, A, K, W, cols, 0.0f, C2, N, scratch),
                         0);
        assert_memory_equal(C1, C2, (size_t)M * N * 4);
        for (long i = 0; i < (long)K * N; i++) /* written again */
            W[i] = f32_to_bf16(rng_uniform(&r) - 0.5f);
        gemm_bf16(0, tb, M, N, K, 1.0f, A, K, W, cols, 0.0f, C1, N);
        assert_memory_equal(C1, C2, (size_t)M * N * 4); /* the packs still hold the old W */
        gemm_bf16_weight_written(W);
        gemm_bf16(0, tb, M, N, K, 1.0f, A, K, W, cols, 0.0f, C1, N);
        gemm_amx_bf16(0, tb, M, N, K, 1.0f, A, K, W, cols, 0.0f, C2, N, scratch);
        assert_memory_equal(C1, C2, (size_t)M * N * 4);
        gemm_bf16_pack_unregister(W, (size_t)K * N * 2);
        for (long i = 0; i < (long)K * N; i++)
            W[i] ^= 0x8000; /* negated; unregistered, read as it is */
        gemm_bf16(0, tb, M, N, K, 1.0f, A, K, W, cols, 0.0f, C1, N);
        for (long i = 0; i < (long)M * N; i++)
            assert_true(C1[i] == -C2[i]);
    }
    free(A), free(W), free(packs), free(C1), free(C2), free(scratch);
}

/* Weights passed as widened copies, read in place also when bf16 products would otherwise go to
 * oneDNN's matmul (sgemm and ref widen as auto does on a host without AMX). */
static void test_widened_copies(void **state) {
    (void)state;
    const char *names[] = {"auto", "dnnl"};
    for (int b = 0; b < 2; b++) {
        assert_int_equal(gemm_set_backend(names[b]), 0);
        sweep(WIDE_A);
        sweep(WIDE_B);
    }
}

/* Operands too large for one widened block of the scratch are cut into blocks of rows (M or N)
 * and K chunks: each cut alone and with the other operand a widened copy. */
static void test_widened_blocks(void **state) {
    (void)state;
    Rng r;
    rng_seed(&r, 13, 0);
    assert_int_equal(gemm_set_backend("sgemm"), 0);
    check_case(1, 1, 0, 4500, 9, 1000, 1.0f, 0.5f, 1, &r);       /* M cut (dW-like: A transposed) */
    check_case(1, 0, 1, 7, 4500, 1000, 1.0f, 0.0f, 0, &r);       /* N cut */
    check_case(WIDE_B, 0, 0, 500, 9, 20000, -1.0f, 1.0f, 2, &r); /* K chunks, then M cut */
    check_case(WIDE_A, 1, 1, 9, 4500, 1000, 1.0f, 0.0f, 0, &r);
}

/* Empty products: M or N = 0 touches nothing; K = 0 leaves beta * C. */
static void test_degenerate(void **state) {
    (void)state;
    const char *names[] = {"auto", "dnnl", "sgemm", "ref"};
    for (int b = 0; b < 4; b++) {
        assert_int_equal(gemm_set_backend(names[b]), 0);
        float C[6] = {1, 2, 3, 4, 5, 6}, A[1] = {0}, B[1] = {0};
        gemm_f32(0, 0, 0, 3, 4, 1.0f, A, 4, B, 3, 0.0f, C, 3);
        gemm_f32(0, 0, 2, 0, 4, 1.0f, A, 4, B, 3, 0.0f, C, 3);
        assert_true(C[0] == 1 && C[5] == 6);
        gemm_f32(0, 0, 2, 3, 0, 1.0f, A, 1, B, 3, 2.0f, C, 3);
        assert_true(C[0] == 2 && C[5] == 12);
        gemm_f32(0, 0, 2, 3, 0, 1.0f, A, 1, B, 3, 0.0f, C, 3);
        assert_true(C[0] == 0 && C[5] == 0);
    }
    assert_int_equal(gemm_set_backend("cublas"), -1);
}

/* A NaN in A reaches exactly its row of C (no zero-skipping shortcut swallows it). */
static void test_nan_propagates(void **state) {
    (void)state;
    const char *names[] = {"auto", "dnnl", "sgemm", "ref"};
    for (int b = 0; b < 4; b++) {
        assert_int_equal(gemm_set_backend(names[b]), 0);
        float A[4 * 8] = {0}, B[8 * 5] = {0}, C[4 * 5];
        A[2 * 8 + 3] = NAN;
        gemm_f32(0, 0, 4, 5, 8, 1.0f, A, 8, B, 5, 0.0f, C, 5);
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 5; j++)
                assert_true(isnan(C[i * 5 + j]) == (i == 2));
    }
}

/* Runs C = op(A) op(B) + 0.25 (f32) or op(A) op(B) (bf16) for the determinism test. */
static void det_call(int bf16, int t, int M, int N, int K, const void *A, const void *B, float *C) {
    int ta = t >> 1, tb = t & 1, lda = ta ? M : K, ldb = tb ? K : N;
    if (bf16) {
        gemm_bf16(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N);
        return;
    }
    for (long i = 0; i < (long)M * N; i++)
        C[i] = 0.25f;
    gemm_f32(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, C, N);
}

/* Same inputs, same outputs, bit for bit: the trainer's exact resume depends on it. Shapes big
 * enough that oneDNN splits the work across threads and blocks K; M 300 (dnnl_sgemm under auto)
 * and M 200 (under auto a matmul primitive for x W^T, ops/gemm.c). The third call reads copies
 * at another alignment (3 elements off), as a resumed run's buffers may be. */
static void deterministic(int M) {
    const int N = 520, K = 1100;
    const size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
    Rng r;
    rng_seed(&r, 11, 0);
    float *A = malloc((na + 3) * 4), *B = malloc((nb + 3) * 4);
    uint16_t *Ah = malloc((na + 3) * 2), *Bh = malloc((nb + 3) * 2);
    float *C0 = malloc(nc * 4), *C = malloc((nc + 3) * 4);
    fill(A, na, &r);
    fill(B, nb, &r);
    for (size_t i = 0; i < na; i++)
        Ah[i] = f32_to_bf16(A[i]);
    for (size_t i = 0; i < nb; i++)
        Bh[i] = f32_to_bf16(B[i]);
    const char *names[] = {"auto", "dnnl", "sgemm"};
    for (int b = 0; b < 3; b++) {
        assert_int_equal(gemm_set_backend(names[b]), 0);
        for (int bf16 = 0; bf16 < 2; bf16++)
            for (int t = 0; t < 4; t++) {
                const void *a = bf16 ? (const void *)Ah : A, *bb = bf16 ? (const void *)Bh : B;
                det_call(bf16, t, M, N, K, a, bb, C0);
                det_call(bf16, t, M, N, K, a, bb, C);
                assert_memory_equal(C0, C, nc * 4);
                /* shift everything 3 elements up, run, shift back */
                memmove(A + 3, A, na * 4), memmove(B + 3, B, nb * 4);
                memmove(Ah + 3, Ah, na * 2), memmove(Bh + 3, Bh, nb * 2);
                det_call(bf16, t, M, N, K, bf16 ? (const void *)(Ah + 3) : A + 3,
                         bf16 ? (const void *)(Bh + 3) : B + 3, C + 3);
                assert_memory_equal(C0, C + 3, nc * 4);
                memmove(A, A + 3, na * 4), memmove(B, B + 3, nb * 4);
                memmove(Ah, Ah + 3, na * 2), memmove(Bh, Bh + 3, nb * 2);
            }
    }
    free(A), free(B), free(Ah), free(Bh), free(C0), free(C);
}

static void test_deterministic(void **state) {
    (void)state;
    deterministic(300);
    deterministic(200);
}

/* Under auto, x W^T of GEMM_F32_MATMUL_M_MIN-_MAX rows runs as the matmul primitive (the dnnl
 * backend's result, bit for bit) and outside that window, or through gemm_f32_varying, as
 * dnnl_sgemm (the sgemm backend's); other transpositions stay on sgemm. */
static void test_small_m_routes(void **state) {
    (void)state;
    const int N = 300, K = 520;
    const int Ms[] = {GEMM_F32_MATMUL_M_MIN - 1, GEMM_F32_MATMUL_M_MIN, 64, GEMM_F32_MATMUL_M_MAX,
                      GEMM_F32_MATMUL_M_MAX + 1};
    Rng r;
    rng_seed(&r, 13, 0);
    float *A = malloc((size_t)(GEMM_F32_MATMUL_M_MAX + 1) * K * 4), *B = malloc((size_t)N * K * 4);
    float *want = malloc((size_t)(GEMM_F32_MATMUL_M_MAX + 1) * N * 4);
    float *got = malloc((size_t)(GEMM_F32_MATMUL_M_MAX + 1) * N * 4);
    fill(A, (size_t)(GEMM_F32_MATMUL_M_MAX + 1) * K, &r);
    fill(B, (size_t)N * K, &r);
    for (size_t i = 0; i < sizeof Ms / sizeof Ms[0]; i++)
        for (int tb = 0; tb < 2; tb++)
            for (int varying = 0; varying < 2; varying++) {
                int M = Ms[i], ldb = tb ? K : N,
                    matmul =
                        tb && !varying && M >= GEMM_F32_MATMUL_M_MIN && M <= GEMM_F32_MATMUL_M_MAX;
                assert_int_equal(gemm_set_backend(matmul ? "dnnl" : "sgemm"), 0);
                gemm_f32(0, tb, M, N, K, 1.0f, A, K, B, ldb, 0.0f, want, N);
                assert_int_equal(gemm_set_backend("auto"), 0);
                (varying ? gemm_f32_varying : gemm_f32)(0, tb, M, N, K, 1.0f, A, K, B, ldb, 0.0f,
                                                        got, N);
                if (memcmp(want, got, (size_t)M * N * 4) != 0)
                    fail_msg("M %d tb %d%s: not the %s result", M, tb,
                             varying ? " (gemm_f32_varying)" : "", matmul ? "matmul" : "sgemm");
            }
    /* Inside a parallel region every thread's x W^T stays on sgemm (no scratchpad per call). */
    assert_int_equal(gemm_set_backend("sgemm"), 0);
    gemm_f32(0, 1, 64, N, K, 1.0f, A, K, B, K, 0.0f, want, N);
    assert_int_equal(gemm_set_backend("auto"), 0);
    int differs = 0;
#pragma omp parallel num_threads(2) reduction(+ : differs)
    {
        float *mine = malloc((size_t)64 * N * 4);
        gemm_f32(0, 1, 64, N, K, 1.0f, A, K, B, K, 0.0f, mine, N);
        differs += memcmp(want, mine, (size_t)64 * N * 4) != 0;
        free(mine);
    }
    assert_int_equal(differs, 0);
    free(A), free(B), free(want), free(got);
}

/* Threads that share the primitive cache, some on one shape and some on their own. */
typedef struct Job {
    int id, failed;
} Job;

static void *job_run(void *p) {
    Job *j = p;
    Rng r;
    rng_seed(&r, 99, (uint64_t)j->id);
    int M = 33 + (j->id & 1) * 8, N = 70, K = 90;
    float *A = malloc((size_t)M * K * 4), *B = malloc((size_t)K * N * 4);
    float *C = malloc((size_t)M * N * 4), *C0 = calloc((size_t)M * N, 4);
    double *want = malloc((size_t)M * N * 8), *bound = malloc((size_t)M * N * 8);
    fill(A, (size_t)M * K, &r);
    fill(B, (size_t)K * N, &r);
    oracle(0, 1, M, N, K, 1.0f, A, K, B, K, 0.0f, C0, N, want, bound);
    for (int rep = 0; rep < 20; rep++) {
        gemm_f32(0, 1, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N);
        for (int i = 0; i < M * N; i++)
            if (!(fabs(C[i] - want[i]) <= (K + 4) * 0x1p-23 * bound[i])) j->failed = 1;
    }
    free(A), free(B), free(C), free(C0), free(want), free(bound);
    return NULL;
}

static void test_concurrent_callers(void **state) {
    (void)state;
    assert_int_equal(gemm_set_backend("dnnl"), 0);
    pthread_t t[6];
    Job jobs[6];
    for (int i = 0; i < 6; i++) {
        jobs[i] = (Job){i, 0};
        assert_int_equal(pthread_create(&t[i], NULL, job_run, &jobs[i]), 0);
    }
    for (int i = 0; i < 6; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(jobs[i].failed, 0);
    }
}

/* Per-head products issued from inside an OpenMP loop (as attention may do): correct, and the
 * same bits as the same products issued one by one from outside. */
static void test_inside_omp_region(void **state) {
    (void)state;
    enum { H = 6, T = 70, E = 40 };
    Rng r;
    rng_seed(&r, 21, 0);
    float *Q = malloc(H * T * E * 4), *Kt = malloc(H * T * E * 4);
    float *S1 = malloc(H * T * T * 4), *S2 = malloc(H * T * T * 4);
    fill(Q, H * T * E, &r);
    fill(Kt, H * T * E, &r);
    const char *names[] = {"auto", "dnnl", "sgemm"};
    for (int b = 0; b < 3; b++) {
        assert_int_equal(gemm_set_backend(names[b]), 0);
#pragma omp parallel for schedule(static)
        for (int h = 0; h < H; h++)
            gemm_f32(0, 1, T, T, E, 0.5f, Q + h * T * E, E, Kt + h * T * E, E, 0.0f, S1 + h * T * T,
                     T);
        for (int h = 0; h < H; h++)
            gemm_f32(0, 1, T, T, E, 0.5f, Q + h * T * E, E, Kt + h * T * E, E, 0.0f, S2 + h * T * T,
                     T);
        assert_memory_equal(S1, S2, H * T * T * 4);
        for (int h = 0; h < H; h += 5)
            for (int i = 0; i < T; i += 7)
                for (int j = 0; j < T; j += 3) {
                    double w = 0, a = 0;
                    for (int k = 0; k < E; k++) {
                        double p = 0.5 * Q[h * T * E + i * E + k] * Kt[h * T * E + j * E + k];
                        w += p, a += fabs(p);
                    }
                    assert_true(fabs(S1[h * T * T + i * T + j] - w) <= (E + 4) * 0x1p-23 * a);
                }
    }
    free(Q), free(Kt), free(S1), free(S2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dnnl_f32),
        cmocka_unit_test(test_dnnl_bf16),
        cmocka_unit_test(test_sgemm_f32),
        cmocka_unit_test(test_sgemm_bf16),
        cmocka_unit_test(test_auto_f32),
        cmocka_unit_test(test_auto_bf16),
        cmocka_unit_test(test_bf16_long_k),
        cmocka_unit_test(test_amx_blocks),
        cmocka_unit_test(test_ref_f32),
        cmocka_unit_test(test_ref_bf16),
        cmocka_unit_test(test_degenerate),
        cmocka_unit_test(test_nan_propagates),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_small_m_routes),
        cmocka_unit_test(test_concurrent_callers),
        cmocka_unit_test(test_inside_omp_region),
        cmocka_unit_test(test_widened_copies),
        cmocka_unit_test(test_widened_blocks),
        cmocka_unit_test(test_amx_prepacked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
