/* Qwen3 model (dense and MoE): layouts (parameters, activations), module tree, forward and
 * backward. Residual adds are done here; everything else is an op called through its module
 * pointer. */
#include "model/qwen3.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "kernels/cpu_ops.h"
#include "kernels/cpu_simd.h"
#include "kernels/loss_amx.h"
#include "model/lora.h"
#include "model/moe.h"
#include "model/moe_ep.h"
#include "ops/gemm.h"
#include "ops/op_profile.h"

/* ---- parameter table ---- */

float **qwen3_param_field(Qwen3Params *p, ParamKindId kind, int layer) {
    Qwen3LayerParams *l = &p->layers[layer < 0 ? 0 : layer];
    switch (kind) {
    case PK_TOK_EMBEDDINGS:
        return &p->tok_embeddings;
    case PK_ATTENTION_NORM:
        return &l->attention_norm;
    case PK_WQ:
        return &l->wq;
    case PK_WK:
        return &l->wk;
    case PK_WV:
        return &l->wv;
    case PK_WO:
        return &l->wo;
    case PK_Q_NORM:
        return &l->q_norm;
    case PK_K_NORM:
        return &l->k_norm;
    case PK_FFN_NORM:
        return &l->ffn_norm;
    case PK_ROUTER_GATE:
        return &l->router_gate;
    case PK_EXPERTS_W1:
        return &l->experts_w1;
    case PK_EXPERTS_W2:
        return &l->experts_w2;
    case PK_EXPERTS_W3:
        return &l->experts_w3;
    case PK_EXPERT_BIAS:
        return &l->expert_bias;
    case PK_W1:
        return &l->w1;
    case PK_W3:
        return &l->w3;
    case PK_W2:
        return &l->w2;
    case PK_NORM:
        return &p->norm;
    case PK_OUTPUT:
        return &p->output;
    case PK_COUNT:
        break;
    }
    abort(); /* unreachable: every kind has a case */
}

uint16_t **qwen3_bf16_field(Qwen3 *m, ParamKindId kind, int layer) {
    Qwen3Bf16Layer *l = &m->pb.layers[layer < 0 ? 0 : layer];
    switch (kind) {
    case PK_WQ:
        return &l->wq;
    case PK_WK:
        return &l->wk;
    case PK_WV:
        return &l->wv;
    case PK_WO:
        return &l->wo;
    case PK_W1:
        return &l->w1;
    case PK_W3:
        return &l->w3;
    case PK_W2:
        return &l->w2;
    case PK_OUTPUT:
        return &m->pb.output;
    case PK_TOK_EMBEDDINGS:
        return &m->pb.tok_embeddings;
    default:
        return NULL;
    }
}

/* With bf16_only: 1 when every module that reads the weight multiplies with its bf16 copy, so
 * no fp32 copy is needed. build_modules has run. */
static int bf16_suffices(const Qwen3 *m, ParamKindId kind, int layer) {
    const Qwen3LayerModules *md = &m->mod.layers[layer < 0 ? 0 : layer];
    switch (kind) {
    case PK_WQ:
    case PK_WK:
    case PK_WV:
        return md->qkv->forward_bf16 != NULL;
    case PK_WO:
        return md->wo->forward_bf16 != NULL;
    case PK_W1:
    case PK_W3:
    case PK_W2:
        return md->feed_forward->forward_bf16 != NULL;
    case PK_OUTPUT: /* a fused loss op reads the fp32 weight */
        return m->mod.loss == &lm_head_loss_reference && m->mod.lm_head->forward_bf16 != NULL;
    default:
        return 0;
    }
}

/* Places the table's parameters (core/param_table.h) and their gradients in the arenas. Runs
 * once counting (m->table NULL, arenas counting) and once placing. A bf16 base's matmul
 * weights and embedding get no fp32 place (layout_bf16 places them). */
static void layout_params(Qwen3 *m, Arena *pa, Arena *ga) {
    int n = param_list(&m->spec, NULL);
    ParamInfo *info = xmalloc((size_t)n * sizeof *info);
    param_list(&m->spec, info);
    for (int i = 0; i < n; i++) {
        const ParamInfo *pi = &info[i];
        int in_bf16 = qwen3_bf16_field(m, pi->kind->id, pi->layer) &&
                      (m->base_bf16 || (m->bf16_only && bf16_suffices(m, pi->kind->id, pi->layer)));
        float *data = in_bf16 ? NULL : arena_floats(pa, (size_t)pi->numel);
        float *grad = arena_floats(ga, (size_t)pi->numel);
        *qwen3_param_field(&m->p, pi->kind->id, pi->layer) = data;
        *qwen3_param_field(&m->g, pi->kind->id, pi->layer) = grad;
        if (!m->table) continue;
        Qwen3Param *p = &m->table[i];
        memcpy(p->name, pi->name, sizeof p->name);
        p->kind = pi->kind;
        p->layer = pi->layer;
        p->ndim = pi->ndim;
        memcpy(p->shape, pi->shape, sizeof p->shape);
        p->numel = (long)pi->numel;
        p->data = data;
        p->grad = grad;
    }
    free(info);
    if (m->spec.tie_embeddings) {
        m->p.output = m->p.tok_embeddings;
        m->g.output = m->g.tok_embeddings;
    }
    m->nparams = n;
}

/* ---- activations ---- */

/* 1 when the model holds only some of the experts it routes to (an expert-parallel rank): the
 * experts op then runs on the rows moe_ep.c receives, in its own buffers, and the arena keeps
 * none for it. */
static int experts_elsewhere(const ModelSpec *s) {
    return s->num_local_experts > 0 && s->num_local_experts < s->num_experts;
}

/* The FFN block's saved activations: dense (h1, h3, g) and / or MoE (routing and the experts'
 * saved buffers; their scratch is shared and placed later). */
static void layout_ffn_acts(Qwen3LayerActs *a, Arena *ar, const ModelSpec *s, long N, int dense,
                            int moe) {
    long F = s->hidden_dim;
    int D = s->dim;
    if (dense) {
        a->h1 = arena_floats(ar, N * F);
        a->h3 = arena_floats(ar, N * F);
        a->g = arena_floats(ar, N * F);
    }
    if (moe) {
        int X = s->num_experts, k = s->top_k, Fm = s->moe_hidden_dim;
        a->probs = arena_floats(ar, N * X);
        a->topk_idx = arena_alloc(ar, (size_t)(N * k) * sizeof(int32_t));
        a->topk_w = arena_floats(ar, N * k);
        if (experts_elsewhere(s)) return;
        float *saved = arena_floats(ar, (size_t)moe_experts_saved_floats(N, k, D, Fm));
        int32_t *ints = arena_alloc(ar, (size_t)moe_experts_saved_ints(N, k, X) * sizeof(int32_t));
        moe_experts_bufs_place(&a->ex, saved, ints, NULL, N, k, D, Fm, X);
    }
}

/* dense / moe: which FFN block's activations this set holds (both when layers share it); n:
 * the tokens of the residual stream (N / sp). */
static void layout_layer_acts(Qwen3LayerActs *a, Arena *ar, const ModelSpec *s, long N, long n,
                              long BHT, int dense, int moe) {
    long D = s->dim, HE = (long)s->n_heads * s->head_dim, KE = (long)s->n_kv_heads * s->head_dim;
    a->xn1 = arena_floats(ar, n * D);
    a->rstd1 = arena_floats(ar, n);
    a->q = arena_floats(ar, N * HE);
    a->k = arena_floats(ar, N * KE);
    a->v = arena_floats(ar, N * KE);
    a->qn = arena_floats(ar, N * HE);
    a->q_rstd = arena_floats(ar, N * s->n_heads);
    a->kn = arena_floats(ar, N * KE);
    a->k_rstd = arena_floats(ar, N * s->n_kv_heads);
    a->qr = arena_floats(ar, N * HE);
    a->kr = arena_floats(ar, N * KE);
    a->att = arena_floats(ar, N * HE);
    a->lse = arena_floats(ar, BHT);
    a->xmid = arena_floats(ar, n * D);
    a->xn2 = arena_floats(ar, n * D);
    a->rstd2 = arena_floats(ar, n);
    layout_ffn_acts(a, ar, s, N, dense, moe);
}

/* ks: the kernel scratch arena, for the workspaces the chosen ops declare. */
static void layout_acts(Qwen3 *m, Arena *ar, Arena *ks) {
    const ModelSpec *s = &m->spec;
    Qwen3Acts *a = &m->a;
    long N = (long)m->max_B * m->max_T, D = s->dim, V = s->vocab_size, F = s->hidden_dim;
    long HE = (long)s->n_heads * s->head_dim, KE = (long)s->n_kv_heads * s->head_dim;
    long BHT = N * s->n_heads, n = N / m->sp;
    a->tokens = arena_alloc(ar, (size_t)N * sizeof(int32_t));
    a->targets = arena_alloc(ar, (size_t)N * sizeof(int32_t));
    a->positions = arena_alloc(ar, (size_t)N * sizeof(int32_t));
    a->doc = arena_alloc(ar, (size_t)N * sizeof(int32_t));
    /* Layers that checkpoint (ac_layer_mode not AC_NONE) work in one shared set, laid out
     * by the first of them for the FFN blocks of all of them; backward recomputes them. */
    int any_dense = 0, any_moe = 0, shared_dense = 0, shared_moe = 0, shared = -1;
    for (int i = 0; i < s->n_layers; i++) {
        int moe = model_spec_layer_is_moe(s, i), kept = ac_layer_mode(m->ac, i) == AC_NONE;
        any_moe |= moe;
        any_dense |= !moe;
        shared_moe |= moe && !kept;
        shared_dense |= !moe && !kept;
    }
    for (int i = 0; i < s->n_layers; i++) {
        a->layers[i].x = arena_floats(ar, n * D);
        int moe = model_spec_layer_is_moe(s, i);
        AcMode lm = ac_layer_mode(m->ac, i);
        if (lm == AC_NONE) {
            layout_layer_acts(&a->layers[i], ar, s, N, n, BHT, !moe, moe);
        } else if (shared < 0) {
            layout_layer_acts(&a->layers[i], ar, s, N, n, BHT, shared_dense, shared_moe);
            shared = i;
        } else {
            Qwen3LayerActs *l = &a->layers[i];
            float *x = l->x;
            *l = a->layers[shared];
            l->x = x;
            if (lm == AC_SELECTIVE) {
                /* Outputs of the matmuls and attention stay per layer. */
                long HE = (long)s->n_heads * s->head_dim, KE = (long)s->n_kv_heads * s->head_dim;
                l->q = arena_floats(ar, N * HE);
                l->k = arena_floats(ar, N * KE);
                l->v = arena_floats(ar, N * KE);
                l->att = arena_floats(ar, N * HE);
                l->lse = arena_floats(ar, BHT);
                l->xmid = arena_floats(ar, n * D);
                layout_ffn_acts(l, ar, s, N, !moe, moe);
            }
        }
    }
    a->h = arena_floats(ar, n * D);
    a->hn = arena_floats(ar, n * D);
    a->rstdf = arena_floats(ar, n);
    a->logits_floats = m->mod.loss->workspace_floats(n, (int)D, (int)V);
    a->logits = arena_floats(ar, (size_t)a->logits_floats);
    a->ce_lse = arena_floats(ar, n);
    a->losses = arena_floats(ar, n);
    a->dres = arena_floats(ar, n * D);
    a->dxn = arena_floats(ar, N * D);
    a->dtmp = arena_floats(ar, n * D);
    a->xg = a->yg = NULL;
    if (m->sp > 1) {
        a->xg = arena_floats(ar, N * D);
        a->yg = arena_floats(ar, N * D);
    }
    a->datt = arena_floats(ar, N * HE);
    a->dqr = arena_floats(ar, N * HE);
    a->dqn = arena_floats(ar, N * HE);
    a->dq = arena_floats(ar, N * HE);
    a->dkr = arena_floats(ar, N * KE);
    a->dkn = arena_floats(ar, N * KE);
    a->dk = arena_floats(ar, N * KE);
    a->dv = arena_floats(ar, N * KE);
    a->ffn_ws = NULL;
    if (any_dense) {
        a->dh1 = arena_floats(ar, N * F);
        a->dh3 = arena_floats(ar, N * F);
        long ws = 0; /* the largest the layers' feed-forward kernels declare */
        for (int i = 0; i < s->n_layers; i++) {
            const SwigluOp *ff = m->mod.layers[i].feed_forward;
            long w = ff && ff->workspace_floats ? ff->workspace_floats(N, (int)D, (int)F) : 0;
            ws = w > ws ? w : ws;
        }
        if (ws) a->ffn_ws = arena_floats(ks, (size_t)ws);
    }
    m->moe_counts = NULL;
    if (any_moe) {
        int X = s->num_experts, k = s->top_k, Fm = s->moe_hidden_dim;
        a->router_logits = arena_floats(ar, N * X);
        a->dgw = arena_floats(ar, N * k);
        a->aux_dprob = arena_floats(ar, X);
        a->aux_counts = arena_alloc(ar, (size_t)X * sizeof(double));
        a->aux_psum = arena_alloc(ar, (size_t)X * sizeof(double));
        m->moe_counts = arena_alloc(ar, (size_t)s->n_layers * X * sizeof(double));
        if (experts_elsewhere(s)) return;
        float *scratch = arena_floats(ar, (size_t)moe_experts_scratch_floats(N, k, (int)D, Fm));
        for (int i = 0; i < s->n_layers; i++)
            moe_experts_bufs_place(&a->layers[i].ex, NULL, NULL, scratch, N, k, (int)D, Fm, X);
    }
}

/* ---- module tree ---- */

typedef struct TreeBuild {
    ModuleSlot *slots; /* NULL: count only */
    int n;
} TreeBuild;

static void add_slot(TreeBuild *tb, OpKind kind, void *field, const char *fmt, int layer) {
    if (tb->slots) {
        ModuleSlot *s = &tb->slots[tb->n];
        snprintf(s->fqn, sizeof s->fqn, fmt, layer);
        s->kind = kind;
        s->field = field;
    }
    tb->n++;
}

int qwen3_module_tree(const ModelSpec *spec, Qwen3Modules *d, ModuleSlot *slots) {
    TreeBuild tb = {slots, 0};
    TreeBuild *m = &tb;
    memset(d, 0, sizeof *d);
    d->tok_embeddings = &embedding_reference;
    add_slot(m, OP_EMBEDDING, &d->tok_embeddings, "tok_embeddings", 0);
    for (int i = 0; i < spec->n_layers && i < QT_MAX_LAYERS; i++) {
        Qwen3LayerModules *l = &d->layers[i];
        l->attention_norm = l->q_norm = l->k_norm = l->ffn_norm = &rmsnorm_reference;
        l->qkv = l->wo = &linear_reference;
        l->rope = &rope_reference;
        l->sdpa = &sdpa_reference;
        l->feed_forward = NULL;
        l->router = NULL;
        l->experts = NULL;
        add_slot(m, OP_RMSNORM, &l->attention_norm, "layers.%d.attention_norm", i);
        add_slot(m, OP_LINEAR, &l->qkv, "layers.%d.attention.qkv", i);
        add_slot(m, OP_RMSNORM, &l->q_norm, "layers.%d.attention.q_norm", i);
        add_slot(m, OP_RMSNORM, &l->k_norm, "layers.%d.attention.k_norm", i);
        add_slot(m, OP_ROPE, &l->rope, "layers.%d.attention.rope", i);
        add_slot(m, OP_SDPA, &l->sdpa, "layers.%d.attention.sdpa", i);
        add_slot(m, OP_LINEAR, &l->wo, "layers.%d.attention.wo", i);
        add_slot(m, OP_RMSNORM, &l->ffn_norm, "layers.%d.ffn_norm", i);
        if (model_spec_layer_is_moe(spec, i)) {
            /* grouped is the CPU default: same maths as the reference, GEMM-sized work. */
            l->router = &linear_reference;
            l->experts = &moe_experts_grouped;
            add_slot(m, OP_LINEAR, &l->router, "layers.%d.moe.router", i);
            add_slot(m, OP_MOE_EXPERTS, &l->experts, "layers.%d.moe.experts", i);
        } else {
            l->feed_forward = &swiglu_reference;
            add_slot(m, OP_SWIGLU, &l->feed_forward, "layers.%d.feed_forward", i);
        }
    }
    d->norm = &rmsnorm_reference;
    d->lm_head = &linear_reference;
    d->loss = &lm_head_loss_reference;
    d->ce = &cross_entropy_reference;
    add_slot(m, OP_RMSNORM, &d->norm, "norm", 0);
    add_slot(m, OP_LINEAR, &d->lm_head, "lm_head", 0);
    add_slot(m, OP_LM_HEAD_LOSS, &d->loss, "loss", 0);
    return tb.n;
}

/* The tree into m->mod and m->slots (when allocated), then impl's choices on top; the slots
 * point into m->mod, so copying impl over it keeps them valid. */
static void build_modules(Qwen3 *m, const Qwen3Modules *impl) {
    m->nslots = qwen3_module_tree(&m->spec, &m->mod, m->slots);
    if (impl) m->mod = *impl;
}

/* Checks the shape and fills what the layout functions read; shared by create and
 * qwen3_sizes so the plan sizes exactly what is created. */
static int setup(Qwen3 *m, const ModelSpec *spec, int B, int T, AcMode ac, int sp, Err *err) {
    memset(m, 0, sizeof *m);
    m->spec = *spec;
    rope_freqs(&m->rope_freqs, spec);
    const ModelSpec *s = &m->spec;
    if (s->num_experts > 0 && (s->top_k < 1 || s->top_k > s->num_experts || s->moe_hidden_dim < 1 ||
                               s->decoder_sparse_step < 1))
        return err_set(err,
                       "MoE shape is invalid (experts %d, top_k %d, moe ffn %d, "
                       "decoder_sparse_step %d)",
                       s->num_experts, s->top_k, s->moe_hidden_dim, s->decoder_sparse_step);
    int all_moe = 1;
    for (int i = 0; i < s->n_layers && i < QT_MAX_LAYERS; i++)
        all_moe &= model_spec_layer_is_moe(s, i);
    if (s->n_layers < 1 || s->n_layers > QT_MAX_LAYERS || s->dim < 1 || s->n_heads < 1 ||
        s->n_kv_heads < 1 || s->n_heads % s->n_kv_heads || s->head_dim < 2 || s->head_dim % 2 ||
        (s->hidden_dim < 1 && !all_moe) || s->vocab_size < 1)
        return err_set(err,
                       "model shape is invalid (layers %d, dim %d, heads %d, kv heads %d, "
                       "head_dim %d, ffn %d, vocab %d)",
                       s->n_layers, s->dim, s->n_heads, s->n_kv_heads, s->head_dim, s->hidden_dim,
                       s->vocab_size);
    if (B < 1 || T < 1) return err_set(err, "batch %d x sequence %d is empty", B, T);
    if (sp < 1 || ((long)B * T) % sp != 0)
        return err_set(err, "sequence parallel over %d ranks: %d x %d tokens do not split evenly",
                       sp, B, T);
    if (sp > 1 && s->num_experts > 0)
        return err_set(err, "sequence parallelism is for dense models (this one has %d experts)",
                       s->num_experts);
    m->sp = sp;
    m->max_B = B;
    m->max_T = T;
    m->ac = ac;
    m->aux_weight = 1.0;
    for (int i = 0; i < s->n_layers; i++)
        m->n_moe_layers += model_spec_layer_is_moe(s, i);
    return 0;
}

/* What create allocates besides activations: OWN_PARAMS | OWN_GRADS for training, OWN_PARAMS
 * alone for forward-only use (eval), neither for sharded training (the table points elsewhere);
 * BF16_ONLY with OWN_PARAMS holds the matmul weights in bf16 only (qwen3_create_inference_bf16). */
enum { OWN_PARAMS = 1, OWN_GRADS = 2, BF16_ONLY = 4 };

static int enable_bf16(Qwen3 *m, int weights, int gemv, Err *err);

int qwen3_check_bf16_base(const Qwen3 *m, Err *err) {
    const char *what = NULL, *name = NULL;
    for (int i = 0; i < m->spec.n_layers && !what; i++) {
        const LinearOp *ops[2] = {m->mod.layers[i].qkv, m->mod.layers[i].wo};
        for (int k = 0; k < 2 && !what; k++)
            if (!ops[k]->forward_bf16 || !ops[k]->backward_bf16)
                what = k ? "attention.wo" : "attention.qkv", name = ops[k]->h.name;
    }
    if (!what && (!m->mod.lm_head->forward_bf16 || !m->mod.lm_head->backward_bf16))
        what = "lm_head", name = m->mod.lm_head->h.name;
    if (what)
        return err_set(err,
                       "lora.base_dtype = \"bfloat16\" multiplies the base in bf16, but the %s "
                       "kernel \"%s\" has no bf16 path",
                       what, name);
    if (m->mod.loss != &lm_head_loss_reference)
        return err_set(err,
                       "lora.base_dtype = \"bfloat16\" needs the reference loss (lm_head, then "
                       "cross-entropy); the loss kernel \"%s\" reads fp32 weights",
                       m->mod.loss->h.name);
    return 0;
}

int qwen3_products_bf16(const Qwen3 *m) {
    Err ignored;
    if (qwen3_check_bf16_base(m, &ignored)) return 0;
    for (int i = 0; i < m->spec.n_layers; i++) {
        const SwigluOp *ff = m->mod.layers[i].feed_forward;
        if (!m->mod.layers[i].experts && (!ff->forward_bf16 || !ff->backward_bf16)) return 0;
    }
    return 1;
}

static int create(Qwen3 *m, const ModelSpec *spec, int B, int T, AcMode ac, int sp, int owned,
                  const Qwen3Modules *impl, int base_bf16, Err *err) {
    TRY(setup(m, spec, B, T, ac, sp, err));
    m->bf16_only = (owned & BF16_ONLY) != 0;
    m->base_bf16 = base_bf16;
    Arena pc, gc, ac_count, ks_count;
    arena_init_counting(&pc, "parameter");
    arena_init_counting(&gc, "gradient");
    arena_init_counting(&ac_count, "activation");
    arena_init_counting(&ks_count, "kernel scratch");
    build_modules(m, impl); /* before the activations: the loss op sizes its workspace */
    layout_params(m, &pc, &gc);
    layout_acts(m, &ac_count, &ks_count);
    m->table = xcalloc((size_t)m->nparams, sizeof *m->table);
    m->slots = xcalloc((size_t)m->nslots, sizeof *m->slots);
    if (((owned & OWN_PARAMS) && arena_init(&m->param_arena, "parameter", pc.used, err)) ||
        ((owned & OWN_GRADS) && arena_init(&m->grad_arena, "gradient", gc.used, err)) ||
        arena_init(&m->act_arena, "activation", ac_count.used, err) ||
        arena_init(&m->scratch_arena, "kernel scratch", ks_count.used, err) ||
        arena_check_headroom("the model's arenas", err)) {
        qwen3_free(m);
        return -1;
    }
    build_modules(m, impl);
    /* Counting arenas place nothing: what is not owned gets NULL in the table. */
    layout_params(m, owned & OWN_PARAMS ? &m->param_arena : &pc,
                  owned & OWN_GRADS ? &m->grad_arena : &gc);
    layout_acts(m, &m->act_arena, &m->scratch_arena);
    if (!base_bf16 && !m->bf16_only) return 0;
    if ((base_bf16 && qwen3_check_bf16_base(m, err)) || enable_bf16(m, 1, 0, err)) {
        qwen3_free(m);
        return -1;
    }
    /* A weight without an fp32 place: the table points at its one copy. */
    for (int i = 0; i < m->nparams; i++) {
        uint16_t **f = qwen3_bf16_field(m, m->table[i].kind->id, m->table[i].layer);
        if (f && !m->table[i].data) m->table[i].data_bf16 = *f;
    }
    return 0;
}

int qwen3_create(Qwen3 *m, const ModelSpec *spec, int B, int T, AcMode ac, Err *err) {
    return create(m, spec, B, T, ac, 1, OWN_PARAMS | OWN_GRADS, NULL, 0, err);
}

int qwen3_create_with(Qwen3 *m, const ModelSpec *spec, int B, int T, AcMode ac,
                      const Qwen3Modules *impl, Err *err) {
    return create(m, spec, B, T, ac, 1, OWN_PARAMS | OWN_GRADS, impl, 0, err);
}

int qwen3_create_forward(Qwen3 *m, const ModelSpec *spec, int B, int T, const Qwen3Modules *impl,
                         Err *err) {
    return create(m, spec, B, T, AC_NONE, 1, OWN_PARAMS, impl, 0, err);
}

int qwen3_create_inference_bf16(Qwen3 *m, const ModelSpec *spec, int B, int T,
                                const Qwen3Modules *impl, Err *err) {
    return create(m, spec, B, T, AC_NONE, 1, OWN_PARAMS | BF16_ONLY, impl, 0, err);
}

void qwen3_param_store(Qwen3 *m, int i, const float *v) {
    const Qwen3Param *p = &m->table[i];
    if (p->data) {
        if (p->data != v) memcpy(p->data, v, (size_t)p->numel * sizeof(float));
    } else {
        simd_f32_to_bf16(*qwen3_bf16_field(m, p->kind->id, p->layer), v, p->numel);
    }
    /* Tied: lm_head's bf16 copy is the embedding's, which no forward casts here. */
    if (m->bf16_only && p->kind->id == PK_TOK_EMBEDDINGS && m->spec.tie_embeddings)
        simd_f32_to_bf16(m->pb.output, v, p->numel);
}

int qwen3_create_frozen_with(Qwen3 *m, const ModelSpec *spec, int B, int T, AcMode ac,
                             const Qwen3Modules *impl, int base_bf16, Err *err) {
    return create(m, spec, B, T, ac, 1, OWN_PARAMS, impl, base_bf16, err);
}

int qwen3_create_unowned(Qwen3 *m, const ModelSpec *spec, int B, int T, AcMode ac, int sp,
                         Err *err) {
    return create(m, spec, B, T, ac, sp, 0, NULL, 0, err);
}

int qwen3_create_unowned_with(Qwen3 *m, const ModelSpec *spec, int B, int T, AcMode ac, int sp,
                              const Qwen3Modules *impl, Err *err) {
    return create(m, spec, B, T, ac, sp, 0, impl, 0, err);
}

void qwen3_free(Qwen3 *m) {
    arena_free(&m->param_arena);
    arena_free(&m->grad_arena);
    arena_free(&m->act_arena);
    arena_free(&m->scratch_arena);
    if (m->bf16_widened) gemm_widened_unregister((const float *)(void *)m->bf16_arena.base);
    if (m->bf16_packed) gemm_bf16_pack_unregister(m->bf16_arena.base, m->bf16_arena.capacity);
    arena_free(&m->bf16_arena);
    free(m->table);
    free(m->slots);
    m->table = NULL;
    m->slots = NULL;
}

void qwen3_init_param(const Qwen3 *m, int i, uint64_t seed, float *out) {
    qwen3_init_param_range(m, i, seed, out, 0, m->table[i].numel);
}

void qwen3_init_param_range(const Qwen3 *m, int i, uint64_t seed, float *out, long lo, long n) {
    const Qwen3Param *p = &m->table[i];
    float std = 0.02f;
    switch (p->kind->init) {
    case INIT_ONES:
        for (long j = 0; j < n; j++)
            out[j] = 1.0f;
        return;
    case INIT_ZEROS:
        memset(out, 0, (size_t)n * sizeof(float));
        return;
    case INIT_RESIDUAL:
        if (m->spec.num_experts > 0) std = (float)(0.02 / sqrt(2.0 * m->spec.n_layers));
        break;
    case INIT_NORMAL:
        break;
    }
    rng_fill_normal_counter_at(seed, (uint64_t)i, out, lo, n, std);
}

void qwen3_init_params(Qwen3 *m, uint64_t seed) {
    float *tmp = NULL;
    for (int i = 0; i < m->nparams; i++) {
        Qwen3Param *p = &m->table[i];
        if (!p->data_bf16) {
            qwen3_init_param(m, i, seed, p->data);
            continue;
        }
        /* A bf16 base: drawn in fp32 a piece at a time and rounded, so no fp32 copy of a
         * whole weight (the embedding: 1.5 GiB at 4B) adds to the peak. */
        if (!tmp) tmp = xmalloc(QWEN3_CHUNK * sizeof *tmp);
        for (long lo = 0; lo < p->numel; lo += QWEN3_CHUNK) {
            long n = p->numel - lo < QWEN3_CHUNK ? p->numel - lo : QWEN3_CHUNK;
            qwen3_init_param_range(m, i, seed, tmp, lo, n);
            simd_f32_to_bf16(p->data_bf16 + lo, tmp, n);
        }
    }
    free(tmp);
}

const Qwen3Param *qwen3_find_param(const Qwen3 *m, const char *name) {
    for (int i = 0; i < m->nparams; i++)
        if (strcmp(m->table[i].name, name) == 0) return &m->table[i];
    return NULL;
}

void qwen3_zero_grads(Qwen3 *m) {
    if (m->grad_arena.base) memset(m->grad_arena.base, 0, m->grad_arena.capacity);
}

void qwen3_moe_reset_counts(Qwen3 *m) {
    if (m->moe_counts)
        memset(m->moe_counts, 0, (size_t)m->spec.n_layers * m->spec.num_experts * sizeof(double));
}

void qwen3_moe_update_bias(Qwen3 *m, const double *counts) {
    const ModelSpec *s = &m->spec;
    for (int i = 0; i < s->n_layers; i++)
        if (m->p.layers[i].expert_bias)
            moe_update_expert_bias(m->p.layers[i].expert_bias, counts + (long)i * s->num_experts,
                                   s->num_experts, s->load_balance_coeff);
}

int qwen3_check_tokens(const Qwen3 *m, const int32_t *ids, long n, int allow_ignore,
                       const char *what, Err *err) {
    for (long i = 0; i < n; i++) {
        if (allow_ignore && ids[i] == CE_IGNORE) continue;
        if (ids[i] < 0 || ids[i] >= m->spec.vocab_size)
            return err_set(err, "%s[%ld] = %d is outside the vocabulary [0, %d)", what, i,
                           (int)ids[i], m->spec.vocab_size);
    }
    return 0;
}

/* ---- mixed precision ---- */

/* A matmul weight's copy of n elements in bf16_arena: bf16, or widened fp32 addressed by its
 * handle (ops/gemm.h), which is the region's handle (the arena's base, registered by
 * enable_bf16) plus the copy's element offset. NULL while counting. */
static uint16_t *weight_copy(const Qwen3 *m, Arena *ar, long n) {
    if (!m->bf16_widened) return arena_alloc(ar, (size_t)n * sizeof(uint16_t));
    float *w = arena_alloc(ar, (size_t)n * sizeof(float));
    float *base = (float *)(void *)ar->base;
    return w ? (uint16_t *)(void *)base + (w - base) : NULL;
}

/* The kinds of a layer's matmul weights that have bf16 copies, in layout order. */
static const ParamKindId COPY_KINDS[] = {PK_WQ, PK_WK, PK_WV, PK_WO, PK_W1, PK_W3, PK_W2};
#define NCOPY ((int)(sizeof COPY_KINDS / sizeof COPY_KINDS[0]))

/* The bf16 weight copies of layer i (those its layer has: an MoE layer's experts stay fp32) in
 * layout order: their fields and their parameters as the parameter table places them; their
 * number. */
static int layer_copies(Qwen3 *m, int i, uint16_t **copies[NCOPY], ParamInfo info[NCOPY]) {
    int n = 0;
    for (int j = 0; j < NCOPY; j++)
        if (param_place(&m->spec, COPY_KINDS[j], i, &info[n]))
            copies[n++] = qwen3_bf16_field(m, COPY_KINDS[j], i);
    return n;
}

/* Runs once counting, once placing (as the other layouts); the weight copies only when
 * weights is 1. The copies come first, so widened ones form one region at the arena's base,
 * of *weight_bytes; packed forms (m->bf16_packed) follow the output's copy. */
static void layout_bf16(Qwen3 *m, Arena *ar, int weights, size_t *weight_bytes) {
    const ModelSpec *s = &m->spec;
    long D = s->dim, HE = (long)s->n_heads * s->head_dim;
    long F = s->hidden_dim, V = s->vocab_size, N = (long)m->max_B * m->max_T;
    uint16_t **copies[NCOPY];
    ParamInfo info[NCOPY];
    for (int i = 0; i < s->n_layers && weights; i++)
        for (int j = 0, n = layer_copies(m, i, copies, info); j < n; j++)
            *copies[j] = weight_copy(m, ar, info[j].numel);
    if (weights) m->pb.output = weight_copy(m, ar, V * D);
    if (weights && m->base_bf16)
        m->pb.tok_embeddings =
            s->tie_embeddings ? m->pb.output : arena_alloc(ar, (size_t)(V * D) * sizeof(uint16_t));
    *weight_bytes = ar->used;
    for (int i = 0; i < s->n_layers && weights && m->bf16_packed; i++)
        for (int j = 0, n = layer_copies(m, i, copies, info); j < n; j++)
            m->pb.layers[i].packs[j] = arena_alloc(
                ar, gemm_bf16_packed_values((int)info[j].shape[0], (int)info[j].shape[1]) *
                        sizeof(uint16_t));
    /* The largest product's inputs: the FFN backward (linear.h, swiglu.h) or lm_head; or
     * attention's cast keys and values (ops/sdpa.h). */
    long need = 2 * D + 2 * F;
    if (D + V > need) need = D + V;
    if (D + HE > need) need = D + HE;
    need *= N;
    long att = SDPA_BF16_SCRATCH(m->max_B, m->max_T, s->n_kv_heads, s->head_dim);
    if (att > need) need = att;
    m->pb.scratch = arena_alloc(ar, (size_t)need * sizeof(uint16_t));
    m->pb.scratch_len = need;
}

/* Registers every layer copy with its packed forms (ops/gemm.h); on failure none. */
static int register_packs(Qwen3 *m, Err *err) {
    uint16_t **copies[NCOPY];
    ParamInfo info[NCOPY];
    for (int i = 0; i < m->spec.n_layers; i++)
        for (int j = 0, n = layer_copies(m, i, copies, info); j < n; j++)
            if (gemm_bf16_pack_register(*copies[j], (int)info[j].shape[0], (int)info[j].shape[1],
                                        m->pb.layers[i].packs[j]) != 0) {
                gemm_bf16_pack_unregister(m->bf16_arena.base, m->bf16_arena.capacity);
                return err_set(err, "too many prepacked bf16 weights at once (ops/gemm.h)");
            }
    return 0;
}

/* gemv 1: the copies stay bf16 (qwen3_enable_bf16_for_gemv). */
static int enable_bf16(Qwen3 *m, int weights, int gemv, Err *err) {
    if (m->bf16) return 0;
    int casts = weights && !gemv && !m->bf16_only && !m->base_bf16;
    m->bf16_widened = casts && gemm_bf16_widens();
    m->bf16_packed = casts && !m->bf16_widened && gemm_bf16_prepacks();
    Arena count;
    size_t wbytes;
    arena_init_counting(&count, "bf16 weight");
    layout_bf16(m, &count, weights, &wbytes);
    TRY(arena_init(&m->bf16_arena, "bf16 weight", count.used, err));
    layout_bf16(m, &m->bf16_arena, weights, &wbytes);
    if (m->bf16_widened &&
        !gemm_widened_register((float *)(void *)m->bf16_arena.base, wbytes / sizeof(float))) {
        m->bf16_widened = 0;
        arena_free(&m->bf16_arena);
        return err_set(err, "too many widened weight regions at once (ops/gemm.h)");
    }
    if (m->bf16_packed && register_packs(m, err) != 0) {
        m->bf16_packed = 0;
        arena_free(&m->bf16_arena);
        return -1;
    }
    m->bf16 = 1;
    m->bf16_by_hook = !weights;
    return 0;
}

int qwen3_enable_bf16(Qwen3 *m, Err *err) {
    return enable_bf16(m, 1, 0, err);
}

int qwen3_enable_bf16_for_gemv(Qwen3 *m, Err *err) {
    return enable_bf16(m, 1, 1, err);
}

int qwen3_enable_bf16_by_hook(Qwen3 *m, Err *err) {
    return enable_bf16(m, 0, 0, err);
}

int qwen3_enable_bf16_base_by_hook(Qwen3 *m, Err *err) {
    m->base_bf16 = 1;
    TRY(qwen3_check_bf16_base(m, err));
    return enable_bf16(m, 0, 0, err);
}

static void cast_weights_bf16(Qwen3 *m) {
    const ModelSpec *s = &m->spec;
    uint16_t **copies[NCOPY];
    ParamInfo info[NCOPY];
    for (int i = 0; i < s->n_layers; i++)
        for (int j = 0, n = layer_copies(m, i, copies, info); j < n; j++) {
            simd_bf16_weight_copy(*copies[j], *qwen3_param_field(&m->p, info[j].kind->id, i),
                                  info[j].numel);
            if (m->bf16_packed) gemm_bf16_weight_written(*copies[j]);
        }
    simd_bf16_weight_copy(m->pb.output, m->p.output, (long)s->vocab_size * s->dim);
}

/* 1 when the model makes its bf16 copies from the fp32 masters itself (else there are no
 * copies, or their driver writes them, or they are the only weights). */
static int casts_weights(const Qwen3 *m) {
    return m->bf16 && !m->bf16_by_hook && !m->bf16_only && !m->base_bf16;
}

void qwen3_refresh_bf16(Qwen3 *m) {
    if (casts_weights(m) && !m->bf16_kept) cast_weights_bf16(m);
}

void qwen3_keep_bf16(Qwen3 *m, int on) {
    if (on && casts_weights(m)) cast_weights_bf16(m);
    m->bf16_kept = on && casts_weights(m);
}

uint16_t *qwen3_bf16_copy(Qwen3 *m, int i) {
    if (!casts_weights(m)) return NULL;
    ParamKindId kind = m->table[i].kind->id;
    /* Tied, the embedding is the output layer's weight (m->p.output), cast with it. */
    if (kind == PK_TOK_EMBEDDINGS) return m->spec.tie_embeddings ? m->pb.output : NULL;
    uint16_t **f = qwen3_bf16_field(m, kind, m->table[i].layer);
    return f ? *f : NULL;
}

/* The reference output op in a bf16 training step whose loss scale is known before the forward
 * (qwen3_forward_backward), on a CPU whose bf16 products run on AMX tiles: projection and
 * cross-entropy at once in vocabulary panels (kernels/loss_amx.h), the logits never whole,
 * where the parts the reference schedule would run are the CPU defaults (an override of
 * lm_head or the cross-entropy keeps its kernel) and the gradient is a plain buffer (no FSDP
 * hooks). n tokens; the workspace is the reference's logits. */
static int amx_head(const Qwen3 *m, const int32_t *targets, const uint16_t *wb, long n) {
    const ModelSpec *s = &m->spec;
    if (!targets || !wb || m->fuse_divisor <= 0 || m->dist.unit || !m->g.output || m->bf16_only)
        return 0;
    if (m->mod.lm_head != &linear_cpu || m->mod.ce != &cross_entropy_cpu) return 0;
    return loss_amx_usable(wb, n, s->dim, s->vocab_size) &&
           loss_amx_workspace_floats(n, s->dim, s->vocab_size) <= m->a.logits_floats;
}

/* The linear and feed_forward calls: the bf16 path when mixed precision is on and the
 * implementation has one, else fp32. */
static void linear_fwd(const Qwen3 *m, const LinearOp *op, float *out, const float *x,
                       const float *w, const uint16_t *wb, long N, int I, int O) {
    if (m->bf16 && op->forward_bf16)
        PROF_OP(&op->h, 0, op->forward_bf16(out, x, wb, m->pb.scratch, N, I, O));
    else
        PROF_OP(&op->h, 0, op->forward(out, x, w, N, I, O));
}

static void linear_bwd(const Qwen3 *m, const LinearOp *op, float *dx, float *dw, const float *dout,
                       const float *x, const float *w, const uint16_t *wb, long N, int I, int O,
                       float dx_beta) {
    if (m->bf16 && op->backward_bf16)
        PROF_OP(&op->h, 1, op->backward_bf16(dx, dw, dout, x, wb, m->pb.scratch, N, I, O, dx_beta));
    else
        PROF_OP(&op->h, 1, op->backward(dx, dw, dout, x, w, N, I, O, dx_beta));
}

/* Attention's products in bf16 (ops/sdpa.h) when mixed precision trains on native bf16
 * products; where this process's bf16 products are widened to fp32 (gemm_bf16_widens: bf16 is
 * no faster there) attention stays fp32 too. Inference holding bf16 weights only computes
 * attention in fp32. The scratch is sized for max_B x max_T; a call of other rows within the
 * same tokens (validation's own batch and length) whose cast keys would not fit computes in
 * fp32, forward and backward alike. */
static int sdpa_bf16(const Qwen3 *m, const SdpaOp *op) {
    return m->bf16 && !m->bf16_only && op->forward_bf16 && op->backward_bf16 &&
           SDPA_BF16_SCRATCH(m->B, m->T, m->spec.n_kv_heads, m->spec.head_dim) <=
               m->pb.scratch_len &&
           !gemm_bf16_widens();
}

/* ---- LoRA (model/lora.h): adapters add to their linears' outputs ---- */

static void lora_fwd(const Qwen3 *m, int i, LoraSite s, float *y, const float *x, long N) {
    if (m->lora && m->lora->at[i][s]) lora_forward(m->lora, m->lora->at[i][s], y, x, N);
}

static void lora_bwd(const Qwen3 *m, int i, LoraSite s, float *dx, const float *dy, const float *x,
                     long N) {
    if (m->lora && m->lora->at[i][s]) lora_backward(m->lora, m->lora->at[i][s], dx, dy, x, N);
}

static int ffn_has_lora(const Qwen3 *m, int i) {
    return m->lora &&
           (m->lora->at[i][LORA_W1] || m->lora->at[i][LORA_W3] || m->lora->at[i][LORA_W2]);
}

/* The dense FFN as three linears and the SwiGLU gate, so adapters can act on h1, h3 and the
 * output: the fused op has no place for them. Saves h1, h3, g as the fused op does. */
static void ffn_lora_forward(Qwen3 *m, int i, float *y, const float *xn2, long N) {
    const Qwen3LayerParams *p = &m->p.layers[i];
    const Qwen3Bf16Layer *pb = &m->pb.layers[i];
    const LinearOp *op = m->mod.layers[i].wo; /* the layer's linear implementation */
    Qwen3LayerActs *a = &m->a.layers[i];
    int D = m->spec.dim, F = m->spec.hidden_dim;
    linear_fwd(m, op, a->h1, xn2, p->w1, pb->w1, N, D, F);
    lora_fwd(m, i, LORA_W1, a->h1, xn2, N);
    linear_fwd(m, op, a->h3, xn2, p->w3, pb->w3, N, D, F);
    lora_fwd(m, i, LORA_W3, a->h3, xn2, N);
    for (long k = 0; k < N * F; k++)
        a->g[k] = a->h1[k] / (1.0f + expf(-a->h1[k])) * a->h3[k];
    linear_fwd(m, op, y, a->g, p->w2, pb->w2, N, F, D);
    lora_fwd(m, i, LORA_W2, y, a->g, N);
}

/* Its backward: dout (N, D) -> m->a.dxn (N, D) written; base and adapter gradients added. */
static void ffn_lora_backward(Qwen3 *m, int i, const float *dout, const float *xn2, long N) {
    const Qwen3LayerParams *p = &m->p.layers[i];
    Qwen3LayerParams *g = &m->g.layers[i];
    const Qwen3Bf16Layer *pb = &m->pb.layers[i];
    const LinearOp *op = m->mod.layers[i].wo;
    const Qwen3LayerActs *a = &m->a.layers[i];
    Qwen3Acts *A = &m->a;
    int D = m->spec.dim, F = m->spec.hidden_dim;
    float *dg = A->dh1, *dh3 = A->dh3;
    linear_bwd(m, op, dg, g->w2, dout, a->g, p->w2, pb->w2, N, F, D, 0.0f);
    lora_bwd(m, i, LORA_W2, dg, dout, a->g, N);
    for (long k = 0; k < N * F; k++) {
        float h = a->h1[k], sg = 1.0f / (1.0f + expf(-h)), d = dg[k];
        dh3[k] = d * h * sg;
        dg[k] = d * a->h3[k] * sg * (1.0f + h * (1.0f - sg)); /* now d h1 */
    }
    linear_bwd(m, op, A->dxn, g->w1, dg, xn2, p->w1, pb->w1, N, D, F, 0.0f);
    lora_bwd(m, i, LORA_W1, A->dxn, dg, xn2, N);
    linear_bwd(m, op, A->dxn, g->w3, dh3, xn2, p->w3, pb->w3, N, D, F, 1.0f);
    lora_bwd(m, i, LORA_W3, A->dxn, dh3, xn2, N);
}

/* ---- forward / backward ---- */

static void hook(Qwen3 *m, int unit, Qwen3HookPhase phase) {
    if (m->dist.unit) m->dist.unit(m->dist.ctx, m, unit, phase);
}

static void tp_sum(Qwen3 *m, float *buf, long n) {
    if (m->dist.tp_sum) m->dist.tp_sum(m->dist.ctx, buf, n);
}

/* Tokens of the residual stream on this rank (all of them without sequence parallelism), and
 * the first one's index in the micro-batch. */
static long local_tokens(const Qwen3 *m) {
    return (long)m->B * m->T / m->sp;
}

static long first_token(const Qwen3 *m) {
    return m->sp_rank * local_tokens(m);
}

/* What a tensor-parallel block reads: part (n, D) itself, or under sequence parallelism every
 * rank's tokens of it gathered into full (N, D). */
static const float *sp_gather(Qwen3 *m, float *full, const float *part, long n_floats) {
    if (m->sp == 1) return part;
    m->dist.tp_gather(m->dist.ctx, full, part, n_floats);
    return full;
}

/* Where wo and w2 write their partial (N, D) sums: straight into out, or into yg. */
static float *tp_partial(Qwen3 *m, float *out) {
    return m->sp == 1 ? out : m->a.yg;
}

/* The partial sums in tp_partial(m, out) become the group's sum: in place over all tokens,
 * or reduce-scattered into out's n tokens (n_floats = n * D). */
static void tp_combine(Qwen3 *m, float *out, long n_floats) {
    if (m->sp == 1)
        tp_sum(m, out, n_floats);
    else
        m->dist.tp_reduce_scatter(m->dist.ctx, out, m->a.yg, n_floats);
}

/* dxn (N, D) holds partial sums of a norm output's gradient; returns the group's sum for this
 * rank's tokens: dxn itself, or under sequence parallelism yg (n, D) (free by then). */
static const float *tp_combine_grad(Qwen3 *m, float *dxn, long n_floats) {
    if (m->sp == 1) {
        tp_sum(m, dxn, n_floats);
        return dxn;
    }
    m->dist.tp_reduce_scatter(m->dist.ctx, m->a.yg, dxn, n_floats);
    return m->a.yg;
}

/* bwd: for the op profile's direction column. */
static void add_into(float *y, const float *x, long n, int bwd) {
    int tok = prof_begin("residual_add", "", bwd);
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++)
        y[i] += x[i];
    prof_end(tok);
}

/* dres += the norm's dx: fused by ops that provide backward_acc, else through tmp. */
static void norm_backward_into(const RmsnormOp *op, float *dres, float *tmp, float *dw,
                               const float *dout, const float *x, const float *w, const float *rstd,
                               long N, int D) {
    if (op->backward_acc) {
        op->backward_acc(dres, dw, dout, x, w, rstd, N, D);
        return;
    }
    op->backward(tmp, dw, dout, x, w, rstd, N, D);
    add_into(dres, tmp, N * D, 1);
}

/* MoE block of layer i: a->xn2 -> out (N, D). count: add the routing to the balancing counts
 * and the auxiliary-loss sums (not when backward recomputes the layer). */
static void moe_forward(Qwen3 *m, int i, float *out, int count) {
    const ModelSpec *s = &m->spec;
    const Qwen3LayerParams *p = &m->p.layers[i];
    const Qwen3LayerModules *md = &m->mod.layers[i];
    Qwen3LayerActs *a = &m->a.layers[i];
    Qwen3Acts *A = &m->a;
    int D = s->dim, X = s->num_experts, k = s->top_k, Fm = s->moe_hidden_dim;
    long N = (long)m->B * m->T;
    PROF_OP(&md->router->h, 0,
            md->router->forward(A->router_logits, a->xn2, p->router_gate, N, D, X));
    moe_router_forward(a->probs, a->topk_idx, a->topk_w, A->router_logits, p->expert_bias, N, X, k,
                       s->norm_topk_prob, m->moe_round_robin);
    if (count) {
        moe_count_add(m->moe_counts + (long)i * X, a->topk_idx, N, k);
        if (s->router_aux_loss_coef > 0) {
            moe_count_add(A->aux_counts, a->topk_idx, N, k);
            moe_prob_sum_add(A->aux_psum, a->probs, N, X);
        }
    }
    if (m->ep) {
        PROF_OP(&md->experts->h, 0,
                moe_ep_forward(m->ep, i, md->experts, out, a->xn2, a->topk_idx, a->topk_w,
                               p->experts_w1, p->experts_w3, p->experts_w2, N, k, D, Fm));
        return;
    }
    PROF_OP(&md->experts->h, 0,
            md->experts->forward(out, &a->ex, a->xn2, a->topk_idx, a->topk_w, p->experts_w1,
                                 p->experts_w3, p->experts_w2, N, k, D, Fm, X));
}

/* Backward of the MoE block: A->dres holds d out; d xn2 is written to A->dxn. */
static void moe_backward(Qwen3 *m, int i) {
    const ModelSpec *s = &m->spec;
    const Qwen3LayerParams *p = &m->p.layers[i];
    Qwen3LayerParams *g = &m->g.layers[i];
    const Qwen3LayerModules *md = &m->mod.layers[i];
    Qwen3LayerActs *a = &m->a.layers[i];
    Qwen3Acts *A = &m->a;
    int D = s->dim, X = s->num_experts, k = s->top_k, Fm = s->moe_hidden_dim;
    long N = (long)m->B * m->T;
    /* Under expert parallelism the rank's block of tokens (all of them unless the group spans
     * the tp ranks): the router's backward covers those, so each token's share of the router
     * gradient (and of the auxiliary loss's) is taken on one tp rank only. */
    long t0 = 0, n = N;
    if (m->ep) {
        n = moe_ep_block(m->ep, N, &t0);
        PROF_OP(&md->experts->h, 1,
                moe_ep_backward(m->ep, i, md->experts, A->dxn, A->dgw, g->experts_w1, g->experts_w3,
                                g->experts_w2, A->dres, a->topk_idx, a->topk_w, p->experts_w1,
                                p->experts_w3, p->experts_w2, N, k, D, Fm));
    } else {
        PROF_OP(&md->experts->h, 1,
                md->experts->backward(A->dxn, A->dgw, g->experts_w1, g->experts_w3, g->experts_w2,
                                      &a->ex, A->dres, a->xn2, a->topk_idx, a->topk_w,
                                      p->experts_w1, p->experts_w3, p->experts_w2, N, k, D, Fm, X));
    }
    moe_router_backward(A->router_logits + t0 * X, A->dgw + t0 * k, a->probs + t0 * X,
                        a->topk_idx + t0 * k, s->router_aux_loss_coef > 0 ? A->aux_dprob : NULL, n,
                        X, k, s->norm_topk_prob);
    PROF_OP(&md->router->h, 1,
            md->router->backward(A->dxn + t0 * D, g->router_gate, A->router_logits + t0 * X,
                                 a->xn2 + t0 * D, p->router_gate, n, D, X, 1.0f));
}

/* Layer i: a->x -> out (N, D); count as in moe_forward. */
static void layer_forward(Qwen3 *m, int i, float *out, int count) {
    const ModelSpec *s = &m->spec;
    const Qwen3LayerParams *p = &m->p.layers[i];
    const Qwen3LayerModules *md = &m->mod.layers[i];
    Qwen3LayerActs *a = &m->a.layers[i];
    int B = m->B, T = m->T, D = s->dim, H = s->n_heads, K = s->n_kv_heads, E = s->head_dim;
    long N = (long)B * T, n = local_tokens(m);
    float eps = (float)s->norm_eps;
    const int32_t *doc = m->a.has_doc ? m->a.doc : NULL;

    const Qwen3Bf16Layer *pb = &m->pb.layers[i];
    PROF_OP(&md->attention_norm->h, 0,
            md->attention_norm->forward(a->xn1, a->rstd1, a->x, p->attention_norm, n, D, eps));
    const float *xn1 = sp_gather(m, m->a.xg, a->xn1, n * D);
    linear_fwd(m, md->qkv, a->q, xn1, p->wq, pb->wq, N, D, H * E);
    linear_fwd(m, md->qkv, a->k, xn1, p->wk, pb->wk, N, D, K * E);
    linear_fwd(m, md->qkv, a->v, xn1, p->wv, pb->wv, N, D, K * E);
    lora_fwd(m, i, LORA_WQ, a->q, xn1, N);
    lora_fwd(m, i, LORA_WK, a->k, xn1, N);
    lora_fwd(m, i, LORA_WV, a->v, xn1, N);
    PROF_OP(&md->q_norm->h, 0,
            md->q_norm->forward(a->qn, a->q_rstd, a->q, p->q_norm, N * H, E, eps));
    PROF_OP(&md->k_norm->h, 0,
            md->k_norm->forward(a->kn, a->k_rstd, a->k, p->k_norm, N * K, E, eps));
    PROF_OP(&md->rope->h, 0,
            md->rope->forward(a->qr, a->qn, m->a.positions, N, H, E, &m->rope_freqs));
    PROF_OP(&md->rope->h, 0,
            md->rope->forward(a->kr, a->kn, m->a.positions, N, K, E, &m->rope_freqs));
    PROF_OP(&md->sdpa->h, 0,
            sdpa_bf16(m, md->sdpa)
                ? md->sdpa->forward_bf16(a->att, a->lse, a->qr, a->kr, a->v, doc, B, T, H, K, E,
                                         m->pb.scratch)
                : md->sdpa->forward(a->att, a->lse, a->qr, a->kr, a->v, doc, B, T, H, K, E));
    linear_fwd(m, md->wo, tp_partial(m, a->xmid), a->att, p->wo, pb->wo, N, H * E, D);
    lora_fwd(m, i, LORA_WO, tp_partial(m, a->xmid), a->att, N);
    tp_combine(m, a->xmid, n * D);
    if (md->ffn_norm->forward_add) { /* a kernel fusing the residual add into the norm */
        PROF_OP(&md->ffn_norm->h, 0,
                md->ffn_norm->forward_add(a->xmid, a->xn2, a->rstd2, a->xmid, a->x, p->ffn_norm, n,
                                          D, eps));
    } else {
        add_into(a->xmid, a->x, n * D, 0);
        PROF_OP(&md->ffn_norm->h, 0,
                md->ffn_norm->forward(a->xn2, a->rstd2, a->xmid, p->ffn_norm, n, D, eps));
    }
    const float *xn2 = sp_gather(m, m->a.xg, a->xn2, n * D);
    float *y = tp_partial(m, out);
    const SwigluOp *ff = md->feed_forward;
    if (md->experts) /* never sequence parallel (setup refuses it) */
        moe_forward(m, i, out, count);
    else if (ffn_has_lora(m, i) || (m->base_bf16 && !ff->forward_bf16))
        ffn_lora_forward(m, i, y, xn2, N);
    else if (m->bf16 && ff->forward_bf16)
        PROF_OP(&ff->h, 0,
                ff->forward_bf16(y, a->h1, a->h3, a->g, xn2, pb->w1, pb->w3, pb->w2, m->pb.scratch,
                                 N, D, s->hidden_dim));
    else
        PROF_OP(&ff->h, 0,
                ff->forward(y, a->h1, a->h3, a->g, xn2, p->w1, p->w3, p->w2, m->a.ffn_ws, N, D,
                            s->hidden_dim));
    tp_combine(m, out, n * D);
    add_into(out, a->xmid, n * D, 0);
}

/* AC_SELECTIVE: rebuilds layer i's norm and rope outputs from the kept activations. */
static void layer_recompute_selective(Qwen3 *m, int i) {
    const ModelSpec *s = &m->spec;
    const Qwen3LayerParams *p = &m->p.layers[i];
    const Qwen3LayerModules *md = &m->mod.layers[i];
    Qwen3LayerActs *a = &m->a.layers[i];
    int D = s->dim, H = s->n_heads, K = s->n_kv_heads, E = s->head_dim;
    long N = (long)m->B * m->T, n = local_tokens(m);
    float eps = (float)s->norm_eps;
    PROF_OP(&md->attention_norm->h, 0,
            md->attention_norm->forward(a->xn1, a->rstd1, a->x, p->attention_norm, n, D, eps));
    PROF_OP(&md->q_norm->h, 0,
            md->q_norm->forward(a->qn, a->q_rstd, a->q, p->q_norm, N * H, E, eps));
    PROF_OP(&md->k_norm->h, 0,
            md->k_norm->forward(a->kn, a->k_rstd, a->k, p->k_norm, N * K, E, eps));
    PROF_OP(&md->rope->h, 0,
            md->rope->forward(a->qr, a->qn, m->a.positions, N, H, E, &m->rope_freqs));
    PROF_OP(&md->rope->h, 0,
            md->rope->forward(a->kr, a->kn, m->a.positions, N, K, E, &m->rope_freqs));
    PROF_OP(&md->ffn_norm->h, 0,
            md->ffn_norm->forward(a->xn2, a->rstd2, a->xmid, p->ffn_norm, n, D, eps));
}

/* Layer i backward: m->a.dres holds d out on entry and d x on exit. */
static void layer_backward(Qwen3 *m, int i) {
    const ModelSpec *s = &m->spec;
    const Qwen3LayerParams *p = &m->p.layers[i];
    Qwen3LayerParams *g = &m->g.layers[i];
    const Qwen3LayerModules *md = &m->mod.layers[i];
    const Qwen3LayerActs *a = &m->a.layers[i];
    Qwen3Acts *A = &m->a;
    int B = m->B, T = m->T, D = s->dim, H = s->n_heads, K = s->n_kv_heads, E = s->head_dim;
    int F = s->hidden_dim;
    long N = (long)B * T, n = local_tokens(m);
    const int32_t *doc = A->has_doc ? A->doc : NULL;

    const Qwen3Bf16Layer *pb = &m->pb.layers[i];
    const SwigluOp *ff = md->feed_forward;
    /* Sequence parallel: the FFN's input is gathered again (only the rank's tokens were kept)
     * and so is the gradient of its output. */
    const float *xn2 = sp_gather(m, A->xg, a->xn2, n * D);
    const float *dout = sp_gather(m, A->yg, A->dres, n * D);
    if (md->experts)
        moe_backward(m, i);
    else if (ffn_has_lora(m, i) || (m->base_bf16 && !ff->forward_bf16))
        ffn_lora_backward(m, i, dout, xn2, N);
    else if (m->bf16 && ff->backward_bf16)
        PROF_OP(&ff->h, 1,
                ff->backward_bf16(A->dxn, g->w1, g->w3, g->w2, A->dh1, A->dh3, dout, xn2, a->h1,
                                  a->h3, a->g, pb->w1, pb->w3, pb->w2, m->pb.scratch, N, D, F));
    else
        PROF_OP(&ff->h, 1,
                ff->backward(A->dxn, g->w1, g->w3, g->w2, A->dh1, A->dh3, dout, xn2, a->h1, a->h3,
                             a->g, p->w1, p->w3, p->w2, A->ffn_ws, N, D, F));
    const float *dxn = tp_combine_grad(m, A->dxn, n * D);
    PROF_OP(&md->ffn_norm->h, 1,
            norm_backward_into(md->ffn_norm, A->dres, A->dtmp, g->ffn_norm, dxn, a->xmid,
                               p->ffn_norm, a->rstd2, n, D)); /* dres = d xmid */

    dout = sp_gather(m, A->yg, A->dres, n * D);
    linear_bwd(m, md->wo, A->datt, g->wo, dout, a->att, p->wo, pb->wo, N, H * E, D, 0.0f);
    lora_bwd(m, i, LORA_WO, A->datt, dout, a->att, N);
    PROF_OP(&md->sdpa->h, 1,
            sdpa_bf16(m, md->sdpa)
                ? md->sdpa->backward_bf16(A->dqr, A->dkr, A->dv, A->datt, a->qr, a->kr, a->v,
                                          a->att, a->lse, doc, B, T, H, K, E, m->pb.scratch)
                : md->sdpa->backward(A->dqr, A->dkr, A->dv, A->datt, a->qr, a->kr, a->v, a->att,
                                     a->lse, doc, B, T, H, K, E));
    PROF_OP(&md->rope->h, 1,
            md->rope->backward(A->dqn, A->dqr, A->positions, N, H, E, &m->rope_freqs));
    PROF_OP(&md->rope->h, 1,
            md->rope->backward(A->dkn, A->dkr, A->positions, N, K, E, &m->rope_freqs));
    PROF_OP(&md->q_norm->h, 1,
            md->q_norm->backward(A->dq, g->q_norm, A->dqn, a->q, p->q_norm, a->q_rstd, N * H, E));
    PROF_OP(&md->k_norm->h, 1,
            md->k_norm->backward(A->dk, g->k_norm, A->dkn, a->k, p->k_norm, a->k_rstd, N * K, E));
    const float *xn1 = sp_gather(m, A->xg, a->xn1, n * D);
    linear_bwd(m, md->qkv, A->dxn, g->wq, A->dq, xn1, p->wq, pb->wq, N, D, H * E, 0.0f);
    linear_bwd(m, md->qkv, A->dxn, g->wk, A->dk, xn1, p->wk, pb->wk, N, D, K * E, 1.0f);
    linear_bwd(m, md->qkv, A->dxn, g->wv, A->dv, xn1, p->wv, pb->wv, N, D, K * E, 1.0f);
    lora_bwd(m, i, LORA_WQ, A->dxn, A->dq, xn1, N);
    lora_bwd(m, i, LORA_WK, A->dxn, A->dk, xn1, N);
    lora_bwd(m, i, LORA_WV, A->dxn, A->dv, xn1, N);
    dxn = tp_combine_grad(m, A->dxn, n * D);
    PROF_OP(&md->attention_norm->h, 1,
            norm_backward_into(md->attention_norm, A->dres, A->dtmp, g->attention_norm, dxn, a->x,
                               p->attention_norm, a->rstd1, n, D)); /* dres = d x */
}

float qwen3_forward(Qwen3 *m, const int32_t *tokens, const int32_t *targets,
                    const int32_t *positions, const int32_t *doc, int B, int T) {
    const ModelSpec *s = &m->spec;
    Qwen3Acts *a = &m->a;
    long N = (long)B * T;
    if (B < 1 || T < 1 || N > (long)m->max_B * m->max_T || N % m->sp != 0) {
        /* The activation arena was sized for max_B x max_T (split over sp ranks); more, or
         * tokens that do not split, is a caller's bug. */
        fprintf(stderr, "internal error: qwen3_forward on %d x %d tokens, sized for %d x %d\n", B,
                T, m->max_B, m->max_T);
        abort();
    }
    m->B = B;
    m->T = T;
    int D = s->dim, V = s->vocab_size;
    memcpy(a->tokens, tokens, (size_t)N * sizeof(int32_t));
    for (long n = 0; n < N; n++) {
        a->targets[n] = targets ? targets[n] : CE_IGNORE;
        a->positions[n] = positions ? positions[n] : (int32_t)(n % T);
        a->doc[n] = doc ? doc[n] : 0;
    }
    a->has_doc = doc != NULL;

    if (m->n_moe_layers && s->router_aux_loss_coef > 0) {
        memset(a->aux_counts, 0, (size_t)s->num_experts * sizeof(double));
        memset(a->aux_psum, 0, (size_t)s->num_experts * sizeof(double));
    }
    if (casts_weights(m) && !m->bf16_kept) PROF_STEP("bf16 weight cast", cast_weights_bf16(m));
    const Qwen3Modules *md = &m->mod;
    int L = s->n_layers;
    /* The embedding, the final norm and the loss run on the rank's tokens (all without
     * sequence parallelism). */
    long n = local_tokens(m), t0 = first_token(m);
    hook(m, 0, QWEN3_PRE_FORWARD);
    if (m->base_bf16) /* the rows of the bf16 table, widened (the op reads fp32 tables) */
        for (long j = 0; j < n; j++)
            simd_bf16_to_f32(a->layers[0].x + j * D,
                             m->pb.tok_embeddings + (long)a->tokens[t0 + j] * D, D);
    else
        PROF_OP(
            &md->tok_embeddings->h, 0,
            md->tok_embeddings->forward(a->layers[0].x, a->tokens + t0, m->p.tok_embeddings, n, D));
    hook(m, 0, QWEN3_POST_FORWARD);
    for (int i = 0; i < L; i++) {
        hook(m, 1 + i, QWEN3_PRE_FORWARD);
        layer_forward(m, i, i + 1 < L ? a->layers[i + 1].x : a->h, 1);
        hook(m, 1 + i, QWEN3_POST_FORWARD);
    }
    hook(m, L + 1, QWEN3_PRE_FORWARD);
    PROF_OP(&md->norm->h, 0,
            md->norm->forward(a->hn, a->rstdf, a->h, m->p.norm, n, D, (float)s->norm_eps));
    m->n_valid = 0;
    const int32_t *tg = a->targets + t0;
    const uint16_t *wb = m->bf16 ? m->pb.output : NULL;
    m->loss_done = 0;
    if (md->loss == &lm_head_loss_reference && amx_head(m, targets ? tg : NULL, wb, n)) {
        PROF_OP(&md->loss->h, 0,
                m->loss_sum = loss_amx_fused(a->losses, a->ce_lse, a->dxn, m->g.output, a->logits,
                                             a->hn, wb, m->pb.scratch, tg, n, (int)D, (int)V,
                                             (float)(1.0 / m->fuse_divisor)));
        m->loss_done = 1;
    } else if (md->loss == &lm_head_loss_reference) {
        /* The reference output op, scheduled here so lm_head can take the bf16 path and the
         * cross-entropy the module set's implementation (md->ce). */
        linear_fwd(m, md->lm_head, a->logits, a->hn, m->p.output, m->pb.output, n, D, V);
        m->loss_sum = 0.0;
        if (targets)
            PROF_OP(&md->ce->h, 0,
                    m->loss_sum = md->ce->forward(a->losses, a->ce_lse, a->logits, tg, n, V));
    } else if (targets && m->fuse_divisor > 0 && md->loss->forward_backward && !m->dist.unit) {
        /* Gradients are plain buffers without FSDP hooks, so lm_head's can fill now; dxn is
         * not touched again before backward reads it. */
        PROF_OP(&md->loss->h, 0,
                m->loss_sum = md->loss->forward_backward(
                    a->losses, a->ce_lse, a->dxn, m->g.output, a->logits, a->hn, m->p.output, wb,
                    m->pb.scratch, tg, md->lm_head, n, D, V, (float)(1.0 / m->fuse_divisor)));
        m->loss_done = 1;
    } else {
        PROF_OP(&md->loss->h, 0,
                m->loss_sum =
                    md->loss->forward(a->losses, a->ce_lse, a->logits, a->hn, m->p.output, wb,
                                      m->pb.scratch, targets ? tg : NULL, md->lm_head, n, D, V));
    }
    if (targets)
        for (long j = 0; j < n; j++)
            m->n_valid += tg[j] != CE_IGNORE;
    m->aux_loss = 0.0;
    double rows = (double)N * m->n_moe_layers;
    if (m->n_moe_layers && s->router_aux_loss_coef > 0)
        m->aux_loss = moe_aux_loss(a->aux_counts, a->aux_psum, rows, s->num_experts);
    hook(m, L + 1, QWEN3_POST_FORWARD);
    double ce = m->n_valid ? m->loss_sum / m->n_valid : 0.0;
    return (float)(ce + s->router_aux_loss_coef * m->aux_loss);
}

float qwen3_forward_backward(Qwen3 *m, const int32_t *tokens, const int32_t *targets,
                             const int32_t *positions, const int32_t *doc, int B, int T,
                             double divisor) {
    m->fuse_divisor = divisor;
    float loss = qwen3_forward(m, tokens, targets, positions, doc, B, T);
    m->fuse_divisor = 0.0;
    qwen3_backward(m, divisor);
    return loss;
}

void qwen3_backward(Qwen3 *m, double divisor) {
    const ModelSpec *s = &m->spec;
    Qwen3Acts *a = &m->a;
    long N = (long)m->B * m->T, n = local_tokens(m), t0 = first_token(m);
    int D = s->dim, V = s->vocab_size;
    if (divisor <= 0) divisor = m->n_valid > 0 ? (double)m->n_valid : 1.0;
    if (m->n_moe_layers && s->router_aux_loss_coef > 0)
        moe_aux_dprob(a->aux_dprob, a->aux_counts, (double)N * m->n_moe_layers, s->num_experts,
                      s->router_aux_loss_coef * m->aux_weight);
    hook(m, s->n_layers + 1, QWEN3_PRE_BACKWARD);
    const Qwen3Modules *md = &m->mod;
    if (m->loss_done) {
        /* the fused step wrote dxn and the output's gradient in the forward */
    } else if (md->loss == &lm_head_loss_reference) {
        /* dlogits overwrite the logits in place. */
        PROF_OP(&md->ce->h, 1,
                md->ce->backward(a->logits, a->logits, a->ce_lse, a->targets + t0, n, V,
                                 (float)(1.0 / divisor)));
        linear_bwd(m, md->lm_head, a->dxn, m->g.output, a->logits, a->hn, m->p.output, m->pb.output,
                   n, D, V, 0.0f);
    } else {
        PROF_OP(&md->loss->h, 1,
                md->loss->backward(a->dxn, m->g.output, a->logits, a->hn, m->p.output,
                                   m->bf16 ? m->pb.output : NULL, m->pb.scratch, a->targets + t0,
                                   a->ce_lse, md->lm_head, n, D, V, (float)(1.0 / divisor)));
    }
    PROF_OP(&md->norm->h, 1,
            md->norm->backward(a->dres, m->g.norm, a->dxn, a->h, m->p.norm, a->rstdf, n, D));
    hook(m, s->n_layers + 1, QWEN3_POST_BACKWARD);
    int last_shared = -1;
    for (int i = 0; i < s->n_layers; i++)
        if (ac_layer_mode(m->ac, i) != AC_NONE) last_shared = i;
    for (int i = s->n_layers - 1; i >= 0; i--) {
        hook(m, 1 + i, QWEN3_PRE_BACKWARD);
        /* The shared buffers still hold the forward values of the last layer that used
         * them (ac_recomputed_layers counts the others). */
        AcMode lm = ac_layer_mode(m->ac, i);
        int again = lm != AC_NONE && i < last_shared;
        if (again && lm == AC_FULL) {
            /* Recompute layer i from its kept input; the output is already in
             * layers[i + 1].x, so write it to a scratch that is free now. */
            layer_forward(m, i, a->dtmp, 0);
        } else if (again && lm == AC_SELECTIVE) {
            layer_recompute_selective(m, i);
        }
        layer_backward(m, i);
        hook(m, 1 + i, QWEN3_POST_BACKWARD);
    }
    hook(m, 0, QWEN3_PRE_BACKWARD);
    if (m->g.tok_embeddings) /* NULL: a frozen table (ops/op.h) */
        PROF_OP(&md->tok_embeddings->h, 1,
                md->tok_embeddings->backward(m->g.tok_embeddings, a->dres, a->tokens + t0, n, D));
    hook(m, 0, QWEN3_POST_BACKWARD);
}

/* ---- sizing without allocating ---- */

int qwen3_sizes(Qwen3Sizes *out, const ModelSpec *spec, int B, int T, AcMode ac, int sp,
                const Qwen3Modules *impl, Err *err) {
    memset(out, 0, sizeof *out);
    /* The same checks, module tree and layout functions create runs, on counting arenas
     * only: no table, no slots, no memory. */
    Qwen3 *m = xcalloc(1, sizeof *m);
    if (setup(m, spec, B, T, ac, sp, err) != 0) {
        free(m);
        return -1;
    }
    build_modules(m, impl); /* before the activations: the loss op sizes its workspace */
    out->products_bf16 = qwen3_products_bf16(m);
    Arena pc, gc, acnt, kcnt;
    arena_init_counting(&pc, "parameter");
    arena_init_counting(&gc, "gradient");
    arena_init_counting(&acnt, "activation");
    arena_init_counting(&kcnt, "kernel scratch");
    layout_params(m, &pc, &gc);
    layout_acts(m, &acnt, &kcnt);
    /* arena_init rounds a block up to the 64-byte alignment. */
    out->param_bytes = (pc.used + 63) / 64 * 64;
    out->grad_bytes = (gc.used + 63) / 64 * 64;
    /* the kernel scratch counts as activation memory for the plan */
    out->act_bytes = (acnt.used + 63) / 64 * 64 + (kcnt.used + 63) / 64 * 64;
    out->nparams = m->nparams;
    size_t wbytes;
    for (int widened = 0; widened < 2; widened++) { /* as qwen3_enable_bf16 lays it out */
        Arena bc;
        arena_init_counting(&bc, "bf16 weight");
        m->bf16_widened = widened;
        layout_bf16(m, &bc, 1, &wbytes);
        out->bf16_bytes[widened] = (bc.used + 63) / 64 * 64;
    }
    m->bf16_widened = 0;
    Arena pk;
    arena_init_counting(&pk, "bf16 weight");
    m->bf16_packed = 1;
    layout_bf16(m, &pk, 1, &wbytes);
    m->bf16_packed = 0;
    out->bf16_pack_bytes = (pk.used + 63) / 64 * 64 - out->bf16_bytes[0];
    /* The same two arenas of a bf16 base. */
    m->base_bf16 = 1;
    Arena pb16, gb16, bb16;
    arena_init_counting(&pb16, "parameter");
    arena_init_counting(&gb16, "gradient");
    arena_init_counting(&bb16, "bf16 weight");
    layout_params(m, &pb16, &gb16);
    layout_bf16(m, &bb16, 1, &wbytes);
    out->base_bf16_param_bytes = (pb16.used + 63) / 64 * 64;
    out->base_bf16_bytes = (bb16.used + 63) / 64 * 64;
    /* The matmul scratch alone: what qwen3_enable_bf16_by_hook allocates (a sharded model). */
    Arena sc;
    arena_init_counting(&sc, "bf16 weight");
    layout_bf16(m, &sc, 0, &wbytes);
    out->bf16_scratch_bytes = (sc.used + 63) / 64 * 64;
    free(m);
    return 0;
}
