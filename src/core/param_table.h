/* The one parameter table of Qwen3 (dense and MoE): one row per kind of parameter with its
 * qtitan name, HF name, role, shape, tensor-parallel split, weight-decay group and init rule.
 * Everything that treats parameters differently reads a row here instead of matching names:
 * the model's layout and init (model/qwen3.c), the HF key mapping (io/hf_keys.c), tensor
 * parallelism (train/train_qwen3.c, train/ckpt_dist.c), AdamW's decay groups, checkpoints (which
 * store the names) and `qtitan inspect`. It lives in core/ beside ModelSpec so that io/, model/
 * and train/ can all read it without depending on each other.
 *
 * The rows are in param_table.c, one per kind, written as a table: tok_embeddings; per layer
 * attention_norm, wq, wk, wv, wo, q_norm, k_norm, ffn_norm, then the MoE block (router gate,
 * experts w1 / w2 / w3, expert_bias) or the dense FFN (w1, w3, w2); norm; output. The order of
 * the rows is the order of a model's parameters, which fixes the rng stream of each
 * parameter's init and the order of checkpoints.
 *
 * Shapes are written in ModelSpec's letters: V vocab, D dim, H heads, K kv heads, E head dim,
 * F dense ffn dim, X experts, Fm expert ffn dim, Xl the experts a model holds (all X but on an
 * expert-parallel rank). */
#ifndef QT_PARAM_TABLE_H
#define QT_PARAM_TABLE_H

#include <stdint.h>

#include "core/model_spec.h"

#define PARAM_NAME_MAX 96

typedef enum ParamKindId {
    PK_TOK_EMBEDDINGS,
    PK_ATTENTION_NORM,
    PK_WQ,
    PK_WK,
    PK_WV,
    PK_WO,
    PK_Q_NORM,
    PK_K_NORM,
    PK_FFN_NORM,
    PK_ROUTER_GATE,
    PK_EXPERTS_W1,
    PK_EXPERTS_W2,
    PK_EXPERTS_W3,
    PK_EXPERT_BIAS,
    PK_W1,
    PK_W3,
    PK_W2,
    PK_NORM,
    PK_OUTPUT,
    PK_COUNT
} ParamKindId;

typedef enum ParamRole {
    ROLE_EMBEDDING,
    ROLE_LINEAR, /* attention and dense FFN projections, output */
    ROLE_NORM,   /* every RMSNorm weight, q_norm / k_norm included */
    ROLE_ROUTER,
    ROLE_EXPERTS, /* stacked (X, ...) expert weights */
    ROLE_BUFFER,  /* state the optimizer does not train (expert_bias: the balancing rule does) */
} ParamRole;

/* Which models and layers have the parameter. */
typedef enum ParamScope {
    SCOPE_MODEL,    /* once per model */
    SCOPE_UNTIED,   /* once per model, unless embeddings are tied (output shares tok_embeddings) */
    SCOPE_LAYER,    /* every layer */
    SCOPE_DENSE,    /* layers with a dense FFN */
    SCOPE_MOE,      /* MoE layers */
    SCOPE_BALANCED, /* MoE layers when load_balance_coeff > 0 (aux-loss-free balancing) */
} ParamScope;

/* How tensor parallelism splits the parameter over the tp ranks (docs/distributed.md):
 * column-parallel linears keep a block of rows (output features), row-parallel ones a block of
 * columns (input features), tp rank t the t-th block; the rest is replicated. */
typedef enum TpSplit { TP_REPLICATED, TP_ROWS, TP_COLS } TpSplit;

/* Weight-decay group: AdamW decays a parameter unless its group is exempt in this run. */
typedef enum DecayGroup {
    DECAY_ALWAYS,
    DECAY_NORMS,      /* exempt with exempt_norms */
    DECAY_EMBEDDINGS, /* exempt with exempt_embeddings */
    DECAY_NEVER,      /* buffers */
} DecayGroup;

typedef enum ParamInit {
    INIT_NORMAL, /* normal(0, 0.02) */
    /* The projections back into the residual stream from attention and the experts:
     * normal(0, 0.02 / sqrt(2 L)) in MoE models (torchtitan's MoE init), normal(0, 0.02) in
     * dense ones. */
    INIT_RESIDUAL,
    INIT_ONES,
    INIT_ZEROS,
} ParamInit;

typedef struct ParamKind {
    ParamKindId id;
    const char *name; /* qtitan name; "%d" is the layer */
    /* HF name: "%d" the layer, then (experts) the expert; NULL: not stored in HF files. */
    const char *hf;
    int hf_order; /* position in transformers' state_dict order within the layer */
    ParamRole role;
    ParamScope scope;
    const char *shape; /* in the spec's letters, e.g. "H*E, D" */
    TpSplit tp;
    DecayGroup decay;
    ParamInit init;
} ParamKind;

extern const ParamKind PARAM_KINDS[PK_COUNT];

/* One parameter of a model: a row of the table placed in a layer. */
typedef struct ParamInfo {
    char name[PARAM_NAME_MAX];
    const ParamKind *kind;
    int layer; /* -1 for model-scope parameters */
    int ndim;
    int64_t shape[3];
    int64_t numel;
} ParamInfo;

/* The parameters of spec in model order (tok_embeddings, each layer's in row order, norm,
 * output) into out (NULL: count only); returns their number. The spec must have passed
 * model_spec_validate. */
int param_list(const ModelSpec *spec, ParamInfo *out);
/* Parameter `id` of layer `layer` (ignored for model-scope kinds) as param_list places it
 * into *out; 0 (out untouched) when the model has no such parameter. */
int param_place(const ModelSpec *spec, ParamKindId id, int layer, ParamInfo *out);
/* The kind of the parameter with this qtitan name (layer set when not NULL, -1 outside the
 * layers), or NULL when no row has that name. For files that carry names only (checkpoints). */
const ParamKind *param_kind_of_name(const char *name, int *layer);
/* 1 when AdamW decays parameters of kind k under these exemptions. */
int param_decays(const ParamKind *k, int exempt_norms, int exempt_embeddings);
/* The tensor-parallel split of the parameter with this name (replicated when unknown). */
TpSplit tp_split_of(const char *name);

#endif
