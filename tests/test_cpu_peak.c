/* Unit tests for kernels/cpu_peak.h: the timed loops really do the credited work (their
 * checksums equal the closed-form values, so no chain was merged or folded away), and the
 * measurement returns positive rates with the units named. */
/* cmocka.h needs these four first. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kernels/cpu_peak.h"

static void test_fma_checksum(void **state) {
    (void)state;
    const long iters = 100000;
    double s = cpu_peak_fma_loop(iters, 1.0f, 1.0f);
    /* chain c ends at c + iters; 12 chains, 16, 8 or 1 lanes */
    double per_lane = 66.0 + 12.0 * iters;
    assert_true(s == 16 * per_lane || s == 8 * per_lane || s == per_lane);
    /* x = 0.5, y = 1: every chain converges to 2 */
    double h = cpu_peak_fma_loop(200, 0.5f, 1.0f);
    assert_true(h == 12 * 16 * 2.0 || h == 12 * 8 * 2.0 || h == 12 * 2.0);
}

static void test_bf16_checksums(void **state) {
    (void)state;
    double d = cpu_peak_dpbf16_loop(1000);
    if (d >= 0) assert_true(d == 16 * (66.0 + 12 * 2.0 * 1000));
    double a = cpu_peak_amx_loop(1000);
    if (a >= 0) assert_true(a == 32.0 * 1000);
}

static void test_measure(void **state) {
    (void)state;
    CpuPeak p;
    cpu_peak_measure(&p);
    assert_true(p.fp32_gflops > 0.1 && p.bf16_gflops > 0.1);
    assert_true(p.fp32_unit[0] && p.bf16_unit[0]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fma_checksum),
        cmocka_unit_test(test_bf16_checksums),
        cmocka_unit_test(test_measure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
