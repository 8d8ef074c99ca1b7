/* Qwen3 trained with FSDP (ZeRO-3) over a device mesh: each rank keeps 1/dp_shard of every
 * parameter (the fp32 master copy), of its gradient and, through the trainer's AdamW over
 * those slices, of the optimizer state. The model holds no parameters of its own: its
 * per-unit hook (Qwen3.unit_hook) all-gathers a unit (the embedding, one layer, the final
 * norm with lm_head) into one of a few full-size workspaces just before the unit's forward
 * and again before its backward, prefetching the next unit with a non-blocking gather, and
 * reduce-scatters the unit's gradient into the rank's slice right after its backward. With
 * dp_replicate > 1 (HSDP) the slices are then summed across replicas.
 *
 * Kept apart from train_job.c for the same reason as train_qwen3.h (model/qwen3.h and
 * core/config.h both name AC_NONE / AC_FULL). */
#ifndef QT_FSDP_MODEL_H
#define QT_FSDP_MODEL_H

#include <stdint.h>

#include "core/ac_mode.h"
#include "core/err.h"
#include "core/model_spec.h"
#include "dist/mesh.h"
#include "model/overrides.h"
#include "train/trainer.h"

typedef struct FsdpModel FsdpModel;

/* A sharded Qwen3 for micro-batches of up to B x T tokens (the batch type is
 * TrainQwen3Batch), with activation checkpointing ac and the kernels of plan (as one process
 * builds them, for the rank's shapes). Parameters start at zero. Dense models with or without
 * tensor parallelism (and sequence parallelism when the mesh has it); MoE models (router,
 * stacked experts and expert_bias sharded with their layer) without it. */
FsdpModel *fsdp_model_create(const ModelSpec *spec, int B, int T, AcMode ac, const Mesh *mesh,
                             const OverridePlan *plan, Err *err);
/* What fsdp_model_create refuses beyond the mesh's checks (MoE with tensor parallelism), for
 * `qtitan plan` to say the same. */
int fsdp_model_check(const ModelSpec *spec, int tp, Err *err);
void fsdp_model_free(FsdpModel *f);
/* Mixed precision (training.mixed_precision_param = "bfloat16"), as one process's model: the
 * matmuls take bf16 copies of the weights, made from each unit's gathered fp32 weights into a
 * bf16 twin of its workspace, so a rank holds bf16 copies of three workspaces, never of the
 * model. Master weights, gradients, collectives and the optimizer stay fp32. */
int fsdp_model_enable_bf16(FsdpModel *f, Err *err);
/* DESIGN §5 init, bitwise the same values as one process: each tensor is drawn whole (one
 * at a time) and only this rank's slice is kept. */
void fsdp_model_init(FsdpModel *f, uint64_t seed);
/* Loads HF weights one tensor at a time, keeping this rank's slice. */
int fsdp_model_load_hf(FsdpModel *f, const char *path, Err *err);
/* MoE: each micro-batch's router auxiliary loss counts 1 / (micro_batches x dp ranks), so a
 * step adds router_aux_loss_coef times the mean over the global batch's micro-batches, as
 * train_qwen3_set_micro_batches does on one process. */
void fsdp_model_set_micro_batches(FsdpModel *f, int micro_batches);
/* The trainer's view: parameters and gradients are this rank's slices, one 1-D tensor per
 * parameter piece the rank holds (named like the full parameter). MoE models also get
 * before_optimizer_step: the routing counts are summed over the data-parallel ranks before the
 * expert_bias update (train/moe_step.h), which is applied to the shards. */
void fsdp_model_train_model(FsdpModel *f, TrainModel *out, int exempt);
/* The trainer's data-parallel hooks (gradient completion, global norm, comm time). */
void fsdp_model_parallel(FsdpModel *f, TrainParallel *out);

#endif
