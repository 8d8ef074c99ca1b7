/* Helpers shared by the finite-difference tests: seeded random tensors, the fixed random
 * projection that turns an op's output into a scalar loss, loss = sum(out * R) in double, and
 * the one central-difference check every gradcheck test calls. Include after cmocka.h. */
#ifndef QT_TEST_FD_UTIL_H
#define QT_TEST_FD_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/rng.h"

static Rng rng;

static float *randn(long n, float std) {
    float *x = malloc((size_t)n * sizeof(float));
    rng_fill_normal(&rng, x, n, std);
    return x;
}

static float *zeros(long n) {
    return calloc((size_t)n, sizeof(float));
}

static double project(const float *out, const float *R, long n) {
    double s = 0.0;
    for (long i = 0; i < n; i++)
        s += (double)out[i] * R[i];
    return s;
}

/* The op under test, as "run forward on the current inputs and return the projected loss". */
typedef double (*LossFn)(void *ctx);

/* Compares analytic[0..n) with central differences of loss w.r.t. x[0..n) (at most
 * max_probe elements, spread over the tensor): the relative L2 error must be below tol. */
static void fd_check(const char *what, float *x, long n, const float *analytic, LossFn loss,
                     void *ctx, float eps, long max_probe, double tol) {
    long step = n > max_probe ? n / max_probe : 1;
    double num2 = 0.0, diff2 = 0.0;
    for (long i = 0; i < n; i += step) {
        float keep = x[i];
        x[i] = keep + eps;
        double lp = loss(ctx);
        x[i] = keep - eps;
        double lm = loss(ctx);
        x[i] = keep;
        double num = (lp - lm) / (2.0 * eps);
        num2 += num * num;
        diff2 += (num - analytic[i]) * (num - analytic[i]);
    }
    double rel = sqrt(diff2) / (sqrt(num2) + 1e-12);
    printf("  %-34s rel L2 error %.2e (|grad| %.3g)\n", what, rel, sqrt(num2));
    assert_true(num2 > 0.0); /* a check of an all-zero gradient proves nothing */
    assert_true(rel < tol);
}

#endif
