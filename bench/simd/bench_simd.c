/* Throughput of the kernels/cpu_simd.h helpers, AVX-512 path against the scalar twin, on
 * Qwen3-0.6B sizes for T = 512 tokens (softmax over 512x512 attention rows, SwiGLU over
 * T x 3072, RMSNorm over T x 1024, bf16 conversion of T x 3072). Best of several calls; the machine
 * may be shared. Usage: bench_simd */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/cpu_simd.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

enum { T = 512, D = 1024, F = 3072 };

/* Best time in microseconds of `what` over 20 calls. */
static double best_us(int what, float *x, float *y, float *z, float *w) {
    double best = 1e30;
    for (int rep = 0; rep < 20; rep++) {
        double t0 = now();
        switch (what) {
        case 0:
            simd_exp(y, x, (long)T * F);
            break;
        case 1:
            simd_softmax_rows(y, x, T, T, T, 0.0883883f);
            break;
        case 2:
            simd_swiglu(z, x, y, (long)T * F);
            break;
        case 3:
            simd_rmsnorm_rows(y, z, x, w, T, D, 1e-6f);
            break;
        case 4:
            z[0] += simd_dot(x, y, (long)T * D);
            break;
        case 5:
            simd_axpy(y, 1e-3f, x, (long)T * F);
            break;
        case 6:
            simd_f32_to_bf16((uint16_t *)z, x, (long)T * F);
            break;
        }
        double dt = (now() - t0) * 1e6;
        if (dt < best) best = dt;
    }
    return best;
}

int main(void) {
    const char *names[] = {"exp        T*F = 1.57M", "softmax    512 rows x 512",
                           "swiglu     T*F = 1.57M", "rmsnorm    T=512 x D=1024",
                           "dot        T*D = 0.52M", "axpy       T*F = 1.57M",
                           "f32->bf16  T*F = 1.57M"};
    float *x = malloc((size_t)T * F * 4), *y = malloc((size_t)T * F * 4);
    float *z = malloc((size_t)T * F * 4), *w = malloc(D * 4);
    if (!x || !y || !z || !w) return 1;
    for (long i = 0; i < (long)T * F; i++)
        x[i] = (float)((i * 7919 % 2000) / 200.0 - 5), y[i] = 0.5f;
    for (int i = 0; i < D; i++)
        w[i] = 1.0f;
    printf("threads %d (softmax and rmsnorm split rows over threads; the rest are serial)\n",
           omp_get_max_threads());
    printf("%-28s %12s %12s %8s\n", "op", "scalar us", "avx512 us", "speedup");
    for (int what = 0; what < 7; what++) {
        simd_force(0);
        double s = best_us(what, x, y, z, w);
        simd_force(1);
        if (!simd_avx512_active()) {
            printf("%-28s %12.0f %12s\n", names[what], s, "n/a");
            continue;
        }
        double v = best_us(what, x, y, z, w);
        printf("%-28s %12.0f %12.0f %7.1fx\n", names[what], s, v, s / v);
    }
    free(x), free(y), free(z), free(w);
    return 0;
}
