/* C[M,N] = alpha * op(A) op(B) + beta * C on AMX tiles: A and B bf16 bit patterns (row-major,
 * op(X) = X or X^T by ta / tb, row strides lda / ldb), accumulation and C fp32, the flags and
 * beta rules of ops/gemm.h. Results depend on the shape only, not on the thread count: every
 * element of C is summed by one thread in a fixed order (32-value tile steps within blocks of
 * 1024, blocks in order). scratch: GEMM_AMX_SCRATCH_BYTES for the packed
 * blocks of A (each thread packs its B panels on its own stack, 64 KiB). Returns 0, or -1 (C
 * untouched) without AMX or for an empty problem. */
#ifndef QT_GEMM_AMX_H
#define QT_GEMM_AMX_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#define GEMM_AMX_SCRATCH_BYTES ((size_t)1 << 20) /* within gemm.h's GEMM_BF16_SCRATCH_BYTES */

/* 1 when the CPU has AMX-BF16 and AMX-TILE and Linux lets this process use the tile state
 * (asked once; the answer is kept); or when QT_AMX_EMULATE=1 and the CPU has AVX-512: then
 * every tile product below runs in software (gemm_amx_emulated), so that the AMX routes (the
 * GEMM, attention, the output layer) and their tests run on hosts without AMX. The emulation
 * sums each pair of products as the instruction is documented to, not necessarily in the
 * hardware's exact bits; it is for tests, far slower than the tiles. */
int gemm_amx_ready(void);
extern int gemm_amx_emulated; /* set by gemm_amx_ready */

/* Loads the tile configuration the kernel uses on the calling thread: palette 1, tiles 0-7
 * each 16 rows x 64 bytes (a 16 x 16 fp32 accumulator, or 16 rows of 32 bf16 values). Needs
 * gemm_amx_ready(); release with gemm_amx_release(). */
void gemm_amx_configure(void);
void gemm_amx_release(void);

/* Where one operand's tiles lie: tile i (0 or 1) of reduction step s (32 values) starts at
 * x + i * next + s * step, its 16 rows ld values apart. An A tile's row holds 32 values of one
 * row of A; a B tile's row p holds, for each of 16 columns j, the pair (k = 2p, 2p + 1) of
 * column j at 2j (VNNI order). */
typedef struct GemmAmxTiles {
    const uint16_t *x;
    long ld, step, next;
} GemmAmxTiles;

/* gemm_amx_group in software (QT_AMX_EMULATE=1). */
void gemm_amx_group_emulated(int mr, int nr, int steps, GemmAmxTiles a, GemmAmxTiles b, float *C,
                             long ldc, int acc);

/* The tile kernel, under gemm_amx_configure's configuration: C (mr x nr tiles of 16 x 16,
 * mr, nr <= 2, row stride ldc floats) = (acc ? C : 0) + the sum over `steps` steps of A tile
 * r times B tile c. Tile registers: 0-3 C, 4-5 A, 6-7 B. prefetch_a (a constant where this is
 * inlined; gemm_amx_group passes 0): A's tiles are whole 1 KiB blocks (ld 32) that come from
 * L2, and those of the next step are prefetched into L1 while a step runs (the output layer's
 * statistics pass, kernels/loss_amx.c). */
__attribute__((target("amx-tile,amx-bf16"))) static inline void
gemm_amx_group_with(int mr, int nr, int steps, GemmAmxTiles a, GemmAmxTiles b, float *C, long ldc,
                    int acc, const int prefetch_a) {
    if (__builtin_expect(gemm_amx_emulated, 0)) {
        gemm_amx_group_emulated(mr, nr, steps, a, b, C, ldc, acc);
        return;
    }
    long cs = 4 * ldc, as = 2 * a.ld, bs = 2 * b.ld;
    float *c1 = C + 16, *c2 = C + 16 * ldc, *c3 = c2 + 16;
    if (acc) {
        _tile_loadd(0, C, cs);
        if (nr > 1) _tile_loadd(1, c1, cs);
        if (mr > 1) _tile_loadd(2, c2, cs);
        if (mr > 1 && nr > 1) _tile_loadd(3, c3, cs);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int s = 0; s < steps; s++) {
        const uint16_t *a0 = a.x + s * a.step, *b0 = b.x + s * b.step;
        if (prefetch_a && s + 1 < steps)
            for (int i = 0; i < 512; i += 32) { /* 64-byte lines of the next step's tiles */
                _mm_prefetch((const char *)(a0 + a.step + i), _MM_HINT_T0);
                if (mr > 1) _mm_prefetch((const char *)(a0 + a.step + a.next + i), _MM_HINT_T0);
            }
        _tile_loadd(4, a0, as);
        _tile_loadd(6, b0, bs);
        _tile_dpbf16ps(0, 4, 6);
        if (nr > 1) {
            _tile_loadd(7, b0 + b.next, bs);
            _tile_dpbf16ps(1, 4, 7);
        }
        if (mr > 1) {
            _tile_loadd(5, a0 + a.next, as);
            _tile_dpbf16ps(2, 5, 6);
            if (nr > 1) _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, C, cs);
    if (nr > 1) _tile_stored(1, c1, cs);
    if (mr > 1) _tile_stored(2, c2, cs);
    if (mr > 1 && nr > 1) _tile_stored(3, c3, cs);
}

/* gemm_amx_group_with, no prefetch. */
__attribute__((target("amx-tile,amx-bf16"))) static inline void
gemm_amx_group(int mr, int nr, int steps, GemmAmxTiles a, GemmAmxTiles b, float *C, long ldc,
               int acc) {
    gemm_amx_group_with(mr, nr, steps, a, b, C, ldc, acc, 0);
}

/* Columns [c0, c0 + 16) x reduction values [k0, k0 + 32 steps) of op(B) (B row-major with row
 * stride ldb, op(B) = B or B^T by tb; K x N in all) as `steps` consecutive tiles of 16 x 32
 * values in the B order of GemmAmxTiles; values beyond K or N are zeros. dst is 64-byte
 * aligned. */
void gemm_amx_pack_b(const uint16_t *B, int tb, int ldb, int c0, int N, int k0, int K, int steps,
                     uint16_t *dst);

/* Rows [r0, r0 + 16) x reduction values [k0, k0 + 32 steps) of op(A) (A row-major with row
 * stride lda, op(A) = A or A^T by ta; M x K in all) as `steps` consecutive A tiles of 16 rows
 * of 32 values; values beyond M or K are zeros. */
void gemm_amx_pack_a(const uint16_t *A, int ta, int lda, int r0, int M, int k0, int K, int steps,
                     uint16_t *dst);

int gemm_amx_bf16(int ta, int tb, int M, int N, int K, float alpha, const uint16_t *A, int lda,
                  const uint16_t *B, int ldb, float beta, float *C, int ldc, void *scratch);

/* ---- op(B) packed once, for a weight used by many products ----
 * The layout gemm_amx_prepack writes: op(B) (K x N) as column halves of 16 (N rounded up to
 * 32), each its K steps of 32 values as consecutive VNNI tiles (GemmAmxTiles' B order), zeros
 * beyond K and N: gemm_amx_packed_values(K, N) bf16 values. */
size_t gemm_amx_packed_values(int K, int N);
/* Packs op(B) (B row-major with row stride ldb, op(B) = B or B^T by tb) into dst, 64-byte
 * aligned; parallel over column halves. */
void gemm_amx_prepack(const uint16_t *B, int tb, int ldb, int K, int N, uint16_t *dst);
/* gemm_amx_bf16 with op(B) given packed (Bp from gemm_amx_prepack with this K and N): never
 * transposed to stream the longer side, so only op(A)'s tiles are packed; any K. */
int gemm_amx_bf16_packed(int ta, int M, int N, int K, float alpha, const uint16_t *A, int lda,
                         const uint16_t *Bp, float beta, float *C, int ldc, void *scratch);

/* Timing of the packing inside products for the op profile, per calling thread: on, every
 * product the thread calls adds the seconds its threads spent packing operands (summed over
 * threads, divided by their number) to a total that gemm_amx_pack_seconds returns. */
void gemm_amx_pack_timing(int on);
double gemm_amx_pack_seconds(void);

#endif
