/* Register-only throughput loops behind kernels/cpu_peak.h. The chains start at different
 * values and the multipliers come from the caller, so the compiler can neither merge the 12
 * chains into one nor fold the arithmetic away (tests/test_cpu_peak.c checks the checksums). */
#include "kernels/cpu_peak.h"

#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "ops/gemm_amx.h"

/* CPUID leaf 7 feature bit (GCC and clang disagree on __builtin_cpu_supports names here). */
static int cpuid7(unsigned sub, int reg, int bit) {
    unsigned r[4];
    if (!__get_cpuid_count(7, sub, &r[0], &r[1], &r[2], &r[3])) return 0;
    return (r[reg] >> bit) & 1;
}
int cpu_has_avx512_bf16(void) {
    return __builtin_cpu_supports("avx512f") && cpuid7(1, 0, 5);
}

#define CHAINS(init)                                                                               \
    init(0);                                                                                       \
    init(1);                                                                                       \
    init(2);                                                                                       \
    init(3);                                                                                       \
    init(4);                                                                                       \
    init(5);                                                                                       \
    init(6);                                                                                       \
    init(7);                                                                                       \
    init(8);                                                                                       \
    init(9);                                                                                       \
    init(10);                                                                                      \
    init(11)

/* 12 chains hide the 4-cycle FMA latency on two ports. */
__attribute__((target("avx512f"))) static double fma512(long iters, float x, float y) {
    __m512 vx = _mm512_set1_ps(x), vy = _mm512_set1_ps(y);
#define INIT(c) __m512 a##c = _mm512_set1_ps((float)c)
    CHAINS(INIT);
#undef INIT
    for (long i = 0; i < iters; i++) {
#define STEP(c) a##c = _mm512_fmadd_ps(a##c, vx, vy)
        CHAINS(STEP);
#undef STEP
    }
    double s = 0;
#define SUM(c) s += _mm512_reduce_add_ps(a##c)
    CHAINS(SUM);
#undef SUM
    return s;
}

__attribute__((target("avx2,fma"))) static double fma256(long iters, float x, float y) {
    __m256 vx = _mm256_set1_ps(x), vy = _mm256_set1_ps(y);
#define INIT(c) __m256 a##c = _mm256_set1_ps((float)c)
    CHAINS(INIT);
#undef INIT
    for (long i = 0; i < iters; i++) {
#define STEP(c) a##c = _mm256_fmadd_ps(a##c, vx, vy)
        CHAINS(STEP);
#undef STEP
    }
    double s = 0;
    float lanes[8];
#define SUM(c)                                                                                     \
    _mm256_storeu_ps(lanes, a##c);                                                                 \
    for (int l = 0; l < 8; l++)                                                                    \
    s += lanes[l]
    CHAINS(SUM);
#undef SUM
    return s;
}

static double fma_scalar(long iters, float x, float y) {
    float a[12];
    for (int c = 0; c < 12; c++)
        a[c] = (float)c;
    for (long i = 0; i < iters; i++)
        for (int c = 0; c < 12; c++)
            a[c] = a[c] * x + y;
    double s = 0;
    for (int c = 0; c < 12; c++)
        s += a[c];
    return s;
}

int cpu_peak_fma_lanes(void) {
    return __builtin_cpu_supports("avx512f")                                 ? 16
           : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 8
                                                                             : 1;
}

double cpu_peak_fma_loop(long iters, float x, float y) {
    int lanes = cpu_peak_fma_lanes();
    return lanes == 16  ? fma512(iters, x, y)
           : lanes == 8 ? fma256(iters, x, y)
                        : fma_scalar(iters, x, y);
}

/* vdpbf16ps: per fp32 lane, a += x0*y0 + x1*y1 over a pair of bf16 values. */
__attribute__((target("avx512f,avx512bf16"))) static double dpbf16(long iters) {
    __m512bh one = (__m512bh)_mm512_set1_epi16(0x3f80);
#define INIT(c) __m512 a##c = _mm512_set1_ps((float)c)
    CHAINS(INIT);
#undef INIT
    for (long i = 0; i < iters; i++) {
#define STEP(c) a##c = _mm512_dpbf16_ps(a##c, one, one)
        CHAINS(STEP);
#undef STEP
    }
    double s = 0;
#define SUM(c) s += _mm512_reduce_add_ps(a##c)
    CHAINS(SUM);
#undef SUM
    return s;
}

double cpu_peak_dpbf16_loop(long iters) {
    return cpu_has_avx512_bf16() ? dpbf16(iters) : -1;
}

/* Tiles 0-3: 16x16 fp32 accumulators; 4-5: A (16 rows x 32 bf16); 6-7: B (16 row-pairs x 16
 * columns, VNNI layout). Each tdpbf16ps is 16*16*32 multiply-adds. */
__attribute__((target("amx-tile,amx-bf16"))) static double amx(long iters) {
    _Alignas(64) uint16_t ones[16 * 32];
    _Alignas(64) float out[16 * 16];
    for (int i = 0; i < 16 * 32; i++)
        ones[i] = 0x3f80; /* bf16 1.0 */
    gemm_amx_configure();
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, ones, 64);
    _tile_loadd(5, ones, 64);
    _tile_loadd(6, ones, 64);
    _tile_loadd(7, ones, 64);
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

double cpu_peak_amx_loop(long iters) {
    return gemm_amx_ready() && !gemm_amx_emulated ? amx(iters) : -1; /* the hardware's tiles */
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* Best-of-5 GFLOP/s of one loop kind on every thread; flop_per_iter is per thread. */
static double best_rate(int kind, long iters, double flop_per_iter) {
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double sink = 0, t0 = now();
#pragma omp parallel reduction(+ : sink)
        sink += kind == 0   ? cpu_peak_fma_loop(iters, 1.0f, 1.0f)
                : kind == 1 ? cpu_peak_dpbf16_loop(iters)
                            : cpu_peak_amx_loop(iters);
        double dt = now() - t0;
        double rate = omp_get_max_threads() * iters * flop_per_iter / dt;
        if (sink != 0 && rate > best) best = rate; /* sink keeps the loops alive */
    }
    return best * 1e-9;
}

void cpu_peak_measure(CpuPeak *out) {
    int lanes = cpu_peak_fma_lanes();
    /* Iteration counts keep each run near 5-10 ms and the checksums exact in fp32. */
    out->fp32_gflops = best_rate(0, lanes > 1 ? 4000000 : 1000000, 12.0 * lanes * 2);
    snprintf(out->fp32_unit, sizeof out->fp32_unit, "%s",
             lanes == 16  ? "avx512 vfmadd"
             : lanes == 8 ? "avx2 vfmadd"
                          : "scalar fma");
    out->bf16_gflops = out->fp32_gflops;
    snprintf(out->bf16_unit, sizeof out->bf16_unit, "fp32 (no bf16 unit)");
    if (cpu_peak_amx_loop(1) >= 0) {
        out->bf16_gflops = best_rate(2, 200000, 4.0 * 16 * 16 * 32 * 2);
        snprintf(out->bf16_unit, sizeof out->bf16_unit, "amx tdpbf16ps");
    } else if (cpu_has_avx512_bf16()) {
        out->bf16_gflops = best_rate(1, 4000000, 12.0 * 32 * 2);
        snprintf(out->bf16_unit, sizeof out->bf16_unit, "avx512_bf16 vdpbf16ps");
    }
}
