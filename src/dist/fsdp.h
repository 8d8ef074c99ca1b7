/* FSDP shard bookkeeping (fully sharded data parallel, flat-parameter layout), without the
 * model. Parameters are grouped into units (a transformer layer, the embedding, the final
 * norm + lm_head); the trainer gathers a unit's full parameters just before it runs and
 * reduce-scatters its full gradients right after its backward.
 *
 * Layout. Within a unit the parameters are laid end to end in the order given, each starting
 * on a 16-float (64-byte) boundary, and the unit is padded to a multiple of 16 * dp_shard
 * floats: that is the unit's full workspace. Shard rank k owns the contiguous k-th 1/dp_shard
 * of it (so a parameter may straddle two ranks). A rank's shard buffer is its pieces of all
 * units end to end; master weights, gradients and both AdamW moments use that same layout,
 * padding included (padding stays zero: its gradient is zero, so AdamW leaves it at zero).
 * A gather lands directly in the full workspace and a reduce-scatter reads directly from it,
 * with no copy in or out.
 *
 * Averaging convention: the trainer's loss is already a sum over tokens divided by the
 * global valid-token count, so every rank's gradient is its share of the global mean and the
 * reduce-scatter SUMS (no division by dp_shard); across dp_replicate the shards are summed
 * too. */
#ifndef QT_DIST_FSDP_H
#define QT_DIST_FSDP_H

#include <stddef.h>

#include "core/err.h"
#include "dist/comm.h"

typedef struct FsdpParam {
    size_t numel;       /* elements of the parameter */
    int unit;           /* the unit it belongs to */
    size_t full_offset; /* where it starts in its unit's full workspace (multiple of 16) */
} FsdpParam;

typedef struct FsdpUnit {
    size_t full_numel;   /* padded full workspace: a multiple of 16 * dp_shard */
    size_t shard_numel;  /* full_numel / dp_shard */
    size_t shard_offset; /* where this unit's piece starts in a rank's shard buffer */
} FsdpUnit;

typedef struct FsdpPlan {
    int dp_shard, shard_rank; /* group size and this rank's index in it */
    int n_params, n_units;
    FsdpParam *params;     /* (n_params) */
    FsdpUnit *units;       /* (n_units) */
    size_t shard_numel;    /* a rank's whole shard buffer */
    size_t max_full_numel; /* the largest unit: size of one full workspace */
    size_t max_unit_shard; /* the largest unit's shard piece: size of a reduce-scatter scratch */
} FsdpPlan;

/* Plans n_params parameters of numel[i] elements in unit[i] (0 <= unit < n_units; a unit
 * may be empty) for rank shard_rank of a dp_shard-rank group. */
int fsdp_plan(FsdpPlan *out, const size_t *numel, const int *unit, int n_params, int n_units,
              int dp_shard, int shard_rank, Err *err);
void fsdp_plan_free(FsdpPlan *p);

/* The part of parameter i that this rank's shard holds: elements [*lo, *hi) of the parameter
 * live at shard[*shard_at ...]. Returns 0 with *lo == *hi when this rank holds none of it. */
void fsdp_param_shard(const FsdpPlan *p, int i, size_t *lo, size_t *hi, size_t *shard_at);

/* Copies full parameters (each param i at full_params[i], numel[i] floats) into this rank's
 * shard (shard_numel floats, padding zeroed): how a model initialised or loaded in full on
 * every rank is cut down. */
void fsdp_shard_from_full(const FsdpPlan *p, float *shard, const float *const *full_params);

/* A pending gather or reduce-scatter of one unit. */
typedef struct FsdpReq {
    CommReq *req;
    float *acc; /* reduce-scatter: (shard_numel of the unit) where the sum is added */
    float *tmp; /* reduce-scatter: (shard_numel of the unit) the received sum */
    size_t n;
} FsdpReq;

/* full (unit's full_numel) = the unit's parameters gathered from every shard's piece of
 * `shard` (this rank's whole shard buffer), both of elements of type t: COMM_F32, or COMM_BF16
 * for a shard held in bf16 (a LoRA run's bf16 base), which moves half the bytes; the plan's
 * offsets and sizes are elements either way. Collective over `comm` (the dp_shard group). */
int fsdp_gather_unit(const FsdpPlan *p, Comm *comm, void *full, const void *shard, int unit,
                     CommDtype t, Err *err);
/* The same, started now and finished by fsdp_wait: prefetches the next unit while this one
 * computes (needs a second full workspace). */
int fsdp_gather_unit_start(const FsdpPlan *p, Comm *comm, void *full, const void *shard, int unit,
                           CommDtype t, FsdpReq *req, Err *err);
/* grad_shard (this rank's whole shard buffer) += this rank's piece of the sum over ranks of
 * full_grad (the unit's full_numel): accumulation, so microbatches add up. scratch
 * (max_unit_shard floats, one per outstanding reduce-scatter) receives the sum first, so
 * nothing is allocated here. */
int fsdp_reduce_scatter_unit(const FsdpPlan *p, Comm *comm, float *grad_shard,
                             const float *full_grad, int unit, float *scratch, Err *err);
int fsdp_reduce_scatter_unit_start(const FsdpPlan *p, Comm *comm, float *grad_shard,
                                   const float *full_grad, int unit, float *scratch, FsdpReq *req,
                                   Err *err);
/* Lets a started gather or reduce-scatter progress (see comm_test); *done = 1 once its data
 * has moved. */
int fsdp_test(Comm *comm, FsdpReq *req, int *done, Err *err);
/* Completes a started gather or reduce-scatter. */
int fsdp_wait(Comm *comm, FsdpReq *req, Err *err);

/* HSDP: sums the whole gradient shard over the dp_replicate group (in place). */
int fsdp_all_reduce_replicas(const FsdpPlan *p, Comm *replicate, float *grad_shard, Err *err);

/* Sums of squares over this rank's shard buffer, in double, split by whether a parameter is
 * replicated across tensor-parallel ranks (tp_replicated[i] != 0; NULL: none is): the two
 * arguments of mesh_global_norm. Padding is counted in neither. */
void fsdp_shard_sq_sums(const FsdpPlan *p, const float *shard, const unsigned char *tp_replicated,
                        double *sq_tp_sharded, double *sq_tp_replicated);

#endif
