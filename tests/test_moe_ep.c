/* Expert parallelism's dispatch / experts / combine (model/moe_ep.h) inside one process: with an
 * EP group of one (the all-to-all a copy) the forward output, input gradient, gate-weight
 * gradient and expert weight gradients equal the grouped op's on the same routing (the rows are
 * the same, in the same order per expert; only the GEMM library's rounding for other buffer
 * addresses differs, so to 1e-5 per element); with two token blocks (two tp ranks of one EP
 * group) each block's rank writes its tokens and zeros elsewhere, so their sum is the whole
 * output and gradient. Some experts get no rows. The multi-process routes are
 * tests/e2e_dist_ep*.sh. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h> /* after the headers it relies on */

#include <stdlib.h>
#include <string.h>

#include <math.h>

#include "core/rng.h"
#include "model/moe_ep.h"
#include "ops/moe_experts.h"

static void copy_all_to_all(void *ctx, float *out, const size_t *recv_counts, const float *in,
                            const size_t *send_counts) {
    int *calls = ctx;
    (*calls)++;
    assert_int_equal(recv_counts[0], send_counts[0]);
    memcpy(out, in, send_counts[0] * sizeof(float));
}

/* Every element within 1e-5 of the reference, relative to max(1, |ref|); a value left
 * unwritten (the 0x7f fill) or a token missed fails. */
static void assert_close(const float *got, const float *want, long n) {
    for (long i = 0; i < n; i++)
        if (!(fabsf(got[i] - want[i]) <= 1e-5f * fmaxf(1.0f, fabsf(want[i]))))
            fail_msg("element %ld: %.9g, want %.9g", i, got[i], want[i]);
}

static float *randn(Rng *g, long n, float scale) {
    float *x = malloc((size_t)n * sizeof *x);
    for (long i = 0; i < n; i++)
        x[i] = rng_normal(g) * scale;
    return x;
}

/* The grouped op on the whole routing: out, dx, dgw and the weight gradients. */
typedef struct Ref {
    float *out, *dx, *dgw, *dw1, *dw3, *dw2;
} Ref;

static void run_case(long N, int k, int D, int F, int X) {
    Rng g;
    rng_seed(&g, 7, (uint64_t)(N * 100 + X));
    float *x = randn(&g, N * D, 1.0f), *dout = randn(&g, N * D, 1.0f);
    float *w1 = randn(&g, (long)X * F * D, 0.2f), *w3 = randn(&g, (long)X * F * D, 0.2f);
    float *w2 = randn(&g, (long)X * D * F, 0.2f), *gw = randn(&g, N * k, 0.5f);
    int32_t *idx = malloc((size_t)(N * k) * sizeof *idx);
    for (long n = 0; n < N; n++) /* k distinct experts, skewed to leave some empty */
        for (int j = 0; j < k; j++)
            idx[n * k + j] = (int32_t)((n * 3 % (X > 2 ? X - 1 : X) + j) % X);
    long fl = moe_experts_saved_floats(N, k, D, F), sc = moe_experts_scratch_floats(N, k, D, F);
    float *saved = malloc((size_t)fl * sizeof(float)),
          *scratch = malloc((size_t)sc * sizeof(float));
    int32_t *ints = malloc((size_t)moe_experts_saved_ints(N, k, X) * sizeof(int32_t));
    MoeExpertsBufs b;
    moe_experts_bufs_place(&b, saved, ints, scratch, N, k, D, F, X);
    Ref r = {calloc((size_t)(N * D), 4),   calloc((size_t)(N * D), 4),
             calloc((size_t)(N * k), 4),   calloc((size_t)X * F * D, 4),
             calloc((size_t)X * F * D, 4), calloc((size_t)X * D * F, 4)};
    moe_experts_grouped.forward(r.out, &b, x, idx, gw, w1, w3, w2, N, k, D, F, X);
    moe_experts_grouped.backward(r.dx, r.dgw, r.dw1, r.dw3, r.dw2, &b, dout, x, idx, gw, w1, w3, w2,
                                 N, k, D, F, X);
    /* Token blocks tb = 1 (the whole micro-batch) and tb = 2 (two tp ranks' halves, summed). */
    for (int tb = 1; tb <= 2; tb++) {
        float *out = calloc((size_t)(N * D), 4), *dx = calloc((size_t)(N * D), 4);
        float *dgw = calloc((size_t)(N * k), 4), *dw1 = calloc((size_t)X * F * D, 4);
        float *dw3 = calloc((size_t)X * F * D, 4), *dw2 = calloc((size_t)X * D * F, 4);
        float *o = malloc((size_t)(N * D) * 4), *d = malloc((size_t)(N * D) * 4);
        for (int at = 0; at < tb; at++) {
            int calls = 0;
            MoeEp *ep = moe_ep_create(1, 0, X, tb, at, 2, copy_all_to_all, &calls);
            memset(o, 0x7f, (size_t)(N * D) * 4); /* every element must be written */
            moe_ep_forward(ep, 1, &moe_experts_grouped, o, x, idx, gw, w1, w3, w2, N, k, D, F);
            memset(d, 0x7f, (size_t)(N * D) * 4);
            moe_ep_backward(ep, 1, &moe_experts_grouped, d, dgw, dw1, dw3, dw2, dout, idx, gw, w1,
                            w3, w2, N, k, D, F);
            assert_int_equal(calls, 3 + 2); /* counts, rows, outputs; gradients there and back */
            for (long i = 0; i < N * D; i++)
                out[i] += o[i], dx[i] += d[i];
            moe_ep_free(ep);
        }
        assert_close(out, r.out, N * D);
        assert_close(dx, r.dx, N * D);
        assert_close(dgw, r.dgw, N * k);
        assert_close(dw1, r.dw1, (long)X * F * D);
        assert_close(dw3, r.dw3, (long)X * F * D);
        assert_close(dw2, r.dw2, (long)X * D * F);
        free(out), free(dx), free(dgw), free(dw1), free(dw3), free(dw2), free(o), free(d);
    }
    free(x), free(dout), free(w1), free(w3), free(w2), free(gw), free(idx);
    free(saved), free(scratch), free(ints);
    free(r.out), free(r.dx), free(r.dgw), free(r.dw1), free(r.dw3), free(r.dw2);
}

static void test_one_rank_equals_grouped(void **state) {
    (void)state;
    run_case(12, 2, 8, 6, 4);
    run_case(10, 4, 16, 8, 64); /* the reduced 30B-A3B's routing: 64 experts, top 4 */
    run_case(6, 1, 4, 4, 8);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_one_rank_equals_grouped)};
    return cmocka_run_group_tests(tests, 0, NULL);
}
