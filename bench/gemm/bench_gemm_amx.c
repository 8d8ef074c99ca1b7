/* qtitan's AMX tile kernel (ops/gemm_amx.h) against oneDNN's bf16 matmul (gemm.h's dnnl
 * backend, the same K-chunked primitives auto ran before the kernel) on the products of one
 * Qwen3-0.6B training step at 2 x 512 tokens (--tokens T: T instead), as the trainer issues them
 * (forward, dX, dW of each linear and of the LM head; shapes read off a profiler trace; wo's are
 * q's transposed). The products whose B is a weight (forward and dX) also run with that weight
 * prepacked (gemm_amx_prepack, as the trainer keeps the layers' copies: ops/gemm.h), the
 * prepack's own time printed apart. The sides alternate within each round, each figure is the
 * best of 3 calls, and a side's result is the median over the rounds; GFLOP/s are wall-clock,
 * next to this machine's measured AMX peak.
 * Usage: bench_gemm_amx [--rounds R] [--only SUBSTRING] [--tokens T]. Needs AMX (or
 * QT_AMX_EMULATE=1 for a check that it runs: the timings are then the emulation's). */
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

/* tok: the dimension that counts tokens ('M' forward and dX, 'K' dW); weight: B is the weight. */
typedef struct Shape {
    const char *name;
    int ta, tb, M, N, K;
    char tok;
    int weight;
} Shape;

static const Shape shapes[] = {
    {"q fwd (x Wq^T)", 0, 1, 1024, 2048, 1024, 'M', 1},
    {"q dX (dY Wq)", 0, 0, 1024, 1024, 2048, 'M', 1},
    {"q dW (dY^T x)", 1, 0, 2048, 1024, 1024, 'K', 0},
    {"k, v fwd", 0, 1, 1024, 1024, 1024, 'M', 1},
    {"k, v dX", 0, 0, 1024, 1024, 1024, 'M', 1},
    {"k, v dW", 1, 0, 1024, 1024, 1024, 'K', 0},
    {"w1, w3 fwd", 0, 1, 1024, 3072, 1024, 'M', 1},
    {"w1, w3 dX", 0, 0, 1024, 1024, 3072, 'M', 1},
    {"w1, w3 dW", 1, 0, 3072, 1024, 1024, 'K', 0},
    {"w2 fwd", 0, 1, 1024, 1024, 3072, 'M', 1},
    {"w2 dX", 0, 0, 1024, 3072, 1024, 'M', 1},
    {"w2 dW", 1, 0, 1024, 3072, 1024, 'K', 0},
    {"lm_head fwd (x E^T)", 0, 1, 1024, 151936, 1024, 'M', 1},
    {"lm_head dX (dlogits E)", 0, 0, 1024, 1024, 151936, 'M', 1},
    {"lm_head dW (dlogits^T x)", 1, 0, 151936, 1024, 1024, 'K', 0},
};

enum { ONEDNN, AMX, AMX_PREPACKED, SIDES };

/* Best of 3 calls of one side, in seconds. Bp: B prepacked (AMX_PREPACKED). */
static double best_of(int side, const Shape *s, const uint16_t *A, const uint16_t *B,
                      const uint16_t *Bp, float *C, void *scratch) {
    int lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now_seconds();
        if (side == AMX)
            gemm_amx_bf16(s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, lda, B, ldb, 0.0f, C, s->N,
                          scratch);
        else if (side == AMX_PREPACKED)
            gemm_amx_bf16_packed(s->ta, s->M, s->N, s->K, 1.0f, A, lda, Bp, 0.0f, C, s->N, scratch);
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
    int rounds = 3, tokens = 1024;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc)
            only = argv[++i];
        else if (strcmp(argv[i], "--tokens") == 0 && i + 1 < argc)
            tokens = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_gemm_amx [--rounds R] [--only SUBSTRING] [--tokens T]\n");
            return 2;
        }
    }
    if (rounds < 1 || rounds > 64 || tokens < 1 || tokens > 65536) {
        fprintf(stderr, "bench_gemm_amx: --rounds must be 1..64 and --tokens 1..65536\n");
        return 2;
    }
    if (!gemm_amx_ready()) {
        printf("bench_gemm_amx: this CPU (or kernel) offers no AMX; nothing to compare\n");
        return 0;
    }
    gemm_set_backend("dnnl");
    CpuPeak peak;
    cpu_peak_measure(&peak);
    printf("%s\nbf16 peak %.0f GFLOP/s (%s)%s; %d tokens; %d rounds, best of 3 calls per side and "
           "round\n",
           gemm_backend_name(), peak.bf16_gflops, peak.bf16_unit,
           gemm_amx_emulated ? " (tiles EMULATED: the timings are the emulation's)" : "", tokens,
           rounds);
    printf("%-30s %8s %8s %8s %7s %7s %7s %9s %9s\n", "product", "oneDNN", "AMX", "prepack",
           "%peak", "%peak", "%peak", "pack (ms)", "max diff");
    void *scratch = malloc(GEMM_AMX_SCRATCH_BYTES);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        Shape sh = shapes[i], *s = &sh;
        if (only && !strstr(s->name, only)) continue;
        if (s->tok == 'M')
            s->M = tokens;
        else
            s->K = tokens;
        long na = (long)s->M * s->K, nb = (long)s->K * s->N, nc = (long)s->M * s->N;
        uint16_t *A = malloc((size_t)na * 2), *B = malloc((size_t)nb * 2), *Bp = NULL;
        float *C[SIDES];
        for (int k = 0; k < SIDES; k++)
            C[k] = malloc((size_t)nc * 4);
        /* multiples of 1/8 in [-1, 1]: every product and partial sum is exact in fp32, so the
         * sides must agree to the bit whatever their summation order */
        for (long j = 0; j < na; j++)
            A[j] = f32_to_bf16((float)((j * 7919) % 17 - 8) / 8);
        for (long j = 0; j < nb; j++)
            B[j] = f32_to_bf16((float)((j * 104729) % 13 - 6) / 8);
        double pack = NAN;
        int sides = s->weight ? SIDES : AMX_PREPACKED;
        if (s->weight) {
            Bp = aligned_alloc(64, (gemm_amx_packed_values(s->K, s->N) * 2 + 63) / 64 * 64);
            for (int rep = 0; rep < 3; rep++) {
                double t0 = now_seconds();
                gemm_amx_prepack(B, s->tb, s->tb ? s->K : s->N, s->K, s->N, Bp);
                double dt = now_seconds() - t0;
                if (!(dt >= pack)) pack = dt;
            }
        }
        double t[SIDES][64];
        for (int r = 0; r < rounds; r++)
            for (int k = 0; k < sides; k++) {
                int side = (r + k + (int)i) % sides;
                t[side][r] = best_of(side, s, A, B, Bp, C[side], scratch);
            }
        double diff = 0, flop = 2.0 * s->M * s->N * s->K, g[SIDES] = {NAN, NAN, NAN};
        for (int k = 1; k < sides; k++)
            for (long j = 0; j < nc; j++)
                diff = fmax(diff, fabs((double)C[0][j] - C[k][j]));
        for (int k = 0; k < sides; k++) {
            qsort(t[k], (size_t)rounds, sizeof t[k][0], cmp_double);
            g[k] = flop / t[k][rounds / 2] * 1e-9;
        }
        printf("%-30s %8.0f %8.0f %8.0f %6.1f%% %6.1f%% %6.1f%% %9.2f %9.2g\n", s->name, g[0], g[1],
               g[2], 100 * g[0] / peak.bf16_gflops, 100 * g[1] / peak.bf16_gflops,
               100 * g[2] / peak.bf16_gflops, 1e3 * pack, diff);
        free(A), free(B), free(Bp);
        for (int k = 0; k < SIDES; k++)
            free(C[k]);
    }
    free(scratch);
    return 0;
}
