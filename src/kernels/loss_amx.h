/* loss_chunked's bf16 training step on AMX tiles (LmHeadLossFusedFn's contract, bf16 weight
 * copy wb): the output projection and cross-entropy in vocabulary panels, so the fp32 logits of
 * a panel never leave the core's caches. Three products, as the token-chunked path runs:
 *
 *  1. per panel of LOSS_AMX_PANEL vocabulary rows (panels over threads): the logits of every
 *     token against the panel's rows in tiles, their per-token maximum m and sum of
 *     exp(logit - m) over the panel (fp32, row order), and exp(logit - m) in bf16 (E, vocab-major
 *     in the bf16 scratch, values in (0, 1] so their relative rounding is bf16's 2^-9);
 *  2. per token: the log-sum-exp from the panels' (m, sum) in panel order (double), the loss
 *     from the target's fp32 logit, and each panel's factor scale * exp(m - lse);
 *  3. per panel again: the dlogits E * factor in bf16, in place over E (the target's entry from
 *     its fp32 logit: scale * expm1(logit - lse)), then dW += dlogits^T x on tiles while the
 *     panel's dlogits are in cache;
 *  4. dX = dlogits E_w: one AMX product over the whole vocabulary (ops/gemm_amx.h).
 *
 * Every value is summed by one thread in an order fixed by the shape, so the results do not
 * depend on the thread count. While the op profile times (ops/op_profile.h), the tile products
 * and their operand packing count as GEMM time of the op that runs this. */
#ifndef QT_KERNELS_LOSS_AMX_H
#define QT_KERNELS_LOSS_AMX_H

#include <stdint.h>

#define LOSS_AMX_PANEL 256 /* vocabulary rows per panel: 8 pairs of 16-row tiles */

/* Floats of workspace loss_amx_fused needs (64-byte alignment included). */
long loss_amx_workspace_floats(long N, int D, int V);

/* 1 when this process's bf16 products run on AMX tiles (ops/gemm.h gemm_bf16_path), wb holds
 * plain bf16 values and the shape fits: D a multiple of 32 and the vocab-major exponentials
 * (V and N rounded up to 32) within the scratch's N (D + V) values. */
int loss_amx_usable(const uint16_t *wb, long N, int D, int V);

/* The fused step under loss_amx_usable: losses and lse of the N tokens written, dx written, dw
 * accumulated (+=); returns the sum of the losses of valid targets in token order. ws: the
 * workspace (loss_amx_workspace_floats), scratch: the bf16 scratch of N (D + V) values. */
double loss_amx_fused(float *losses, float *lse, float *dx, float *dw, float *ws, const float *x,
                      const uint16_t *wb, uint16_t *scratch, const int32_t *targets, long N, int D,
                      int V, float scale);

#endif
