/* The Qwen3 reference model behind the trainer's TrainModel interface: parameter table as
 * named tensors, weight-decay flags, forward + backward on one micro-batch, and loading HF
 * weights by name. */
#ifndef QT_TRAIN_QWEN3_H
#define QT_TRAIN_QWEN3_H

#include <stddef.h>
#include <stdint.h>

#include "core/ac_mode.h"
#include "core/err.h"
#include "core/model_spec.h"
#include "io/hf_export.h"
#include "kernels/overrides.h"
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
} TrainQwen3Batch;

/* Dense and MoE models; activations sized for B x T, kept or recomputed as ac says. The
 * modules run the fast CPU kernels (kernels/cpu_ops.h), or the references when the
 * environment has QT_KERNELS=reference. */
TrainQwen3 *train_qwen3_create(const ModelSpec *spec, int B, int T, AcMode ac, Err *err);
/* As train_qwen3_create with the kernels of plan (from overrides_resolve; NULL = none) applied
 * before the activations are sized; logs one line per replacement. frozen: the model's own
 * weights do not train (LoRA), so its gradients go to one sink (qwen3_create_frozen_with). */
TrainQwen3 *train_qwen3_create_with(const ModelSpec *spec, int B, int T, AcMode ac,
                                    const OverridePlan *plan, int frozen, Err *err);
void train_qwen3_free(TrainQwen3 *q);
/* The module set a model of spec runs (creating and sizing both take it from here, so `qtitan
 * plan` sizes what training allocates): the fast CPU kernels by default, the plain references
 * with QT_KERNELS=reference (said once when verbose), plan's overrides when plan is not NULL
 * (one log line per replacement). spec may be a tensor-parallel rank's part of plan's model.
 * Caller frees. */
struct Qwen3Modules *train_qwen3_modules(const ModelSpec *spec, const OverridePlan *plan,
                                         int verbose);

/* Bytes of the parameter, gradient and activation arenas train_qwen3_create would allocate
 * for the same arguments (model/qwen3.h qwen3_sizes: the same layout code, counting only);
 * sp > 1: the activations of a sequence-parallel rank (the sharded model's). */
typedef struct TrainQwen3Sizes {
    size_t param_bytes, grad_bytes, act_bytes;
    size_t bf16_bytes;        /* added by train_qwen3_enable_bf16 */
    size_t frozen_grad_bytes; /* the gradient sink of a frozen model, instead of grad_bytes */
    int nparams;
} TrainQwen3Sizes;
int train_qwen3_sizes(TrainQwen3Sizes *out, const ModelSpec *spec, int B, int T, AcMode ac, int sp,
                      const OverridePlan *plan, Err *err);

/* Mixed precision (training.mixed_precision_param = "bfloat16"): bf16 matmuls, fp32 masters. */
int train_qwen3_enable_bf16(TrainQwen3 *q, Err *err);
/* DESIGN §5 random init. */
void train_qwen3_init(TrainQwen3 *q, uint64_t seed);
/* Loads HF-named weights (a .safetensors file or an HF directory), any of F32/BF16/F16. The
 * files must hold exactly the model's tensors with their shapes (lm_head.weight may be absent
 * when tied); the error lists every missing, unexpected and misshaped key. */
int train_qwen3_load_hf(TrainQwen3 *q, const char *path, Err *err);
/* MoE: each micro-batch's router auxiliary loss counts 1 / micro_batches, so a step adds
 * router_aux_loss_coef times the mean over its micro-batches (the reported loss is the
 * cross-entropy alone). */
void train_qwen3_set_micro_batches(TrainQwen3 *q, int micro_batches);
/* The TrainModel view (valid while q lives). exempt: no weight decay for norms and embeddings.
 * MoE models also get the before_optimizer_step hook (train/moe_step.h): expert_bias update
 * and the moe_tokens_min / moe_tokens_max / moe_imbalance metrics. */
void train_qwen3_model(TrainQwen3 *q, TrainModel *out, int exempt);

/* LoRA (model/lora.h): lo's adapters act in q's forward and backward, and out becomes the
 * TrainModel of the adapters alone (A and B of each, named "layers.N.attention.wq.lora_A", all
 * weight-decayed): the optimizer, clipping and checkpoints see only them, the base weights stay
 * as loaded. lo must outlive q's use. */
void train_qwen3_model_lora(TrainQwen3 *q, struct Lora *lo, TrainModel *out);
/* Merges the adapters into the base weights (W + s B A, in place; the adapters stop acting)
 * and writes them as an HF model directory. */
int train_qwen3_export_merged(TrainQwen3 *q, const char *dir, const HfExportOptions *o, Err *err);

#endif
