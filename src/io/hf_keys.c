/* qtitan parameter table and its mapping to HF Qwen3 / Qwen3-MoE keys; see hf_keys.h. */
#include "io/hf_keys.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct Builder {
    HfKeyTable *t;
    int pcap, hcap;
} Builder;

static int add_param(Builder *b, QtParamKind kind, int layer, const char *name, int ndim,
                     int64_t d0, int64_t d1, int64_t d2) {
    HfKeyTable *t = b->t;
    if (t->nparams == b->pcap) {
        b->pcap = b->pcap ? 2 * b->pcap : 64;
        t->params = xrealloc(t->params, (size_t)b->pcap * sizeof *t->params);
    }
    QtParam *p = &t->params[t->nparams];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->kind = kind;
    p->layer = layer;
    p->ndim = ndim;
    int64_t d[3] = {d0, d1, d2};
    p->numel = 1;
    for (int i = 0; i < ndim; i++) {
        p->shape[i] = d[i];
        p->numel *= d[i];
    }
    p->exported = kind != PK_EXPERT_BIAS;
    p->no_decay = kind == PK_NORM || kind == PK_EMBEDDING;
    return t->nparams++;
}

static void add_hf(Builder *b, int param, int expert, const char *name, int ndim, int64_t d0,
                   int64_t d1) {
    HfKeyTable *t = b->t;
    if (t->nhf == b->hcap) {
        b->hcap = b->hcap ? 2 * b->hcap : 64;
        t->hf = xrealloc(t->hf, (size_t)b->hcap * sizeof *t->hf);
    }
    HfTensor *h = &t->hf[t->nhf++];
    memset(h, 0, sizeof *h);
    snprintf(h->name, sizeof h->name, "%s", name);
    h->ndim = ndim;
    h->shape[0] = d0;
    h->shape[1] = ndim > 1 ? d1 : 0;
    h->numel = ndim > 1 ? d0 * d1 : d0;
    h->param = param;
    h->expert = expert;
}

static char *fmt(char *buf, const char *f, ...) __attribute__((format(printf, 2, 3)));
static char *fmt(char *buf, const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, HF_KEY_MAX, f, ap);
    va_end(ap);
    return buf;
}

typedef struct NameIdx {
    const char *name;
    int idx;
} NameIdx;

static int cmp_name_idx(const void *a, const void *b) {
    return strcmp(((const NameIdx *)a)->name, ((const NameIdx *)b)->name);
}

/* Indices of n names (each at base + i * stride) in name order. */
static int *sorted_indices(const char *base, size_t stride, int n) {
    NameIdx *v = xmalloc((size_t)(n ? n : 1) * sizeof *v);
    for (int i = 0; i < n; i++)
        v[i] = (NameIdx){base + (size_t)i * stride, i};
    qsort(v, (size_t)n, sizeof *v, cmp_name_idx);
    int *out = xmalloc((size_t)(n ? n : 1) * sizeof *out);
    for (int i = 0; i < n; i++)
        out[i] = v[i].idx;
    free(v);
    return out;
}

void hf_keys_build(HfKeyTable *t, const ModelSpec *s) {
    memset(t, 0, sizeof *t);
    Builder b = {.t = t};
    const int64_t D = s->dim, H = s->n_heads, K = s->n_kv_heads, E = s->head_dim, V = s->vocab_size,
                  X = s->num_experts;
    t->tied = s->tie_embeddings;
    t->vocab = V;
    t->dim = D;
    char q[HF_KEY_MAX], h[HF_KEY_MAX];
    int p = add_param(&b, PK_EMBEDDING, -1, "tok_embeddings.weight", 2, V, D, 0);
    add_hf(&b, p, -1, "model.embed_tokens.weight", 2, V, D);
    for (int i = 0; i < s->n_layers; i++) {
        /* Parameters in forward order; HF tensors in transformers' registration order
         * (self_attn, mlp, then the two norms), which is its save order. */
        int an =
            add_param(&b, PK_NORM, i, fmt(q, "layers.%d.attention_norm.weight", i), 1, D, 0, 0);
        int wq =
            add_param(&b, PK_LINEAR, i, fmt(q, "layers.%d.attention.wq.weight", i), 2, H * E, D, 0);
        int wk =
            add_param(&b, PK_LINEAR, i, fmt(q, "layers.%d.attention.wk.weight", i), 2, K * E, D, 0);
        int wv =
            add_param(&b, PK_LINEAR, i, fmt(q, "layers.%d.attention.wv.weight", i), 2, K * E, D, 0);
        int qn =
            add_param(&b, PK_NORM, i, fmt(q, "layers.%d.attention.q_norm.weight", i), 1, E, 0, 0);
        int kn =
            add_param(&b, PK_NORM, i, fmt(q, "layers.%d.attention.k_norm.weight", i), 1, E, 0, 0);
        int wo =
            add_param(&b, PK_LINEAR, i, fmt(q, "layers.%d.attention.wo.weight", i), 2, D, H * E, 0);
        t->params[wo].residual_out = 1;
        int fn = add_param(&b, PK_NORM, i, fmt(q, "layers.%d.ffn_norm.weight", i), 1, D, 0, 0);
        add_hf(&b, wq, -1, fmt(h, "model.layers.%d.self_attn.q_proj.weight", i), 2, H * E, D);
        add_hf(&b, wk, -1, fmt(h, "model.layers.%d.self_attn.k_proj.weight", i), 2, K * E, D);
        add_hf(&b, wv, -1, fmt(h, "model.layers.%d.self_attn.v_proj.weight", i), 2, K * E, D);
        add_hf(&b, wo, -1, fmt(h, "model.layers.%d.self_attn.o_proj.weight", i), 2, D, H * E);
        add_hf(&b, qn, -1, fmt(h, "model.layers.%d.self_attn.q_norm.weight", i), 1, E, 0);
        add_hf(&b, kn, -1, fmt(h, "model.layers.%d.self_attn.k_norm.weight", i), 1, E, 0);
        if (model_spec_layer_is_moe(s, i)) {
            const int64_t F = s->moe_hidden_dim;
            int rg = add_param(&b, PK_ROUTER, i, fmt(q, "layers.%d.moe.router.gate.weight", i), 2,
                               X, D, 0);
            int w1 =
                add_param(&b, PK_EXPERTS, i, fmt(q, "layers.%d.moe.experts.w1", i), 3, X, F, D);
            int w3 =
                add_param(&b, PK_EXPERTS, i, fmt(q, "layers.%d.moe.experts.w3", i), 3, X, F, D);
            int w2 =
                add_param(&b, PK_EXPERTS, i, fmt(q, "layers.%d.moe.experts.w2", i), 3, X, D, F);
            t->params[w2].residual_out = 1;
            if (s->load_balance_coeff > 0)
                add_param(&b, PK_EXPERT_BIAS, i, fmt(q, "layers.%d.moe.expert_bias", i), 1, X, 0,
                          0);
            add_hf(&b, rg, -1, fmt(h, "model.layers.%d.mlp.gate.weight", i), 2, X, D);
            for (int e = 0; e < X; e++) {
                add_hf(&b, w1, e, fmt(h, "model.layers.%d.mlp.experts.%d.gate_proj.weight", i, e),
                       2, F, D);
                add_hf(&b, w3, e, fmt(h, "model.layers.%d.mlp.experts.%d.up_proj.weight", i, e), 2,
                       F, D);
                add_hf(&b, w2, e, fmt(h, "model.layers.%d.mlp.experts.%d.down_proj.weight", i, e),
                       2, D, F);
            }
        } else {
            const int64_t F = s->hidden_dim;
            int w1 = add_param(&b, PK_LINEAR, i, fmt(q, "layers.%d.feed_forward.w1.weight", i), 2,
                               F, D, 0);
            int w3 = add_param(&b, PK_LINEAR, i, fmt(q, "layers.%d.feed_forward.w3.weight", i), 2,
                               F, D, 0);
            int w2 = add_param(&b, PK_LINEAR, i, fmt(q, "layers.%d.feed_forward.w2.weight", i), 2,
                               D, F, 0);
            t->params[w2].residual_out = 1;
            add_hf(&b, w1, -1, fmt(h, "model.layers.%d.mlp.gate_proj.weight", i), 2, F, D);
            add_hf(&b, w3, -1, fmt(h, "model.layers.%d.mlp.up_proj.weight", i), 2, F, D);
            add_hf(&b, w2, -1, fmt(h, "model.layers.%d.mlp.down_proj.weight", i), 2, D, F);
        }
        add_hf(&b, an, -1, fmt(h, "model.layers.%d.input_layernorm.weight", i), 1, D, 0);
        add_hf(&b, fn, -1, fmt(h, "model.layers.%d.post_attention_layernorm.weight", i), 1, D, 0);
    }
    p = add_param(&b, PK_NORM, -1, "norm.weight", 1, D, 0, 0);
    add_hf(&b, p, -1, "model.norm.weight", 1, D, 0);
    if (!s->tie_embeddings) {
        p = add_param(&b, PK_LINEAR, -1, "output.weight", 2, V, D, 0);
        add_hf(&b, p, -1, "lm_head.weight", 2, V, D);
    }
    t->param_by_name = sorted_indices(t->params[0].name, sizeof *t->params, t->nparams);
    t->hf_by_name = sorted_indices(t->hf[0].name, sizeof *t->hf, t->nhf);
}

void hf_keys_free(HfKeyTable *t) {
    free(t->params);
    free(t->hf);
    free(t->param_by_name);
    free(t->hf_by_name);
    memset(t, 0, sizeof *t);
}

int hf_keys_find_param(const HfKeyTable *t, const char *name) {
    int lo = 0, hi = t->nparams - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(t->params[t->param_by_name[mid]].name, name);
        if (c == 0) return t->param_by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

int hf_keys_find_hf(const HfKeyTable *t, const char *name) {
    int lo = 0, hi = t->nhf - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(t->hf[t->hf_by_name[mid]].name, name);
        if (c == 0) return t->hf_by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

static void shape_str(char *out, size_t cap, const int64_t *shape, int ndim) {
    size_t k = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < ndim && k < cap; i++)
        k += (size_t)snprintf(out + k, cap - k, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (k < cap) snprintf(out + k, cap - k, "]");
}

static int same_shape(const HfTensor *h, const StTensor *st) {
    if (st->ndim != h->ndim) return 0;
    for (int i = 0; i < h->ndim; i++)
        if (st->shape[i] != h->shape[i]) return 0;
    return 1;
}

static int float_dtype(DType d) {
    return d == DT_F32 || d == DT_BF16 || d == DT_F16;
}

static void push(char ***list, int *n, const char *f, ...) __attribute__((format(printf, 3, 4)));
static void push(char ***list, int *n, const char *f, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, sizeof buf, f, ap);
    va_end(ap);
    *list = xrealloc(*list, (size_t)(*n + 1) * sizeof **list);
    (*list)[(*n)++] = xstrdup(buf);
}

int hf_keys_check(HfCheck *out, const HfKeyTable *t, const StSet *set) {
    memset(out, 0, sizeof *out);
    char a[128], b[128];
    for (int i = 0; i < t->nhf; i++) {
        const HfTensor *h = &t->hf[i];
        const StTensor *st = st_set_find(set, h->name);
        shape_str(a, sizeof a, h->shape, h->ndim);
        if (!st) {
            push(&out->missing, &out->nmissing, "%s (expected %s)", h->name, a);
        } else if (!same_shape(h, st)) {
            shape_str(b, sizeof b, st->shape, st->ndim);
            push(&out->wrong, &out->nwrong, "%s: shape %s, expected %s", h->name, b, a);
        } else if (!float_dtype(st->dtype)) {
            push(&out->wrong, &out->nwrong, "%s: dtype %s, expected F32, BF16 or F16", h->name,
                 dtype_name(st->dtype));
        }
    }
    for (int f = 0; f < set->nfiles; f++)
        for (int i = 0; i < set->files[f].n; i++) {
            const StTensor *st = &set->files[f].tensors[i];
            if (hf_keys_find_hf(t, st->name) >= 0) continue;
            shape_str(b, sizeof b, st->shape, st->ndim);
            if (t->tied && strcmp(st->name, "lm_head.weight") == 0) {
                int64_t want[2] = {t->vocab, t->dim};
                if (st->ndim != 2 || st->shape[0] != want[0] || st->shape[1] != want[1]) {
                    shape_str(a, sizeof a, want, 2);
                    push(&out->wrong, &out->nwrong,
                         "%s: shape %s, expected %s (ignored when embeddings are tied)", st->name,
                         b, a);
                }
                continue;
            }
            push(&out->unexpected, &out->nunexpected, "%s %s", st->name, b);
        }
    return out->nmissing + out->nunexpected + out->nwrong;
}

void hf_check_free(HfCheck *c) {
    for (int i = 0; i < c->nmissing; i++)
        free(c->missing[i]);
    for (int i = 0; i < c->nunexpected; i++)
        free(c->unexpected[i]);
    for (int i = 0; i < c->nwrong; i++)
        free(c->wrong[i]);
    free(c->missing);
    free(c->unexpected);
    free(c->wrong);
    memset(c, 0, sizeof *c);
}

int hf_keys_load_param(float *dst, const HfKeyTable *t, int p, const StSet *set, Err *err) {
    const QtParam *qp = &t->params[p];
    if (!qp->exported)
        return err_set(err, "parameter %s is not stored in HF checkpoints", qp->name);
    int found = 0;
    for (int i = 0; i < t->nhf; i++) {
        const HfTensor *h = &t->hf[i];
        if (h->param != p) continue;
        const StTensor *st = st_set_find(set, h->name);
        char a[128], b[128];
        if (!st)
            return err_set(err, "HF checkpoint has no tensor \"%s\" (for %s)", h->name, qp->name);
        shape_str(a, sizeof a, h->shape, h->ndim);
        if (!same_shape(h, st)) {
            shape_str(b, sizeof b, st->shape, st->ndim);
            return err_set(err, "HF tensor \"%s\" has shape %s, expected %s", h->name, b, a);
        }
        if (!float_dtype(st->dtype))
            return err_set(err, "HF tensor \"%s\" has dtype %s, expected F32, BF16 or F16", h->name,
                           dtype_name(st->dtype));
        int64_t off = h->expert < 0 ? 0 : (int64_t)h->expert * h->numel;
        st_to_f32(st, dst + off);
        st_set_progress(set, st->nbytes);
        /* A NaN or an infinity would make every loss and gradient NaN from the first step, and
         * the run would then blame the learning rate; name the tensor instead. */
        for (int64_t k = 0; k < h->numel; k++)
            if (!isfinite(dst[off + k]))
                return err_set(
                    err, "HF tensor \"%s\" holds %s at element %" PRId64 "; weights must be finite",
                    h->name, isnan(dst[off + k]) ? "a NaN" : "an infinity", k);
        found++;
    }
    return found ? 0 : err_set(err, "parameter %s has no HF tensors", qp->name);
}

void hf_keys_add_to_writer(StWriter *w, const HfKeyTable *t, const float *const *params,
                           DType dtype) {
    for (int i = 0; i < t->nhf; i++) {
        const HfTensor *h = &t->hf[i];
        int64_t off = h->expert < 0 ? 0 : (int64_t)h->expert * h->numel;
        st_writer_add_f32(w, h->name, dtype, h->ndim, h->shape, params[h->param] + off);
    }
}
