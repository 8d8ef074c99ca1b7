/* LR schedule: against LambdaLR values from tools/make_optim_fixtures.py, plus hand-computed
 * points of torchtitan's formula. */
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
#include "train/lr_schedule.h"

/* The fixture's decay_type name as the config's enum (names from core/config.c). */
static DecayType decay_type(const json_t *name) {
    for (DecayType d = DECAY_LINEAR; d <= DECAY_COSINE; d++)
        if (strcmp(config_decay_type_name(d), json_string_value(name)) == 0) return d;
    fail_msg("decay_type %s is not a config name", json_string_value(name));
    return DECAY_LINEAR;
}

static void test_lr_hand_values(void **state) {
    (void)state;
    LrSchedule s;
    Err err;
    /* 10 steps, warmup 2, decay over the remaining 8, linear to 0. */
    assert_int_equal(lr_schedule_init(&s, 1.0, 10, -1, 2, -1.0, DECAY_LINEAR, 0.0, &err), 0);
    assert_int_equal(s.decay_steps, 8);
    assert_int_equal(s.stable_steps, 0);
    assert_true(fabs(lr_schedule_lr(&s, 1) - 1.0 / 3) < 1e-15); /* (0+1)/(2+1) */
    assert_true(fabs(lr_schedule_lr(&s, 2) - 2.0 / 3) < 1e-15);
    assert_true(fabs(lr_schedule_lr(&s, 3) - (1 - 1.0 / 9)) < 1e-15); /* progress (2+1-2)/9 */
    assert_true(fabs(lr_schedule_lr(&s, 10) - (1 - 8.0 / 9)) < 1e-15);
    assert_true(lr_schedule_lr(&s, 11) == 0.0); /* clamped: (10+1-2)/9 = 1 */
    /* Cosine with a floor: halfway through the decay the factor is min + (1-min)/2. */
    assert_int_equal(lr_schedule_init(&s, 2.0, 100, -1, 0, 0.49, DECAY_COSINE, 0.2, &err), 0);
    assert_int_equal(s.decay_steps, 49);
    assert_int_equal(s.stable_steps, 51);
    /* c + 1 - 51 = 25 of 50 */
    assert_true(fabs(lr_schedule_factor(&s, 75) - (0.2 + 0.8 * 0.5)) < 1e-12);
}

/* Fixture case k (tools/make_optim_fixtures.py: torch's LambdaLR over `steps` steps, and two
 * past the end) for a run of `run` steps with lr_scheduler.total_steps = total (-1: none): its
 * first n learning rates. */
static void expect_lrs(json_t *k, size_t c, int64_t run, int64_t total, size_t n) {
    LrSchedule s;
    Err err;
    assert_int_equal(lr_schedule_init(&s, json_number_value(json_object_get(k, "base_lr")), run,
                                      total, json_integer_value(json_object_get(k, "warmup_steps")),
                                      json_number_value(json_object_get(k, "decay_ratio")),
                                      decay_type(json_object_get(k, "decay_type")),
                                      json_number_value(json_object_get(k, "min_lr_factor")), &err),
                     0);
    json_t *lrs = json_object_get(k, "lr");
    for (size_t i = 0; i < n && i < json_array_size(lrs); i++) {
        double want = json_number_value(json_array_get(lrs, i));
        double got = lr_schedule_lr(&s, (int64_t)i + 1);
        if (!(fabs(got - want) <= 1e-15 * fmax(1.0, fabs(want)))) { /* a NaN fails too */
            printf("case %zu, run of %lld steps, total_steps %lld, step %zu: got %.17g want "
                   "%.17g\n",
                   c, (long long)run, (long long)total, i + 1, got, want);
            fail();
        }
    }
}

/* The schedule of each case, past its end too; and with lr_scheduler.total_steps, runs that
 * stop part-way along it (to be resumed), end with it, or go past its end (the last steps at the
 * final factor, clamped as the LambdaLR's lambda clamps). */
static void test_lr_matches_lambdalr(void **state) {
    (void)state;
    const char *src = getenv("QT_SOURCE_DIR");
    if (!src) skip();
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/fixtures/train/lr_schedule.json", src);
    Err err;
    json_t *root = json_load_path(path, &err);
    assert_non_null(root);
    assert_true(json_array_size(root) >= 5);
    for (size_t c = 0; c < json_array_size(root); c++) {
        json_t *k = json_array_get(root, c);
        int64_t steps = json_integer_value(json_object_get(k, "steps"));
        expect_lrs(k, c, steps, -1, SIZE_MAX);
        const int64_t runs[] = {1, steps / 2 + 1, steps, steps + 2};
        for (int r = 0; r < 4; r++)
            expect_lrs(k, c, runs[r], steps, (size_t)runs[r]);
    }
    json_decref(root);
}

/* The learning rates of the whole-run parity fixture (tools/make_train_parity_fixture.py) come
 * from the same schedule: 5 steps, warmup 2, linear decay to 0. */
static void test_lr_matches_parity_fixture(void **state) {
    (void)state;
    const char *src = getenv("QT_SOURCE_DIR");
    if (!src) skip();
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/fixtures/train_parity/expected.json", src);
    Err err;
    json_t *root = json_load_path(path, &err);
    assert_non_null(root);
    json_t *steps = json_object_get(root, "steps");
    assert_int_equal(json_array_size(steps), 5);
    LrSchedule s;
    assert_int_equal(lr_schedule_init(&s, 1e-2, 5, -1, 2, -1.0, DECAY_LINEAR, 0.0, &err), 0);
    for (size_t i = 0; i < 5; i++) {
        double want = json_number_value(json_object_get(json_array_get(steps, i), "lr"));
        assert_true(fabs(lr_schedule_lr(&s, (int64_t)i + 1) - want) <= 1e-17);
    }
    json_decref(root);
}

/* A warmup longer than the run trains on the ramp alone, as torchtitan's LambdaLR does (its
 * decay and stable phases are empty or negative then): step s gets s / (warmup + 1). */
static void test_lr_warmup_longer_than_run(void **state) {
    (void)state;
    const double ratios[] = {-1.0, 0.2, 1.0};
    for (int r = 0; r < 3; r++) {
        LrSchedule s;
        Err err;
        assert_int_equal(lr_schedule_init(&s, 1e-3, 10, -1, 20, ratios[r], DECAY_COSINE, 0.1, &err),
                         0);
        for (int64_t step = 1; step <= 10; step++)
            assert_true(fabs(lr_schedule_lr(&s, step) - 1e-3 * (double)step / 21.0) <= 1e-18);
    }
}

static void test_lr_bad_input(void **state) {
    (void)state;
    LrSchedule s;
    Err err;
    assert_int_equal(lr_schedule_init(&s, 1e-3, 10, -1, 2, 1.5, DECAY_LINEAR, 0.0, &err), -1);
    assert_non_null(strstr(err.msg, "decay_ratio"));
    assert_int_equal(lr_schedule_init(&s, 1e-3, 10, -1, 2, -1, DECAY_LINEAR, 2.0, &err), -1);
    assert_non_null(strstr(err.msg, "min_lr_factor"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lr_hand_values),
        cmocka_unit_test(test_lr_matches_lambdalr),
        cmocka_unit_test(test_lr_matches_parity_fixture),
        cmocka_unit_test(test_lr_warmup_longer_than_run),
        cmocka_unit_test(test_lr_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
