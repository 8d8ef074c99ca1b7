/* bf16 products on AMX tiles (ops/gemm_amx.h). Per K block of GA_KC values: op(A)'s block is
 * packed once into 16-row tiles (every thread packs a share), then each thread takes 32-column
 * panels of op(B), packs one panel into VNNI pairs in its own buffer and runs it against every
 * 32-row pair of A tiles: 2 x 2 tiles of C accumulate in the tile registers over the block, and
 * leave through a 32 x 32 fp32 buffer that applies alpha, beta and the store's transposition.
 * Rows, columns and reduction steps beyond the problem are packed as zeros. */
#include "ops/gemm_amx.h"

#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/dtype.h"

#define GA_KC 1024        /* reduction values per block: a 32-column B panel is 64 KiB */
#define GA_STEP 32        /* bf16 values per tile row: one tdpbf16ps step of K */
#define GA_TILE (16 * 32) /* bf16 values per packed A or B tile */
#define GA_MC 512         /* rows of op(A) per packed block: 1 MiB at GA_KC */
_Static_assert((size_t)GA_MC *GA_KC * 2 <= GEMM_AMX_SCRATCH_BYTES, "a packed A block");

/* gemm_amx_pack_timing / gemm_amx_pack_seconds: per calling thread, read and added to outside
 * the products' parallel regions. */
static _Thread_local int g_pack_timed;
static _Thread_local double g_pack_seconds;

/* CPUID leaf 7 sub-leaf 0, EDX: AMX-BF16 is bit 22, AMX-TILE bit 24. */
static int cpuid7_edx(int bit) {
    unsigned r[4];
    if (!__get_cpuid_count(7, 0, &r[0], &r[1], &r[2], &r[3])) return 0;
    return (r[3] >> bit) & 1;
}

int gemm_amx_emulated;

int gemm_amx_ready(void) {
    static int state = -1;
    if (state < 0) {
        const long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
        state = cpuid7_edx(22) && cpuid7_edx(24) &&
                syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
        const char *e = getenv("QT_AMX_EMULATE");
        if (e && strcmp(e, "1") == 0 && __builtin_cpu_supports("avx512f"))
            state = gemm_amx_emulated = 1;
    }
    return state;
}

/* One tile product in software, as TDPBF16PS is documented: for each row m of A, pair p and
 * column n, the two products of the pair (exact in fp32) summed in fp32, then added to C. */
static void emulated_dp(float c[16][16], const uint16_t *a, long as, const uint16_t *b, long bs) {
    for (int m = 0; m < 16; m++)
        for (int p = 0; p < 16; p++) {
            float a0 = bf16_to_f32(a[m * as + 2 * p]), a1 = bf16_to_f32(a[m * as + 2 * p + 1]);
            for (int n = 0; n < 16; n++) {
                float t = a0 * bf16_to_f32(b[p * bs + 2 * n]);
                t += a1 * bf16_to_f32(b[p * bs + 2 * n + 1]);
                c[m][n] += t;
            }
        }
}

void gemm_amx_group_emulated(int mr, int nr, int steps, GemmAmxTiles a, GemmAmxTiles b, float *C,
                             long ldc, int acc) {
    for (int r = 0; r < mr; r++)
        for (int q = 0; q < nr; q++) {
            float c[16][16];
            float *ct = C + (long)r * 16 * ldc + q * 16;
            for (int i = 0; i < 16; i++)
                for (int j = 0; j < 16; j++)
                    c[i][j] = acc ? ct[i * ldc + j] : 0.0f;
            for (int s = 0; s < steps; s++)
                emulated_dp(c, a.x + s * a.step + r * a.next, a.ld, b.x + s * b.step + q * b.next,
                            b.ld);
            for (int i = 0; i < 16; i++)
                for (int j = 0; j < 16; j++)
                    ct[i * ldc + j] = c[i][j];
        }
}

typedef struct TileCfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileCfg;

/* One operand as stored: element (r, c) of op(X) is x[r * ld + c], or x[c * ld + r] when t. */
typedef struct Op {
    const uint16_t *x;
    int t, ld;
} Op;

static inline uint16_t at(const Op *o, long r, long c) {
    return o->t ? o->x[c * o->ld + r] : o->x[r * o->ld + c];
}

/* r[i] (16 rows of 16 32-bit values) becomes its transpose: in 4 rounds, pairs of 32-bit
 * values, then of 64-bit, within 128-bit lanes (4 x 4 blocks), then 128-bit lanes across rows. */
__attribute__((target("avx512f"))) static void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    /* r[4g + q], lane j: column 4j + q of rows 4g .. 4g + 3 */
    for (int g = 0; g < 4; g++) {
        r[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
        r[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
        r[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
        r[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
    for (int q = 0; q < 4; q++) { /* lanes j of the four row groups side by side */
        __m512i a02 = _mm512_shuffle_i32x4(r[q], r[4 + q], 0x88);
        __m512i a13 = _mm512_shuffle_i32x4(r[q], r[4 + q], 0xdd);
        __m512i c02 = _mm512_shuffle_i32x4(r[8 + q], r[12 + q], 0x88);
        __m512i c13 = _mm512_shuffle_i32x4(r[8 + q], r[12 + q], 0xdd);
        t[q] = _mm512_shuffle_i32x4(a02, c02, 0x88);
        t[4 + q] = _mm512_shuffle_i32x4(a13, c13, 0x88);
        t[8 + q] = _mm512_shuffle_i32x4(a02, c02, 0xdd);
        t[12 + q] = _mm512_shuffle_i32x4(a13, c13, 0xdd);
    }
    for (int i = 0; i < 16; i++)
        r[i] = t[i];
}

/* Row pairs (2p, 2p + 1) of 16 values of x (row stride ld) as 32-bit words: word j of r[p]
 * holds (x[2p][j], x[2p + 1][j]). */
__attribute__((target("avx512f"))) static void load_pairs(const uint16_t *x, long ld,
                                                          __m512i r[16]) {
    for (int p = 0; p < 16; p++) {
        __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)(x + 2 * p * ld)));
        __m512i hi =
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)(x + (2 * p + 1) * ld)));
        r[p] = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
    }
}

/* One whole A tile of op(A) = x^T: 16 rows (columns of x) of 32 values (rows of x). */
__attribute__((target("avx512f"))) static void pack_a_columns(const uint16_t *x, long ld,
                                                              uint16_t *tile) {
    __m512i r[16];
    load_pairs(x, ld, r);
    transpose16(r);
    for (int i = 0; i < 16; i++)
        _mm512_storeu_si512((void *)(tile + i * 32), r[i]);
}

/* One whole A tile of op(A) = x: 16 rows of 32 values, row stride ld (a 64-byte copy each: a
 * libc memcpy call per row cost more than the copy, 2-3 GB/s). */
__attribute__((target("avx512f"))) static void pack_a_rows(const uint16_t *x, long ld,
                                                           uint16_t *tile) {
    for (int i = 0; i < 16; i++)
        _mm512_storeu_si512((void *)(tile + i * 32),
                            _mm512_loadu_si512((const void *)(x + i * ld)));
}

/* Rows [r0, r0 + 16) x K values [k0, k0 + steps * 32) of op(A) as `steps` consecutive tiles of
 * 16 rows x 32 values; outside rows < M, k < K zeros. */
static void pack_a_tiles(const Op *a, int r0, int M, int k0, int K, int steps, uint16_t *dst) {
    for (int s = 0; s < steps; s++) {
        int kb = k0 + s * GA_STEP;
        if (!a->t && r0 + 16 <= M && K - kb >= GA_STEP) {
            pack_a_rows(a->x + (long)r0 * a->ld + kb, a->ld, dst + (long)s * GA_TILE);
            continue;
        }
        for (int i = 0; i < 16; i++) {
            uint16_t *row = dst + ((long)s * 16 + i) * GA_STEP;
            int r = r0 + i;
            int n = r < M ? (K - kb < GA_STEP ? K - kb : GA_STEP) : 0;
            if (n < 0) n = 0;
            if (a->t && n == GA_STEP && i == 0 && r0 + 16 <= M) {
                pack_a_columns(a->x + (long)kb * a->ld + r0, a->ld, row);
                break; /* the whole tile */
            }
            if (!a->t && n > 0) {
                memcpy(row, a->x + (long)r * a->ld + kb, (size_t)n * 2);
            } else {
                for (int c = 0; c < n; c++)
                    row[c] = at(a, r, kb + c);
            }
            for (int c = n; c < GA_STEP; c++)
                row[c] = 0;
        }
    }
}

/* One whole VNNI tile from 32 rows of 16 values (row stride ld): row pair p, column j becomes
 * the 32-bit word p * 16 + j holding (x[2p][j], x[2p + 1][j]). */
__attribute__((target("avx512f"))) static void pack_b_pairs(const uint16_t *x, long ld,
                                                            uint16_t *tile) {
    __m512i r[16];
    load_pairs(x, ld, r);
    for (int p = 0; p < 16; p++)
        _mm512_store_si512((void *)(tile + p * 32), r[p]);
}

/* One whole VNNI tile from 16 columns of op(B) stored as rows of x (row stride ld, 32 values
 * each): word p of column j, the pair (x[j][2p], x[j][2p + 1]), goes to p * 16 + j. */
__attribute__((target("avx512f"))) static void pack_b_columns(const uint16_t *x, long ld,
                                                              uint16_t *tile) {
    __m512i r[16];
    for (int j = 0; j < 16; j++)
        r[j] = _mm512_loadu_si512((const void *)(x + j * ld));
    transpose16(r);
    for (int p = 0; p < 16; p++)
        _mm512_store_si512((void *)(tile + p * 32), r[p]);
}

/* Columns [c0, c0 + 16) x K values [k0, k0 + steps * 32) of op(B) as `steps` tiles in VNNI
 * order: tile row p holds, for each column j, the pair (k = 2p, 2p + 1). Whole tiles go through
 * the vector packers above; edges element by element. */
static void pack_b_tiles(const Op *b, int c0, int N, int k0, int K, int steps, uint16_t *dst) {
    for (int s = 0; s < steps; s++) {
        uint16_t *tile = dst + (long)s * GA_TILE;
        int kb = k0 + s * GA_STEP;
        if (c0 + 16 <= N && K - kb >= GA_STEP) {
            if (b->t) /* op(B)(k, j) = x[j * ld + k]: a column of op(B) is contiguous */
                pack_b_columns(b->x + (long)c0 * b->ld + kb, b->ld, tile);
            else
                pack_b_pairs(b->x + (long)kb * b->ld + c0, b->ld, tile);
            continue;
        }
        for (int k = 0; k < GA_STEP; k++)
            for (int j = 0; j < 16; j++)
                tile[(k >> 1) * 32 + j * 2 + (k & 1)] =
                    kb + k < K && c0 + j < N ? at(b, kb + k, c0 + j) : 0;
    }
}

void gemm_amx_pack_a(const uint16_t *A, int ta, int lda, int r0, int M, int k0, int K, int steps,
                     uint16_t *dst) {
    Op a = {A, ta, lda};
    pack_a_tiles(&a, r0, M, k0, K, steps, dst);
}

void gemm_amx_pack_b(const uint16_t *B, int tb, int ldb, int c0, int N, int k0, int K, int steps,
                     uint16_t *dst) {
    Op b = {B, tb, ldb};
    pack_b_tiles(&b, c0, N, k0, K, steps, dst);
}

/* acc (32 x 32, row stride 32) into C rows [m0, m0 + 32) x columns [n0, n0 + 32) of the M x N
 * result, or of its transpose when tc (then C[n][m]; acc is transposed in place first). */
__attribute__((target("avx512f"))) static void store_block(float *acc, int m0, int n0, int M, int N,
                                                           float alpha, float beta, int first,
                                                           int tc, float *C, int ldc) {
    int mr = M - m0 < 32 ? M - m0 : 32, nr = N - n0 < 32 ? N - n0 : 32;
    if (tc) { /* four 16 x 16 quarters, each transposed, the off-diagonal two swapped */
        __m512i q[4][16];
        for (int b = 0; b < 4; b++) {
            for (int i = 0; i < 16; i++)
                q[b][i] = _mm512_loadu_si512(
                    (const void *)(acc + (b >> 1) * 512 + i * 32 + (b & 1) * 16));
            transpose16(q[b]);
        }
        for (int b = 0; b < 4; b++)
            for (int i = 0; i < 16; i++) /* quarter (r, c) goes to (c, r) */
                _mm512_storeu_si512((void *)(acc + (b & 1) * 512 + i * 32 + (b >> 1) * 16),
                                    q[b][i]);
        int t = mr;
        mr = nr, nr = t, t = m0, m0 = n0, n0 = t;
    }
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j += 16) {
            __mmask16 k = nr - j >= 16 ? 0xffff : (__mmask16)((1u << (nr - j)) - 1);
            float *c = C + (long)(m0 + i) * ldc + n0 + j;
            __m512 v = _mm512_mul_ps(va, _mm512_loadu_ps(acc + i * 32 + j));
            if (!first)
                v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, c));
            else if (beta != 0.0f)
                v = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(k, c), v);
            _mm512_mask_storeu_ps(c, k, v);
        }
}

/* In static storage: GCC 12 dropped the stores filling a local configuration before
 * ldtilecfg in an inlined copy (all tiles then 0 x 0, and the first tile load faulted). */
static const TileCfg g_tiles = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

__attribute__((target("amx-tile"))) void gemm_amx_configure(void) {
    if (!gemm_amx_emulated) _tile_loadconfig(&g_tiles);
}

__attribute__((target("amx-tile"))) void gemm_amx_release(void) {
    if (!gemm_amx_emulated) _tile_release();
}

/* The product with op(A) M x K and op(B) K x N, result (or its transpose, tc) in C. op(B) is
 * packed here panel by panel, or, when bp is set, was packed whole by gemm_amx_prepack. */
static void run(const Op *a, const Op *b, const uint16_t *bp, int M, int N, int K, float alpha,
                float beta, int tc, float *C, int ldc, uint16_t *apack) {
    int direct = alpha == 1.0f && !tc && (beta == 0.0f || beta == 1.0f);
    long bsteps = (K + GA_STEP - 1) / GA_STEP; /* of a prepacked column half */
    int timed = g_pack_timed;
    for (int k0 = 0; k0 < K; k0 += GA_KC) {
        int kc = K - k0 < GA_KC ? K - k0 : GA_KC, steps = (kc + GA_STEP - 1) / GA_STEP;
        for (int m0 = 0; m0 < M; m0 += GA_MC) {
            int mc = M - m0 < GA_MC ? M - m0 : GA_MC, strips = (mc + 31) / 32 * 2;
            long strip = (long)steps * GA_TILE;
            double packing = 0; /* seconds the threads spent packing, summed */
#pragma omp parallel reduction(+ : packing)
            {
                double t0 = timed ? omp_get_wtime() : 0;
#pragma omp for schedule(static)
                for (int s = 0; s < strips; s++)
                    pack_a_tiles(a, m0 + s * 16, M, k0, K, steps, apack + s * strip);
                if (timed) packing += omp_get_wtime() - t0;
                _Alignas(64) uint16_t bpack[2 * (GA_KC / GA_STEP) * GA_TILE];
                _Alignas(64) float acc[32 * 32];
                gemm_amx_configure();
                int panels = (N + 31) / 32;
#pragma omp for schedule(static)
                for (int p = 0; p < panels; p++) {
                    GemmAmxTiles bt = {bpack, GA_STEP, GA_TILE, strip};
                    if (bp) {
                        bt = (GemmAmxTiles){bp + (2 * p * bsteps + k0 / GA_STEP) * GA_TILE, GA_STEP,
                                            GA_TILE, bsteps * GA_TILE};
                    } else {
                        double t1 = timed ? omp_get_wtime() : 0;
                        pack_b_tiles(b, p * 32, N, k0, K, steps, bpack);
                        pack_b_tiles(b, p * 32 + 16, N, k0, K, steps, bpack + strip);
                        if (timed) packing += omp_get_wtime() - t1;
                    }
                    for (int s = 0; s < strips; s += 2) {
                        int r0 = m0 + s * 16, c0 = p * 32;
                        const uint16_t *a0 = apack + s * strip;
                        /* Whole blocks with alpha 1 accumulate in C itself. */
                        GemmAmxTiles at = {a0, GA_STEP, GA_TILE, strip};
                        if (direct && r0 + 32 <= M && c0 + 32 <= N) {
                            gemm_amx_group(2, 2, steps, at, bt, C + (long)r0 * ldc + c0, ldc,
                                           k0 > 0 || beta != 0.0f);
                        } else {
                            gemm_amx_group(2, 2, steps, at, bt, acc, 32, 0);
                            store_block(acc, r0, c0, M, N, alpha, beta, k0 == 0, tc, C, ldc);
                        }
                    }
                }
                gemm_amx_release();
            }
            if (timed) g_pack_seconds += packing / omp_get_max_threads();
        }
    }
}

int gemm_amx_bf16(int ta, int tb, int M, int N, int K, float alpha, const uint16_t *A, int lda,
                  const uint16_t *B, int ldb, float beta, float *C, int ldc, void *scratch) {
    if (!gemm_amx_ready() || M <= 0 || N <= 0 || K <= 0) return -1;
    Op a = {A, ta, lda}, b = {B, tb, ldb};
    int tc = 0;
    if (M > N) { /* stream the longer side as B panels: C^T = op(B)^T op(A)^T */
        a = (Op){B, !tb, ldb};
        b = (Op){A, !ta, lda};
        int x = M;
        M = N, N = x, tc = 1;
    }
    run(&a, &b, NULL, M, N, K, alpha, beta, tc, C, ldc, scratch);
    return 0;
}

size_t gemm_amx_packed_values(int K, int N) {
    return (size_t)((N + 31) / 32 * 2) * (size_t)((K + GA_STEP - 1) / GA_STEP) * GA_TILE;
}

void gemm_amx_prepack(const uint16_t *B, int tb, int ldb, int K, int N, uint16_t *dst) {
    Op b = {B, tb, ldb};
    int halves = (N + 31) / 32 * 2, steps = (K + GA_STEP - 1) / GA_STEP;
#pragma omp parallel for schedule(static)
    for (int h = 0; h < halves; h++)
        pack_b_tiles(&b, h * 16, N, 0, K, steps, dst + (long)h * steps * GA_TILE);
}

int gemm_amx_bf16_packed(int ta, int M, int N, int K, float alpha, const uint16_t *A, int lda,
                         const uint16_t *Bp, float beta, float *C, int ldc, void *scratch) {
    if (!gemm_amx_ready() || M <= 0 || N <= 0 || K <= 0) return -1;
    Op a = {A, ta, lda};
    run(&a, NULL, Bp, M, N, K, alpha, beta, 0, C, ldc, scratch);
    return 0;
}

void gemm_amx_pack_timing(int on) {
    g_pack_timed = on;
}

double gemm_amx_pack_seconds(void) {
    return g_pack_seconds;
}
