/* The default CPU kernels (kernels/cpu_ops.h) against the references in src/ops, forward and
 * backward, on random inputs of several shapes (GQA ratios, head dims, sequence lengths that
 * are not multiples of the tiles, packed documents, ignored targets). The references are
 * gradchecked against finite differences in test_ops_gradcheck.c, so agreement here carries
 * that over. Also: each kernel gives bitwise the same result with 1 and 2 threads, and the
 * bf16 paths of linear / feed_forward stay within bf16 rounding of fp32.
 *
 * Tolerances (max |got - ref| / (max |ref| of the tensor), per tensor): 2e-5 for fp32 kernels,
 * which only reorder fp32 sums (reductions of up to a few hundred terms); 0 for rope (the same
 * operations as the reference); 2e-2 for the bf16 products (8 significant bits per input). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h> /* after the headers it relies on */

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "kernels/cpu_ops.h"
#include "kernels/cpu_peak.h"
#include "kernels/cpu_simd.h"

static float *rnd(long n, uint64_t stream, float scale) {
    float *x = malloc((size_t)n * sizeof *x);
    Rng r;
    rng_seed(&r, 1234, stream);
    rng_fill_normal(&r, x, n, scale);
    return x;
}

static float *zeros(long n) {
    return calloc((size_t)n, sizeof(float));
}

/* max |a - b| / max |b|, printed with what. */
static double rel_err(const char *what, const float *a, const float *b, long n) {
    double d = 0, m = 0;
    for (long i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        if (isnan(e) || e > d) d = e; /* a NaN sticks: nothing compares above it */
        if (fabs(b[i]) > m) m = fabs(b[i]);
    }
    double r = d / (m > 0 ? m : 1);
    if (!(r <= 2e-5)) fprintf(stderr, "%s: rel err %.3g (max |ref| %.3g)\n", what, r, m);
    return r;
}

static void expect_close(const char *what, const float *a, const float *b, long n, double tol) {
    double r = rel_err(what, a, b, n);
    if (!(r <= tol)) fail_msg("%s: relative error %.3g above %.3g", what, r, tol);
}

/* ---- sdpa ---- */

typedef struct SdpaCase {
    int B, T, H, K, E, docs;
} SdpaCase;

static void sdpa_run(const SdpaOp *op, const SdpaCase *c, const float *q, const float *k,
                     const float *v, const float *dout, const int32_t *doc, float *out, float *lse,
                     float *dq, float *dk, float *dv) {
    op->forward(out, lse, q, k, v, doc, c->B, c->T, c->H, c->K, c->E);
    op->backward(dq, dk, dv, dout, q, k, v, out, lse, doc, c->B, c->T, c->H, c->K, c->E);
}

/* Each of an sdpa call's outputs (out, lse, dq, dk, dv) within tol of the reference's. */
static void expect_sdpa_close(const char *what, const SdpaCase *c, const float *const got[5],
                              const float *const ref[5], double tol) {
    long nq = (long)c->B * c->T * c->H * c->E, nk = (long)c->B * c->T * c->K * c->E;
    long n[5] = {nq, (long)c->B * c->H * c->T, nq, nk, nk};
    static const char *names[5] = {"out", "lse", "dq", "dk", "dv"};
    for (int i = 0; i < 5; i++) {
        char label[64];
        snprintf(label, sizeof label, "%s %s", what, names[i]);
        expect_close(label, got[i], ref[i], n[i], tol);
    }
}

/* Runs run on one thread and requires its outputs bitwise those of the same call on the
 * default threads (o, l, dq, dk, dv). */
typedef void (*SdpaRun)(const SdpaOp *, const SdpaCase *, const float *, const float *,
                        const float *, const float *, const int32_t *, float *, float *, float *,
                        float *, float *);
static void expect_same_on_one_thread(SdpaRun run, const SdpaCase *c, const float *q,
                                      const float *k, const float *v, const float *dout,
                                      const int32_t *doc, const float *o, const float *l,
                                      const float *dq, const float *dk, const float *dv) {
    long nq = (long)c->B * c->T * c->H * c->E, nk = (long)c->B * c->T * c->K * c->E;
    long nl = (long)c->B * c->H * c->T;
    float *o1 = zeros(nq), *l1 = zeros(nl), *dq1 = zeros(nq), *dk1 = zeros(nk), *dv1 = zeros(nk);
    int nt = omp_get_max_threads();
    omp_set_num_threads(1);
    run(&sdpa_cpu, c, q, k, v, dout, doc, o1, l1, dq1, dk1, dv1);
    omp_set_num_threads(nt);
    assert_memory_equal(o1, o, (size_t)nq * sizeof(float));
    assert_memory_equal(l1, l, (size_t)nl * sizeof(float));
    assert_memory_equal(dq1, dq, (size_t)nq * sizeof(float));
    assert_memory_equal(dk1, dk, (size_t)nk * sizeof(float));
    assert_memory_equal(dv1, dv, (size_t)nk * sizeof(float));
    free(o1), free(l1), free(dq1), free(dk1), free(dv1);
}

/* The bf16 entries, with a scratch of exactly the size ops/sdpa.h asks for (ASan sees a
 * write past it). */
static void sdpa_run_bf16(const SdpaOp *op, const SdpaCase *c, const float *q, const float *k,
                          const float *v, const float *dout, const int32_t *doc, float *out,
                          float *lse, float *dq, float *dk, float *dv) {
    long n = SDPA_BF16_SCRATCH(c->B, c->T, c->K, c->E);
    uint16_t *scratch = malloc((size_t)n * sizeof *scratch);
    op->forward_bf16(out, lse, q, k, v, doc, c->B, c->T, c->H, c->K, c->E, scratch);
    op->backward_bf16(dq, dk, dv, dout, q, k, v, out, lse, doc, c->B, c->T, c->H, c->K, c->E,
                      scratch);
    free(scratch);
}

static void test_sdpa(void **state) {
    (void)state;
    static const SdpaCase cases[] = {
        {1, 1, 2, 1, 8, 0},
        {2, 37, 4, 2, 16, 0},
        {2, 70, 4, 4, 8, 1},
        {1, 130, 8, 2, 32, 1},
        {1, 96, 2, 1, 128, 0},
        {2, 65, 6, 3, 24, 1},
        {1, 200, 4, 1, 64, 1},
        /* Past one key chunk (256 keys): with documents longer than a chunk that start off a
         * block boundary (docs = 2), a block straddles a chunk start, so some of its rows end
         * before a chunk begins. */
        {1, 700, 2, 1, 16, 2},
        {1, 600, 2, 1, 16, 1},
        {1, 520, 2, 2, 8, 0},
        /* bf16 products: an odd sequence with documents past a chunk (odd key counts and
         * query rows), and head dims the bf16 path hands to fp32 (odd, above 128). */
        {1, 601, 4, 2, 128, 2},
        {1, 45, 2, 1, 9, 1},
        {1, 70, 2, 1, 160, 0},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const SdpaCase *c = &cases[ci];
        long nq = (long)c->B * c->T * c->H * c->E, nk = (long)c->B * c->T * c->K * c->E;
        long nl = (long)c->B * c->H * c->T;
        float *q = rnd(nq, 1, 1.0f), *k = rnd(nk, 2, 1.0f), *v = rnd(nk, 3, 1.0f);
        float *dout = rnd(nq, 4, 1.0f);
        int32_t *doc = NULL;
        if (c->docs) {
            /* Documents of varying length, some shorter than a tile, some across tiles. */
            doc = malloc((size_t)c->B * c->T * sizeof *doc);
            for (int b = 0; b < c->B; b++) {
                int id = 0, left = 3 + b;
                for (int t = 0; t < c->T; t++) {
                    if (left-- == 0) {
                        id++;
                        left = c->docs == 2 ? 290 + id * 37 : (id * 29 + 5) % 70;
                    }
                    doc[b * c->T + t] = id;
                }
            }
        }
        float *o0 = zeros(nq), *l0 = zeros(nl), *dq0 = zeros(nq), *dk0 = zeros(nk),
              *dv0 = zeros(nk);
        float *o1 = zeros(nq), *l1 = zeros(nl), *dq1 = zeros(nq), *dk1 = zeros(nk),
              *dv1 = zeros(nk);
        sdpa_run(&sdpa_reference, c, q, k, v, dout, doc, o0, l0, dq0, dk0, dv0);
        /* The portable vector helpers first (no AVX-512), then the AVX-512 ones. */
        for (int avx = 0; avx <= 1; avx++) {
            simd_force(avx);
            sdpa_run(&sdpa_cpu, c, q, k, v, dout, doc, o1, l1, dq1, dk1, dv1);
            const float *got[] = {o1, l1, dq1, dk1, dv1}, *ref[] = {o0, l0, dq0, dk0, dv0};
            expect_sdpa_close("sdpa", c, got, ref, 2e-5);
        }
        /* One thread gives bitwise the same. */
        expect_same_on_one_thread(sdpa_run, c, q, k, v, dout, doc, o1, l1, dq1, dk1, dv1);
        /* The bf16 entries (mixed precision): within bf16 rounding of the reference, bitwise
         * the same on 1 and 2 threads, and, where the bf16 path applies (AVX512_BF16, even
         * head_dim up to 128), not the fp32 result (so the check above saw bf16 products). */
        /* Outputs start nonzero: the calls write them (=), never add to them. */
        float *o3 = rnd(nq, 5, 1.0f), *l3 = rnd(nl, 6, 1.0f), *dq3 = rnd(nq, 7, 1.0f),
              *dk3 = rnd(nk, 8, 1.0f), *dv3 = rnd(nk, 9, 1.0f);
        sdpa_run_bf16(&sdpa_cpu, c, q, k, v, dout, doc, o3, l3, dq3, dk3, dv3);
        const float *got3[] = {o3, l3, dq3, dk3, dv3}, *ref[] = {o0, l0, dq0, dk0, dv0};
        expect_sdpa_close("sdpa bf16", c, got3, ref, 2e-2);
        int bf16_runs = simd_avx512_active() && cpu_has_avx512_bf16() && c->E % 2 == 0 &&
                        c->E <= SDPA_BF16_MAX_HEAD_DIM;
        if (bf16_runs) {
            assert_true(memcmp(o3, o1, (size_t)nq * sizeof(float)) != 0);
            assert_true(memcmp(dk3, dk1, (size_t)nk * sizeof(float)) != 0);
        } else {
            assert_memory_equal(o3, o1, (size_t)nq * sizeof(float));
            assert_memory_equal(dv3, dv1, (size_t)nk * sizeof(float));
        }
        expect_same_on_one_thread(sdpa_run_bf16, c, q, k, v, dout, doc, o3, l3, dq3, dk3, dv3);
        float *bufs[] = {q,  k,   v,   dout, o0, l0, dq0, dk0, dv0, o1,
                         l1, dq1, dk1, dv1,  o3, l3, dq3, dk3, dv3};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            free(bufs[i]);
        free(doc);
    }
}

/* ---- cross-entropy ---- */

static void test_cross_entropy(void **state) {
    (void)state;
    static const int shapes[][2] = {{1, 7}, {5, 3000}, {9, 151936 / 16}, {3, 4099}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        long N = shapes[si][0];
        int V = shapes[si][1];
        float *logits = rnd(N * V, 10 + si, 3.0f);
        int32_t *tgt = malloc((size_t)N * sizeof *tgt);
        for (long n = 0; n < N; n++)
            tgt[n] = n % 4 == 2 ? CE_IGNORE : (int32_t)((n * 7919) % V);
        float *ls0 = zeros(N), *z0 = zeros(N), *ls1 = zeros(N), *z1 = zeros(N);
        double s0 = cross_entropy_reference.forward(ls0, z0, logits, tgt, N, V);
        double s1 = cross_entropy_cpu.forward(ls1, z1, logits, tgt, N, V);
        assert_true(fabs(s1 - s0) <= 1e-5 * fabs(s0) + 1e-6);
        expect_close("ce losses", ls1, ls0, N, 2e-6);
        expect_close("ce lse", z1, z0, N, 2e-6);
        float *d0 = zeros(N * V), *d1 = malloc((size_t)(N * V) * sizeof(float));
        cross_entropy_reference.backward(d0, logits, z0, tgt, N, V, 0.25f);
        /* In place, as the model calls it. */
        memcpy(d1, logits, (size_t)(N * V) * sizeof(float));
        cross_entropy_cpu.backward(d1, d1, z1, tgt, N, V, 0.25f);
        expect_close("ce dlogits", d1, d0, N * V, 2e-6);
        free(logits), free(tgt), free(ls0), free(z0), free(ls1), free(z1), free(d0), free(d1);
    }
}

/* ---- rmsnorm ---- */

static void test_rmsnorm(void **state) {
    (void)state;
    static const int shapes[][2] = {{1, 5}, {17, 64}, {300, 128}, {33, 1024}, {8, 100}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        long R = shapes[si][0];
        int C = shapes[si][1];
        float *x = rnd(R * C, 20, 2.0f), *w = rnd(C, 21, 1.0f), *dout = rnd(R * C, 22, 1.0f);
        float *o0 = zeros(R * C), *r0 = zeros(R), *o1 = zeros(R * C), *r1 = zeros(R);
        rmsnorm_reference.forward(o0, r0, x, w, R, C, 1e-6f);
        rmsnorm_cpu.forward(o1, r1, x, w, R, C, 1e-6f);
        expect_close("rmsnorm out", o1, o0, R * C, 2e-6);
        expect_close("rmsnorm rstd", r1, r0, R, 2e-6);
        float *dx0 = zeros(R * C), *dw0 = rnd(C, 23, 1.0f), *dx1 = zeros(R * C);
        float *dw1 = malloc((size_t)C * sizeof(float));
        memcpy(dw1, dw0, (size_t)C * sizeof(float)); /* both accumulate onto the same start */
        rmsnorm_reference.backward(dx0, dw0, dout, x, w, r0, R, C);
        rmsnorm_cpu.backward(dx1, dw1, dout, x, w, r0, R, C);
        expect_close("rmsnorm dx", dx1, dx0, R * C, 2e-5);
        expect_close("rmsnorm dw", dw1, dw0, C, 2e-6);
        /* The fusions are bitwise the separate add: forward_add on xsum = x + dout (into a copy
         * of x, as the model aliases it) against forward on that sum; backward_acc onto dres
         * against backward, then the add. */
        float *sum = malloc((size_t)(R * C) * sizeof(float)), *o2 = zeros(R * C), *r2 = zeros(R);
        for (long i = 0; i < R * C; i++)
            sum[i] = x[i] + dout[i];
        rmsnorm_cpu.forward(o1, r1, sum, w, R, C, 1e-6f);
        memcpy(sum, x, (size_t)(R * C) * sizeof(float));
        rmsnorm_cpu.forward_add(sum, o2, r2, sum, dout, w, R, C, 1e-6f);
        for (long i = 0; i < R * C; i++)
            assert_true(sum[i] == x[i] + dout[i]);
        assert_memory_equal(o2, o1, (size_t)(R * C) * sizeof(float));
        assert_memory_equal(r2, r1, (size_t)R * sizeof(float));
        float *dres = rnd(R * C, 24, 1.0f), *want = malloc((size_t)(R * C) * sizeof(float));
        memcpy(dw0, dw1, (size_t)C * sizeof(float));
        rmsnorm_cpu.backward(dx1, dw1, dout, x, w, r0, R, C);
        for (long i = 0; i < R * C; i++)
            want[i] = dres[i] + dx1[i];
        rmsnorm_cpu.backward_acc(dres, dw0, dout, x, w, r0, R, C);
        assert_memory_equal(dres, want, (size_t)(R * C) * sizeof(float));
        assert_memory_equal(dw0, dw1, (size_t)C * sizeof(float));
        free(sum), free(o2), free(r2), free(dres), free(want);
        free(x), free(w), free(dout), free(o0), free(r0), free(o1), free(r1);
        free(dx0), free(dw0), free(dx1), free(dw1);
    }
}

/* ---- rope ---- */

/* rope_cpu is bitwise the reference, for plain RoPE and for YaRN's blended frequencies and
 * scaled cos / sin. */
static void test_rope(void **state) {
    (void)state;
    static const int shapes[][3] = {{1, 1, 2}, {40, 4, 8}, {70, 2, 128}, {9, 3, 6}};
    for (int yarn = 0; yarn < 2; yarn++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            long N = shapes[si][0];
            int NH = shapes[si][1], E = shapes[si][2];
            long n = N * NH * E;
            ModelSpec spec = {.head_dim = E, .rope_theta = 1e6};
            if (yarn)
                spec.rope_scaling = (RopeScaling){.type = ROPE_YARN,
                                                  .factor = 8,
                                                  .original_max_seq_len = 64,
                                                  .beta_fast = 32,
                                                  .beta_slow = 1,
                                                  .truncate = 1};
            RopeFreqs *f = malloc(sizeof *f);
            rope_freqs(f, &spec);
            float *x = rnd(n, 30, 1.0f);
            int32_t *pos = malloc((size_t)N * sizeof *pos);
            for (long i = 0; i < N; i++)
                pos[i] = (int32_t)((i * 13) % 1000); /* packed documents: positions restart */
            float *a = zeros(n), *b = zeros(n);
            rope_reference.forward(a, x, pos, N, NH, E, f);
            rope_cpu.forward(b, x, pos, N, NH, E, f);
            assert_memory_equal(a, b, (size_t)n * sizeof(float));
            rope_reference.backward(a, x, pos, N, NH, E, f);
            rope_cpu.backward(b, x, pos, N, NH, E, f);
            assert_memory_equal(a, b, (size_t)n * sizeof(float));
            free(x), free(pos), free(a), free(b), free(f);
        }
}

/* ---- swiglu and linear, fp32 and bf16 ---- */

static void test_swiglu(void **state) {
    (void)state;
    long N = 19;
    int D = 48, F = 80;
    float *x = rnd(N * D, 40, 1.0f), *w1 = rnd((long)F * D, 41, 0.2f);
    float *w3 = rnd((long)F * D, 42, 0.2f), *w2 = rnd((long)D * F, 43, 0.2f);
    float *dout = rnd(N * D, 44, 1.0f);
    float *out[3], *h1[3], *h3[3], *g[3], *dx[3], *dw1[3], *dw3[3], *dw2[3];
    float *dh1 = zeros(N * F), *dh3 = zeros(N * F);
    uint16_t w1b[80 * 48], w3b[80 * 48], w2b[48 * 80];
    uint16_t *scratch = calloc((size_t)(N * (2 * D + 2 * F)), sizeof(uint16_t));
    simd_f32_to_bf16(w1b, w1, (long)F * D);
    simd_f32_to_bf16(w3b, w3, (long)F * D);
    simd_f32_to_bf16(w2b, w2, (long)D * F);
    for (int r = 0; r < 3; r++) {
        out[r] = zeros(N * D), h1[r] = zeros(N * F), h3[r] = zeros(N * F), g[r] = zeros(N * F);
        dx[r] = zeros(N * D), dw1[r] = zeros((long)F * D), dw3[r] = zeros((long)F * D);
        dw2[r] = zeros((long)D * F);
    }
    /* 0: reference, 1: cpu fp32, 2: cpu bf16 */
    swiglu_reference.forward(out[0], h1[0], h3[0], g[0], x, w1, w3, w2, NULL, N, D, F);
    swiglu_reference.backward(dx[0], dw1[0], dw3[0], dw2[0], dh1, dh3, dout, x, h1[0], h3[0], g[0],
                              w1, w3, w2, NULL, N, D, F);
    swiglu_cpu.forward(out[1], h1[1], h3[1], g[1], x, w1, w3, w2, NULL, N, D, F);
    swiglu_cpu.backward(dx[1], dw1[1], dw3[1], dw2[1], dh1, dh3, dout, x, h1[1], h3[1], g[1], w1,
                        w3, w2, NULL, N, D, F);
    swiglu_cpu.forward_bf16(out[2], h1[2], h3[2], g[2], x, w1b, w3b, w2b, scratch, N, D, F);
    swiglu_cpu.backward_bf16(dx[2], dw1[2], dw3[2], dw2[2], dh1, dh3, dout, x, h1[2], h3[2], g[2],
                             w1b, w3b, w2b, scratch, N, D, F);
    static const double tol[3] = {0, 2e-5, 2e-2};
    for (int r = 1; r < 3; r++) {
        expect_close(r == 1 ? "swiglu out" : "swiglu bf16 out", out[r], out[0], N * D, tol[r]);
        expect_close("swiglu g", g[r], g[0], N * F, tol[r]);
        expect_close("swiglu dx", dx[r], dx[0], N * D, tol[r]);
        expect_close("swiglu dw1", dw1[r], dw1[0], (long)F * D, tol[r]);
        expect_close("swiglu dw3", dw3[r], dw3[0], (long)F * D, tol[r]);
        expect_close("swiglu dw2", dw2[r], dw2[0], (long)D * F, tol[r]);
    }
    /* bf16 is not fp32: the test could tell them apart. */
    assert_true(rel_err("bf16 vs fp32 (expected nonzero)", out[2], out[0], N * D) > 1e-5);
    for (int r = 0; r < 3; r++)
        free(out[r]), free(h1[r]), free(h3[r]), free(g[r]), free(dx[r]), free(dw1[r]), free(dw3[r]),
            free(dw2[r]);
    free(x), free(w1), free(w3), free(w2), free(dout), free(dh1), free(dh3), free(scratch);
}

static void test_linear_bf16(void **state) {
    (void)state;
    long N = 23;
    int I = 40, O = 56;
    float *x = rnd(N * I, 50, 1.0f), *w = rnd((long)O * I, 51, 0.2f), *dout = rnd(N * O, 52, 1.0f);
    uint16_t *wb = malloc((size_t)O * I * sizeof *wb);
    uint16_t *scratch = malloc((size_t)(N * (I + O)) * sizeof *scratch);
    simd_f32_to_bf16(wb, w, (long)O * I);
    float *o0 = zeros(N * O), *o1 = zeros(N * O), *dx0 = rnd(N * I, 53, 1.0f);
    float *dx1 = malloc((size_t)(N * I) * sizeof(float));
    memcpy(dx1, dx0, (size_t)(N * I) * sizeof(float));
    float *dw0 = zeros((long)O * I), *dw1 = zeros((long)O * I);
    linear_reference.forward(o0, x, w, N, I, O);
    linear_cpu.forward_bf16(o1, x, wb, scratch, N, I, O);
    expect_close("linear bf16 out", o1, o0, N * O, 2e-2);
    /* dx_beta = 1 adds onto what dx held. */
    linear_reference.backward(dx0, dw0, dout, x, w, N, I, O, 1.0f);
    linear_cpu.backward_bf16(dx1, dw1, dout, x, wb, scratch, N, I, O, 1.0f);
    expect_close("linear bf16 dx", dx1, dx0, N * I, 2e-2);
    expect_close("linear bf16 dw", dw1, dw0, (long)O * I, 2e-2);
    free(x), free(w), free(dout), free(wb), free(scratch), free(o0), free(o1), free(dx0), free(dx1),
        free(dw0), free(dw1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sdpa),    cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_rmsnorm), cmocka_unit_test(test_rope),
        cmocka_unit_test(test_swiglu),  cmocka_unit_test(test_linear_bf16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
