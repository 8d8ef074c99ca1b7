/* AdamW and Adam (L2 weight decay): against a double-precision restatement of the update rule
 * (weight decay on / off per tensor), and against torch.optim.AdamW and torch.optim.Adam values
 * from tools/make_optim_fixtures.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "core/param_table.h"
#include "core/rng.h"
#include "kernels/cpu_simd.h"
#include "ops/gemm.h"
#include "train/adamw.h"

/* The textbook decoupled AdamW, in double, written from the paper's formulas rather than
 * torch's operation order; with l2, Adam with L2 regularisation (the decay's gradient wd p
 * added to g). */
static void ref_step(double *p, double *m, double *v, const double *g, size_t n, int t, double lr,
                     double b1, double b2, double eps, double wd, int l2) {
    for (size_t i = 0; i < n; i++) {
        double gi = l2 ? g[i] + wd * p[i] : g[i];
        if (!l2) p[i] -= lr * wd * p[i];
        m[i] = b1 * m[i] + (1 - b1) * gi;
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        double mhat = m[i] / (1 - pow(b1, t)), vhat = v[i] / (1 - pow(b2, t));
        p[i] -= lr * mhat / (sqrt(vhat) + eps);
    }
}

static void check_vs_double_reference(int l2) {
    enum { N0 = 1000, N1 = 37, STEPS = 6 };
    float p0[N0], p1[N1], g0[N0], g1[N1];
    double r0[N0], r1[N1], m0[N0] = {0}, v0[N0] = {0}, m1[N1] = {0}, v1[N1] = {0}, d0[N0], d1[N1];
    Rng rng;
    rng_seed(&rng, 7, 0);
    rng_fill_normal(&rng, p0, N0, 1.0f);
    rng_fill_normal(&rng, p1, N1, 1.0f);
    for (int i = 0; i < N0; i++)
        r0[i] = p0[i];
    for (int i = 0; i < N1; i++)
        r1[i] = p1[i];
    AdamWParam params[2] = {{"layers.0.attention.wq.weight", p0, g0, N0, 1},
                            {"layers.0.attention_norm.weight", p1, g1, N1, 0}};
    AdamWConfig cfg = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .l2 = l2};
    AdamW opt;
    Err err;
    assert_int_equal(adamw_init(&opt, &cfg, params, 2, &err), 0);
    for (int t = 1; t <= STEPS; t++) {
        rng_fill_normal(&rng, g0, N0, 0.3f);
        rng_fill_normal(&rng, g1, N1, 0.3f);
        for (int i = 0; i < N0; i++)
            d0[i] = g0[i];
        for (int i = 0; i < N1; i++)
            d1[i] = g1[i];
        double lr = 1e-2 * t / STEPS;
        adamw_step(&opt, lr);
        ref_step(r0, m0, v0, d0, N0, t, lr, 0.9, 0.95, 1e-8, 0.1, l2);
        ref_step(r1, m1, v1, d1, N1, t, lr, 0.9, 0.95, 1e-8, 0.0, l2);
    }
    assert_int_equal(opt.step, STEPS);
    /* Not fmax, which drops a NaN: a NaN parameter must fail the check. */
    double worst = 0;
    for (int i = 0; i < N0; i++) {
        double d = fabs(p0[i] - r0[i]) / (fabs(r0[i]) + 1e-3);
        if (isnan(d) || d > worst) worst = d;
    }
    for (int i = 0; i < N1; i++) {
        double d = fabs(p1[i] - r1[i]) / (fabs(r1[i]) + 1e-3);
        if (isnan(d) || d > worst) worst = d;
    }
    printf("%s vs the double-precision rule: max relative difference %.3g\n", l2 ? "adam" : "adamw",
           worst);
    assert_true(worst < 2e-5);
    adamw_free(&opt);
}

static void test_adamw_vs_double_reference(void **state) {
    (void)state;
    check_vs_double_reference(0);
    check_vs_double_reference(1);
}

/* name: the fixture (adamw_torch.json, adam_torch.json); l2: Adam's weight decay. */
static void check_vs_torch(const char *name, int l2) {
    const char *src = getenv("QT_SOURCE_DIR");
    if (!src) skip();
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/fixtures/train/%s", src, name);
    Err err;
    json_t *root = json_load_path(path, &err);
    assert_non_null(root);
    json_t *init = json_object_get(root, "init"), *steps = json_object_get(root, "steps");
    json_t *wd = json_object_get(root, "weight_decay");
    float *p[2], *g[2];
    size_t n[2];
    AdamWParam params[2];
    for (int k = 0; k < 2; k++) {
        json_t *arr = json_array_get(init, (size_t)k);
        n[k] = json_array_size(arr);
        p[k] = malloc(n[k] * sizeof(float));
        g[k] = malloc(n[k] * sizeof(float));
        for (size_t i = 0; i < n[k]; i++)
            p[k][i] = (float)json_number_value(json_array_get(arr, i));
        params[k] = (AdamWParam){"t", p[k], g[k], n[k],
                                 json_number_value(json_array_get(wd, (size_t)k)) != 0.0};
    }
    AdamWConfig cfg = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .l2 = l2};
    AdamW opt;
    assert_int_equal(adamw_init(&opt, &cfg, params, 2, &err), 0);
    double worst = 0;
    for (size_t s = 0; s < json_array_size(steps); s++) {
        json_t *st = json_array_get(steps, s);
        for (int k = 0; k < 2; k++) {
            json_t *ga = json_array_get(json_object_get(st, "grads"), (size_t)k);
            for (size_t i = 0; i < n[k]; i++)
                g[k][i] = (float)json_number_value(json_array_get(ga, i));
        }
        adamw_step(&opt, json_number_value(json_object_get(st, "lr")));
        for (int k = 0; k < 2; k++) {
            json_t *pa = json_array_get(json_object_get(st, "params"), (size_t)k);
            for (size_t i = 0; i < n[k]; i++) {
                double want = json_number_value(json_array_get(pa, i));
                double d = fabs(p[k][i] - want) / fmax(fabs(want), 1e-6);
                if (isnan(d) || d > worst) worst = d; /* not fmax, which drops a NaN */
            }
        }
    }
    printf("%s vs torch: max relative difference %.3g after %zu steps\n", l2 ? "adam" : "adamw",
           worst, json_array_size(steps));
    assert_true(worst < 1e-6);
    adamw_free(&opt);
    for (int k = 0; k < 2; k++) {
        free(p[k]);
        free(g[k]);
    }
    json_decref(root);
}

static void test_adamw_matches_torch(void **state) {
    (void)state;
    check_vs_torch("adamw_torch.json", 0);
}

/* torch.optim.Adam: weight decay added to the gradient (torchtitan's optimizer.name = "Adam"). */
static void test_adam_matches_torch(void **state) {
    (void)state;
    check_vs_torch("adam_torch.json", 1);
}

/* With copies (adamw_set_copies) the parameters update bitwise as without them, and each copy
 * holds what a separate cast of the updated values gives: a bf16 copy and a widened one, over
 * tensors longer and shorter than a run of the update. */
static void test_adamw_writes_copies(void **state) {
    (void)state;
    enum { N0 = 20011, N1 = 37, STEPS = 3 };
    size_t n[2] = {N0, N1};
    float *p[2][2], *g[2];
    Rng rng;
    rng_seed(&rng, 11, 0);
    for (int k = 0; k < 2; k++) {
        p[0][k] = malloc(n[k] * sizeof(float));
        p[1][k] = malloc(n[k] * sizeof(float));
        g[k] = malloc(n[k] * sizeof(float));
        rng_fill_normal(&rng, p[0][k], n[k], 1.0f);
        memcpy(p[1][k], p[0][k], n[k] * sizeof(float));
    }
    uint16_t *bf16 = calloc(N0, sizeof *bf16), *want = calloc(N0, sizeof *want);
    float *wide = calloc(N1, sizeof *wide), *want_wide = calloc(N1, sizeof *want_wide);
    uint16_t *handle = gemm_widened_register(wide, N1);
    uint16_t *want_handle = gemm_widened_register(want_wide, N1);
    assert_non_null(handle);
    assert_non_null(want_handle);
    uint16_t *copies[2] = {bf16, handle};
    AdamWConfig cfg = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    AdamW opt[2];
    Err err;
    for (int o = 0; o < 2; o++) {
        AdamWParam params[2] = {{"a", p[o][0], g[0], N0, 1}, {"b", p[o][1], g[1], N1, 0}};
        assert_int_equal(adamw_init(&opt[o], &cfg, params, 2, &err), 0);
    }
    adamw_set_copies(&opt[1], copies);
    for (int st = 0; st < STEPS; st++) {
        for (int k = 0; k < 2; k++)
            rng_fill_normal(&rng, g[k], n[k], 0.1f);
        adamw_step(&opt[0], 1e-3);
        adamw_step_scaled(&opt[1], 1e-3, 1.0f);
        for (int k = 0; k < 2; k++)
            assert_memory_equal(p[0][k], p[1][k], n[k] * sizeof(float));
        simd_bf16_weight_copy(want, p[0][0], N0);
        simd_bf16_weight_copy(want_handle, p[0][1], N1);
        assert_memory_equal(bf16, want, N0 * sizeof *bf16);
        assert_memory_equal(wide, want_wide, N1 * sizeof *wide);
    }
    for (int o = 0; o < 2; o++)
        adamw_free(&opt[o]);
    gemm_widened_unregister(wide);
    gemm_widened_unregister(want_wide);
    free(bf16), free(want), free(wide), free(want_wide);
    for (int k = 0; k < 2; k++)
        free(p[0][k]), free(p[1][k]), free(g[k]);
}

/* AdamW's decay groups come from the parameter table: the group of the parameter named name. */
static int adamw_default_decay(const char *name, int exempt_norms, int exempt_embeddings) {
    const ParamKind *k = param_kind_of_name(name, NULL);
    assert_non_null(k);
    return param_decays(k, exempt_norms, exempt_embeddings);
}

static void test_adamw_default_decay(void **state) {
    (void)state;
    assert_int_equal(adamw_default_decay("layers.3.attention_norm.weight", 1, 1), 0);
    assert_int_equal(adamw_default_decay("layers.3.attention.q_norm.weight", 1, 0), 0);
    assert_int_equal(adamw_default_decay("norm.weight", 0, 0), 1);
    assert_int_equal(adamw_default_decay("tok_embeddings.weight", 1, 1), 0);
    assert_int_equal(adamw_default_decay("tok_embeddings.weight", 1, 0), 1);
    assert_int_equal(adamw_default_decay("layers.0.feed_forward.w1.weight", 1, 1), 1);
}

static void test_adamw_bad_config(void **state) {
    (void)state;
    AdamWConfig cfg = {.beta1 = 1.0, .beta2 = 0.95, .eps = 1e-8};
    AdamW opt;
    Err err;
    assert_int_equal(adamw_init(&opt, &cfg, NULL, 0, &err), -1);
    assert_non_null(strstr(err.msg, "beta1"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw_vs_double_reference),
        cmocka_unit_test(test_adamw_matches_torch),
        cmocka_unit_test(test_adam_matches_torch),
        cmocka_unit_test(test_adamw_writes_copies),
        cmocka_unit_test(test_adamw_default_decay),
        cmocka_unit_test(test_adamw_bad_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
