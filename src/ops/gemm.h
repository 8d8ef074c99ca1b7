/* The one GEMM interface every matmul goes through (forward and both backward products).
 * Row-major: C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C, where op(X) is X or X^T
 * (ta / tb). lda, ldb, ldc are row strides of A, B, C as stored. beta = 1 accumulates, which
 * parameter gradients use; beta = 0 never reads C (NaN or garbage there does not leak in).
 *
 * Backends (chosen once, logged once; QT_GEMM=auto|dnnl|sgemm|ref forces one for debugging):
 *   auto   the default: fp32 through dnnl_sgemm. On the model's real products sgemm is as fast
 *          as matmul or faster, and matmul falls to 20-30% of peak when a row stride is a
 *          multiple of 4 KiB (w2's dX and dW with F = 3072: bench/README.md "GEMM"). bf16
 *          through whichever of two paths is faster on this host, timed once at start-up
 *          (QT_GEMM_BF16=widen|onednn forces one): oneDNN's bf16 matmul (the only route to
 *          AMX), or dnnl_sgemm on operands widened to fp32, which wins where the bf16 unit is
 *          vdpbf16ps at half the FMA rate (no AMX; bench/README.md "Versus PyTorch").
 *   dnnl   oneDNN matmul primitives, cached per (dtype, shape, transposition, strides, alpha,
 *          beta); fp32 and bf16 (bf16 needs AVX512_BF16 or oneDNN's AVX-512 emulation).
 *   sgemm  oneDNN's dnnl_sgemm (fp32; bf16 on widened operands).
 *   ref    the plain loops below (gemm_f32_ref); the numerical truth in tests.
 * Results are bitwise reproducible run to run for a fixed thread count and fixed shapes, also
 * across buffer alignment (tests/test_gemm.c checks it); a different OMP_NUM_THREADS may change
 * the summation order and so the last bits (measured: oneDNN bf16 and dnnl_sgemm do, see
 * bench/README.md). Thread-safe: any number of threads may call concurrently. */
#ifndef QT_GEMM_H
#define QT_GEMM_H

#include <stddef.h>
#include <stdint.h>

void gemm_f32(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc);

/* Under auto, fp32 products x W^T (tb = 1) of GEMM_F32_MATMUL_M_MIN to GEMM_F32_MATMUL_M_MAX
 * rows run as a cached oneDNN matmul primitive, every other fp32 product as dnnl_sgemm (why:
 * ops/gemm.c). */
#define GEMM_F32_MATMUL_M_MIN 16
#define GEMM_F32_MATMUL_M_MAX 256

/* gemm_f32 for a product whose shape changes from call to call within a training step (a MoE
 * expert's share of the tokens; attention's blocks where the CPU lacks AVX-512). gemm_f32 may
 * build and keep a oneDNN primitive for each new shape (products x W^T of few rows, outside
 * parallel regions; ops/gemm.c), which allocates; this one runs such products as dnnl_sgemm
 * under auto, which keeps nothing per shape, so a step of ever-new shapes allocates nothing
 * here. Same flags, beta rules and reproducibility. */
void gemm_f32_varying(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                      const float *B, int ldb, float beta, float *C, int ldc);

/* A and B hold bf16 bit patterns, or are handles of widened copies (below); accumulation and
 * C are fp32. Same flags and beta rules. */
void gemm_bf16(int ta, int tb, int M, int N, int K, float alpha, const uint16_t *A, int lda,
               const uint16_t *B, int ldb, float beta, float *C, int ldc);

/* Plain loops, parallel over rows of C: slow, obviously correct. */
void gemm_f32_ref(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, float beta, float *C, int ldc);

/* Selects a backend by name ("auto", "dnnl", "sgemm", "ref") for tests and benchmarks; returns -1
 * for an unknown name. Not thread-safe against concurrent GEMMs. */
int gemm_set_backend(const char *name);
/* The active backend's one-line description, e.g. "oneDNN 2.6.3 matmul (fp32, bf16)". */
const char *gemm_backend_name(void);

/* ---- weight copies in the layout of the bf16 path ----
 * 1 when bf16 products run as fp32 GEMMs on widened operands (see auto above). A trained
 * weight's low-precision copy is then best kept widened: its bf16-rounded values stored as fp32
 * (twice the bytes of bf16), written once per optimizer step, so no product widens a weight.
 * Activations and gradients, and weights held in bf16 only, are widened per product in blocks
 * into GEMM_BF16_SCRATCH_BYTES of scratch, allocated on the first product and kept. */
int gemm_bf16_widens(void);
/* The bf16 paths under auto, each a different summation order: fp32 GEMMs on widened operands,
 * oneDNN's bf16 matmul, or qtitan's AMX tile kernel (ops/gemm_amx.h; oneDNN's matmul past
 * K 16384). Checkpoints record them by these names (GEMM_BF16_PATH_NAMES, index = value). */
enum { GEMM_BF16_WIDEN = 1, GEMM_BF16_ONEDNN, GEMM_BF16_AMX };
#define GEMM_BF16_PATH_NAMES                                                                       \
    { "auto", "widen", "onednn", "amx" }
/* This process's bf16 path (chosen now if not yet); under a forced backend, GEMM_BF16_WIDEN
 * when it widens and GEMM_BF16_ONEDNN otherwise. */
int gemm_bf16_path(void);
/* Makes this process's bf16 path the one another process chose (its gemm_bf16_path), so the
 * ranks of a job multiply alike whatever each would have measured. Call before the first bf16
 * product or question; returns -1 when this process had already chosen otherwise, or cannot
 * run that path (amx without AMX). */
int gemm_bf16_adopt(int path);
/* Prefers the path a resumed run's checkpoint was trained with (as gemm_bf16_path answered
 * then; why: the reason the backend line gives), so the resumed steps multiply as the
 * uninterrupted run would have; QT_GEMM_BF16 still wins (the resume compares the two and
 * warns), and so does a path this CPU cannot run. Call before the first bf16 product or
 * question. */
void gemm_bf16_prefer(int path, const char *why);
#define GEMM_BF16_SCRATCH_BYTES ((size_t)32 << 20)

/* ---- bf16 weights prepacked for the AMX path ----
 * On the AMX path (under auto; QT_GEMM_PREPACK=0 turns it off) a bf16 weight W (rows x cols,
 * row-major, row stride cols) that many products read can be registered with room for its two
 * packed forms (ops/gemm_amx.h): op(B) = W^T, the forward's x W^T, and op(B) = W, the backward's
 * dout W. A product whose B is the registered W itself, whole, in one of these two roles, then
 * reads the packed form: no product packs the weight, and op(A) is never swapped in to stream
 * the longer side (its tiles are packed instead: rows of an untransposed A are copied as
 * they are). Whoever writes W calls gemm_bf16_weight_written(W) after (the optimizer, once per
 * step), which repacks both forms.
 * 1 when this process prepacks (asks, so may choose, the bf16 path). */
int gemm_bf16_prepacks(void);
/* The bf16 values both packed forms of a rows x cols weight take. */
size_t gemm_bf16_packed_values(int rows, int cols);
/* Registers W with dst (gemm_bf16_packed_values(rows, cols) values, 64-byte aligned) for its
 * forms, to be filled by gemm_bf16_weight_written; -1 when too many weights are registered. */
int gemm_bf16_pack_register(const uint16_t *w, int rows, int cols, uint16_t *dst);
/* Unregisters every W in [base, base + bytes) (before that memory is freed). */
void gemm_bf16_pack_unregister(const void *base, size_t bytes);
/* W was written: repacks its forms when it is registered (else nothing). */
void gemm_bf16_weight_written(const uint16_t *w);

/* Registers n fp32 values at base as widened copies and returns the handle of base[0], or NULL
 * when too many regions are registered. The copy of base[i] is passed wherever a bf16 weight
 * goes (up to gemm_bf16) as handle + i: a uint16_t pointer that only gemm_bf16 reads, through
 * gemm_widened_values. Unregister before freeing base. */
uint16_t *gemm_widened_register(float *base, size_t n);
void gemm_widened_unregister(const float *base);
/* The fp32 values behind a handle; NULL when p is not one (plain bf16 values). */
float *gemm_widened_values(const uint16_t *p);

#endif
