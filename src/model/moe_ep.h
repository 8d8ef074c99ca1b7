/* Expert parallelism for the MoE block (docs/distributed.md, "Expert parallelism"): the X
 * experts of a layer are split over the P ranks of an expert-parallel group, rank q holding
 * experts [q * Xl, (q + 1) * Xl), Xl = X / P. Routing stays on the token's own rank; the
 * experts part moves the tokens instead of the weights:
 *
 *   dispatch  every assignment (token n, slot j) of this rank's tokens, in expert order (stable,
 *             so token order inside an expert), is sent with its input row to the rank that
 *             holds expert idx[n, j]: an all-to-all of the per-expert counts, then of the rows;
 *   experts   the received rows go through the layer's experts op (any implementation, kernel
 *             overrides included) as M one-slot tokens with gate weight 1, so each output row
 *             is the expert's unweighted SwiGLU, exactly as inside one process's op;
 *   combine   the output rows travel back by the reverse all-to-all and each token sums
 *             gw[n, j] * y[n, j] in slot order, as the grouped op does.
 *
 * Backward runs the same path with the weighted output gradients (gw * dout, the rows the op's
 * own backward would form) and returns the input gradients of the rows; the gate-weight
 * gradients dout . y are taken where the token lives. The local experts' weight gradients
 * accumulate the rows of every rank of the group.
 *
 * Token blocks: when the group also spans the tp ranks, which all hold the same tokens, tp rank
 * b of TB takes the tokens [b * N / TB, (b + 1) * N / TB) and leaves zeros in the others' rows
 * of out / dx, so the model's tensor-parallel sum assembles every token exactly (x + 0 = x).
 *
 * Buffers grow to the largest count seen (the number of rows an expert receives depends on the
 * routing) and are kept, per layer where backward needs them. */
#ifndef QT_MOE_EP_H
#define QT_MOE_EP_H

#include <stddef.h>
#include <stdint.h>

#include "ops/moe_experts.h"

/* The all-to-all over the EP group (comm_all_to_all_v on floats): send_counts[p] floats of in
 * go to rank p, recv_counts[p] floats from rank p land in out, both runs in rank order. */
typedef void (*MoeEpAllToAll)(void *ctx, float *out, const size_t *recv_counts, const float *in,
                              const size_t *send_counts);

typedef struct MoeEpLayer MoeEpLayer;

typedef struct MoeEp {
    int P, q;      /* group size and this rank's index */
    int X, Xl;     /* experts of a layer, and per rank */
    int tb, tb_at; /* token blocks (the tp ranks in the group, else 1) and this rank's */
    MoeEpAllToAll all_to_all;
    void *ctx;
    int L;
    MoeEpLayer *layers; /* (L) */
    /* shared scratch, grown on demand */
    float *send, *recv, *drows, *rows_gw, *rows_dgw, *scratch;
    int32_t *rows_idx;
    size_t send_cap, recv_cap, drows_cap, rows_cap, rows_gw_cap, rows_dgw_cap, scratch_cap;
    size_t *counts; /* (4 P) send / receive floats, and their row counts */
    float *ecount;  /* (2 X) per-expert counts sent / received (as floats: exact below 2^24) */
    long *cursor;   /* (X + 1) the counting sort's fill cursors */
} MoeEp;

/* P ranks, this one q; X experts (divisible by P); tb token blocks, this rank's tb_at. */
MoeEp *moe_ep_create(int P, int q, int X, int tb, int tb_at, int L, MoeEpAllToAll fn, void *ctx);
void moe_ep_free(MoeEp *ep);

/* The first token and count of this rank's block of N tokens. */
long moe_ep_block(const MoeEp *ep, long N, long *first);

/* Layer l's experts part forward: out (N, D) written (zeros outside this rank's block); x (N, D)
 * the normed input, idx / gw (N, k) the routing of all N tokens; w* this rank's Xl experts. */
void moe_ep_forward(MoeEp *ep, int l, const MoeExpertsOp *op, float *out, const float *x,
                    const int32_t *idx, const float *gw, const float *w1, const float *w3,
                    const float *w2, long N, int k, int D, int F);
/* Its backward: dx (N, D) written (zeros outside the block), dgw (N, k) written for the block's
 * tokens, dw* (the local experts') accumulated; dout (N, D). */
void moe_ep_backward(MoeEp *ep, int l, const MoeExpertsOp *op, float *dx, float *dgw, float *dw1,
                     float *dw3, float *dw2, const float *dout, const int32_t *idx, const float *gw,
                     const float *w1, const float *w3, const float *w2, long N, int k, int D,
                     int F);

#endif
