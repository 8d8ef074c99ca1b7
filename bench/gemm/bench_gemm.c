/* GEMM throughput: GFLOP/s of each gemm.h backend for fp32 and bf16 on square products and
 * on Qwen3-0.6B's real shapes, next to this machine's measured peaks (kernels/cpu_peak.h:
 * register-only FMA and bf16 loops on every OpenMP thread), so results read as a fraction of
 * peak.
 * Usage: bench_gemm [--quick] [--lmhead] [--only SUBSTRING]   (--quick: 64 and 512 only; --lmhead
 * adds the 151936-wide LM head product, ~160 GFLOP per call). Each figure is the best of several
 * timed calls, since the machine may be shared.
 *        bench_gemm --rows [ROUNDS]   fp32 x W^T at 0.6B and debugmodel weight shapes for M = 1 to
 * 1024 rows on dnnl_sgemm, the matmul primitive and auto (which picks between them by M,
 * ops/gemm.h), the three alternating within each round; the best GFLOP/s over the rounds. */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/timer.h"
#include "kernels/cpu_peak.h"
#include "ops/gemm.h"

typedef struct Shape {
    const char *name;
    int ta, tb, M, N, K;
} Shape;

/* Times C = op(A) op(B) for one backend and dtype; returns the best GFLOP/s. */
static double time_gemm(const Shape *s, int bf16, float *A, float *B, uint16_t *Ah, uint16_t *Bh,
                        float *C) {
    int lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
    double flop = 2.0 * s->M * s->N * s->K, best = 1e30, spent = 0;
    for (int rep = 0; rep < 12 && (rep < 3 || spent < 1.0); rep++) {
        double t0 = now_seconds();
        if (bf16)
            gemm_bf16(s->ta, s->tb, s->M, s->N, s->K, 1.0f, Ah, lda, Bh, ldb, 0.0f, C, s->N);
        else
            gemm_f32(s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, lda, B, ldb, 0.0f, C, s->N);
        double dt = now_seconds() - t0;
        if (rep > 0 && dt < best) best = dt; /* call 0 builds the primitive */
        spent += dt;
    }
    return flop / best * 1e-9;
}

/* --rows: where dnnl_sgemm and the matmul primitive part ways on fp32 products x W^T. */
static int rows_sweep(int rounds) {
    static const int Ms[] = {1, 4, 8, 12, 16, 24, 32, 64, 128, 256, 384, 512, 1024};
    static const struct {
        const char *name;
        int N, K;
    } W[] = {{"0.6B w1 3072x1024", 3072, 1024},
             {"0.6B w2 1024x3072", 1024, 3072},
             {"debugmodel wq 2048x256", 2048, 256}};
    const char *backends[] = {"sgemm", "dnnl", "auto"};
    enum { NM = sizeof Ms / sizeof Ms[0], NW = sizeof W / sizeof W[0] };
    size_t maxa = 1024 * 3072, maxb = 3072 * 1024, maxc = 1024 * 3072;
    float *A = malloc(maxa * 4), *B = malloc(maxb * 4), *C = malloc(maxc * 4);
    if (!A || !B || !C) return 1;
    for (size_t i = 0; i < maxa; i++)
        A[i] = (float)((i * 7919 % 1000) / 1000.0 - 0.5);
    for (size_t i = 0; i < maxb; i++)
        B[i] = (float)((i * 104729 % 1000) / 1000.0 - 0.5);
    static double best[NW][NM][3];
    for (int r = 0; r < rounds; r++)
        for (int w = 0; w < NW; w++)
            for (int m = 0; m < NM; m++)
                for (int b = 0; b < 3; b++) {
                    int bi = (b + r + m) % 3; /* a different backend first each time */
                    gemm_set_backend(backends[bi]);
                    Shape s = {"", 0, 1, Ms[m], W[w].N, W[w].K};
                    double g = time_gemm(&s, 0, A, B, NULL, NULL, C);
                    if (g > best[w][m][bi]) best[w][m][bi] = g;
                }
    printf("threads %d; fp32 x W^T, GFLOP/s, best of %d round(s)\n", omp_get_max_threads(), rounds);
    for (int w = 0; w < NW; w++) {
        printf("\n%-24s %8s %8s %8s\n", W[w].name, "sgemm", "matmul", "auto");
        for (int m = 0; m < NM; m++)
            printf("  M %4d %24.0f %8.0f %8.0f\n", Ms[m], best[w][m][0], best[w][m][1],
                   best[w][m][2]);
    }
    free(A), free(B), free(C);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "--rows")) {
        int rounds = argc > 2 ? atoi(argv[2]) : 2;
        if (rounds < 1 || argc > 3) {
            fprintf(stderr, "bench_gemm --rows [ROUNDS]: ROUNDS must be a whole number >= 1\n");
            return 2;
        }
        return rows_sweep(rounds);
    }
    int quick = 0, lmhead = 0;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--lmhead"))
            lmhead = 1;
        else {
            fprintf(stderr, "usage: bench_gemm [--quick] [--lmhead] [--only SUBSTRING] | --rows "
                            "[ROUNDS]\n");
            return 2;
        }
    }
    /* T = 512 tokens (batch 1 x seq 512), D = 1024, F = 3072, (H+2K)E = 4096 fused QKV rows.
     * Weights are stored (out, in) as in HF checkpoints, so the forward is x W^T (tb = 1);
     * backward: dX = dY W (nn), dW += dY^T X (ta = 1). */
    const Shape shapes[] = {
        {"sq64 nn (per-call overhead)", 0, 0, 64, 64, 64},
        {"sq512 nn", 0, 0, 512, 512, 512},
        {"sq1024 nn", 0, 0, 1024, 1024, 1024},
        {"sq2048 nn", 0, 0, 2048, 2048, 2048},
        {"fwd x*Wup^T T512 D1024 F3072", 0, 1, 512, 3072, 1024},
        {"fwd x*Wqkv^T T512 D1024 4096", 0, 1, 512, 4096, 1024},
        {"fwd x*Wo^T T512 2048->1024", 0, 1, 512, 1024, 2048},
        {"bwd dX=dY*Wup T512 F3072->1024", 0, 0, 512, 1024, 3072},
        {"bwd dWup=dY^T*X F3072 D1024 T512", 1, 0, 3072, 1024, 512},
        {"attn S=Q*K^T per head T512 E128", 0, 1, 512, 512, 128},
        {"attn O=P*V per head T512 E128", 0, 0, 512, 128, 512},
        {"lmhead x*E^T T512 D1024 V151936", 0, 1, 512, 151936, 1024},
    };
    int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
    size_t maxa = 0, maxb = 0, maxc = 0;
    for (int i = 0; i < nshapes; i++) {
        size_t a = (size_t)shapes[i].M * shapes[i].K, b = (size_t)shapes[i].K * shapes[i].N,
               c = (size_t)shapes[i].M * shapes[i].N;
        if (!lmhead && i == nshapes - 1) continue;
        maxa = a > maxa ? a : maxa;
        maxb = b > maxb ? b : maxb;
        maxc = c > maxc ? c : maxc;
    }
    float *A = malloc(maxa * 4), *B = malloc(maxb * 4), *C = malloc(maxc * 4);
    uint16_t *Ah = malloc(maxa * 2), *Bh = malloc(maxb * 2);
    if (!A || !B || !C || !Ah || !Bh) return 1;
    for (size_t i = 0; i < maxa; i++)
        A[i] = (float)((i * 7919 % 1000) / 1000.0 - 0.5);
    for (size_t i = 0; i < maxb; i++)
        B[i] = (float)((i * 104729 % 1000) / 1000.0 - 0.5);
    for (size_t i = 0; i < maxa; i++)
        Ah[i] = f32_to_bf16(A[i]);
    for (size_t i = 0; i < maxb; i++)
        Bh[i] = f32_to_bf16(B[i]);

    CpuPeak peak;
    cpu_peak_measure(&peak);
    double pf = peak.fp32_gflops, pb = peak.bf16_gflops;
    printf("threads %d\npeak fp32 %.0f GFLOP/s (%s), bf16 %.0f GFLOP/s (%s)\n",
           omp_get_max_threads(), pf, peak.fp32_unit, pb, peak.bf16_unit);
    const char *backends[] = {"dnnl", "sgemm", "ref"};
    for (int b = 0; b < 3; b++) {
        gemm_set_backend(backends[b]);
        printf("\nbackend %s: %s\n", backends[b], gemm_backend_name());
        printf("%-34s %10s %7s %10s %7s\n", "shape (M N K)", "fp32 GF/s", "%peak", "bf16 GF/s",
               "%peak");
        for (int i = 0; i < nshapes; i++) {
            const Shape *s = &shapes[i];
            if (i == nshapes - 1 && !lmhead) continue;
            if ((quick || b == 2) && i > 1) continue; /* the reference is slow */
            if (only && !strstr(s->name, only)) continue;
            double f = time_gemm(s, 0, A, B, Ah, Bh, C);
            double h = time_gemm(s, 1, A, B, Ah, Bh, C);
            printf("%-34s %10.1f %6.0f%% %10.1f %6.0f%%\n", s->name, f, pf > 0 ? 100 * f / pf : 0.0,
                   h, pb > 0 ? 100 * h / pb : 0.0);
            fflush(stdout);
        }
    }
    free(A), free(B), free(C), free(Ah), free(Bh);
    return 0;
}
