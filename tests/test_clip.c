/* Gradient clipping: global norm against a direct double sum, thread-count independence,
 * torch's clip coefficient, and non-finite gradients. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "train/clip.h"

static void test_norm_and_clip(void **state) {
    (void)state;
    enum { A = 200001, B = 3 };
    float *a = malloc(A * sizeof(float)), b[B] = {3.0f, 4.0f, 0.0f};
    Rng rng;
    rng_seed(&rng, 1, 0);
    rng_fill_normal(&rng, a, A, 0.01f);
    GradRef g[2] = {{a, A, NULL}, {b, B, NULL}};
    long double want = 25.0L;
    for (int i = 0; i < A; i++)
        want += (long double)a[i] * a[i];
    double norm = grad_global_norm(g, 2);
    assert_true(fabs(norm - sqrt((double)want)) < 1e-12 * norm);
    /* Bitwise the same on 1 and on several threads. */
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    double one = grad_global_norm(g, 2);
    omp_set_num_threads(3);
    double three = grad_global_norm(g, 2);
    omp_set_num_threads(threads);
    assert_true(one == norm && three == norm);
    /* No clipping above the norm; clipping below it gives norm ~= max_norm. */
    int finite;
    float b0 = b[0];
    assert_true(grad_clip(g, 2, 100.0, &finite) == norm && finite);
    assert_true(b[0] == b0);
    assert_true(grad_clip_coef(1e30, INFINITY) == 1.0f); /* training.max_norm = inf: off */
    double pre = grad_clip(g, 2, 1.0, &finite);
    assert_true(pre == norm && finite);
    float coef = 1.0f / ((float)norm + 1e-6f);
    assert_true(b[0] == b0 * coef);
    assert_true(fabs(grad_global_norm(g, 2) - 1.0) < 1e-5);
    free(a);
}

static void test_nonfinite(void **state) {
    (void)state;
    float a[4] = {1, 2, NAN, 3}, b[2] = {INFINITY, 1};
    GradRef g[1] = {{a, 4, NULL}};
    int finite = 1;
    assert_true(isnan(grad_clip(g, 1, 1.0, &finite)));
    assert_int_equal(finite, 0);
    assert_true(a[0] == 1.0f); /* left alone */
    GradRef h[1] = {{b, 2, NULL}};
    assert_true(isinf(grad_clip(h, 1, 1.0, &finite)));
    assert_int_equal(finite, 0);
    assert_true(grad_global_norm(NULL, 0) == 0.0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_norm_and_clip),
        cmocka_unit_test(test_nonfinite),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
