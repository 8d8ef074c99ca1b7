/* Qwen3 dense model on the fp32 reference path: parameter table, module tree, forward and
 * backward. Matches HF transformers' Qwen3ForCausalLM (tests/test_parity.c).
 *
 * Dimensions: B batch, T sequence, N = B*T tokens, D model dim, H heads, K kv heads,
 * E head dim, F ffn dim, V vocab, L layers.
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
#include "ops/cross_entropy.h"
#include "ops/embedding.h"
#include "ops/linear.h"
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
} Qwen3LayerParams;

typedef struct Qwen3Params {
    float *tok_embeddings; /* (V, D) */
    Qwen3LayerParams layers[QT_MAX_LAYERS];
    float *norm;   /* (D) */
    float *output; /* (V, D); == tok_embeddings when tied */
} Qwen3Params;

/* One entry of the parameter table: torchtitan name, shape, value and gradient. */
typedef struct Qwen3Param {
    char name[96];
    int ndim;
    int64_t shape[2];
    long numel;
    float *data; /* points into the parameter arena */
    float *grad; /* points into the gradient arena */
    int is_norm; /* initialised to ones rather than normal(0, 0.02) */
} Qwen3Param;

/* Implementation pointer of every module instance (DESIGN §4). */
typedef struct Qwen3LayerModules {
    const RmsnormOp *attention_norm;
    const LinearOp *qkv;
    const RmsnormOp *q_norm;
    const RmsnormOp *k_norm;
    const RopeOp *rope;
    const SdpaOp *sdpa;
    const LinearOp *wo;
    const RmsnormOp *ffn_norm;
    const SwigluOp *feed_forward;
} Qwen3LayerModules;

typedef struct Qwen3Modules {
    const EmbeddingOp *tok_embeddings;
    Qwen3LayerModules layers[QT_MAX_LAYERS];
    const RmsnormOp *norm;
    const LinearOp *lm_head;
    const CrossEntropyOp *loss;
} Qwen3Modules;

/* Activations of one layer. AC_FULL: all layers share one set except x. AC_SELECTIVE: they
 * share the norm and rope outputs (xn1, rstd1, qn, q_rstd, kn, k_rstd, qr, kr, xn2, rstd2). */
typedef struct Qwen3LayerActs {
    float *x;      /* (N, D) layer input (residual stream), kept in every mode */
    float *xn1;    /* (N, D) attention_norm output */
    float *rstd1;  /* (N) */
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
    float *xmid;   /* (N, D) x + attention */
    float *xn2;    /* (N, D) ffn_norm output */
    float *rstd2;  /* (N) */
    float *h1;     /* (N, F) */
    float *h3;     /* (N, F) */
    float *g;      /* (N, F) */
} Qwen3LayerActs;

typedef struct Qwen3Acts {
    int32_t *tokens;    /* (N) */
    int32_t *targets;   /* (N) */
    int32_t *positions; /* (N) */
    int32_t *doc;       /* (N) */
    int has_doc;
    Qwen3LayerActs layers[QT_MAX_LAYERS];
    float *h;      /* (N, D) output of the last layer */
    float *hn;     /* (N, D) after the final norm */
    float *rstdf;  /* (N) */
    float *logits; /* (N, V); becomes dlogits during backward */
    float *ce_lse; /* (N) */
    float *losses; /* (N) */
    /* Activation gradients: one set, reused by every layer in turn. */
    float *dres; /* (N, D) gradient of the residual stream */
    float *dxn;  /* (N, D) */
    float *dtmp; /* (N, D) */
    float *datt; /* (N, H*E) */
    float *dqr;  /* (N, H*E) */
    float *dqn;  /* (N, H*E) */
    float *dq;   /* (N, H*E) */
    float *dkr;  /* (N, K*E) */
    float *dkn;  /* (N, K*E) */
    float *dk;   /* (N, K*E) */
    float *dv;   /* (N, K*E) */
    float *dh1;  /* (N, F) */
    float *dh3;  /* (N, F) */
} Qwen3Acts;

typedef struct Qwen3 {
    ModelSpec spec;
    int max_B, max_T; /* activation capacity */
    AcMode ac;
    Arena param_arena, grad_arena, act_arena;
    Qwen3Params p;
    Qwen3Params g; /* gradients, same layout */
    Qwen3Param *table;
    int nparams;
    Qwen3Modules mod;
    ModuleSlot *slots;
    int nslots;
    Qwen3Acts a;
    /* Set by forward, read by backward. */
    int B, T;
    double loss_sum; /* sum of CE over valid targets */
    long n_valid;
} Qwen3;

/* Builds the parameter table and arenas for spec and activations for up to B x T tokens.
 * Parameters are zero until qwen3_init_params or a load fills them. Dense models only. */
int qwen3_create(Qwen3 *m, const ModelSpec *spec, int B, int T, AcMode ac, Err *err);
void qwen3_free(Qwen3 *m);

/* DESIGN §5: normal(0, 0.02) for linears and the embedding, ones for norms; parameter i of
 * the table draws from rng stream i of seed, so the result does not depend on order. */
void qwen3_init_params(Qwen3 *m, uint64_t seed);
const Qwen3Param *qwen3_find_param(const Qwen3 *m, const char *name);
void qwen3_zero_grads(Qwen3 *m);

/* Forward on B x T tokens (B * T <= max_B * max_T; more aborts as a programming error). tokens and
 * targets in [0, V), targets may be CE_IGNORE or the whole array NULL (no loss: logits only).
 * positions NULL means 0..T-1 in every row; doc NULL means plain causal attention. Returns the mean
 * loss over valid targets (0 when none) and fills m->loss_sum / m->n_valid; logits stay in
 * m->a.logits (N, V) until backward. Token ids must already be checked. */
float qwen3_forward(Qwen3 *m, const int32_t *tokens, const int32_t *targets,
                    const int32_t *positions, const int32_t *doc, int B, int T);
/* Backward of loss = loss_sum / divisor (divisor <= 0: this forward's n_valid); parameter
 * gradients accumulate into m->g. Needs a forward with targets just before. */
void qwen3_backward(Qwen3 *m, double divisor);

/* Checks token ids (and targets) against the vocabulary; the sentence names the index. */
int qwen3_check_tokens(const Qwen3 *m, const int32_t *ids, long n, int allow_ignore,
                       const char *what, Err *err);

#endif
