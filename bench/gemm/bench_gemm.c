/* GEMM throughput: GFLOP/s of each gemm.h backend for fp32 and bf16 on square products and
 * on Qwen3-0.6B's real shapes, next to the measured FMA peak of this machine (a register-only
 * AVX-512 loop on every OpenMP thread), so results read as a fraction of peak.
 * Usage: bench_gemm [--quick] [--lmhead] [--only SUBSTRING]   (--quick: 64 and 512 only; --lmhead
 * adds the 151936-wide LM head product, ~160 GFLOP per call). Each figure is the best of several
 * timed calls, since the machine may be shared. */
#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/dtype.h"
#include "ops/gemm.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* 12 independent FMA chains hide the 4-cycle latency on two FMA ports. */
__attribute__((target("avx512f"))) static float fma_loop(long iters) {
    __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-3f);
    /* Distinct starting values: identical chains would be merged into one by the compiler. */
    __m512 a0 = _mm512_set1_ps(0), a1 = _mm512_set1_ps(1), a2 = _mm512_set1_ps(2),
           a3 = _mm512_set1_ps(3), a4 = _mm512_set1_ps(4), a5 = _mm512_set1_ps(5),
           a6 = _mm512_set1_ps(6), a7 = _mm512_set1_ps(7), a8 = _mm512_set1_ps(8),
           a9 = _mm512_set1_ps(9), a10 = _mm512_set1_ps(10), a11 = _mm512_set1_ps(11);
    for (long i = 0; i < iters; i++) {
        a0 = _mm512_fmadd_ps(a0, x, y);
        a1 = _mm512_fmadd_ps(a1, x, y);
        a2 = _mm512_fmadd_ps(a2, x, y);
        a3 = _mm512_fmadd_ps(a3, x, y);
        a4 = _mm512_fmadd_ps(a4, x, y);
        a5 = _mm512_fmadd_ps(a5, x, y);
        a6 = _mm512_fmadd_ps(a6, x, y);
        a7 = _mm512_fmadd_ps(a7, x, y);
        a8 = _mm512_fmadd_ps(a8, x, y);
        a9 = _mm512_fmadd_ps(a9, x, y);
        a10 = _mm512_fmadd_ps(a10, x, y);
        a11 = _mm512_fmadd_ps(a11, x, y);
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
    return _mm512_reduce_add_ps(s);
}

/* Same with vdpbf16ps: each instruction does 32 bf16 multiply-adds into 16 fp32 lanes. */
__attribute__((target("avx512f,avx512bf16"))) static float dpbf16_loop(long iters) {
    __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3a80);
    __m512 a0 = _mm512_set1_ps(0), a1 = _mm512_set1_ps(1), a2 = _mm512_set1_ps(2),
           a3 = _mm512_set1_ps(3), a4 = _mm512_set1_ps(4), a5 = _mm512_set1_ps(5),
           a6 = _mm512_set1_ps(6), a7 = _mm512_set1_ps(7), a8 = _mm512_set1_ps(8),
           a9 = _mm512_set1_ps(9), a10 = _mm512_set1_ps(10), a11 = _mm512_set1_ps(11);
    for (long i = 0; i < iters; i++) {
        a0 = _mm512_dpbf16_ps(a0, x, y);
        a1 = _mm512_dpbf16_ps(a1, x, y);
        a2 = _mm512_dpbf16_ps(a2, x, y);
        a3 = _mm512_dpbf16_ps(a3, x, y);
        a4 = _mm512_dpbf16_ps(a4, x, y);
        a5 = _mm512_dpbf16_ps(a5, x, y);
        a6 = _mm512_dpbf16_ps(a6, x, y);
        a7 = _mm512_dpbf16_ps(a7, x, y);
        a8 = _mm512_dpbf16_ps(a8, x, y);
        a9 = _mm512_dpbf16_ps(a9, x, y);
        a10 = _mm512_dpbf16_ps(a10, x, y);
        a11 = _mm512_dpbf16_ps(a11, x, y);
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
    return _mm512_reduce_add_ps(s);
}

/* AMX: four 16x16 fp32 accumulator tiles fed by two A and two B tiles; each tdpbf16ps is
 * 16*16*32 multiply-adds. Linux hands out the tile state only on request (arch_prctl). */
typedef struct TileCfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileCfg;

/* CPUID feature bit (GCC and clang disagree on __builtin_cpu_supports names for these). */
static int cpu_has(unsigned leaf, unsigned sub, int reg, int bit) {
    unsigned r[4];
    if (!__get_cpuid_count(leaf, sub, &r[0], &r[1], &r[2], &r[3])) return 0;
    return (r[reg] >> bit) & 1;
}
#define HAS_AVX512_BF16() cpu_has(7, 1, 0, 5)                         /* EAX bit 5 */
#define HAS_AMX_BF16() (cpu_has(7, 0, 3, 22) && cpu_has(7, 0, 3, 24)) /* EDX: AMX-BF16, -TILE */

static int amx_enable(void) {
    const long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

__attribute__((target("amx-tile,amx-bf16"))) static float amx_loop(long iters) {
    static _Alignas(64) uint16_t src[16 * 32];
    _Alignas(64) float out[16 * 16];
    for (int i = 0; i < 16 * 32; i++)
        src[i] = 0x3c00; /* bf16 2^-7 */
    TileCfg cfg = {.palette = 1};
    for (int t = 0; t < 8; t++)
        cfg.colsb[t] = 64, cfg.rows[t] = 16;
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, src, 64);
    _tile_loadd(5, src, 64);
    _tile_loadd(6, src, 64);
    _tile_loadd(7, src, 64);
    for (long i = 0; i < iters; i++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, out, 64);
    _tile_release();
    return out[0];
}

static double amx_peak(void) {
    const long iters = 1000000;
    double best = 0;
    volatile float sink = 0;
    for (int rep = 0; rep < 10; rep++) {
        double t0 = now();
#pragma omp parallel reduction(+ : sink)
        sink += amx_loop(iters);
        double dt = now() - t0;
        double flop = (double)omp_get_max_threads() * iters * 4 * 16 * 16 * 32 * 2;
        if (flop / dt > best) best = flop / dt;
    }
    return best * 1e-9;
}

/* Best-of-10 GFLOP/s of the register loop on all threads; flop_per_iter per thread. */
static double peak(int bf16) {
    const long iters = 20000000;
    double best = 0;
    volatile float sink = 0;
    for (int rep = 0; rep < 10; rep++) {
        double t0 = now();
#pragma omp parallel reduction(+ : sink)
        sink += bf16 ? dpbf16_loop(iters) : fma_loop(iters);
        double dt = now() - t0;
        double flop = (double)omp_get_max_threads() * iters * 12 * 16 * 2 * (bf16 ? 2 : 1);
        if (flop / dt > best) best = flop / dt;
    }
    return best * 1e-9;
}

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
        double t0 = now();
        if (bf16)
            gemm_bf16(s->ta, s->tb, s->M, s->N, s->K, 1.0f, Ah, lda, Bh, ldb, 0.0f, C, s->N);
        else
            gemm_f32(s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, lda, B, ldb, 0.0f, C, s->N);
        double dt = now() - t0;
        if (rep > 0 && dt < best) best = dt; /* call 0 builds the primitive */
        spent += dt;
    }
    return flop / best * 1e-9;
}

int main(int argc, char **argv) {
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
            fprintf(stderr, "usage: bench_gemm [--quick] [--lmhead] [--only SUBSTRING]\n");
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

    int avx512 = __builtin_cpu_supports("avx512f");
    double pf = avx512 ? peak(0) : 0, pb = avx512 && HAS_AVX512_BF16() ? peak(1) : 0;
    double pa = HAS_AMX_BF16() && amx_enable() ? amx_peak() : 0;
    printf("threads %d\nfp32 FMA peak %.0f GFLOP/s; bf16 peak %.0f GFLOP/s (AVX512_BF16 "
           "vdpbf16ps), %.0f GFLOP/s (AMX tdpbf16ps; 0 = no AMX)\n",
           omp_get_max_threads(), pf, pb, pa);
    if (pa > pb) pb = pa; /* bf16 %%peak is against the best bf16 unit present */
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
