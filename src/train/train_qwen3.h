/* The training driver: Qwen3 on a device mesh behind the trainer's TrainModel and
 * TrainParallel interfaces, for every mesh; one process is a world of one.
 *
 * On a world of one the model's own arenas hold the parameters and gradients and no collective
 * runs. On more processes the model trains with FSDP (ZeRO-3): each rank keeps 1/dp_shard of
 * every parameter (the fp32 master copy), of its gradient and, through the trainer's AdamW over
 * those slices, of the optimizer state. The model then holds no parameters of its own: its
 * unit callback (Qwen3Dist.unit) all-gathers a unit (the embedding, one layer, the final norm
 * with lm_head) into one of a few full-size workspaces just before the unit's forward and again
 * before its backward, prefetching the next unit with a non-blocking gather, and
 * reduce-scatters the unit's gradient into the rank's slice right after its backward. With
 * dp_replicate > 1 (HSDP) the slices are then summed across replicas; with tp > 1 the rank's
 * model has its share of the heads and FFN columns (and of the tokens under sequence
 * parallelism); with expert parallelism it holds its EP group's share of every MoE layer's
 * experts. */
#ifndef QT_TRAIN_QWEN3_H
#define QT_TRAIN_QWEN3_H

#include <stddef.h>
#include <stdint.h>

#include "core/ac_mode.h"
#include "core/err.h"
#include "core/model_spec.h"
#include "dist/mesh.h"
#include "io/hf_export.h"
#include "model/overrides.h"
#include "train/trainer.h"

typedef struct TrainQwen3 TrainQwen3;
struct Lora;

/* One micro-batch: B rows of T tokens. positions / doc NULL = 0..T-1, plain causal. */
typedef struct TrainQwen3Batch {
    int B, T;
    const int32_t *tokens;    /* (B, T) */
    const int32_t *targets;   /* (B, T) */
    const int32_t *positions; /* (B, T) or NULL */
    const int32_t *doc;       /* (B, T) or NULL */
    int64_t row;              /* the dataset row of the first row (seeds LoRA dropout masks) */
} TrainQwen3Batch;

/* This rank's Qwen3 for micro-batches of up to B x T tokens, with activation checkpointing ac
 * and the kernels of plan (from overrides_resolve, chosen for the rank's shapes; NULL = the
 * defaults of train_qwen3_modules). mesh NULL: a world of one. Parameters start at zero. Dense
 * models on any mesh; MoE models with the router and expert_bias sharded with their layer and
 * the stacked experts either too (expert_parallel_degree 1) or split over the mesh's EP group,
 * X / ep experts per rank, themselves FSDP-sharded over the replica's ranks computing the same
 * ones (Mesh.ep_shard), the tokens moved to them by all-to-all
 * (model/moe_ep.h), which is how MoE trains with tp > 1. frozen: the model's own weights do not
 * train (LoRA): no gradient arena, no weight-gradient products (qwen3_create_frozen_with), and
 * when sharded no gradient shard, workspace or reduce-scatter; base_bf16 (with frozen): its
 * matmul weights and embedding held in bf16 only, on a world of one and when sharded alike
 * (bf16 shards, gathered in bf16 into bf16 workspaces: 2 bytes a parameter). */
TrainQwen3 *train_qwen3_create(const ModelSpec *spec, int B, int T, AcMode ac, const Mesh *mesh,
                               const OverridePlan *plan, int frozen, int base_bf16, Err *err);
void train_qwen3_free(TrainQwen3 *q);
/* The model itself, for forward-only work between steps (validation): when sharded, this
 * rank's, whose forward gathers each unit as training's does (collective over the mesh). */
struct Qwen3 *train_qwen3_qwen3(TrainQwen3 *q);
/* The mesh q trains on (a world of one when created without one). */
const Mesh *train_qwen3_mesh(const TrainQwen3 *q);
/* 1 when q runs on more than one process (its model holds no parameters of its own). */
int train_qwen3_sharded(const TrainQwen3 *q);
/* Samples on a mesh or with LoRA: out becomes a forward-only model of the whole spec (one
 * process's shapes, the same kernels and precision as q) with no weights yet; rank 0 makes
 * one. */
int train_qwen3_whole_create(TrainQwen3 *q, struct Qwen3 *out, Err *err);
/* Collective over q's mesh: every unit gathered as for a forward and, under tensor
 * parallelism, the parts of each split parameter joined, so that dst (NULL on every rank but
 * the one that holds it) gets the whole current weights, bitwise (on one process, a copy), with
 * LoRA adapters merged as train_qwen3_export_merged merges them, and their bf16 copies when it
 * has them. */
int train_qwen3_gather_whole(TrainQwen3 *q, struct Qwen3 *dst, Err *err);
/* Samples through the shards, when a whole copy would not fit: out becomes a forward-only
 * model of the whole spec (as train_qwen3_whole_create's) whose weights live in two buffers q
 * keeps, one for the edge unit being run (the embedding, or the final norm and lm_head) and one
 * for a layer, with bf16 twins under mixed precision; train_qwen3_gather_unit fills them one
 * unit at a time. Rank 0 makes one; a sharded q only. */
int train_qwen3_unitwise_create(TrainQwen3 *q, struct Qwen3 *out, Err *err);
/* Collective over q's mesh: unit `unit` (0 the embedding, 1 + l layer l, n_layers + 1 the
 * final norm and lm_head) gathered as train_qwen3_gather_whole gathers it into dst (from
 * train_qwen3_unitwise_create; NULL on the ranks that only take part), and its bf16 copy cast.
 * A failed collective aborts the job, as one inside a forward does. */
void train_qwen3_gather_unit(TrainQwen3 *q, struct Qwen3 *dst, int unit);
/* The module set a model of spec runs (creating and sizing both take it from here, so `qtitan
 * plan` sizes what training allocates): the fast CPU kernels by default, the plain references
 * with QT_KERNELS=reference (said once when verbose), plan's overrides when plan is not NULL
 * (one log line per replacement). spec may be a tensor-parallel rank's part of plan's model.
 * Caller frees. */
struct Qwen3Modules *train_qwen3_modules(const ModelSpec *spec, const OverridePlan *plan,
                                         int verbose);

/* Bytes of the parameter, gradient and activation arenas a model of spec has for the same
 * arguments (model/qwen3.h qwen3_sizes: the same layout code, counting only); sp > 1: the
 * activations of a sequence-parallel rank. */
typedef struct TrainQwen3Sizes {
    size_t param_bytes, grad_bytes, act_bytes;
    size_t bf16_bytes[2];   /* added by train_qwen3_enable_bf16 on a world of one (Qwen3Sizes) */
    size_t bf16_pack_bytes; /* and where the copies are prepacked (Qwen3Sizes) */
    /* A frozen bf16 base (train_qwen3_create base_bf16): its fp32 and bf16 arenas instead. */
    size_t base_bf16_param_bytes, base_bf16_bytes;
    size_t bf16_scratch_bytes; /* sharded, under bf16: the model's matmul scratch alone */
    int products_bf16;         /* every product reads bf16 copies under bf16 (qwen3.h) */
    int nparams;
} TrainQwen3Sizes;
int train_qwen3_sizes(TrainQwen3Sizes *out, const ModelSpec *spec, int B, int T, AcMode ac, int sp,
                      const OverridePlan *plan, Err *err);

/* Mixed precision (training.mixed_precision_param = "bfloat16"): bf16 matmuls; master weights,
 * gradients, collectives and the optimizer stay fp32. When sharded, the bf16 copies are made
 * from each unit's gathered fp32 weights into a bf16 twin of its workspace, so a rank holds
 * bf16 copies of three workspaces, never of the model. */
int train_qwen3_enable_bf16(TrainQwen3 *q, Err *err);
/* The model's random init (qwen3_init_params), bitwise the same values on every mesh: a
 * sharded rank draws its part alone, 2^20 values at a time, never a tensor whole. */
void train_qwen3_init(TrainQwen3 *q, uint64_t seed);
/* Loads HF-named weights (a .safetensors file or an HF directory), any of F32/BF16/F16; a
 * sharded rank reads its part alone from the mapped files, 2^20 values at a time. The files must
 * hold exactly the model's tensors with their shapes (lm_head.weight may be absent when tied); the
 * error lists every missing, unexpected and misshaped key. */
int train_qwen3_load_hf(TrainQwen3 *q, const char *path, Err *err);
/* MoE: each micro-batch's router auxiliary loss counts 1 / (micro_batches x dp ranks), so a
 * step adds router_aux_loss_coef times the mean over the global batch's micro-batches (the
 * reported loss is the cross-entropy alone). */
void train_qwen3_set_micro_batches(TrainQwen3 *q, int micro_batches);
/* The TrainModel view (valid while q lives): one tensor per parameter piece this rank holds,
 * named like the full parameter (the whole parameter, shaped, on a world of one; a 1-D slice
 * when sharded). exempt: no weight decay for norms and embeddings. MoE models also get
 * before_optimizer_step (train/moe_step.h): the routing counts summed over the data-parallel
 * ranks, the expert_bias update and the moe_tokens_min / moe_tokens_max / moe_imbalance
 * metrics. */
void train_qwen3_model(TrainQwen3 *q, TrainModel *out, int exempt);
/* The trainer's mesh hooks (gradient completion, global norm, comm time). */
void train_qwen3_parallel(TrainQwen3 *q, TrainParallel *out);

/* LoRA (model/lora.h): lo's adapters (made whole: created, and initialised or loaded) act in
 * q's forward and backward, and out becomes the TrainModel of the adapters alone (A and B of
 * each, named "layers.N.attention.wq.lora_A", all weight-decayed): the optimizer, clipping and
 * checkpoints see only them, the base weights stay as loaded. On a mesh the adapters are
 * sharded like their base layer: each tensor-parallel rank keeps its blocks (lora_set_tp), and
 * of those 1/dp_shard, gathered and reduce-scattered with the layer's FSDP unit (lo's whole
 * factors are freed); out's pieces are then those shares, with their slices. lo must outlive
 * q's use. */
int train_qwen3_model_lora(TrainQwen3 *q, struct Lora *lo, TrainModel *out, Err *err);
/* Every adapter's whole A and B into out, in Lora.param's layout (lora_numel floats); out NULL:
 * this rank only takes part. Collective when sharded (each layer's adapters gathered). */
int train_qwen3_lora_params(TrainQwen3 *q, float *out, Err *err);
/* Merges the adapters into the base weights (W + s B A; the adapters stop acting) and writes
 * them as an HF model directory in o->dtype: in place on one process, where a bf16 base's
 * weights (lora.base_dtype) are widened exactly and merged in fp32 a chunk at a time while
 * the file is written (the bf16 copies stay unmerged); when sharded, collective, rank 0
 * writing the tensors as the ranks gather them one FSDP unit at a time (the adapters stay
 * acting), so its extra memory is what train_qwen3_export_sizes gives. */
int train_qwen3_export_merged(TrainQwen3 *q, const char *dir, const HfExportOptions *o, Err *err);
/* The sharded merged export's buffers, in floats, for the whole model spec on a mesh of tensor-
 * and expert-parallel degrees tp and ep with lo's adapters (NULL: none): stage, rank 0's whole
 * copies of one unit's parameters that it cannot read where the gather leaves them (split over
 * tp or ep ranks, with an adapter to merge, or with base16 a bf16 base's matmul weights and
 * embedding, widened); parts, every rank's staging of one split parameter's gather (0 when
 * tp = ep = 1). `qtitan plan` counts them. */
void train_qwen3_export_sizes(const ModelSpec *spec, int tp, int ep, const struct Lora *lo,
                              int base16, size_t *stage, size_t *parts);

#endif
