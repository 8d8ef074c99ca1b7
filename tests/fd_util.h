/* Helpers shared by the finite-difference tests: seeded random tensors and the fixed random
 * projection that turns an op's output into a scalar loss, loss = sum(out * R) in double. */
#ifndef QT_TEST_FD_UTIL_H
#define QT_TEST_FD_UTIL_H

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

#endif
