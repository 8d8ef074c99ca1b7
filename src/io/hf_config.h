/* HF config.json <-> ModelSpec for Qwen3ForCausalLM and Qwen3MoeForCausalLM.
 *
 * Reading follows what transformers itself would build from the file: an absent field takes
 * transformers' default for that architecture (Qwen3Config / Qwen3MoeConfig), e.g. head_dim
 * 128 for dense models but hidden_size / num_attention_heads for MoE ones, rope_theta 10000,
 * tie_word_embeddings false. Both config generations are read: transformers 4.x keys
 * (rope_theta, rope_scaling, num_experts, torch_dtype) and 5.x keys (rope_parameters,
 * num_local_experts, dtype). Features qtitan does not implement are errors rather than
 * silently different models: RoPE scaling other than "default", attention biases, sliding
 * windows, a hidden_act other than silu.
 *
 * Writing produces the 4.x layout of the published Qwen3 configs, which both generations
 * of transformers load. */
#ifndef QT_HF_CONFIG_H
#define QT_HF_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "core/model_spec.h"

#define HF_MAX_TOKEN_IDS 8

/* Fields of config.json that describe the tokenizer rather than the network; carried from an
 * imported config to an exported one. */
typedef struct HfConfigExtra {
    int n_bos, n_eos; /* 0 = absent (omitted on write) */
    int64_t bos_token_id[HF_MAX_TOKEN_IDS];
    int64_t eos_token_id[HF_MAX_TOKEN_IDS]; /* HF allows a list of EOS ids */
    int eos_is_list;                        /* written back as a list when it was one */
    /* transformers adds the router auxiliary loss only when this is true; the published
     * Qwen3-MoE configs carry router_aux_loss_coef = 0.001 with it false. */
    int output_router_logits;
    /* The config's router_aux_loss_coef (has_router_aux_loss_coef: the key was there). Route 1
     * trains without the auxiliary loss when output_router_logits is false, which zeroes the
     * spec's coefficient; an export writes this value back then, so a round trip keeps it. */
    int has_router_aux_loss_coef;
    double router_aux_loss_coef;
    /* transformers' attention_dropout, in [0, 1]: inactive in eval and generation (as in HF's
     * eval mode); training refuses a value > 0 (train_job_spec), as qtitan has no dropout. */
    double attention_dropout;
    /* quantization_config with quant_method "fp8" (Qwen3-*-FP8, DeepSeek-style): the linear
     * weights are stored F8_E4M3 with one scale per fp8_block[0] x fp8_block[1] block
     * (weight_block_size, [128, 128] when absent) and are read dequantized
     * (io/safetensors' st_set_pair_fp8). {0, 0} when the config has none. Other methods, and
     * static activation scales, are errors: qtitan reads the weights only. */
    int64_t fp8_block[2];
} HfConfigExtra;

/* Reads an HF config.json; an unsupported architecture or rope_scaling type is an error. */
int model_spec_from_hf_config(ModelSpec *spec, const char *config_json_path, Err *err);
/* Same, also returning the token ids (extra may be NULL). */
int model_spec_from_hf_config_ex(ModelSpec *spec, HfConfigExtra *extra,
                                 const char *config_json_path, Err *err);
/* Parses config.json text already in memory; `what` names it in errors. */
int model_spec_from_hf_config_text(ModelSpec *spec, HfConfigExtra *extra, const char *text,
                                   size_t len, const char *what, Err *err);

/* Writes an HF config.json for spec (torch_dtype names the exported dtype: "float32",
 * "bfloat16" or "float16"). */
int model_spec_write_hf_config(const ModelSpec *spec, const char *path, const char *torch_dtype,
                               Err *err);
/* The text of that config.json (malloc'd, NUL-terminated, *len bytes with the final newline),
 * or NULL after an error. */
char *model_spec_hf_config_text(const ModelSpec *spec, const HfConfigExtra *extra,
                                const char *torch_dtype, size_t *len, Err *err);
/* Same, with bos/eos token ids from extra (NULL or absent ids are omitted). */
int model_spec_write_hf_config_ex(const ModelSpec *spec, const HfConfigExtra *extra,
                                  const char *path, const char *torch_dtype, Err *err);

#endif
