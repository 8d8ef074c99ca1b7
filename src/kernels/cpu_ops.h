/* The default CPU implementations ("cpu") of the op kinds: vectorised (AVX-512 through the
 * compiler and kernels/cpu_simd.h) and split over OpenMP threads, each beside its plain
 * reference in src/ops and tested against it (tests/test_cpu_ops.c). Each sums in an order
 * fixed by the shapes alone, so results are the same for any thread count and run to run.
 * The registry (kernels/registry.c) marks them the CPU defaults; the embedding's reference is
 * already a parallel copy / scatter-add, so it is also the CPU default. */
#ifndef QT_CPU_OPS_H
#define QT_CPU_OPS_H

#include "ops/cross_entropy.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/op.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/sdpa.h"
#include "ops/swiglu.h"

/* Largest head_dim sdpa_cpu and rope_cpu take (their tiles live on the stack). */
#define SDPA_MAX_HEAD_DIM 256
/* Largest head_dim sdpa_cpu's bf16 entries compute in bf16 (an even one; others, and CPUs
 * without AVX512_BF16, compute in fp32). */
#define SDPA_BF16_MAX_HEAD_DIM 128

extern const SdpaOp sdpa_cpu;                  /* tiled, online softmax, causal / document skips */
extern const CrossEntropyOp cross_entropy_cpu; /* rows over threads, simd_exp in chunks */
extern const RmsnormOp rmsnorm_cpu;            /* fp32 vector row sums */
extern const RopeOp rope_cpu;                  /* cos / sin once per token; bitwise the reference */
extern const SwigluOp swiglu_cpu;              /* vector gate; bf16 path */
extern const LinearOp linear_cpu;              /* the reference's GEMMs; bf16 path */
/* supports() of sdpa_cpu and rope_cpu: head_dim <= SDPA_MAX_HEAD_DIM. */
const char *cpu_head_dim_supports(const OpRun *run);

#endif
