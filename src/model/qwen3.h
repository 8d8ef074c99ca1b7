/* Qwen3 model (dense and MoE) on the fp32 reference path: parameter table, module tree,
 * forward and backward. Matches HF transformers' Qwen3ForCausalLM (tests/test_parity.c) and
 * Qwen3MoeForCausalLM (tests/test_moe_parity.c).
 *
 * Dimensions: B batch, T sequence, N = B*T tokens, D model dim, H heads, K kv heads,
 * E head dim, F ffn dim (dense layers), V vocab, L layers; MoE layers: X experts, k experts
 * per token, Fm expert ffn dim.
 *
 * Memory: parameters, gradients and activations each live in one arena, sized before the
 * first step (a counting pass runs the same layout code); forward/backward allocate nothing.
 * Every op call goes through the module's implementation pointer (Qwen3Modules), so a kernel
 * registry can replace implementations per module instance by name. */
#ifndef QT_QWEN3_H
#define QT_QWEN3_H

#include <stdint.h>

#include "core/ac_mode.h"
#include "core/arena.h"
#include "core/err.h"
#include "core/model_spec.h"
#include "core/param_table.h"
#include "ops/cross_entropy.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/lm_head_loss.h"
#include "ops/moe_experts.h"
#include "ops/op.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/sdpa.h"
#include "ops/swiglu.h"

/* One layer's parameters (also used for its gradients). */
typedef struct Qwen3LayerParams {
    float *attention_norm; /* (D) */
    float *wq;             /* (H*E, D) */
    float *wk;             /* (K*E, D) */
    float *wv;             /* (K*E, D) */
    float *wo;             /* (D, H*E) */
    float *q_norm;         /* (E) */
    float *k_norm;         /* (E) */
    float *ffn_norm;       /* (D) */
    /* Dense FFN slot; an MoE layer leaves these NULL and uses its own block. */
    float *w1; /* (F, D) */
    float *w3; /* (F, D) */
    float *w2; /* (D, F) */
    /* MoE block (model/moe.h); NULL in dense layers. */
    float *router_gate; /* (X, D) */
    float *experts_w1;  /* (Xl, Fm, D): Xl = X except under expert parallelism */
    float *experts_w3;  /* (Xl, Fm, D) */
    float *experts_w2;  /* (Xl, D, Fm) */
    float *expert_bias; /* (X) balancing state; NULL when load_balance_coeff is 0 */
} Qwen3LayerParams;

typedef struct Qwen3Params {
    float *tok_embeddings; /* (V, D) */
    Qwen3LayerParams layers[QT_MAX_LAYERS];
    float *norm;   /* (D) */
    float *output; /* (V, D); == tok_embeddings when tied */
} Qwen3Params;

/* One parameter of the model: its row of the parameter table (core/param_table.h) placed in
 * a layer, with its value and gradient. */
typedef struct Qwen3Param {
    char name[PARAM_NAME_MAX];
    const ParamKind *kind; /* role, HF name, split, decay group and init rule */
    int layer;             /* -1 outside the layers */
    int ndim;
    int64_t shape[3];
    long numel;
    float *data; /* points into the parameter arena; NULL when held in bf16 (data_bf16) */
    float *grad; /* points into the gradient arena */
    /* A weight held in bf16 only (a bf16 base, Qwen3.base_bf16, or bf16 inference,
     * Qwen3.bf16_only): its only copy, in the bf16 arena; else NULL. */
    uint16_t *data_bf16;
} Qwen3Param;

/* Implementation pointer of every module instance (docs/kernels.md). */
typedef struct Qwen3LayerModules {
    const RmsnormOp *attention_norm;
    const LinearOp *qkv;
    const RmsnormOp *q_norm;
    const RmsnormOp *k_norm;
    const RopeOp *rope;
    const SdpaOp *sdpa;
    const LinearOp *wo;
    const RmsnormOp *ffn_norm;
    const SwigluOp *feed_forward; /* dense layers */
    const LinearOp *router;       /* MoE layers: moe.router (the gate linear) */
    const MoeExpertsOp *experts;  /* MoE layers: moe.experts */
} Qwen3LayerModules;

typedef struct Qwen3Modules {
    const EmbeddingOp *tok_embeddings;
    Qwen3LayerModules layers[QT_MAX_LAYERS];
    const RmsnormOp *norm;
    const LinearOp *lm_head;  /* the projection, called by loss */
    const LmHeadLossOp *loss; /* lm_head + cross-entropy (ops/lm_head_loss.h) */
    /* The cross-entropy the reference `loss` op runs inside the model (so lm_head keeps its
     * bf16 path): part of the `loss` instance, not a module of its own. */
    const CrossEntropyOp *ce;
} Qwen3Modules;

/* Activations of one layer. AC_FULL: all layers share one set except x. AC_SELECTIVE: they
 * share the norm and rope outputs (xn1, rstd1, qn, q_rstd, kn, k_rstd, qr, kr, xn2, rstd2).
 * n is the number of tokens a rank keeps in the residual stream: N, or N / sp under sequence
 * parallelism (Qwen3.sp). */
typedef struct Qwen3LayerActs {
    float *x;      /* (n, D) layer input (residual stream), kept in every mode */
    float *xn1;    /* (n, D) attention_norm output */
    float *rstd1;  /* (n) */
    float *q;      /* (N, H*E) */
    float *k;      /* (N, K*E) */
    float *v;      /* (N, K*E) */
    float *qn;     /* (N, H*E) after q_norm */
    float *q_rstd; /* (N*H) */
    float *kn;     /* (N, K*E) after k_norm */
    float *k_rstd; /* (N*K) */
    float *qr;     /* (N, H*E) after rope */
    float *kr;     /* (N, K*E) after rope */
    float *att;    /* (N, H*E) sdpa output */
    float *lse;    /* (B, H, T) */
    float *xmid;   /* (n, D) x + attention */
    float *xn2;    /* (n, D) ffn_norm output */
    float *rstd2;  /* (n) */
    float *h1;     /* (N, F) */
    float *h3;     /* (N, F) */
    float *g;      /* (N, F) */
    /* MoE layers */
    float *probs;      /* (N, X) router softmax */
    int32_t *topk_idx; /* (N, k) chosen experts */
    float *topk_w;     /* (N, k) gate weights */
    MoeExpertsBufs ex; /* saved per layer; scratch shared by all layers */
} Qwen3LayerActs;

typedef struct Qwen3Acts {
    int32_t *tokens;    /* (N) */
    int32_t *targets;   /* (N) */
    int32_t *positions; /* (N) */
    int32_t *doc;       /* (N) */
    int has_doc;
    Qwen3LayerActs layers[QT_MAX_LAYERS];
    float *h;           /* (n, D) output of the last layer */
    float *hn;          /* (n, D) after the final norm */
    float *rstdf;       /* (n) */
    float *logits;      /* loss workspace: (n, V) logits with the reference, becomes dlogits during
                         * backward; a chunked loss sizes it smaller (workspace_floats) */
    long logits_floats; /* its size */
    float *ce_lse;      /* (n) */
    float *losses;      /* (n) */
    /* Activation gradients: one set, reused by every layer in turn. */
    float *dres;   /* (n, D) gradient of the residual stream */
    float *dxn;    /* (N, D) */
    float *dtmp;   /* (n, D) */
    float *datt;   /* (N, H*E) */
    float *dqr;    /* (N, H*E) */
    float *dqn;    /* (N, H*E) */
    float *dq;     /* (N, H*E) */
    float *dkr;    /* (N, K*E) */
    float *dkn;    /* (N, K*E) */
    float *dk;     /* (N, K*E) */
    float *dv;     /* (N, K*E) */
    float *dh1;    /* (N, F) */
    float *dh3;    /* (N, F) */
    float *ffn_ws; /* the feed-forward ops' workspace (SwigluOp.workspace_floats), or NULL */
    /* MoE, shared by all layers */
    float *router_logits; /* (N, X); router logits, then their gradient in backward */
    float *dgw;           /* (N, k) */
    float *aux_dprob;     /* (X) */
    double *aux_counts;   /* (X) this forward's assignments over all MoE layers */
    double *aux_psum;     /* (X) this forward's router probabilities over all MoE layers */
    /* Sequence parallelism only (NULL without it), shared by all layers. */
    float *xg; /* (N, D) a norm output gathered from the group: the q/k/v or w1/w3 input */
    float *yg; /* (N, D) wo or FFN partial sums before their reduce-scatter; in backward the
                * residual gradient gathered from the group, then a reduce-scattered dxn */
} Qwen3Acts;

/* Mixed precision: the bf16 copies of the matmul weights, refreshed from the fp32 masters at
 * every forward, or kept current by the optimizer (qwen3_keep_bf16). */
typedef struct Qwen3Bf16Layer {
    uint16_t *wq, *wk, *wv, *wo; /* shaped as the fp32 weights */
    uint16_t *w1, *w3, *w2;
    /* Where this host prepacks (Qwen3.bf16_packed): the packed forms of each copy above, in
     * that order (ops/gemm.h gemm_bf16_pack_register); else NULL. */
    uint16_t *packs[7];
} Qwen3Bf16Layer;

typedef struct Qwen3Bf16 {
    Qwen3Bf16Layer layers[QT_MAX_LAYERS];
    uint16_t *output;  /* (V, D) */
    uint16_t *scratch; /* bf16 casts of matmul inputs, sized for the largest product */
    long scratch_len;  /* its bf16 values */
    /* (V, D) a bf16 base's embedding table (Qwen3.base_bf16; output itself when tied), else
     * NULL: the fp32 table is the one read. */
    uint16_t *tok_embeddings;
} Qwen3Bf16;

/* FSDP hook phases (see Qwen3Dist.unit). */
typedef enum Qwen3HookPhase {
    QWEN3_PRE_FORWARD,
    QWEN3_POST_FORWARD,
    QWEN3_PRE_BACKWARD,
    QWEN3_POST_BACKWARD,
} Qwen3HookPhase;

typedef struct Qwen3 Qwen3;
struct Lora;

/* The model's distributed callbacks, one ctx for all; a NULL callback is never called. */
typedef struct Qwen3Dist {
    void *ctx;
    /* Called before and after each unit's forward and backward, so a sharded driver can point
     * the unit's m->p / m->g pointers at gathered buffers just in time. Units: 0 the
     * embedding, 1 + i layer i, n_layers + 1 the final norm with lm_head. */
    void (*unit)(void *ctx, Qwen3 *m, int unit, Qwen3HookPhase phase);
    /* Tensor parallel: the model then has this rank's heads and FFN columns, and this sums buf
     * (n floats) over the tensor-parallel group in place, where partial results meet: the wo
     * and w2 outputs before the residual adds, and the gradients of the attention / FFN norm
     * outputs. Not called under sequence parallelism, which uses the two below instead. */
    void (*tp_sum)(void *ctx, float *buf, long n);
    /* Sequence parallel (Qwen3.sp > 1): tp_gather writes into full (n * sp floats) every
     * rank's part (n floats) in rank order, before q/k/v and w1/w3 and for the residual
     * gradient in backward; tp_reduce_scatter writes into part this rank's n floats of the
     * group's sum of full, after wo and w2 and for the norm output gradients. */
    void (*tp_gather)(void *ctx, float *full, const float *part, long n);
    void (*tp_reduce_scatter)(void *ctx, float *part, const float *full, long n);
} Qwen3Dist;

struct Qwen3 {
    ModelSpec spec;
    RopeFreqs rope_freqs; /* rope_freqs(spec), what every RoPE kernel rotates by */
    int max_B, max_T;     /* activation capacity */
    AcMode ac;
    Arena param_arena, grad_arena, act_arena;
    Arena scratch_arena; /* the workspaces the chosen kernels declare (e.g. swiglu_fused's) */
    Qwen3Params p;
    Qwen3Params g; /* gradients, same layout */
    Qwen3Param *table;
    int nparams;
    Qwen3Modules mod;
    ModuleSlot *slots;
    int nslots;
    Qwen3Acts a;
    int bf16;         /* 1 after qwen3_enable_bf16 */
    int bf16_by_hook; /* 1 after qwen3_enable_bf16_by_hook: pb's weights are the driver's */
    int bf16_only;    /* 1 from qwen3_create_inference_bf16: see there */
    /* 1 when pb's matmul weight copies are widened (ops/gemm.h: fp32 holding bf16 values, at
     * the start of bf16_arena, passed as handles), because this host's bf16 products run as
     * fp32 GEMMs; 0: bf16. */
    int bf16_widened;
    /* 1 when the layers' bf16 copies are registered with packed forms that every product
     * reads (ops/gemm.h gemm_bf16_prepacks: the AMX path), repacked whenever a copy is written:
     * by the model's cast, or by the optimizer that keeps them. */
    int bf16_packed;
    /* 1 after qwen3_keep_bf16(m, 1): forward does not cast, the caller keeps the copies. */
    int bf16_kept;
    Arena bf16_arena;
    Qwen3Bf16 pb;
    /* Set by forward, read by backward. */
    int B, T;
    double loss_sum;     /* sum of CE over valid targets */
    double fuse_divisor; /* > 0 inside qwen3_forward_backward */
    int loss_done;       /* the output layer's backward already ran in forward */
    long n_valid;
    /* MoE */
    int n_moe_layers;
    double aux_loss;    /* HF router auxiliary loss of the last forward (0 when coef is 0) */
    double aux_weight;  /* backward scales d(coef * aux) by this (1; 1/micro-batches when
                         * the trainer accumulates, so the step adds coef * mean aux) */
    double *moe_counts; /* (L, X) tokens routed to each expert, summed over forwards since
                         * qwen3_moe_reset_counts (recomputation excluded); dense layers 0 */
    /* Parallelism, applied from outside by the training driver (src/train/train_qwen3.c);
     * all NULL on a world of one. */
    Qwen3Dist dist;
    /* Sequence parallel (sp > 1, from qwen3_create_unowned; 1 without it): the tensor-parallel
     * group of sp ranks also splits the tokens. Rank sp_rank (set by the driver) keeps tokens
     * [sp_rank * n, (sp_rank + 1) * n), n = B * T / sp, of the flattened micro-batch in the
     * residual stream, the attention and FFN norms, the embedding, the final norm, lm_head
     * and the loss; attention and the FFN see all N tokens (their heads and columns), moved
     * by dist.tp_gather and dist.tp_reduce_scatter. loss_sum and n_valid count the rank's
     * tokens, and the gradients of the norm weights, the embedding and lm_head its tokens'
     * share: the driver sums them over the group. Dense models only. */
    int sp, sp_rank;
    /* A frozen base held in bf16 (qwen3_create_frozen_with, base_bf16 1): the matmul weights
     * and the embedding live in pb alone (no fp32 copy; their table rows have data NULL and
     * data_bf16 set), so forward never casts them, and every product with them is bf16. */
    int base_bf16;
    /* LoRA adapters (model/lora.h) added to their linears' outputs, or NULL. Under tensor
     * parallelism each acts on the rank's part of its linear (lora_set_tp); a row-split
     * linear's adapter output is a partial sum like the linear's own. */
    struct Lora *lora;
    /* Expert parallelism (model/moe_ep.h), set by the driver, or NULL: the experts part of
     * every MoE layer moves the tokens to the ranks holding their experts; the model holds
     * spec.num_local_experts experts of each layer. Not owned. */
    struct MoeEp *ep;
    /* debug.moe_force_load_balance, set by the driver: the routers assign experts round-robin
     * (moe_router_forward) instead of by score, for measuring the experts at a perfect
     * balance. */
    int moe_round_robin;
};

/* The module tree of spec (docs/kernels.md), without allocating a model: fills mod with each
 * kind's reference implementation and, when slots is not NULL, slots[i] with instance i's FQN,
 * kind and the address of its pointer inside mod. Returns the number of instances. The model
 * builds its own tree with this function, so the override check (model/overrides.h) sees
 * exactly the instances the model runs. */
int qwen3_module_tree(const ModelSpec *spec, Qwen3Modules *mod, ModuleSlot *slots);

/* Builds the parameter table and arenas for spec and activations for up to B x T tokens.
 * Parameters are zero until qwen3_init_params or a load fills them. */
int qwen3_create(Qwen3 *m, const ModelSpec *spec, int B, int T, AcMode ac, Err *err);
/* As qwen3_create with the module implementations taken from impl (a tree from
 * qwen3_module_tree for the same spec, with overrides applied; NULL = references), so the
 * activations are sized for them (a chunked loss needs no (N, V) logits). */
int qwen3_create_with(Qwen3 *m, const ModelSpec *spec, int B, int T, AcMode ac,
                      const Qwen3Modules *impl, Err *err);
/* As qwen3_create_with (impl NULL: the defaults) for qwen3_forward and decoding only (eval,
 * generate, validation): no gradient arena (the table's grads are NULL), so a model costs its
 * parameters and activations, not twice its parameters. */
int qwen3_create_forward(Qwen3 *m, const ModelSpec *spec, int B, int T, const Qwen3Modules *impl,
                         Err *err);
/* As qwen3_create_forward, for inference with bf16 weights: the matmul weights whose modules
 * have a bf16 path (attention and dense FFN projections; lm_head when the loss op is the
 * reference one) are held in bf16 only, with no fp32 master, and mixed precision is on. Their
 * table entries' data is NULL and data_bf16 their copy: loaders write them there (or with
 * qwen3_param_store). Forward casts
 * nothing; a model of bf16 weights costs about half its fp32 parameters. */
int qwen3_create_inference_bf16(Qwen3 *m, const ModelSpec *spec, int B, int T,
                                const Qwen3Modules *impl, Err *err);
/* Writes v (the parameter's numel values) into table entry i: its fp32 data, or its bf16 copy
 * (rounded to nearest even) when the model holds it in bf16 only. */
void qwen3_param_store(Qwen3 *m, int i, const float *v);
/* As qwen3_create_with for a model whose own weights do not train (the base of LoRA): no
 * gradient arena (the table's grads and m->g are NULL), so backward computes the input
 * gradients only and skips every weight-gradient product (ops/op.h). base_bf16: the matmul
 * weights and the embedding are held in bf16 only (Qwen3.base_bf16), which needs linear
 * kernels with a bf16 path and the unchunked loss (an error sentence names the one missing). */
int qwen3_create_frozen_with(Qwen3 *m, const ModelSpec *spec, int B, int T, AcMode ac,
                             const Qwen3Modules *impl, int base_bf16, Err *err);
/* A bf16 base has no fp32 matmul weights (or, sharded, only bf16 values in them), so every
 * product with them must have a bf16 path: an error sentence names the kernel without one. */
int qwen3_check_bf16_base(const Qwen3 *m, Err *err);
/* 1 when under mixed precision every product with a matmul weight (attention, dense FFN,
 * lm_head) reads its bf16 copy and never the fp32 weight, forward and backward. */
int qwen3_products_bf16(const Qwen3 *m);
/* As qwen3_create, without parameter and gradient memory: the table has names and shapes but NULL
 * data and grad, and m->p / m->g stay NULL until dist.unit points them somewhere (FSDP).
 * sp > 1: sequence parallel over sp ranks (Qwen3.sp; B * T must be divisible by it), with the
 * residual-stream activations sized for B * T / sp tokens. */
int qwen3_create_unowned(Qwen3 *m, const ModelSpec *spec, int B, int T, AcMode ac, int sp,
                         Err *err);
/* The same with the module implementations taken from impl (as qwen3_create_with). */
int qwen3_create_unowned_with(Qwen3 *m, const ModelSpec *spec, int B, int T, AcMode ac, int sp,
                              const Qwen3Modules *impl, Err *err);
void qwen3_free(Qwen3 *m);

/* Bytes of the three arenas qwen3_create would allocate for the same arguments (with sp > 1,
 * qwen3_create_unowned's activation arena; its parameter and gradient arenas are not
 * allocated), computed by the same layout code on counting arenas (so they cannot drift),
 * without allocating them. */
typedef struct Qwen3Sizes {
    size_t param_bytes, grad_bytes, act_bytes;
    /* The bf16 weight arena qwen3_enable_bf16 would add: [0] with bf16 copies, [1] with widened
     * ones; gemm_bf16_widens() picks (asked only by a bf16 job: the question times the GEMM
     * paths). */
    size_t bf16_bytes[2];
    /* What [0] grows by where the copies are prepacked (ops/gemm.h gemm_bf16_prepacks). */
    size_t bf16_pack_bytes;
    /* The parameter and bf16 arenas of qwen3_create_frozen_with with base_bf16 1 instead. */
    size_t base_bf16_param_bytes, base_bf16_bytes;
    /* The bf16 arena of qwen3_enable_bf16_by_hook: the matmul scratch alone (a sharded model's
     * weights are its driver's). */
    size_t bf16_scratch_bytes;
    int products_bf16; /* qwen3_products_bf16 of the model */
    int nparams;       /* entries of the parameter table (a tied output is no entry) */
} Qwen3Sizes;
int qwen3_sizes(Qwen3Sizes *out, const ModelSpec *spec, int B, int T, AcMode ac, int sp,
                const Qwen3Modules *impl, Err *err);

/* Mixed precision (docs/training.md): from now on every forward first copies the matmul weights
 * (attention and FFN projections, lm_head) to bf16 (unless they are kept: qwen3_keep_bf16),
 * and the linear / feed_forward modules whose implementation has a bf16 path multiply in bf16
 * with fp32 accumulation. Master weights, gradients, norms, attention, softmax, loss and the
 * MoE layers stay fp32. */
int qwen3_enable_bf16(Qwen3 *m, Err *err);
/* The same with the copies in bf16 whatever the GEMM path: for decode's GEMV (infer/decode.h),
 * which reads them itself. qwen3_enable_bf16 keeps them widened where the bf16 products run
 * as fp32 GEMMs (ops/gemm.h gemm_bf16_widens): twice the bytes, and no product widens a
 * weight. */
int qwen3_enable_bf16_for_gemv(Qwen3 *m, Err *err);
/* The same for a model driven by dist.unit (FSDP), which owns the bf16 weights: it points
 * m->pb.layers[*] and m->pb.output at its own buffers and fills a unit's copies from the fp32
 * weights before the unit runs; forward casts nothing. Only the matmul scratch is allocated. */
int qwen3_enable_bf16_by_hook(Qwen3 *m, Err *err);
/* The same for a frozen base driven by dist.unit and held in bf16 (a sharded LoRA base,
 * lora.base_dtype): the model computes as a bf16 base (Qwen3.base_bf16), the driver points
 * the qwen3_bf16_field slots at its gathered bf16 weights and leaves their fp32 fields NULL.
 * Checks the kernels as qwen3_check_bf16_base does. */
int qwen3_enable_bf16_base_by_hook(Qwen3 *m, Err *err);
/* Where a bf16 base holds parameter kind of layer: its slot in m->pb (the matmul weights and
 * the embedding), or NULL for a kind that stays fp32 (norms, the MoE router and experts). */
uint16_t **qwen3_bf16_field(Qwen3 *m, ParamKindId kind, int layer);
/* Copies the fp32 matmul weights to their bf16 copies now (forward does it by itself), for
 * code that runs the bf16 weights without a forward, such as inference (infer/decode.h);
 * nothing while the copies are kept (qwen3_keep_bf16), as they are current then. */
void qwen3_refresh_bf16(Qwen3 *m);
/* on 1: casts the copies now, and forward no longer does: whatever changes a weight from then
 * on writes its copy too (the trainer's AdamW, through qwen3_bf16_copy), so a copy is written
 * once per optimizer step instead of once per forward, and a frozen base's once. on 0: forward
 * casts again. Nothing when the model does not cast its copies itself. */
void qwen3_keep_bf16(Qwen3 *m, int on);
/* The bf16 copy of table entry i that forward casts from its fp32 weight (bf16, or a widened
 * copy's handle: ops/gemm.h), shaped as it; NULL when it has none or the model does not cast
 * its copies itself (a driver's, bf16-only and bf16-base models). */
uint16_t *qwen3_bf16_copy(Qwen3 *m, int i);

/* Each parameter by its init rule in the parameter table (core/param_table.h): normal(0, 0.02)
 * for linears and the embedding, ones for norms, zeros for buffers; in MoE models wo and the
 * experts' w2 use 0.02 / sqrt(2 L). Parameter i of the table draws
 * from rng stream i of seed, so the result does not depend on order. */
void qwen3_init_params(Qwen3 *m, uint64_t seed);
/* The same for parameter i alone, written to out (table[i].numel floats): a sharded run
 * initialises one tensor at a time and keeps only its slice. */
void qwen3_init_param(const Qwen3 *m, int i, uint64_t seed, float *out);
/* Elements [lo, lo + n) of what qwen3_init_param writes (lo even), into out (n floats). */
void qwen3_init_param_range(const Qwen3 *m, int i, uint64_t seed, float *out, long lo, long n);
/* The floats of the pieces a weight held in bf16 only is made or loaded in (even), so no fp32
 * copy of the whole weight is ever held. */
#define QWEN3_CHUNK (1L << 20)
const Qwen3Param *qwen3_find_param(const Qwen3 *m, const char *name);
/* Where parameters of this kind and layer (-1 outside the layers) live in p: Qwen3Params is
 * the model's named view of the parameter table (core/param_table.h). */
float **qwen3_param_field(Qwen3Params *p, ParamKindId kind, int layer);
void qwen3_zero_grads(Qwen3 *m);

/* Forward on B x T tokens (B * T <= max_B * max_T; more aborts as a programming error). tokens
 * and targets in [0, V), targets may be CE_IGNORE or the whole array NULL (no loss: logits
 * only). positions NULL means 0..T-1 in every row; doc NULL means plain causal attention.
 * Returns the mean loss over valid targets (0 when none) plus, in MoE models with
 * router_aux_loss_coef > 0, coef times the router auxiliary loss (as HF's loss does); fills
 * m->loss_sum (cross-entropy only) / m->n_valid / m->aux_loss; logits stay in m->a.logits
 * (N, V) until backward. MoE layers add their routing counts to m->moe_counts. Token ids must
 * already be checked. */
float qwen3_forward(Qwen3 *m, const int32_t *tokens, const int32_t *targets,
                    const int32_t *positions, const int32_t *doc, int B, int T);
/* Backward of loss = loss_sum / divisor (divisor <= 0: this forward's n_valid); parameter
 * gradients accumulate into m->g. Needs a forward with targets just before. */
void qwen3_backward(Qwen3 *m, double divisor);
/* qwen3_forward then qwen3_backward(divisor) with divisor > 0 known up front (the trainer's
 * count of the step's valid targets), so a loss op with forward_backward runs the output
 * layer's backward inside the forward and never keeps the logits (on a world of one; under
 * FSDP hooks the two run apart). Returns what qwen3_forward returns. */
float qwen3_forward_backward(Qwen3 *m, const int32_t *tokens, const int32_t *targets,
                             const int32_t *positions, const int32_t *doc, int B, int T,
                             double divisor);

/* MoE load balancing: zeroes m->moe_counts (call at the start of each optimizer step). */
void qwen3_moe_reset_counts(Qwen3 *m);
/* Applies moe_update_expert_bias to every MoE layer with counts (L, X) (m->moe_counts, or the
 * same all-reduced over data-parallel ranks), using spec.load_balance_coeff; no-op when it is
 * 0. Call after the step's backward passes, before the optimizer step. */
void qwen3_moe_update_bias(Qwen3 *m, const double *counts);

/* Checks token ids (and targets) against the vocabulary; the sentence names the index. */
int qwen3_check_tokens(const Qwen3 *m, const int32_t *ids, long n, int allow_ignore,
                       const char *what, Err *err);

#endif
