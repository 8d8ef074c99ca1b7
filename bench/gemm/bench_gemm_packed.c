/* An experiment kept as a benchmark: a hand-written packed AVX-512 fp32 GEMM (Goto / BLIS
 * design) against the fp32 GEMM qtitan uses (gemm.h "auto" = dnnl_sgemm), on the products a
 * training step of the compare_pytorch shapes makes. bench/README.md, section "A packed
 * AVX-512 GEMM of our own", has the results: it did not beat dnnl_sgemm, so it is not a
 * backend. bench/gemm/torch_gemm.py times PyTorch (MKL) on the same shapes.
 *
 * Usage: bench_gemm_packed [--no-pack] [--rounds R]
 *   --no-pack  skips all packing after the first call (results wrong, timing = micro-kernel
 *              and cache traffic only): the gap to the normal run is what packing costs.
 *
 * Design: per KC-deep slice of K, the threads pack op(A) into 12-row panels together; per
 * NC-wide block of op(B) each thread packs the 32-column panels it owns (columns of C are
 * split over threads; rows when there are too few columns). The 12 x 32 micro-kernel keeps
 * the C tile in 24 zmm registers, one A panel stays in L1 while B panels stream from L2
 * (faster here than the reverse, which was measured first). Transposing packs move 16 x 16
 * blocks through registers; straight packs read the source row by row (a panel at a time
 * walks a new page on every row, which cost 2-3 ns per element in TLB misses). */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"
#include "kernels/cpu_peak.h"
#include "ops/gemm.h"

#define MR 12   /* rows of the C tile */
#define NR 32   /* columns of the C tile: two zmm */
#define KC 256  /* depth of one packed slice: a 12 x 256 A panel is 12 KiB, 32 x 256 B 32 KiB */
#define NC 1024 /* columns packed per block: 32 panels, 1 MiB */

/* Below this many multiply-adds, forking threads costs more than it saves. */
#define SERIAL_MACS (64L * 64 * 64)

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

static int supported(void) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
}

static int min_i(int a, int b) {
    return a < b ? a : b;
}

/* --no-pack: time the kernels on stale packed data, to see what packing costs */
static int g_skip_pack;

/* ---- micro-kernel ----------------------------------------------------------------------- */

/* c[12 x 32] (row stride ldc) = or += alpha * a-panel * b-panel over kc. */
AVX512 static void kernel_12x32(int kc, const float *restrict a, const float *restrict b,
                                float *restrict c, long ldc, float alpha, int accumulate) {
    __m512 acc[MR][2];
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) {
        acc[i][0] = acc[i][1] = _mm512_setzero_ps();
        _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(c + i * ldc + 16), _MM_HINT_T0);
    }
    for (int k = 0; k < kc; k++) {
        _mm_prefetch((const char *)(b + 8 * NR), _MM_HINT_T0);
        _mm_prefetch((const char *)(b + 8 * NR + 16), _MM_HINT_T0);
        __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#pragma GCC unroll 12
        for (int i = 0; i < MR; i++) {
            __m512 ai = _mm512_set1_ps(a[i]);
            acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
        }
        a += MR;
        b += NR;
    }
    __m512 va = _mm512_set1_ps(alpha);
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) {
        float *ci = c + i * ldc;
        if (accumulate) {
            _mm512_storeu_ps(ci, _mm512_fmadd_ps(va, acc[i][0], _mm512_loadu_ps(ci)));
            _mm512_storeu_ps(ci + 16, _mm512_fmadd_ps(va, acc[i][1], _mm512_loadu_ps(ci + 16)));
        } else {
            _mm512_storeu_ps(ci, _mm512_mul_ps(va, acc[i][0]));
            _mm512_storeu_ps(ci + 16, _mm512_mul_ps(va, acc[i][1]));
        }
    }
}

/* ---- packing ---------------------------------------------------------------------------- */

/* In place: r[i] (16 rows of 16) becomes column i. */
AVX512 static void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* r[4i + c], 128-bit lane L: rows 4i..4i+3 of column 4L + c */
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    __m512 o[16];
    for (int c = 0; c < 4; c++) {
        __m512 x0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
        __m512 x1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
        __m512 x2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
        __m512 x3 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
        o[c] = _mm512_shuffle_f32x4(x0, x2, 0x88);
        o[4 + c] = _mm512_shuffle_f32x4(x1, x3, 0x88);
        o[8 + c] = _mm512_shuffle_f32x4(x0, x2, 0xDD);
        o[12 + c] = _mm512_shuffle_f32x4(x1, x3, 0xDD);
    }
    for (int i = 0; i < 16; i++)
        r[i] = o[i];
}

/* Panels [q0, q1) of P vectors each from an operand of w vectors (x < w), every vector kc
 * long; vector x starts at src + x * ld and runs contiguously along k. Panel q is stored
 * k-major at dst + q * P * kc: element (k, x) at [k * P + x - q * P], zero past w. The
 * transposing pack (op(A) = A, op(B) = B^T) through 16 x 16 register blocks. */
AVX512 static void pack_transposed(int P, const float *src, long ld, int w, int q0, int q1, int kc,
                                   float *dst) {
    for (int q = q0; q < q1; q++) {
        const float *s = src + (long)q * P * ld;
        float *d = dst + (long)q * P * kc;
        int pw = w - q * P, k = 0;
        for (; k + 16 <= kc; k += 16)
            for (int j0 = 0; j0 < P; j0 += 16) {
                __m512 r[16];
                for (int j = 0; j < 16; j++)
                    r[j] =
                        j0 + j < pw ? _mm512_loadu_ps(s + (j0 + j) * ld + k) : _mm512_setzero_ps();
                transpose16(r);
                __mmask16 m = (__mmask16)((1u << min_i(P - j0, 16)) - 1);
                for (int c = 0; c < 16; c++)
                    _mm512_mask_storeu_ps(d + (k + c) * P + j0, m, r[c]);
            }
        for (; k < kc; k++)
            for (int j = 0; j < P; j++)
                d[k * P + j] = j < pw ? s[j * ld + k] : 0.0f;
    }
}

/* The same panels when the operand runs the other way: element (k, x) at src[k * ld + x]. A
 * copy; k is the outer loop so the source is read row after row (one page at a time, where a
 * panel at a time would touch a new page on every row of a wide matrix). */
AVX512 static void pack_straight(int P, const float *src, long ld, int w, int q0, int q1, int kc,
                                 float *dst) {
    for (int k = 0; k < kc; k++)
        for (int q = q0; q < q1; q++)
            for (int j0 = 0; j0 < P; j0 += 16) {
                int x = q * P + j0, n = w - x < 0 ? 0 : min_i(w - x, 16);
                __mmask16 m = (__mmask16)((1u << n) - 1),
                          ms = (__mmask16)((1u << min_i(P - j0, 16)) - 1);
                _mm512_mask_storeu_ps(dst + ((long)q * kc + k) * P + j0, ms,
                                      _mm512_maskz_loadu_ps(m, src + k * ld + x));
            }
}

/* NR panels [q0, q1) of op(B)[p0 .. p0+kc) x [j0 .. j0+w). */
static void pack_b(int tb, const float *B, long ldb, int p0, int kc, int j0, int w, int q0, int q1,
                   float *dst) {
    if (tb)
        pack_transposed(NR, B + j0 * ldb + p0, ldb, w, q0, q1, kc, dst);
    else
        pack_straight(NR, B + (long)p0 * ldb + j0, ldb, w, q0, q1, kc, dst);
}

/* MR panels [r0, r1) of op(A)[0 .. M) x [p0 .. p0+kc). */
static void pack_a(int ta, const float *A, long lda, int M, int p0, int kc, int r0, int r1,
                   float *dst) {
    if (ta)
        pack_straight(MR, A + (long)p0 * lda, lda, M, r0, r1, kc, dst);
    else
        pack_transposed(MR, A + p0, lda, M, r0, r1, kc, dst);
}

/* ---- driver ----------------------------------------------------------------------------- */

typedef struct Job {
    int ta, tb, M, N, K;
    float alpha, beta;
    const float *A, *B;
    long lda, ldb, ldc;
    float *C;
    float *apack; /* ceil(M / MR) * MR x KC: one KC slice of op(A), shared by the team */
    float *bpack; /* (NC + NR) x KC: one block of op(B), shared by the team */
} Job;

/* C tile at (i, j) of h x w from a packed pair, through a scratch tile when partial. */
static void tile(const Job *jb, int kc, const float *pa, const float *pb, int i, int j, int h,
                 int w, int accumulate) {
    float *c = jb->C + i * jb->ldc + j;
    if (h == MR && w == NR) {
        kernel_12x32(kc, pa, pb, c, jb->ldc, jb->alpha, accumulate);
        return;
    }
    float t[MR * NR] __attribute__((aligned(64)));
    kernel_12x32(kc, pa, pb, t, NR, jb->alpha, 0);
    for (int r = 0; r < h; r++)
        for (int s = 0; s < w; s++)
            c[r * jb->ldc + s] = accumulate ? c[r * jb->ldc + s] + t[r * NR + s] : t[r * NR + s];
}

static void barrier(int nt) {
    if (nt > 1) {
#pragma omp barrier
    }
}

/* One thread's part. Each op(A) slice and op(B) block is packed once, by the threads
 * together. The NR panels (columns of C) are split over the threads, so each packs the B
 * panels it uses and they stay in its core's L2; with fewer than two panels per thread the
 * MR panels (rows) are split instead. The A panel in use stays in L1 while B panels stream
 * from L2: measured faster here than the reverse. */
static void run_team(const Job *jb, int t, int nt) {
    int mpanels = (jb->M + MR - 1) / MR, splitcols = (jb->N + NR - 1) / NR >= 2 * nt;
    int r0 = splitcols ? 0 : (int)((long)mpanels * t / nt);
    int r1 = splitcols ? mpanels : (int)((long)mpanels * (t + 1) / nt);
    for (int pc = 0; pc < jb->K; pc += KC) {
        int kc = min_i(KC, jb->K - pc), accumulate = pc > 0 || jb->beta != 0.0f;
        barrier(nt);
        if (!g_skip_pack)
            pack_a(jb->ta, jb->A, jb->lda, jb->M, pc, kc, (int)((long)mpanels * t / nt),
                   (int)((long)mpanels * (t + 1) / nt), jb->apack);
        for (int jc = 0; jc < jb->N; jc += NC) {
            int nc = min_i(NC, jb->N - jc), npanels = (nc + NR - 1) / NR;
            int q0 = splitcols ? (int)((long)npanels * t / nt) : 0;
            int q1 = splitcols ? (int)((long)npanels * (t + 1) / nt) : npanels;
            if (!g_skip_pack) {
                if (splitcols) {
                    pack_b(jb->tb, jb->B, jb->ldb, pc, kc, jc, nc, q0, q1, jb->bpack);
                    if (jc == 0) barrier(nt); /* the A slice is complete */
                } else {
                    barrier(nt);
                    pack_b(jb->tb, jb->B, jb->ldb, pc, kc, jc, nc, (int)((long)npanels * t / nt),
                           (int)((long)npanels * (t + 1) / nt), jb->bpack);
                    barrier(nt);
                }
            }
            for (int r = r0; r < r1; r++)
                for (int q = q0; q < q1; q++)
                    tile(jb, kc, jb->apack + (long)r * MR * kc, jb->bpack + (long)q * NR * kc,
                         r * MR, jc + q * NR, min_i(MR, jb->M - r * MR), min_i(NR, nc - q * NR),
                         accumulate);
        }
    }
}

/* The calling thread's packing buffers, grown on demand and kept for the thread's life (the
 * team's threads work inside the caller's). */
static _Thread_local float *t_buf;
static _Thread_local size_t t_cap;

static float *caller_buffer(size_t floats) {
    if (t_cap < floats) {
        free(t_buf);
        t_buf = aligned_alloc(64, ((floats * sizeof(float) + 63) / 64) * 64);
        t_cap = t_buf ? floats : 0;
    }
    return t_buf;
}

static int packed_gemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc) {
    if (beta != 0.0f && beta != 1.0f) return -1;
    /* the B block starts on a cache line: the micro-kernel's loads from it are aligned */
    size_t kc = (size_t)min_i(KC, K),
           afloats = ((size_t)(M + MR - 1) / MR * MR * kc + 15) / 16 * 16;
    float *buf = caller_buffer(afloats + (size_t)(NC + NR) * kc);
    if (!buf) return -1;
    Job jb = {ta, tb, M, N, K, alpha, beta, A, B, lda, ldb, ldc, C, buf, buf + afloats};
    int nt = omp_in_parallel() || (long)M * N * K < SERIAL_MACS ? 1 : omp_get_max_threads();
    if (nt == 1)
        run_team(&jb, 0, 1);
    else {
#pragma omp parallel num_threads(nt)
        run_team(&jb, omp_get_thread_num(), omp_get_num_threads());
    }
    return 0;
}

/* ---- harness ---------------------------------------------------------------------------- */

typedef struct Shape {
    const char *name;
    int ta, tb, M, N, K;
} Shape;

int main(int argc, char **argv) {
    int rounds = 4;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-pack"))
            g_skip_pack = 1;
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_gemm_packed [--no-pack] [--rounds R]\n");
            return 2;
        }
    }
    if (!supported()) {
        printf("bench_gemm_packed: this CPU has no AVX-512; nothing to compare\n");
        return 0;
    }
    /* The compare_pytorch shapes. debugmodel: T = 512 tokens, D = 256, F = 3072, 2048 query
     * and 1024 key/value features; 0.6B: T = 1024, D = 1024, F = 3072. Weights are (out, in):
     * forward x W^T (tb), dX = dY W (nn), dW = dY^T X (ta). Keep in step with torch_gemm.py. */
    const Shape shapes[] = {
        {"debug x*Wq^T", 0, 1, 512, 2048, 256},
        {"debug x*Wup^T", 0, 1, 512, 3072, 256},
        {"debug h*Wdown^T", 0, 1, 512, 256, 3072},
        {"debug o*Wo^T", 0, 1, 512, 256, 2048},
        {"debug dX=dY*Wup", 0, 0, 512, 256, 3072},
        {"debug dWup=dY^T*X", 1, 0, 3072, 256, 512},
        {"debug dH=dY*Wdown", 0, 0, 512, 3072, 256},
        {"debug dWdown=dY^T*H", 1, 0, 256, 3072, 512},
        {"0.6B x*Wup^T", 0, 1, 1024, 3072, 1024},
        {"0.6B o*Wo^T", 0, 1, 1024, 1024, 2048},
        {"0.6B dX=dY*Wup", 0, 0, 1024, 1024, 3072},
        {"0.6B dWup=dY^T*X", 1, 0, 3072, 1024, 1024},
        {"0.6B dWdown=dY^T*H", 1, 0, 1024, 3072, 1024},
        {"attn block S=Q*K^T", 0, 1, 64, 128, 128},
    };
    CpuPeak peak;
    cpu_peak_measure(&peak);
    printf("threads %d, peak fp32 %.0f GFLOP/s; gemm_f32: %s%s\n", omp_get_max_threads(),
           peak.fp32_gflops, gemm_backend_name(), g_skip_pack ? "; packed: --no-pack" : "");
    printf("%-22s %5s %5s %5s  %9s %9s  %6s  %s\n", "shape", "M", "N", "K", "gemm GF/s", "packed",
           "ratio", "max |diff|");
    for (int s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++) {
        const Shape *sh = &shapes[s];
        int M = sh->M, N = sh->N, K = sh->K, lda = sh->ta ? M : K, ldb = sh->tb ? K : N;
        float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N);
        float *C1 = malloc(sizeof(float) * M * N), *C2 = malloc(sizeof(float) * M * N);
        if (!A || !B || !C1 || !C2) return 1;
        for (long i = 0; i < (long)M * K; i++)
            A[i] = (float)(i % 97) / 97.0f - 0.5f;
        for (long i = 0; i < (long)K * N; i++)
            B[i] = (float)(i % 89) / 89.0f - 0.5f;
        int skip = g_skip_pack;
        g_skip_pack = 0; /* the first call packs, so --no-pack times real (stale) panels */
        gemm_f32(sh->ta, sh->tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C1, N);
        if (packed_gemm(sh->ta, sh->tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C2, N) != 0) return 1;
        g_skip_pack = skip;
        double diff = 0;
        for (long i = 0; i < (long)M * N; i++)
            diff = fmax(diff, fabs(C1[i] - C2[i]));
        /* alternate the two so a burst of load on the shared machine hits both */
        double flop = 2.0 * M * N * K, best[2] = {1e30, 1e30};
        int reps = (int)(5e8 / flop) + 2;
        for (int r = 0; r < rounds; r++)
            for (int w = 0; w < 2; w++) {
                double t0 = now_seconds();
                for (int i = 0; i < reps; i++)
                    if (w == 0)
                        gemm_f32(sh->ta, sh->tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C1, N);
                    else
                        packed_gemm(sh->ta, sh->tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C2, N);
                double t = now_seconds() - t0;
                if (t < best[w]) best[w] = t;
            }
        printf("%-22s %5d %5d %5d  %9.1f %9.1f  %5.2fx  %.1e\n", sh->name, M, N, K,
               flop * reps / best[0] * 1e-9, flop * reps / best[1] * 1e-9, best[0] / best[1],
               g_skip_pack ? NAN : diff);
        free(A), free(B), free(C1), free(C2);
    }
    return 0;
}
