/* [[override]] resolution: conflicts, no-match warnings, unknown / wrong-kind kernel names,
 * failed supports(), order independence; and the kernel check itself can fail (a broken
 * kernel is caught by verify_kernel). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <string.h>

#include "core/config.h"
#include "kernels/kernels.h"
#include "kernels/verify.h"
#include "model/overrides.h"
#include "spec_util.h"

static ModelSpec tiny(void) {
    return test_spec(
        (TestShape){.D = 32, .L = 4, .H = 4, .K = 2, .E = 8, .F = 48, .V = 97, .T = 4096});
}

/* Loads the [[override]] entries of toml into cfg (file name "job.toml" labels messages). */
static void load(JobConfig *cfg, const char *toml) {
    Err err;
    config_init(cfg);
    int rc = config_apply_toml(cfg, toml, strlen(toml), "job.toml", &err);
    if (rc) fail_msg("%s", err.msg);
}

static int resolve(OverridePlan *plan, const char *toml, int T, int doc, Err *err) {
    JobConfig cfg;
    load(&cfg, toml);
    ModelSpec s = tiny();
    OpRun run = {&s, 2, T, doc, 0};
    int rc =
        overrides_resolve(plan, &s, cfg.overrides, cfg.n_overrides, "job.toml", "cpu", &run, err);
    config_free(&cfg);
    return rc;
}

static const char *SET = "[[override]]\n"
                         "target = \"layers.*.attention.rope\"\n"
                         "kernel = \"rope_nogather\"\n"
                         "[[override]]\n"
                         "target = \"layers.*.attention.sdpa\"\n"
                         "kernel = \"flash\"\n"
                         "[[override]]\n"
                         "target = \"loss\"\n"
                         "kernel = \"loss_chunked\"\n";

static void test_plan(void **state) {
    (void)state;
    OverridePlan plan;
    Err err;
    assert_int_equal(resolve(&plan, SET, 128, 0, &err), 0);
    assert_int_equal(plan.n, 4 + 4 + 1);
    assert_int_equal(plan.n_unmatched, 0);
    int n_flash = 0;
    for (int i = 0; i < plan.n; i++) {
        if (plan.choices[i].impl == &sdpa_flash.h) {
            n_flash++;
            assert_int_equal(plan.choices[i].line, 4);
        }
    }
    assert_int_equal(n_flash, 4);
    assert_string_equal(plan.choices[plan.n - 1].fqn, "loss");
    overrides_plan_free(&plan);
}

static void test_conflict_names_both_and_instance(void **state) {
    (void)state;
    OverridePlan plan;
    Err err;
    const char *toml = "[[override]]\n"
                       "target = \"layers.*.attention.rope\"\n"
                       "kernel = \"rope_nogather\"\n"
                       "[[override]]\n"
                       "target = \"layers.2.*\"\n"
                       "kernel = \"reference\"\n";
    assert_int_equal(resolve(&plan, toml, 128, 0, &err), -1);
    assert_non_null(strstr(err.msg, "line 1"));
    assert_non_null(strstr(err.msg, "line 4"));
    assert_non_null(strstr(err.msg, "layers.2.attention.rope"));
    /* Entry order does not matter: swapped, the same instance is named. */
    const char *swapped = "[[override]]\n"
                          "target = \"layers.2.*\"\n"
                          "kernel = \"reference\"\n"
                          "[[override]]\n"
                          "target = \"layers.*.attention.rope\"\n"
                          "kernel = \"rope_nogather\"\n";
    assert_int_equal(resolve(&plan, swapped, 128, 0, &err), -1);
    assert_non_null(strstr(err.msg, "layers.2.attention.rope"));
}

static void test_no_match_is_a_warning(void **state) {
    (void)state;
    OverridePlan plan;
    Err err;
    const char *toml = "[[override]]\n"
                       "target = \"layers.9.attention.rope\"\n" /* 4 layers: no layer 9 */
                       "kernel = \"rope_nogather\"\n"
                       "[[override]]\n"
                       "target = \"norm\"\n"
                       "kernel = \"rmsnorm_fused\"\n";
    assert_int_equal(resolve(&plan, toml, 100, 1, &err), 0);
    assert_int_equal(plan.n_unmatched, 1);
    assert_int_equal(plan.n, 1);
    assert_string_equal(plan.choices[0].fqn, "norm");
    overrides_plan_free(&plan);
}

static void test_unknown_and_wrong_kind(void **state) {
    (void)state;
    OverridePlan plan;
    Err err;
    assert_int_equal(resolve(&plan,
                             "[[override]]\ntarget = \"layers.*.attention.sdpa\"\n"
                             "kernel = \"flsh\"\n",
                             128, 0, &err),
                     -1);
    assert_non_null(strstr(err.msg, "job.toml:1"));
    assert_non_null(strstr(err.msg, "\"flsh\""));
    assert_non_null(strstr(err.msg, "reference, flash")); /* the valid names */
    assert_int_equal(resolve(&plan,
                             "[[override]]\ntarget = \"layers.0.attention.rope\"\n"
                             "kernel = \"flash\"\n",
                             128, 0, &err),
                     -1);
    assert_non_null(strstr(err.msg, "op sdpa"));
    assert_non_null(strstr(err.msg, "reference, rope_nogather"));
}

static void test_failed_supports(void **state) {
    (void)state;
    OverridePlan plan;
    Err err;
    /* flash needs seq_len % 64 == 0 */
    assert_int_equal(resolve(&plan, SET, 100, 0, &err), -1);
    assert_non_null(strstr(err.msg, "flash"));
    assert_non_null(strstr(err.msg, "layers.0.attention.sdpa"));
    assert_non_null(strstr(err.msg, "multiple of 64"));
    /* rope_nogather rejects document-masked packing */
    assert_int_equal(resolve(&plan, SET, 128, 1, &err), -1);
    assert_non_null(strstr(err.msg, "layers.0.attention.rope"));
    assert_non_null(strstr(err.msg, "document_mask"));
}

/* A kernel with a wrong backward (sign flipped) must fail verification. */
static void broken_backward(float *dx, const float *dout, const int32_t *positions, long N, int NH,
                            int E, const RopeFreqs *f) {
    rope_forward(dx, dout, positions, N, NH, E, f);
}
static const RopeOp broken_rope = {{"broken", OP_ROPE, "cpu", 0}, rope_forward, broken_backward};

static void test_verify_catches_a_broken_kernel(void **state) {
    (void)state;
    KernelInfo k = {&broken_rope.h, 0, 1e-6, 1e-5, "test"};
    VerifyShape sh = {.B = 1, .T = 9, .H = 2, .E = 8, .theta = 1e4};
    VerifyResult r;
    verify_kernel(&r, &k, &sh, 1);
    assert_false(r.ok);
    assert_true(r.max_abs > 1e-3);
    /* and the shipped kernels pass the same harness */
    int n;
    const KernelInfo *reg = kernel_registry(&n);
    for (int i = 0; i < n; i++) {
        if (op_reference(reg[i].op->kind) == reg[i].op) continue;
        VerifyShape s = {.B = 2,
                         .T = 64,
                         .H = 4,
                         .K = 2,
                         .E = 16,
                         .D = 24,
                         .F = 40,
                         .V = 61,
                         .doc = 0,
                         .theta = 1e6,
                         .X = 6,
                         .k = 2};
        verify_kernel(&r, &reg[i], &s, 5);
        if (!r.ok) fail_msg("%s: max abs %g", reg[i].op->name, r.max_abs);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_conflict_names_both_and_instance),
        cmocka_unit_test(test_no_match_is_a_warning),
        cmocka_unit_test(test_unknown_and_wrong_kind),
        cmocka_unit_test(test_failed_supports),
        cmocka_unit_test(test_verify_catches_a_broken_kernel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
