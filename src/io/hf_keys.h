/* The one table between qtitan parameter names (torchtitan style) and HF Qwen3 / Qwen3-MoE
 * checkpoint keys. For a ModelSpec it lists every qtitan parameter with its shape and kind,
 * and every HF tensor with its shape and the parameter (and expert slice) it maps to.
 *
 * Letters: D dim, H heads, K kv heads, E head dim, F ffn dim (dense or per expert), V vocab,
 * X experts.
 *
 *   qtitan                                   HF                                         shape
 *   tok_embeddings.weight                    model.embed_tokens.weight                  (V, D)
 *   layers.{i}.attention_norm.weight         model.layers.{i}.input_layernorm.weight    (D)
 *   layers.{i}.attention.wq.weight           model.layers.{i}.self_attn.q_proj.weight   (H*E, D)
 *   layers.{i}.attention.wk.weight           ...self_attn.k_proj.weight                 (K*E, D)
 *   layers.{i}.attention.wv.weight           ...self_attn.v_proj.weight                 (K*E, D)
 *   layers.{i}.attention.wo.weight           ...self_attn.o_proj.weight                 (D, H*E)
 *   layers.{i}.attention.q_norm.weight       ...self_attn.q_norm.weight                 (E)
 *   layers.{i}.attention.k_norm.weight       ...self_attn.k_norm.weight                 (E)
 *   layers.{i}.ffn_norm.weight               ...post_attention_layernorm.weight         (D)
 *   layers.{i}.feed_forward.w1.weight        ...mlp.gate_proj.weight                    (F, D)
 *   layers.{i}.feed_forward.w3.weight        ...mlp.up_proj.weight                      (F, D)
 *   layers.{i}.feed_forward.w2.weight        ...mlp.down_proj.weight                    (D, F)
 *   layers.{i}.moe.router.gate.weight        ...mlp.gate.weight                         (X, D)
 *   layers.{i}.moe.experts.w1  (X, F, D)     ...mlp.experts.{e}.gate_proj.weight        (F, D)
 *   layers.{i}.moe.experts.w3  (X, F, D)     ...mlp.experts.{e}.up_proj.weight          (F, D)
 *   layers.{i}.moe.experts.w2  (X, D, F)     ...mlp.experts.{e}.down_proj.weight        (D, F)
 *   layers.{i}.moe.expert_bias (X)           (training state only, not in HF files)
 *   norm.weight                              model.norm.weight                          (D)
 *   output.weight                            lm_head.weight                             (V, D)
 *
 * Expert e of a stacked (X, ...) parameter is the contiguous slice at e * (numel / X), in the
 * same row-major layout as the HF per-expert tensor, so no transposes are needed.
 *
 * Tied embeddings (tie_embeddings): there is no output.weight parameter and lm_head.weight is
 * not exported, which is what transformers' save_pretrained writes. When loading, an
 * lm_head.weight present in a tied checkpoint is ignored if its shape is (V, D) (transformers
 * re-ties it to the embedding as well) and reported as misshaped otherwise.
 *
 * A layer uses the MoE block when model_spec_layer_is_moe says so (transformers'
 * Qwen3MoeDecoderLayer rule). The spec must have passed model_spec_validate.
 * expert_bias exists only when load_balance_coeff > 0 (aux-loss-free balancing). */
#ifndef QT_HF_KEYS_H
#define QT_HF_KEYS_H

#include <stdint.h>

#include "core/err.h"
#include "core/model_spec.h"
#include "io/safetensors.h"

#define HF_KEY_MAX 96

typedef enum QtParamKind {
    PK_EMBEDDING,   /* tok_embeddings.weight */
    PK_NORM,        /* every RMSNorm weight, including q_norm / k_norm */
    PK_LINEAR,      /* attention and dense FFN projections, output.weight */
    PK_ROUTER,      /* moe.router.gate.weight */
    PK_EXPERTS,     /* moe.experts.w1 / w2 / w3 */
    PK_EXPERT_BIAS, /* moe.expert_bias: updated by the balancing rule, not by the optimizer */
} QtParamKind;

typedef struct QtParam {
    char name[HF_KEY_MAX];
    QtParamKind kind;
    int layer; /* -1 for tok_embeddings, norm, output */
    int ndim;
    int64_t shape[3];
    int64_t numel;
    int exported;     /* has HF tensors */
    int no_decay;     /* norms and the embedding: candidates for weight-decay exemption */
    int residual_out; /* wo and w2 (dense and experts): the projections back into the residual */
} QtParam;

typedef struct HfTensor {
    char name[HF_KEY_MAX];
    int ndim;
    int64_t shape[2];
    int64_t numel;
    int param;  /* index into HfKeyTable.params */
    int expert; /* -1: the whole parameter; else slice e of a stacked expert parameter */
} HfTensor;

typedef struct HfKeyTable {
    QtParam *params; /* in model order (embedding, layers in forward order, norm, output) */
    int nparams;
    HfTensor *hf; /* in transformers' state_dict order */
    int nhf;
    int tied;
    int64_t vocab, dim;
    int *param_by_name; /* indices sorted by name, for lookups */
    int *hf_by_name;
} HfKeyTable;

void hf_keys_build(HfKeyTable *t, const ModelSpec *spec);
void hf_keys_free(HfKeyTable *t);
/* Index of a parameter / HF tensor by name, or -1. */
int hf_keys_find_param(const HfKeyTable *t, const char *name);
int hf_keys_find_hf(const HfKeyTable *t, const char *hf_name);

/* Checks a set of safetensors files against the table. Lists are malloc'd sentences (one per
 * key), e.g. missing "model.norm.weight (expected [16])", unexpected "x.y [3, 4]", wrong
 * "model.norm.weight: shape [8], expected [16]" or "...: dtype I32, expected F32, BF16 or
 * F16". Returns the total number of problems. */
typedef struct HfCheck {
    char **missing, **unexpected, **wrong;
    int nmissing, nunexpected, nwrong;
} HfCheck;
int hf_keys_check(HfCheck *out, const HfKeyTable *t, const StSet *set);
void hf_check_free(HfCheck *c);

/* Fills parameter p (fp32, its full shape) from the HF tensors that map to it, converting
 * BF16/F16. Missing or misshaped tensors, and tensors holding a NaN or an infinity, are errors
 * naming the HF key. */
int hf_keys_load_param(float *dst, const HfKeyTable *t, int p, const StSet *set, Err *err);
/* Adds every exported HF tensor to w, reading from params[p] (fp32, full shape of parameter
 * p) and converting to dtype while the file is written. */
void hf_keys_add_to_writer(StWriter *w, const HfKeyTable *t, const float *const *params,
                           DType dtype);

#endif
