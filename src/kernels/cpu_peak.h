/* Peak arithmetic rate of this CPU, measured with register-only loops on every OpenMP thread:
 * the denominator of MFU on CPU (measured once at start-up unless metrics.peak_tflops is set;
 * docs/training.md), and the "%peak" of bench/gemm. On a shared or throttled machine the
 * measurement is low; metrics.peak_tflops overrides it. */
#ifndef QT_CPU_PEAK_H
#define QT_CPU_PEAK_H

typedef struct CpuPeak {
    double fp32_gflops; /* FMA: AVX-512, else AVX2, else scalar */
    double bf16_gflops; /* the fastest bf16 unit: AMX, else AVX512_BF16, else = fp32 */
    char fp32_unit[32]; /* e.g. "avx512 vfmadd" */
    char bf16_unit[32]; /* e.g. "amx tdpbf16ps" */
} CpuPeak;

/* 1 when the CPU has AVX-512F and AVX512_BF16 (vdpbf16ps). */
int cpu_has_avx512_bf16(void);

/* Measures both peaks; takes about 0.1-0.3 s (best of 5 short runs per unit). */
void cpu_peak_measure(CpuPeak *out);

/* The timed loops, exposed so tests can check they do the work they are credited with. Each
 * runs `iters` steps on the calling thread and returns a checksum:
 * fma: 12 chains of a = a*x + y over the widest vector unit present, chain c starting at c;
 *      returns the sum over chains and lanes (x = 1, y = 1 gives lanes*(66 + 12*iters)).
 * dpbf16: 12 chains of a += dot(1.0 pairs) on AVX512_BF16 (each step adds 2 per lane);
 *      returns the sum over chains and lanes, or -1 without AVX512_BF16.
 * amx: four 16x16 tiles, each step adds 32 (all-ones inputs) to every element; returns
 *      element [0][0] of tile 0, or -1 without AMX-BF16 (or without the kernel's permission). */
double cpu_peak_fma_loop(long iters, float x, float y);
/* Lanes of the unit cpu_peak_fma_loop uses: 16 (AVX-512), 8 (AVX2) or 1 (scalar); a loop step
 * is 12 * lanes FMAs, i.e. 24 * lanes FLOPs. */
int cpu_peak_fma_lanes(void);
double cpu_peak_dpbf16_loop(long iters);
double cpu_peak_amx_loop(long iters);

#endif
