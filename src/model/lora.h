/* LoRA adapters on the linear layers of a Qwen3 model: for a target linear W (O, I),
 *   y = x W^T + s * (x A^T) B^T,   s = alpha / r,   A (r, I), B (O, r),
 * (s = alpha / sqrt(r) with peft's use_rslora, rank-stabilised LoRA)
 * as HF peft's LoraLayer computes it; with dropout p (lora_set_dropout) training replaces the
 * adapter's input x by dropout(x) (zeroed with probability p, else scaled by 1 / (1 - p)),
 * peft's lora_dropout, and the base linear keeps x. A starts as peft's default
 * (kaiming-uniform with a = sqrt(5): uniform(-1/sqrt(I), 1/sqrt(I)), seeded), B as zeros, so a
 * fresh adapter leaves the model unchanged. The base weights stay as they are (frozen: the
 * optimizer sees only A and B); the model calls lora_forward / lora_backward after each target
 * linear (model/qwen3.c). docs/finetune.md lists the config keys.
 *
 * Legend: N tokens, I inputs, O outputs, r rank. */
#ifndef QT_LORA_H
#define QT_LORA_H

#include <stdint.h>

#include "core/err.h"
#include "core/model_spec.h"
#include "core/param_table.h"

/* The linears an adapter can sit on, in the order of a layer's module names. */
typedef enum LoraSite {
    LORA_WQ,
    LORA_WK,
    LORA_WV,
    LORA_WO,
    LORA_W1,
    LORA_W3,
    LORA_W2,
    LORA_NSITES
} LoraSite;

/* The module name of site s in layer l ("layers.3.attention.wq"), the name targets match. */
void lora_module_name(char *out, size_t cap, int layer, LoraSite s);
/* Its HF module name ("model.layers.3.self_attn.q_proj"), which peft's target_modules name;
 * "" when the model has no such linear (a MoE layer's FFN). t: hf_keys_build of the spec. */
struct HfKeyTable;
void lora_hf_module(char *out, size_t cap, const struct HfKeyTable *t, int layer, LoraSite site);
/* Whether a lora.targets entry names a linear, given its module name and HF module name: a glob
 * over either name, or peft's target_modules rule for a list entry (the HF name equals it or
 * ends with "." + it, so "q_proj" and "mlp.down_proj" work), or "all-linear". */
int lora_target_match(const char *target, const char *name, const char *hf_name);

typedef struct LoraAdapter {
    int layer;
    LoraSite site;
    int in, out; /* I, O of the base linear */
    /* This rank's factors, A (r, in_l) and B (out_l, r): all of A and B without tensor
     * parallelism, else the blocks its base layer has (lora_set_tp); where they live is the
     * owner's (lora_create's param, or a sharded driver's gathered workspace). */
    float *a, *b;
    float *da, *db; /* their gradients, accumulated */
    float *xa;      /* (N, r) x A^T of the last forward, for backward */
    /* What this rank's linear is of the whole one (lora_set_tp): inputs [in_off, in_off +
     * in_l) and outputs [out_off, out_off + out_l); all of it without tensor parallelism. */
    int in_l, out_l, in_off, out_off;
    long at; /* where the whole A starts in Lora.param's layout (the whole B at at + r I) */
} LoraAdapter;

typedef struct Lora {
    int rank;
    double alpha;
    int rslora;  /* peft's use_rslora: the scale is alpha / sqrt(rank) */
    float scale; /* alpha / rank, or alpha / sqrt(rank) with rslora */
    LoraAdapter *ad;
    int n;
    /* Every adapter's whole A and B end to end (lora_numel floats), and their gradients in the
     * same layout: one buffer for the optimizer's view on one process. A sharded driver takes
     * its shares from param and frees both (NULL then). */
    float *param, *grad;
    LoraAdapter *at[QT_MAX_LAYERS][LORA_NSITES]; /* NULL where no adapter */
    long max_tokens;
    float *scratch; /* (max_tokens, r) */
    /* Dropout: p, its seed, and whether the forward being run drops (lora_dropout_rows; eval,
     * generate and export never do). The mask of adapter k on token t of dataset row R is a
     * function of (seed, R, k, t) alone: the recomputed forward of activation checkpointing,
     * a resume, and any split of the rows over micro-batches or ranks draw the same one. */
    double dropout;
    uint64_t drop_seed;
    int dropping;
    int64_t drop_row0; /* the dataset row of the micro-batch's first row */
    int drop_T;        /* tokens per row */
    float *xd;         /* (max_tokens, largest I) dropout(x), or its gradient; p > 0 only */
} Lora;

/* Where each of lora.rank, lora.alpha and lora.targets was set ("FILE:LINE", "command line",
 * an adapter_config.json), for the sentences about them. */
typedef struct LoraWhere {
    const char *rank, *alpha, *targets;
} LoraWhere;

/* Adapters of rank r and scale alpha / r (alpha / sqrt(r) with rslora) on every site of spec
 * that one of targets[0..nt) names (lora_target_match: globs as in [[override]], or peft's
 * target_modules names; `set_at` names where each key was set, in messages). A target that
 * matches no module is a warning, like an override's (warn 1; 0 for a repeat of a creation that
 * warns); none matched at all, rank < 1 or larger than a targeted layer's smaller side, or
 * alpha <= 0 is an error sentence. max_tokens: the most tokens of one forward (B * T). */
int lora_create(Lora *lo, const ModelSpec *spec, int rank, double alpha, int rslora,
                char *const *targets, int nt, long max_tokens, const LoraWhere *set_at, int warn,
                Err *err);
void lora_free(Lora *lo);
/* Dropout p in [0, 1) on the adapters' input during training, masks seeded by seed; p > 0
 * allocates xd, max_tokens x lora_max_in floats. */
void lora_set_dropout(Lora *lo, double p, uint64_t seed);
/* The widest adapter input I. */
int lora_max_in(const Lora *lo);
/* The next forward and backward are training on the micro-batch whose first row is dataset
 * row first_row, rows of T tokens: they drop (when p > 0). first_row < 0: they do not. */
void lora_dropout_rows(Lora *lo, int64_t first_row, int T);

/* Tensor parallelism (docs/distributed.md): rank t of tp runs its part of every base linear,
 * and its adapters act on that part. A column-split base (wq, wk, wv, w1, w3: output features
 * split) has its block of B's rows and all of A; a row-split base (wo, w2: input features
 * split) its block of A's columns and all of B. This sets each adapter's part (in_l, out_l
 * and offsets); the caller points a, b, da, db at factors of those shapes (lora_block). A
 * rank's backward adds its block's gradient, or a partial sum for the whole factor, whose sum
 * over the tensor-parallel group is one process's gradient. Dropout masks use the whole
 * input's feature index, so they are the same as one process's. */
void lora_set_tp(Lora *lo, int tp, int t);
/* 1 when this rank's factor of ad is whole but its gradient a partial sum over the
 * tensor-parallel group: A of a column-split base ('A'), B of a row-split one ('B'). */
int lora_tp_whole(const LoraAdapter *ad, char which);
/* This rank's blocks (lora_set_tp) of the whole A (r, I) and B (O, r) of ad: al (r, in_l)
 * and bl (out_l, r). */
void lora_block(const Lora *lo, const LoraAdapter *ad, const float *a, const float *b, float *al,
                float *bl);

/* A from (seed, adapter index), B zeros. */
void lora_init(Lora *lo, uint64_t seed);
void lora_zero_grads(Lora *lo);
/* Number of adapter floats (A and B of every adapter). */
long lora_numel(const Lora *lo);

/* y (N, O) += s * (x' A^T) B^T, x' = x or, while dropping, dropout(x); keeps x' A^T for
 * backward. Under tensor parallelism x is (N, in_l), y (N, out_l), the factors the rank's
 * blocks, and a row-split base's x' A^T a partial sum (the model sums y over the group). */
void lora_forward(const Lora *lo, LoraAdapter *ad, float *y, const float *x, long N);
/* With dy = dL/dy (N, O) and the x of the forward: dB += s * dy^T (x' A^T),
 * dA += (s * dy B)^T x', dx (N, I) += s * dy B A (times the mask's scale while dropping: the
 * mask is drawn again, not stored). */
void lora_backward(const Lora *lo, LoraAdapter *ad, float *dx, const float *dy, const float *x,
                   long N);

/* An adapter's scale s: alpha / rank, or alpha / sqrt(rank) with rsLoRA (peft's use_rslora). */
float lora_scale(double alpha, double rank, int rslora);
/* The parameter kind (core/param_table.h) of site s's base weight. */
ParamKindId lora_site_kind(LoraSite s);

/* W (O, I) += s * B A: adapter ad, of whole factors a (r, I) and b (O, r), merged into its base
 * weight (export of a merged model), for the rows [row0, row0 + rows) of W held at w (rows x
 * I; all of W: 0, O). */
void lora_merge(const Lora *lo, const LoraAdapter *ad, const float *a, const float *b, float *w,
                int row0, int rows);

/* peft's files (lora_peft.c). The key of adapter ad's A (which 'A') or B ('B') as peft saves
 * it: "base_model.model." + the HF module name + ".lora_A.weight". */
void lora_peft_key(char *out, size_t cap, const ModelSpec *spec, const LoraAdapter *ad, char which);
/* What an adapter_config.json says about the adapters' function: r, lora_alpha and
 * use_rslora. */
typedef struct LoraPeftConfig {
    int64_t r;
    double alpha;
    int rslora;
} LoraPeftConfig;
/* Reads len bytes of an adapter_config.json (`path` names it in sentences). r (an integer >= 1)
 * and lora_alpha (a number > 0) are required; a setting of a peft variant whose adapters
 * compute something else than y += s B A x (peft_type other than LORA, use_dora, rank_pattern,
 * alpha_pattern, modules_to_save, lora_bias, ...) is an error sentence naming the key, never
 * ignored. Settings of how adapters were chosen or initialised (target_modules,
 * init_lora_weights, ...) and unknown keys are not read. */
int lora_peft_config_parse(const char *text, size_t len, const char *path, LoraPeftConfig *out,
                           Err *err);
/* Reads A and B of every adapter (whole: lo as lora_create made it) from a peft adapter folder
 * (adapter_config.json, adapter_model.safetensors). Its r, lora_alpha and use_rslora must be lo's,
 * lora_dropout 0 is not checked (training only), and the file must hold exactly lo's keys with
 * their shapes: every missing, unexpected or misshaped key is named. */
int lora_load_peft(Lora *lo, const ModelSpec *spec, const char *dir, Err *err);
/* Creates lo from a peft adapter folder alone (the adapters run unmerged, as test_lora checks them
 * against peft): r, lora_alpha and use_rslora from adapter_config.json, an adapter on every linear
 * the file has keys for, then lora_load_peft. A folder with no adapter for this model is an error
 * sentence. */
int lora_open_peft(Lora *lo, const ModelSpec *spec, const char *dir, long max_tokens, Err *err);
/* Merges a peft adapter folder into a model's weights as peft's merge_and_unload computes them,
 * for inference (generate, eval --adapter): params[k] holds parameter k of hf_keys_build(spec)
 * (fp32, its full shape). Each adapted linear: W += s B A with s = alpha / r (alpha / sqrt(r)
 * with use_rslora), r and alpha taken from rank_pattern / alpha_pattern where a key matches the
 * module as peft matches it (re.match of "(.*\.)?(KEY)$"); with use_dora, each row then scaled
 * to its lora_magnitude_vector entry over the merged row's norm. modules_to_save's tensors
 * ("base_model.model." + an HF weight name) replace those weights (not an embedding or output
 * of a tied model, which would untie them); trainable_token_indices' rows
 * (...embed_tokens.token_adapter.trainable_tokens_delta) replace the listed rows. Every tensor
 * of the file must be used: one that is not, a misshaped one, or a variant that computes
 * something else (lora_bias, ...) is a sentence. */
int lora_peft_merge(const ModelSpec *spec, float *const *params, const char *dir, Err *err);
/* Writes dir/adapter_config.json and dir/adapter_model.safetensors (F32) as peft's
 * save_pretrained does, so peft.PeftModel.from_pretrained(base, dir) loads them;
 * base_model names the base model in the config (may be ""). param: every adapter's whole A
 * and B in Lora.param's layout (lo->param itself on one process). */
int lora_save_peft(const Lora *lo, const ModelSpec *spec, const char *dir, const char *base_model,
                   const float *param, Err *err);

#endif
