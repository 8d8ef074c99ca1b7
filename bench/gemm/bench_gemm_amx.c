/* qtitan's AMX tile kernel (ops/gemm_amx.h) against oneDNN's bf16 matmul (gemm.h's dnnl
 * backend, the same K-chunked primitives auto ran before the kernel) on the products of one
 * Qwen3-0.6B training step at 2 x 512 tokens, as the trainer issues them (forward, dX, dW of
 * each linear and of the LM head; shapes read off a profiler trace; wo's are q's transposed). The
 * two sides alternate within each round, each figure is the best of 3 calls, and a side's result is
 * the median over the rounds; GFLOP/s are wall-clock, next to this machine's measured AMX peak.
 * Usage: bench_gemm_amx [--rounds R] [--only SUBSTRING]. Needs AMX. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/timer.h"
#include "kernels/cpu_peak.h"
#include "ops/gemm.h"
#include "ops/gemm_amx.h"

typedef struct Shape {
    const char *name;
    int ta, tb, M, N, K;
} Shape;

static const Shape shapes[] = {
    {"q fwd (x Wq^T)", 0, 1, 1024, 2048, 1024},
    {"q dX (dY Wq)", 0, 0, 1024, 1024, 2048},
    {"q dW (dY^T x)", 1, 0, 2048, 1024, 1024},
    {"k, v fwd", 0, 1, 1024, 1024, 1024},
    {"k, v dX", 0, 0, 1024, 1024, 1024},
    {"k, v dW", 1, 0, 1024, 1024, 1024},
    {"w1, w3 fwd", 0, 1, 1024, 3072, 1024},
    {"w1, w3 dX", 0, 0, 1024, 1024, 3072},
    {"w1, w3 dW", 1, 0, 3072, 1024, 1024},
    {"w2 fwd", 0, 1, 1024, 1024, 3072},
    {"w2 dX", 0, 0, 1024, 3072, 1024},
    {"w2 dW", 1, 0, 1024, 3072, 1024},
    {"lm_head fwd (x E^T)", 0, 1, 1024, 151936, 1024},
    {"lm_head dX (dlogits E)", 0, 0, 1024, 1024, 151936},
    {"lm_head dW (dlogits^T x)", 1, 0, 151936, 1024, 1024},
};

/* Best of 3 calls of one side, in seconds. */
static double best_of(int amx, const Shape *s, const uint16_t *A, const uint16_t *B, float *C,
                      void *scratch) {
    int lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now_seconds();
        if (amx)
            gemm_amx_bf16(s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, lda, B, ldb, 0.0f, C, s->N,
                          scratch);
        else
            gemm_bf16(s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, lda, B, ldb, 0.0f, C, s->N);
        double dt = now_seconds() - t0;
        if (dt < best) best = dt;
    }
    return best;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int rounds = 3;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc)
            only = argv[++i];
        else {
            fprintf(stderr, "usage: bench_gemm_amx [--rounds R] [--only SUBSTRING]\n");
            return 2;
        }
    }
    if (rounds < 1 || rounds > 64) {
        fprintf(stderr, "bench_gemm_amx: --rounds must be 1..64\n");
        return 2;
    }
    if (!gemm_amx_ready()) {
        printf("bench_gemm_amx: this CPU (or kernel) offers no AMX; nothing to compare\n");
        return 0;
    }
    gemm_set_backend("dnnl");
    CpuPeak peak;
    cpu_peak_measure(&peak);
    printf("%s\nAMX peak %.0f GFLOP/s (%s); %d rounds, best of 3 calls per side and round\n",
           gemm_backend_name(), peak.bf16_gflops, peak.bf16_unit, rounds);
    printf("%-30s %8s %8s %7s %7s %6s %9s\n", "product", "oneDNN", "AMX", "%peak", "%peak", "ratio",
           "max diff");
    void *scratch = malloc(GEMM_AMX_SCRATCH_BYTES);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const Shape *s = &shapes[i];
        if (only && !strstr(s->name, only)) continue;
        long na = (long)s->M * s->K, nb = (long)s->K * s->N, nc = (long)s->M * s->N;
        uint16_t *A = malloc((size_t)na * 2), *B = malloc((size_t)nb * 2);
        float *C0 = malloc((size_t)nc * 4), *C1 = malloc((size_t)nc * 4);
        /* multiples of 1/8 in [-1, 1]: every product and partial sum is exact in fp32, so the
         * two sides must agree to the bit whatever their summation order */
        for (long j = 0; j < na; j++)
            A[j] = f32_to_bf16((float)((j * 7919) % 17 - 8) / 8);
        for (long j = 0; j < nb; j++)
            B[j] = f32_to_bf16((float)((j * 104729) % 13 - 6) / 8);
        double t[2][64];
        for (int r = 0; r < rounds; r++)
            for (int k = 0; k < 2; k++) {
                int amx = (r + k + (int)i) % 2;
                t[amx][r] = best_of(amx, s, A, B, amx ? C1 : C0, scratch);
            }
        double diff = 0;
        for (long j = 0; j < nc; j++)
            diff = fmax(diff, fabs((double)C0[j] - C1[j]));
        double flop = 2.0 * s->M * s->N * s->K, g[2];
        for (int k = 0; k < 2; k++) {
            qsort(t[k], (size_t)rounds, sizeof t[k][0], cmp_double);
            g[k] = flop / t[k][rounds / 2] * 1e-9;
        }
        printf("%-30s %8.0f %8.0f %6.1f%% %6.1f%% %5.2fx %9.2g\n", s->name, g[0], g[1],
               100 * g[0] / peak.bf16_gflops, 100 * g[1] / peak.bf16_gflops, g[1] / g[0], diff);
        free(A), free(B), free(C0), free(C1);
    }
    free(scratch);
    return 0;
}
