/* The rows of the Qwen3 parameter table; see param_table.h. */
#include "core/param_table.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define L "layers.%d."
#define HL "model.layers.%d."

/* Two lines a row: kind, qtitan name, HF name, HF order; then role, scope, shape, tensor-parallel
 * split, weight-decay group, init. L is a layer's qtitan prefix, HL its HF prefix. HF order within
 * a layer is transformers' registration order (self_attn, mlp, then the two norms), which is the
 * order save_pretrained writes; experts interleave per expert (gate, up, down of expert 0, then of
 * expert 1, ...). */
// clang-format off
const ParamKind PARAM_KINDS[PK_COUNT] = {
    {PK_TOK_EMBEDDINGS, "tok_embeddings.weight",     "model.embed_tokens.weight",          0,
     ROLE_EMBEDDING, SCOPE_MODEL,    "V, D",     TP_REPLICATED, DECAY_EMBEDDINGS, INIT_NORMAL},
    {PK_ATTENTION_NORM, L "attention_norm.weight",   HL "input_layernorm.weight",          10,
     ROLE_NORM,      SCOPE_LAYER,    "D",        TP_REPLICATED, DECAY_NORMS,      INIT_ONES},
    {PK_WQ,             L "attention.wq.weight",     HL "self_attn.q_proj.weight",         0,
     ROLE_LINEAR,    SCOPE_LAYER,    "H*E, D",   TP_ROWS,       DECAY_ALWAYS,     INIT_NORMAL},
    {PK_WK,             L "attention.wk.weight",     HL "self_attn.k_proj.weight",         1,
     ROLE_LINEAR,    SCOPE_LAYER,    "K*E, D",   TP_ROWS,       DECAY_ALWAYS,     INIT_NORMAL},
    {PK_WV,             L "attention.wv.weight",     HL "self_attn.v_proj.weight",         2,
     ROLE_LINEAR,    SCOPE_LAYER,    "K*E, D",   TP_ROWS,       DECAY_ALWAYS,     INIT_NORMAL},
    {PK_WO,             L "attention.wo.weight",     HL "self_attn.o_proj.weight",         3,
     ROLE_LINEAR,    SCOPE_LAYER,    "D, H*E",   TP_COLS,       DECAY_ALWAYS,     INIT_RESIDUAL},
    {PK_Q_NORM,         L "attention.q_norm.weight", HL "self_attn.q_norm.weight",         4,
     ROLE_NORM,      SCOPE_LAYER,    "E",        TP_REPLICATED, DECAY_NORMS,      INIT_ONES},
    {PK_K_NORM,         L "attention.k_norm.weight", HL "self_attn.k_norm.weight",         5,
     ROLE_NORM,      SCOPE_LAYER,    "E",        TP_REPLICATED, DECAY_NORMS,      INIT_ONES},
    {PK_FFN_NORM,       L "ffn_norm.weight",         HL "post_attention_layernorm.weight", 11,
     ROLE_NORM,      SCOPE_LAYER,    "D",        TP_REPLICATED, DECAY_NORMS,      INIT_ONES},
    {PK_ROUTER_GATE,    L "moe.router.gate.weight",  HL "mlp.gate.weight",                 6,
     ROLE_ROUTER,    SCOPE_MOE,      "X, D",     TP_REPLICATED, DECAY_ALWAYS,     INIT_NORMAL},
    {PK_EXPERTS_W1,     L "moe.experts.w1",          HL "mlp.experts.%d.gate_proj.weight", 7,
     ROLE_EXPERTS,   SCOPE_MOE,      "Xl, Fm, D", TP_REPLICATED, DECAY_ALWAYS,     INIT_NORMAL},
    {PK_EXPERTS_W2,     L "moe.experts.w2",          HL "mlp.experts.%d.down_proj.weight", 9,
     ROLE_EXPERTS,   SCOPE_MOE,      "Xl, D, Fm", TP_REPLICATED, DECAY_ALWAYS,     INIT_RESIDUAL},
    {PK_EXPERTS_W3,     L "moe.experts.w3",          HL "mlp.experts.%d.up_proj.weight",   8,
     ROLE_EXPERTS,   SCOPE_MOE,      "Xl, Fm, D", TP_REPLICATED, DECAY_ALWAYS,     INIT_NORMAL},
    {PK_EXPERT_BIAS,    L "moe.expert_bias",         NULL,                                 0,
     ROLE_BUFFER,    SCOPE_BALANCED, "X",        TP_REPLICATED, DECAY_NEVER,      INIT_ZEROS},
    {PK_W1,             L "feed_forward.w1.weight",  HL "mlp.gate_proj.weight",            7,
     ROLE_LINEAR,    SCOPE_DENSE,    "F, D",     TP_ROWS,       DECAY_ALWAYS,     INIT_NORMAL},
    {PK_W3,             L "feed_forward.w3.weight",  HL "mlp.up_proj.weight",              8,
     ROLE_LINEAR,    SCOPE_DENSE,    "F, D",     TP_ROWS,       DECAY_ALWAYS,     INIT_NORMAL},
    {PK_W2,             L "feed_forward.w2.weight",  HL "mlp.down_proj.weight",            9,
     ROLE_LINEAR,    SCOPE_DENSE,    "D, F",     TP_COLS,       DECAY_ALWAYS,     INIT_NORMAL},
    {PK_NORM,           "norm.weight",               "model.norm.weight",                  0,
     ROLE_NORM,      SCOPE_MODEL,    "D",        TP_REPLICATED, DECAY_NORMS,      INIT_ONES},
    {PK_OUTPUT,         "output.weight",             "lm_head.weight",                     0,
     ROLE_LINEAR,    SCOPE_UNTIED,   "V, D",     TP_REPLICATED, DECAY_ALWAYS,     INIT_NORMAL},
};
// clang-format on

/* The size of one dimension written in the spec's letters. */
static int64_t dim_of(const ModelSpec *s, const char *letters, size_t n) {
    static const char *const names[] = {"V", "D", "H*E", "K*E", "E", "F", "X", "Fm", "Xl"};
    const int64_t sizes[] = {s->vocab_size,
                             s->dim,
                             (int64_t)s->n_heads * s->head_dim,
                             (int64_t)s->n_kv_heads * s->head_dim,
                             s->head_dim,
                             s->hidden_dim,
                             s->num_experts,
                             s->moe_hidden_dim,
                             s->num_local_experts > 0 ? s->num_local_experts : s->num_experts};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strlen(names[i]) == n && strncmp(names[i], letters, n) == 0) return sizes[i];
    /* The rows are constants; test_param_table places every row, so this cannot be reached. */
    fprintf(stderr, "param_table: unknown dimension \"%.*s\"\n", (int)n, letters);
    abort();
}

static int is_layer_scope(ParamScope s) {
    return s != SCOPE_MODEL && s != SCOPE_UNTIED;
}

static int present(const ModelSpec *s, const ParamKind *k, int layer) {
    switch (k->scope) {
    case SCOPE_MODEL:
        return 1;
    case SCOPE_UNTIED:
        return !s->tie_embeddings;
    case SCOPE_LAYER:
        return 1;
    case SCOPE_DENSE:
        return !model_spec_layer_is_moe(s, layer);
    case SCOPE_MOE:
        return model_spec_layer_is_moe(s, layer);
    case SCOPE_BALANCED:
        return model_spec_layer_is_moe(s, layer) && s->load_balance_coeff > 0;
    }
    return 0;
}

static void place(ParamInfo *p, const ModelSpec *s, const ParamKind *k, int layer) {
    memset(p, 0, sizeof *p);
    /* Model-scope names have no "%d"; the extra argument is then ignored. */
    snprintf(p->name, sizeof p->name, k->name, layer);
    p->kind = k;
    p->layer = layer;
    p->numel = 1;
    for (const char *at = k->shape; *at; p->ndim++) {
        size_t n = strcspn(at, ",");
        p->shape[p->ndim] = dim_of(s, at, n);
        p->numel *= p->shape[p->ndim];
        at += n;
        at += strspn(at, ", ");
    }
}

int param_place(const ModelSpec *s, ParamKindId id, int layer, ParamInfo *out) {
    const ParamKind *k = &PARAM_KINDS[id];
    if (!present(s, k, is_layer_scope(k->scope) ? layer : -1)) return 0;
    place(out, s, k, is_layer_scope(k->scope) ? layer : -1);
    return 1;
}

int param_list(const ModelSpec *s, ParamInfo *out) {
    int n = 0, layers_done = 0;
    for (int r = 0; r < PK_COUNT; r++) {
        const ParamKind *k = &PARAM_KINDS[r];
        if (!is_layer_scope(k->scope)) {
            if (present(s, k, -1) && out) place(&out[n], s, k, -1);
            n += present(s, k, -1);
            continue;
        }
        if (layers_done) continue;
        layers_done = 1; /* all layer rows are adjacent: place every layer at the first one */
        for (int i = 0; i < s->n_layers; i++)
            for (int lr = r; lr < PK_COUNT && is_layer_scope(PARAM_KINDS[lr].scope); lr++) {
                if (!present(s, &PARAM_KINDS[lr], i)) continue;
                if (out) place(&out[n], s, &PARAM_KINDS[lr], i);
                n++;
            }
    }
    return n;
}

const ParamKind *param_kind_of_name(const char *name, int *layer) {
    int li = -1;
    const char *rest = name;
    if (strncmp(name, "layers.", 7) == 0) {
        char *end;
        long v = strtol(name + 7, &end, 10);
        if (end == name + 7 || *end != '.' || v < 0 || v >= QT_MAX_LAYERS) return NULL;
        li = (int)v;
        rest = end + 1;
    }
    for (int r = 0; r < PK_COUNT; r++) {
        const ParamKind *k = &PARAM_KINDS[r];
        if (is_layer_scope(k->scope) != (li >= 0)) continue;
        if (strcmp(li >= 0 ? k->name + strlen(L) : k->name, rest) != 0) continue;
        /* Exactly the name the table gives (no "layers.03." or "layers.+3."). */
        char full[PARAM_NAME_MAX];
        snprintf(full, sizeof full, k->name, li);
        if (strcmp(full, name) != 0) return NULL;
        if (layer) *layer = li;
        return k;
    }
    return NULL;
}

int param_decays(const ParamKind *k, int exempt_norms, int exempt_embeddings) {
    switch (k->decay) {
    case DECAY_ALWAYS:
        return 1;
    case DECAY_NORMS:
        return !exempt_norms;
    case DECAY_EMBEDDINGS:
        return !exempt_embeddings;
    case DECAY_NEVER:
        return 0;
    }
    return 1;
}

TpSplit tp_split_of(const char *name) {
    const ParamKind *k = param_kind_of_name(name, NULL);
    return k ? k->tp : TP_REPLICATED;
}
