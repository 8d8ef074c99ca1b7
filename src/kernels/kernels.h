/* The CPU kernels of the library (one file each in src/kernels/), each a faster implementation of
 * an op kind registered by name in registry.c; each file holds one kernel's forward, backward and
 * supports(). Tile and chunk sizes are exported for tests and benchmarks. */
#ifndef QT_KERNELS_H
#define QT_KERNELS_H

#include "ops/lm_head_loss.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/sdpa.h"
#include "ops/swiglu.h"

/* sdpa "flash": tiled attention with online softmax; seq_len a multiple of FLASH_TILE. */
#define FLASH_TILE 64
#define FLASH_MAX_HEAD_DIM 256
extern const SdpaOp sdpa_flash;

/* rope "rope_nogather": positions 0..T-1 of every row, no position table. */
extern const RopeOp rope_nogather;

/* feed_forward "swiglu_fused": one GEMM against [w1; w3] and a fused activation. */
extern const SwigluOp swiglu_fused;

/* rmsnorm "rmsnorm_fused": AVX-512 rows; fuses the residual add (see rmsnorm.h forward_add). */
extern const RmsnormOp rmsnorm_fused;

/* loss "loss_chunked": lm_head + cross-entropy LOSS_CHUNK tokens at a time. */
#define LOSS_CHUNK 256
extern const LmHeadLossOp loss_chunked;

#endif
