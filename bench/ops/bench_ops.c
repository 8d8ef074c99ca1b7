/* Reference vs default CPU kernels (kernels/cpu_ops.h) at the shapes of one 0.6B layer with
 * seq_len 512, batch 1: process CPU time per call (robust on a shared machine; with N threads
 * it is the sum over threads), best of a few repeats.
 *   OMP_NUM_THREADS=1 build/bench_ops */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "core/rng.h"
#include "kernels/cpu_ops.h"

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float *rnd(long n, uint64_t stream, float scale) {
    float *x = malloc((size_t)n * sizeof *x);
    Rng r;
    rng_seed(&r, 1, stream);
    rng_fill_normal(&r, x, n, scale);
    return x;
}

#define REPS 3
#define TIME(label, call)                                                                          \
    do {                                                                                           \
        double best = 1e30;                                                                        \
        for (int r_ = 0; r_ < REPS; r_++) {                                                        \
            double t0_ = cpu_now();                                                                \
            call;                                                                                  \
            double dt_ = cpu_now() - t0_;                                                          \
            best = dt_ < best ? dt_ : best;                                                        \
        }                                                                                          \
        printf("  %-34s %9.2f ms\n", label, 1e3 * best);                                           \
    } while (0)

int main(void) {
    int B = 1, T = 512, H = 16, K = 8, E = 128, V = 151936;
    long N = (long)B * T;
    float *q = rnd(N * H * E, 1, 1), *k = rnd(N * K * E, 2, 1), *v = rnd(N * K * E, 3, 1);
    float *dout = rnd(N * H * E, 4, 1), *out = rnd(N * H * E, 5, 1), *lse = rnd(N * H, 6, 1);
    float *dq = rnd(N * H * E, 7, 1), *dk = rnd(N * K * E, 8, 1), *dv = rnd(N * K * E, 9, 1);
    printf("sdpa B=%d T=%d H=%d K=%d E=%d (causal)\n", B, T, H, K, E);
    const SdpaOp *sd[2] = {&sdpa_reference, &sdpa_cpu};
    for (int i = 0; i < 2; i++) {
        char l[64];
        snprintf(l, sizeof l, "%s forward", sd[i]->h.name);
        TIME(l, sd[i]->forward(out, lse, q, k, v, NULL, B, T, H, K, E));
        snprintf(l, sizeof l, "%s backward", sd[i]->h.name);
        TIME(l, sd[i]->backward(dq, dk, dv, dout, q, k, v, out, lse, NULL, B, T, H, K, E));
    }
    float *logits = rnd(N * V, 10, 2);
    float *losses = malloc((size_t)N * sizeof *losses), *z = malloc((size_t)N * sizeof *z);
    int32_t *tgt = malloc((size_t)N * sizeof *tgt);
    for (long n = 0; n < N; n++)
        tgt[n] = (int32_t)(n * 7 % V);
    printf("cross_entropy N=%ld V=%d\n", N, V);
    const CrossEntropyOp *ce[2] = {&cross_entropy_reference, &cross_entropy_cpu};
    float *dl = malloc((size_t)(N * V) * sizeof *dl);
    for (int i = 0; i < 2; i++) {
        char l[64];
        snprintf(l, sizeof l, "%s forward", ce[i]->h.name);
        TIME(l, ce[i]->forward(losses, z, logits, tgt, N, V));
        snprintf(l, sizeof l, "%s backward", ce[i]->h.name);
        TIME(l, ce[i]->backward(dl, logits, z, tgt, N, V, 1.0f / N));
    }
    static const int rc[2][2] = {{512, 1024}, {512 * 16, 128}};
    const RmsnormOp *rn[2] = {&rmsnorm_reference, &rmsnorm_cpu};
    for (int s = 0; s < 2; s++) {
        long R = rc[s][0];
        int C = rc[s][1];
        float *x = rnd(R * C, 20, 1), *w = rnd(C, 21, 1), *o = malloc((size_t)(R * C) * 4);
        float *rs = malloc((size_t)R * 4), *dx = malloc((size_t)(R * C) * 4), *dw = rnd(C, 22, 1);
        printf("rmsnorm R=%ld C=%d\n", R, C);
        for (int i = 0; i < 2; i++) {
            char l[64];
            snprintf(l, sizeof l, "%s forward", rn[i]->h.name);
            TIME(l, rn[i]->forward(o, rs, x, w, R, C, 1e-6f));
            snprintf(l, sizeof l, "%s backward", rn[i]->h.name);
            TIME(l, rn[i]->backward(dx, dw, o, x, w, rs, R, C));
        }
        free(x), free(w), free(o), free(rs), free(dx), free(dw);
    }
    int32_t *pos = malloc((size_t)N * sizeof *pos);
    for (long n = 0; n < N; n++)
        pos[n] = (int32_t)n;
    printf("rope N=%ld NH=%d E=%d\n", N, H, E);
    const RopeOp *ro[2] = {&rope_reference, &rope_cpu};
    static RopeFreqs freqs;
    rope_freqs_plain(&freqs, 1e6, E);
    for (int i = 0; i < 2; i++) {
        char l[64];
        snprintf(l, sizeof l, "%s forward", ro[i]->h.name);
        TIME(l, ro[i]->forward(dq, q, pos, N, H, E, &freqs));
    }
    return 0;
}
