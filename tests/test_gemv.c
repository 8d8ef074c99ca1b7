/* Unit tests for kernels/gemv_bf16.h: every path the CPU has (scalar, AVX-512F, AVX512_BF16)
 * against a double-precision product of the same bf16 values, over shapes that exercise the
 * masked tails (I not a multiple of 16 or 32), partial weight-row blocks (O not a multiple of
 * GEMV_ROWS), activation row counts past GEMV_ROWS, and several parts sharing one input. */
/* cmocka.h needs these four first. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/gemv_bf16.h"

static uint16_t *random_bf16(long n, Rng *r) {
    uint16_t *x = malloc((size_t)n * sizeof *x);
    for (long i = 0; i < n; i++)
        x[i] = f32_to_bf16(rng_normal(r));
    return x;
}

/* Each output within 1e-5 of sum |w x| (fp32 accumulation of exact products) of the double
 * product. */
static void check_part(const GemvPart *p, const uint16_t *xb, long n, int I, const char *what) {
    for (long r = 0; r < n; r++)
        for (int o = 0; o < p->O; o++) {
            double want = 0.0, mag = 0.0;
            for (int i = 0; i < I; i++) {
                double t = (double)bf16_to_f32(p->w[(long)o * I + i]) * bf16_to_f32(xb[r * I + i]);
                want += t;
                mag += fabs(t);
            }
            double got = p->out[r * p->O + o];
            if (fabs(got - want) > 1e-5 * mag + 1e-30)
                fail_msg("%s n=%ld I=%d O=%d: out[%ld][%d] = %.9g, double product %.9g", what, n, I,
                         p->O, r, o, got, want);
        }
}

static void test_paths_against_double(void **state) {
    (void)state;
    const int Is[] = {1, 7, 16, 33, 64, 100, 1024};
    const int Os[] = {1, 3, 4, 5, 37};
    const char *names[] = {"scalar", "avx512", "avx512_bf16"};
    Rng rng;
    rng_seed(&rng, 7, 0);
    int tried = 0;
    for (int path = GEMV_SCALAR; path <= GEMV_AVX512_BF16; path++) {
        gemv_bf16_force(path);
        if (gemv_bf16_path() != path) continue; /* the CPU lacks it */
        tried++;
        for (size_t a = 0; a < sizeof Is / sizeof Is[0]; a++)
            for (size_t b = 0; b < sizeof Os / sizeof Os[0]; b++)
                for (long n = 1; n <= GEMV_ROWS + 2; n++) {
                    int I = Is[a], O = Os[b];
                    uint16_t *xb = random_bf16(n * I, &rng);
                    /* Three parts of different heights over one input, as q, k and v. */
                    GemvPart parts[3];
                    for (int k = 0; k < 3; k++) {
                        parts[k].O = O + k;
                        parts[k].w = random_bf16((long)parts[k].O * I, &rng);
                        parts[k].out = calloc((size_t)(n * parts[k].O), sizeof(float));
                    }
                    gemv_bf16(parts, 3, xb, n, I);
                    for (int k = 0; k < 3; k++) {
                        check_part(&parts[k], xb, n, I, names[path]);
                        free((void *)parts[k].w), free(parts[k].out);
                    }
                    free(xb);
                }
    }
    printf("gemv: %d path(s) checked against double products\n", tried);
    assert_true(tried >= 1);
    gemv_bf16_force(GEMV_AVX512_BF16);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paths_against_double),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
