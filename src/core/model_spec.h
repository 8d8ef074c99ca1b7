/* The shape of a Qwen3 model (dense or MoE), independent of where it came from: a native
 * flavor (the published Qwen3 sizes), an HF config.json, or either with fields replaced from the
 * job config. Names follow torchtitan's Qwen3 model args. */
#ifndef QT_MODEL_SPEC_H
#define QT_MODEL_SPEC_H

#include <stdint.h>

#include "core/err.h"

#define QT_MAX_LAYERS 256

/* RoPE scaling, as HF's rope_scaling / rope_parameters give it (ops/rope.h computes the
 * frequencies): none, "linear" (positions divided by factor) or "yarn" (frequencies blended
 * between the two by a ramp over the dims, cos and sin scaled by an attention factor). */
typedef enum RopeScalingType { ROPE_PLAIN = 0, ROPE_LINEAR, ROPE_YARN } RopeScalingType;
typedef struct RopeScaling {
    double factor;                 /* linear, yarn: > 0 */
    double attention_factor;       /* yarn: given; 0 = derived from factor (and mscale) */
    double mscale, mscale_all_dim; /* yarn: both non-zero = the attention factor's ratio form */
    double beta_fast, beta_slow;   /* yarn: the ramp's rotation bounds (32, 1) */
    RopeScalingType type;
    int original_max_seq_len; /* yarn: original_max_position_embeddings */
    int truncate;             /* yarn: the ramp's ends rounded out to whole dims */
} RopeScaling;

typedef struct ModelSpec {
    char flavor[32];          /* "debugmodel", "0.6B", ..., or "hf" */
    int dim;                  /* D: hidden_size */
    int n_layers;             /* L: num_hidden_layers */
    int n_heads;              /* H: num_attention_heads */
    int n_kv_heads;           /* K: num_key_value_heads */
    int head_dim;             /* E: head_dim (not always dim / n_heads) */
    int hidden_dim;           /* F: intermediate_size of dense FFN layers */
    int vocab_size;           /* V */
    int max_seq_len;          /* max_position_embeddings */
    double norm_eps;          /* rms_norm_eps */
    double rope_theta;        /* rope_theta */
    RopeScaling rope_scaling; /* zero = plain RoPE; only an HF config sets it */
    int tie_embeddings;       /* tie_word_embeddings: lm_head shares tok_embeddings */
    /* Mixture of experts; num_experts == 0 means dense. */
    int num_experts;                        /* num_experts */
    int top_k;                              /* num_experts_per_tok */
    int moe_hidden_dim;                     /* moe_intermediate_size */
    int norm_topk_prob;                     /* renormalise the chosen k gate weights */
    int decoder_sparse_step;                /* layer i is MoE when (i + 1) % step == 0 */
    uint8_t mlp_only_layers[QT_MAX_LAYERS]; /* 1 = dense FFN in that layer even if MoE */
    double router_aux_loss_coef;            /* HF auxiliary loss weight (0 = off) */
    double load_balance_coeff;              /* aux-loss-free bias update step (0 = off) */
    /* Experts whose weights the model holds (0 = num_experts): an expert-parallel rank's
     * share (docs/distributed.md); never read from or written to a config. */
    int num_local_experts;
} ModelSpec;

/* Fills spec from the native flavor table; error lists the flavors when name is unknown. */
int model_spec_flavor(ModelSpec *spec, const char *flavor, Err *err);
/* Replaces one field by its torchtitan name ("n_layers", "num_experts", "top_k", ...) from the
 * value's text; an unknown field is an error suggesting the nearest name. */
int model_spec_set_field(ModelSpec *spec, const char *field, const char *value, Err *err);
/* "none", "linear" or "yarn": the rope_scaling field's value for t, and the rope_type an HF
 * config gives for the scaled ones. */
const char *model_spec_rope_name(RopeScalingType t);
/* 1 when field names a string field (rope_scaling: "none", "linear", "yarn"), 0 otherwise. */
int model_spec_field_is_string(const char *field);
/* Plain RoPE with YaRN's defaults ready (beta_fast 32, beta_slow 1, truncate), for a spec whose
 * rope_scaling fields may be set one at a time. */
void model_spec_rope_defaults(RopeScaling *r);
/* 1 when field names a boolean field (tie_embeddings, norm_topk_prob), 0 otherwise. */
int model_spec_field_is_bool(const char *field);
/* Checks internal consistency (heads divisible, top_k <= num_experts, ...). */
int model_spec_validate(const ModelSpec *spec, Err *err);
/* 1 when layer i uses the MoE block. */
int model_spec_layer_is_moe(const ModelSpec *spec, int layer);
/* The replaceable fields, for config validation and suggestions: MODEL_SPEC_NFIELDS of them,
 * field i named model_spec_field_name(i). */
extern const int MODEL_SPEC_NFIELDS;
const char *model_spec_field_name(int i);

#endif
