/* Reference cross-entropy with ignore index; row reductions in double. */
#include "ops/cross_entropy.h"

#include <math.h>

double cross_entropy_forward(float *losses, float *lse, const float *logits, const int32_t *targets,
                             long N, int V) {
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++) {
        const float *l = logits + n * V;
        float m = l[0];
        for (int j = 1; j < V; j++)
            m = l[j] > m ? l[j] : m;
        double s = 0.0;
        for (int j = 0; j < V; j++)
            s += exp((double)l[j] - m);
        double z = m + log(s);
        lse[n] = (float)z;
        losses[n] = targets[n] == CE_IGNORE ? 0.0f : (float)(z - l[targets[n]]);
    }
    return cross_entropy_valid_sum(losses, targets, N);
}

double cross_entropy_valid_sum(const float *losses, const int32_t *targets, long N) {
    double sum = 0.0;
    for (long n = 0; n < N; n++)
        if (targets[n] != CE_IGNORE) sum += losses[n];
    return sum;
}

void cross_entropy_backward(float *dlogits, const float *logits, const float *lse,
                            const int32_t *targets, long N, int V, float scale) {
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++) {
        const float *l = logits + n * V;
        float *d = dlogits + n * V;
        int t = targets[n];
        if (t == CE_IGNORE) {
            for (int j = 0; j < V; j++)
                d[j] = 0.0f;
            continue;
        }
        float z = lse[n];
        for (int j = 0; j < V; j++)
            d[j] = expf(l[j] - z) * scale;
        d[t] -= scale;
    }
}

const CrossEntropyOp cross_entropy_reference = {
    {"reference", OP_CROSS_ENTROPY, "cpu", 0}, cross_entropy_forward, cross_entropy_backward};
