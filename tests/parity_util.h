/* Shared by the parity tests (test_parity, test_moe_parity): how far our values are from the
 * ones Hugging Face computed. */
#ifndef QT_TEST_PARITY_UTIL_H
#define QT_TEST_PARITY_UTIL_H

#include <math.h>

/* max |got - ref| / max |ref| over n values. Not fmax for the differences, which drops a
 * NaN: a NaN sticks and fails the check. */
static inline double rel_err(const float *got, const float *ref, long n) {
    double maxabs = 0, maxdiff = 0;
    for (long i = 0; i < n; i++) {
        maxabs = fmax(maxabs, fabs(ref[i]));
        double d = fabs((double)got[i] - ref[i]);
        if (isnan(d) || d > maxdiff) maxdiff = d;
    }
    return maxdiff / maxabs;
}

#endif
