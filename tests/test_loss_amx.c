/* Unit tests for kernels/loss_amx.h, loss_chunked's bf16 training step on AMX tiles, through the
 * op (loss_chunked.forward_backward with the bf16 weight copy): losses, log-sum-exps, dX and dW
 * against an oracle in double on the same bf16-rounded inputs, over shapes that cut every
 * panel and tile edge (vocabularies not a multiple of 32, several statistics panels, grad panels
 * smaller than them, ignored targets) and tokens whose target is nearly certain (their
 * gradients are differences of nearly equal terms, which a target dlogit taken from the bf16
 * exponentials would lose); dW accumulated onto what it held, dX overwritten; results
 * bitwise equal for 1 and 2 threads. Skipped where this process's bf16 path is not AMX. */
/* cmocka.h needs these four first. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/cpu_ops.h"
#include "kernels/kernels.h"
#include "kernels/loss_amx.h"
#include "ops/cross_entropy.h"

typedef struct Case {
    long N;
    int D, V;
} Case;

typedef struct Run {
    float *loss, *lse, *dx, *dw;
    double sum;
} Run;

static float bf16_value(float f) {
    return bf16_to_f32(f32_to_bf16(f));
}

/* x, w rounded to bf16 (the values the kernel multiplies), targets with every 7th ignored and
 * every 5th made nearly certain (x is the target's row of w, scaled up). */
static void make(const Case *c, float *x, float *w, uint16_t *wb, int32_t *tg, Rng *r) {
    long N = c->N;
    int D = c->D, V = c->V;
    for (long i = 0; i < (long)V * D; i++)
        w[i] = bf16_value(0.5f * (2.0f * rng_uniform(r) - 1.0f));
    for (long n = 0; n < N; n++) {
        tg[n] = n % 7 == 3 ? CE_IGNORE : (int32_t)((n * 37 + 11) % V);
        for (int d = 0; d < D; d++) {
            float v = 2.0f * rng_uniform(r) - 1.0f;
            if (n % 5 == 1 && tg[n] != CE_IGNORE) v = 60.0f / D * w[(long)tg[n] * D + d] * 8.0f;
            x[n * D + d] = bf16_value(v);
        }
    }
    for (long i = 0; i < (long)V * D; i++)
        wb[i] = f32_to_bf16(w[i]);
}

/* The oracle in double: losses, lse, dX and dW (dW without the prior content). */
static void oracle(const Case *c, const float *x, const float *w, const int32_t *tg, float scale,
                   double *loss, double *lse, double *dx, double *dw) {
    long N = c->N;
    int D = c->D, V = c->V;
    double *l = malloc((size_t)V * sizeof *l);
    memset(dx, 0, (size_t)N * D * sizeof *dx);
    memset(dw, 0, (size_t)V * D * sizeof *dw);
    for (long n = 0; n < N; n++) {
        double mx = -INFINITY, s = 0;
        for (int v = 0; v < V; v++) {
            double a = 0;
            for (int d = 0; d < D; d++)
                a += (double)x[n * D + d] * w[(long)v * D + d];
            l[v] = a;
            mx = a > mx ? a : mx;
        }
        for (int v = 0; v < V; v++)
            s += exp(l[v] - mx);
        double z = mx + log(s);
        lse[n] = z;
        loss[n] = tg[n] == CE_IGNORE ? 0 : z - l[tg[n]];
        if (tg[n] == CE_IGNORE) continue;
        for (int v = 0; v < V; v++) {
            double g = (v == tg[n] ? expm1(l[v] - z) : exp(l[v] - z)) * scale;
            for (int d = 0; d < D; d++) {
                dx[n * D + d] += g * w[(long)v * D + d];
                dw[(long)v * D + d] += g * x[n * D + d];
            }
        }
    }
    free(l);
}

static Run run(const Case *c, const float *x, const float *w, const uint16_t *wb, const int32_t *tg,
               const float *dw0, float scale, int threads) {
    long N = c->N;
    int D = c->D, V = c->V;
    Run r = {calloc((size_t)N, 4), calloc((size_t)N, 4), malloc((size_t)N * D * 4),
             malloc((size_t)V * D * 4), 0};
    for (long i = 0; i < N * D; i++)
        r.dx[i] = 1e30f; /* written, never read */
    memcpy(r.dw, dw0, (size_t)V * D * 4);
    float *ws = calloc((size_t)loss_chunked.workspace_floats(N, D, V), 4);
    uint16_t *scratch = calloc((size_t)(N * (D + V)), 2);
    int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    r.sum = loss_chunked.forward_backward(r.loss, r.lse, r.dx, r.dw, ws, x, w, wb, scratch, tg,
                                          &linear_cpu, N, D, V, scale);
    omp_set_num_threads(saved);
    free(ws), free(scratch);
    return r;
}

static void run_free(Run *r) {
    free(r->loss), free(r->lse), free(r->dx), free(r->dw);
}

/* max over rows of |got - want| / (|want|_inf of the row + floor), rows of n values. */
static double row_err(const float *got, const double *want, long rows, int n, double floor) {
    double worst = 0;
    for (long i = 0; i < rows; i++) {
        double e = 0, m = 0;
        for (int j = 0; j < n; j++) {
            e = fmax(e, fabs(got[i * n + j] - want[i * n + j]));
            m = fmax(m, fabs(want[i * n + j]));
        }
        worst = fmax(worst, e / (m + floor));
    }
    return worst;
}

static void check_case(const Case *c) {
    long N = c->N;
    int D = c->D, V = c->V;
    Rng r;
    rng_seed(&r, (uint64_t)(N * 131 + D * 7 + V), 1);
    float *x = malloc((size_t)N * D * 4), *w = malloc((size_t)V * D * 4);
    float *dw0 = malloc((size_t)V * D * 4);
    uint16_t *wb = malloc((size_t)V * D * 2);
    int32_t *tg = malloc((size_t)N * 4);
    make(c, x, w, wb, tg, &r);
    for (long i = 0; i < (long)V * D; i++)
        dw0[i] = 0.25f * (2.0f * rng_uniform(&r) - 1.0f);
    assert_true(loss_amx_usable(wb, N, D, V));
    float scale = 1.0f / (float)N;
    double *loss = malloc((size_t)N * 8), *lse = malloc((size_t)N * 8);
    double *dx = malloc((size_t)N * D * 8), *dw = malloc((size_t)V * D * 8);
    oracle(c, x, w, tg, scale, loss, lse, dx, dw);

    Run a = run(c, x, w, wb, tg, dw0, scale, 1), b = run(c, x, w, wb, tg, dw0, scale, 2);
    double sum = 0, worst_loss = 0;
    for (long n = 0; n < N; n++) {
        worst_loss = fmax(worst_loss, fabs(a.loss[n] - loss[n]) / fmax(1.0, fabs(loss[n])));
        worst_loss = fmax(worst_loss, fabs(a.lse[n] - lse[n]) / fmax(1.0, fabs(lse[n])));
        sum += loss[n];
    }
    assert_true(worst_loss < 2e-5);
    assert_true(fabs(a.sum - sum) <= 2e-5 * fmax(1.0, fabs(sum)));
    /* dW's rows against the oracle's change, the prior content taken off */
    float *ddw = malloc((size_t)V * D * 4);
    for (long i = 0; i < (long)V * D; i++)
        ddw[i] = a.dw[i] - dw0[i];
    /* dlogits are rounded to bf16 (2^-9 relative, twice): a few parts in 1000 of each row */
    double ex = row_err(a.dx, dx, N, D, 1e-6), ew = row_err(ddw, dw, V, D, 1e-3 * scale);
    print_message("N %ld D %d V %d: loss %.2e, dx %.2e, dw %.2e\n", N, D, V, worst_loss, ex, ew);
    assert_true(ex < 2e-2);
    assert_true(ew < 2e-2);
    /* 1 and 2 threads: the same bits */
    assert_memory_equal(a.loss, b.loss, (size_t)N * 4);
    assert_memory_equal(a.lse, b.lse, (size_t)N * 4);
    assert_memory_equal(a.dx, b.dx, (size_t)N * D * 4);
    assert_memory_equal(a.dw, b.dw, (size_t)V * D * 4);
    run_free(&a), run_free(&b);
    free(x), free(w), free(dw0), free(wb), free(tg), free(loss), free(lse), free(dx), free(dw);
    free(ddw);
}

static void test_shapes(void **state) {
    (void)state;
    if (!loss_amx_usable((const uint16_t *)state, 32, 32, 32)) {
        skip(); /* no AMX here, or the bf16 path is not AMX */
    }
    /* one panel; the 0.6B test model's shape; several panels and dX blocks with a partial last
     * tile pair; a wider D (three steps); grad panels smaller than the statistics panels */
    static const Case cases[] = {
        {32, 32, 40}, {64, 64, 384}, {64, 64, 2100}, {96, 96, 517}, {2048, 32, 600}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_case(&cases[i]);
}

/* Shapes the kernel leaves to the token-chunked path. */
static void test_not_usable(void **state) {
    uint16_t w[32];
    (void)state;
    assert_false(loss_amx_usable(NULL, 32, 32, 32));
    assert_false(loss_amx_usable(w, 33, 32, 32)); /* tokens not a multiple of 32 */
    assert_false(loss_amx_usable(w, 32, 48, 32)); /* D not a multiple of 32 */
}

int main(void) {
    static uint16_t probe[32];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_shapes, probe),
        cmocka_unit_test(test_not_usable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
