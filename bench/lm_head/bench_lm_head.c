/* The output layer (lm_head projection + cross-entropy, forward and backward) at Qwen3-0.6B's
 * shape (D 1024, V 151,936), as one training step runs it: the reference schedule the model
 * used before (full (N, V) fp32 logits, the cpu cross-entropy, linear_cpu's products) against
 * loss_chunked's fused path (LOSS_CHUNK tokens at a time, one exp per logit, no logits kept),
 * each in bf16 (mixed precision) and fp32. Prints seconds, GFLOP/s of the three products
 * (6 N V D) and that as a fraction of this machine's measured peak of the same precision
 * (kernels/cpu_peak.h: the bf16 peak is AMX where present, else vdpbf16ps). The peak is timed
 * in thread CPU time, so beside the wall-clock rate the bench prints the rate per CPU second
 * of the process times the thread count ("cpu GF/s"), which a shared machine's preemption
 * does not lower (spin-waiting threads still count against it).
 * Usage: bench_lm_head [N tokens, default 512] [reps, default 2] [bf16|fp32, default both];
 * best of reps after a warm-up call. Memory: about 4.6 N V bytes + 10 V D bytes (2.1 GiB at N =
 * 512). */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/timer.h"
#include "kernels/cpu_ops.h"
#include "kernels/cpu_peak.h"
#include "kernels/cpu_simd.h"
#include "kernels/kernels.h"
#include "ops/cross_entropy.h"
#include "ops/gemm.h"

static float *randn(long n, float std, unsigned seed) {
    float *x = malloc((size_t)n * sizeof *x);
    unsigned s = seed * 2654435761u + 1;
    for (long i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = std * ((float)(s >> 8) / 16777216.0f - 0.5f) * 3.4f;
    }
    return x;
}

typedef struct {
    long N;
    int D, V;
    float *x, *w, *dx, *dw, *ls, *lse, *ws;
    uint16_t *wb, *scratch;
    int32_t *tg;
} Ctx;

/* What the model ran for the reference op: lm_head through linear_cpu, the cpu CE. */
static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double run_reference(Ctx *c, int bf16) {
    long N = c->N;
    int D = c->D, V = c->V;
    double t0 = now_seconds();
    if (bf16)
        linear_cpu.forward_bf16(c->ws, c->x, c->wb, c->scratch, N, D, V);
    else
        linear_cpu.forward(c->ws, c->x, c->w, N, D, V);
    cross_entropy_cpu.forward(c->ls, c->lse, c->ws, c->tg, N, V);
    cross_entropy_cpu.backward(c->ws, c->ws, c->lse, c->tg, N, V, 1.0f / (float)N);
    if (bf16)
        linear_cpu.backward_bf16(c->dx, c->dw, c->ws, c->x, c->wb, c->scratch, N, D, V, 0.0f);
    else
        linear_cpu.backward(c->dx, c->dw, c->ws, c->x, c->w, N, D, V, 0.0f);
    return now_seconds() - t0;
}

static double run_fused(Ctx *c, int bf16) {
    double t0 = now_seconds();
    loss_chunked.forward_backward(c->ls, c->lse, c->dx, c->dw, c->ws, c->x, c->w,
                                  bf16 ? c->wb : NULL, c->scratch, c->tg, &linear_cpu, c->N, c->D,
                                  c->V, 1.0f / (float)c->N);
    return now_seconds() - t0;
}

int main(int argc, char **argv) {
    Ctx c = {.N = argc > 1 ? atol(argv[1]) : 512, .D = 1024, .V = 151936};
    int reps = argc > 2 ? atoi(argv[2]) : 2;
    const char *prec = argc > 3 ? argv[3] : "both";
    int lo = strcmp(prec, "bf16") == 0, hi = strcmp(prec, "fp32") != 0;
    if (c.N <= 0 || reps <= 0 || (strcmp(prec, "both") && strcmp(prec, "bf16") && lo == hi)) {
        fprintf(stderr, "usage: bench_lm_head [N > 0] [reps > 0] [bf16|fp32|both]\n");
        return 2;
    }
    long N = c.N, VD = (long)c.V * c.D;
    CpuPeak pk;
    cpu_peak_measure(&pk);
    printf("gemm: %s\n", gemm_backend_name());
    printf("peak fp32 %.0f GFLOP/s (%s), bf16 %.0f GFLOP/s (%s)\n", pk.fp32_gflops, pk.fp32_unit,
           pk.bf16_gflops, pk.bf16_unit);
    c.x = randn(N * c.D, 1.0f, 1), c.w = randn(VD, 0.02f, 2);
    c.dx = calloc((size_t)N * c.D, 4), c.dw = calloc((size_t)VD, 4);
    c.ls = calloc((size_t)N, 4), c.lse = calloc((size_t)N, 4);
    long wsf = loss_chunked.workspace_floats(N, c.D, c.V);     /* fused: a chunk, or its panels */
    c.ws = calloc((size_t)(N * c.V > wsf ? N * c.V : wsf), 4); /* the reference's full logits */
    c.wb = malloc((size_t)VD * 2), c.scratch = malloc((size_t)N * (c.D + c.V) * 2);
    c.tg = malloc((size_t)N * 4);
    for (long i = 0; i < N; i++)
        c.tg[i] = (int32_t)((i * 7919) % c.V);
    simd_f32_to_bf16(c.wb, c.w, VD);
    double flop = 6.0 * (double)N * c.V * c.D;
    printf("N %ld D %d V %d: %.0f GFLOP per forward+backward (3 products)\n", N, c.D, c.V,
           flop * 1e-9);
    printf("%-10s %-5s %9s %9s %8s %9s %8s %10s\n", "schedule", "prec", "seconds", "GFLOP/s",
           "%peak", "cpu GF/s", "%peak", "loss");
    for (int bf16 = hi; bf16 >= lo; bf16--) {
        for (int fused = 0; fused <= 1; fused++) {
            double best = 1e30, best_cpu = 1e30;
            for (int r = 0; r <= reps; r++) {
                double c0 = cpu_seconds();
                double t = fused ? run_fused(&c, bf16) : run_reference(&c, bf16);
                double ct = (cpu_seconds() - c0) / omp_get_max_threads();
                if (r > 0 && t < best) best = t; /* call 0 builds the primitives */
                if (r > 0 && ct < best_cpu) best_cpu = ct;
            }
            double sum = 0;
            for (long i = 0; i < N; i++)
                sum += c.ls[i];
            double gf = flop / best * 1e-9, peak = bf16 ? pk.bf16_gflops : pk.fp32_gflops;
            double cgf = flop / best_cpu * 1e-9;
            printf("%-10s %-5s %9.2f %9.1f %7.1f%% %9.1f %7.1f%% %10.6f\n",
                   fused ? "fused" : "reference", bf16 ? "bf16" : "fp32", best, gf, 100 * gf / peak,
                   cgf, 100 * cgf / peak, sum / (double)N);
            fflush(stdout);
        }
    }
    free(c.x), free(c.w), free(c.dx), free(c.dw), free(c.ls), free(c.lse), free(c.ws), free(c.wb);
    free(c.scratch), free(c.tg);
    return 0;
}
