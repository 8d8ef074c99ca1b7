/* KV-cache inference over the model's module implementations (see decode.h). */
#include "infer/decode.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/arena.h"
#include "kernels/cpu_simd.h"
#include "kernels/gemv_bf16.h"
#include "model/moe.h"

/* Places the cache and work rows in a (counting or real): the one layout decoder_create
 * allocates and decoder_bytes counts. */
static void place(Decoder *d, Arena *a, const ModelSpec *s, const Qwen3Modules *mod, int bf16,
                  int S, int C) {
    long D = s->dim, HE = (long)s->n_heads * s->head_dim, KE = (long)s->n_kv_heads * s->head_dim;
    long F = s->hidden_dim, V = s->vocab_size, L = s->n_layers, H = s->n_heads;
    long R = C > S ? C : S;
#define FL(n) arena_floats(a, (size_t)((n) > 0 ? (n) : 1))
    d->kc = FL(L * S * C * KE);
    d->vc = FL(L * S * C * KE);
    d->len = arena_alloc(a, (size_t)S * sizeof *d->len);
    d->ids = arena_alloc(a, (size_t)S * C * sizeof *d->ids);
    d->x = FL(R * D), d->out = FL(R * D), d->xmid = FL(R * D);
    d->xn = FL(R * D), d->xn2 = FL(R * D);
    d->rstd = FL(R * H);
    d->q = FL(R * HE), d->qn = FL(R * HE), d->qr = FL(R * HE);
    d->k = FL(R * KE), d->kn = FL(R * KE), d->kr = FL(R * KE), d->v = FL(R * KE);
    d->att = FL(R * HE);
    d->lse = FL(H * C);
    d->scores = FL((long)S * H * C);
    d->h1 = FL(R * F), d->h3 = FL(R * F), d->g = FL(R * F);
    d->pos = arena_alloc(a, (size_t)R * sizeof *d->pos);
    d->row_seq = arena_alloc(a, (size_t)R * sizeof *d->row_seq);
    long ws = 0; /* the largest workspace the layers' feed-forward kernels declare for R rows */
    for (int l = 0; l < s->n_layers; l++) {
        const SwigluOp *ff = mod->layers[l].feed_forward;
        long w = ff && ff->workspace_floats ? ff->workspace_floats(R, (int)D, (int)F) : 0;
        ws = w > ws ? w : ws;
    }
    d->ffn_ws = ws ? FL(ws) : NULL;
    if (bf16) {
        /* The largest product's bf16 inputs (linear.h, swiglu.h): lm_head runs on at most S
         * rows, everything else on up to R. */
        long need = R * (2 * D + 2 * F);
        if (R * (D + HE) > need) need = R * (D + HE);
        if ((long)S * (D + V) > need) need = (long)S * (D + V);
        d->scratch = arena_alloc(a, (size_t)need * sizeof *d->scratch);
    }
    int moe = 0;
    for (int l = 0; l < s->n_layers; l++)
        moe |= model_spec_layer_is_moe(s, l);
    if (moe) {
        long X = s->num_experts, k = s->top_k, Fm = s->moe_hidden_dim;
        d->router_logits = FL(R * X), d->probs = FL(R * X);
        d->topk_idx = arena_alloc(a, (size_t)(R * k) * sizeof *d->topk_idx);
        d->topk_w = FL(R * k);
        long saved = moe_experts_saved_floats(R, (int)k, (int)D, (int)Fm);
        long scratch = moe_experts_scratch_floats(R, (int)k, (int)D, (int)Fm);
        d->ex_mem = FL(saved + scratch);
        long ints = moe_experts_saved_ints(R, (int)k, (int)X);
        d->ex_ints = arena_alloc(a, (size_t)(ints > 0 ? ints : 1) * sizeof(int32_t));
        if (a->base)
            moe_experts_bufs_place(&d->ex, d->ex_mem, d->ex_ints, d->ex_mem + saved, R, (int)k,
                                   (int)D, (int)Fm, (int)X);
    }
#undef FL
}

size_t decoder_bytes(const ModelSpec *s, const Qwen3Modules *mod, int bf16, int S, int C) {
    Decoder d;
    Arena a;
    arena_init_counting(&a, "decoder");
    place(&d, &a, s, mod, bf16, S, C);
    return a.used;
}

int decoder_create(Decoder *d, Qwen3 *m, int S, int C, Err *err) {
    memset(d, 0, sizeof *d);
    if (S < 1 || C < 1)
        return err_set(err, "a decoder needs at least one sequence and one position (got %d, %d)",
                       S, C);
    TRY(arena_init(&d->mem, "decoder", decoder_bytes(&m->spec, &m->mod, m->bf16, S, C), err));
    place(d, &d->mem, &m->spec, &m->mod, m->bf16, S, C);
    d->m = m;
    d->S = S;
    d->C = C;
    d->R = C > S ? C : S;
    return 0;
}

void decoder_free(Decoder *d) {
    arena_free(&d->mem);
    memset(d, 0, sizeof *d);
}

void decoder_reset(Decoder *d) {
    memset(d->len, 0, (size_t)d->S * sizeof *d->len);
}

/* The linear calls as the model makes them (qwen3.c linear_fwd): bf16 when mixed precision is
 * on and the implementation has a bf16 path. */
static void linear(const Decoder *d, const LinearOp *op, float *out, const float *x, const float *w,
                   const uint16_t *wb, long N, int I, int O) {
    if (d->m->bf16 && op->forward_bf16)
        op->forward_bf16(out, x, wb, d->scratch, N, I, O);
    else
        op->forward(out, x, w, N, I, O);
}

static float *cache_row(const Decoder *d, float *c, int l, int s, int t) {
    long KE = (long)d->m->spec.n_kv_heads * d->m->spec.head_dim;
    return c + (((long)l * d->S + s) * d->C + t) * KE;
}

/* Rows r0..r0+n-1 against the cache, each a query at position pos[r] of sequence seq[r] that
 * attends to that sequence's positions 0..pos[r] (its own key and value already written there):
 * the causal softmax attention of ops/sdpa.h with the keys already in the cache. At most S rows
 * at once (the scores they fill); the G query heads that share a kv head go together, so each
 * cached key and value row is read once per row. */
static void attend_rows(Decoder *d, int l, const int *seq, long r0, long n) {
    const ModelSpec *s = &d->m->spec;
    int H = s->n_heads, K = s->n_kv_heads, E = s->head_dim, C = d->C, G = H / K;
    long KE = (long)K * E;
    float scale = 1.0f / sqrtf((float)E);
#pragma omp parallel for schedule(static)
    for (long rk = 0; rk < n * K; rk++) {
        long i = rk / K, r = r0 + i;
        int kh = (int)(rk % K), T = d->pos[r] + 1;
        const float *kc = cache_row(d, d->kc, l, seq[r], 0) + (long)kh * E;
        const float *vc = cache_row(d, d->vc, l, seq[r], 0) + (long)kh * E;
        long h0 = r * H + (long)kh * G; /* the group's first (row, head) */
        const float *q = d->qr + h0 * E;
        float *sc = d->scores + (i * H + (long)kh * G) * C, *o = d->att + h0 * E;
        for (int t = 0; t < T; t++)
            for (int g = 0; g < G; g++)
                sc[(long)g * C + t] = simd_dot(q + (long)g * E, kc + t * KE, E);
        for (int g = 0; g < G; g++)
            simd_softmax_row(sc + (long)g * C, sc + (long)g * C, T, scale);
        memset(o, 0, (size_t)G * E * sizeof *o);
        for (int t = 0; t < T; t++)
            for (int g = 0; g < G; g++)
                simd_axpy(o + (long)g * E, sc[(long)g * C + t], vc + t * KE, E);
    }
}

/* Each of n rows' key and value into the cache at its sequence's position pos[r], then its
 * attention over the cache (attend_rows, S rows at a time). */
static void attend_cached(Decoder *d, int l, const int *seq, long n) {
    long KE = (long)d->m->spec.n_kv_heads * d->m->spec.head_dim;
    for (long r = 0; r < n; r++) {
        memcpy(cache_row(d, d->kc, l, seq[r], d->pos[r]), d->kr + r * KE,
               (size_t)KE * sizeof(float));
        memcpy(cache_row(d, d->vc, l, seq[r], d->pos[r]), d->v + r * KE,
               (size_t)KE * sizeof(float));
    }
    for (long r0 = 0; r0 < n; r0 += d->S)
        attend_rows(d, l, seq, r0, n - r0 < d->S ? n - r0 : d->S);
}

/* The most rows a decode step streams through the GEMV kernel (bench/README.md, "Beam search":
 * on the 0.6B shapes in bf16 it leads the bf16 GEMM at 1 row, 14-15 against 12-13 tokens/s; the
 * two are even at 4 rows, and the GEMM leads by 20-25% at 8 rows and 27-86% at 16). */
#define DECODE_GEMV_MAX_ROWS 4

/* Decode's products with bf16 weights (kernels/gemv_bf16.h): x (n, I) cast to bf16 as the
 * bf16 linear ops cast it, then every part's weights read once. */
static void gemv(const Decoder *d, const GemvPart *parts, int nparts, const float *x, long n,
                 int I) {
    simd_f32_to_bf16(d->scratch, x, n * I);
    gemv_bf16(parts, nparts, d->scratch, n, I);
}

/* Layer l on n rows of d->x (written to d->out). prefill_seq >= 0: the rows are that
 * sequence's positions 0..n-1, from an empty cache; else row r is the token at position
 * pos[r] of sequence seq[r], its earlier positions in the cache (a decode step when step is 1,
 * a prompt's continuation otherwise). */
static void layer(Decoder *d, int l, long n, int prefill_seq, const int *seq, int step) {
    Qwen3 *m = d->m;
    const ModelSpec *s = &m->spec;
    const Qwen3LayerParams *p = &m->p.layers[l];
    const Qwen3Bf16Layer *pb = &m->pb.layers[l];
    const Qwen3LayerModules *md = &m->mod.layers[l];
    int D = s->dim, H = s->n_heads, K = s->n_kv_heads, E = s->head_dim, F = s->hidden_dim;
    long KE = (long)K * E;
    float eps = (float)s->norm_eps;

    /* Decode steps of a few rows with bf16 weights stream them through the GEMV kernel; a
     * prompt, or a step of more rows (the beams of several searches), goes through the model's
     * own ops, as do widened copies (qwen3.h), which the GEMV cannot read. */
    int stream = m->bf16 && !m->bf16_widened && step && n <= DECODE_GEMV_MAX_ROWS;

    md->attention_norm->forward(d->xn, d->rstd, d->x, p->attention_norm, n, D, eps);
    if (stream) {
        GemvPart qkv[3] = {{pb->wq, d->q, H * E}, {pb->wk, d->k, K * E}, {pb->wv, d->v, K * E}};
        gemv(d, qkv, 3, d->xn, n, D);
    } else {
        linear(d, md->qkv, d->q, d->xn, p->wq, pb->wq, n, D, H * E);
        linear(d, md->qkv, d->k, d->xn, p->wk, pb->wk, n, D, K * E);
        linear(d, md->qkv, d->v, d->xn, p->wv, pb->wv, n, D, K * E);
    }
    md->q_norm->forward(d->qn, d->rstd, d->q, p->q_norm, n * H, E, eps);
    md->k_norm->forward(d->kn, d->rstd, d->k, p->k_norm, n * K, E, eps);
    md->rope->forward(d->qr, d->qn, d->pos, n, H, E, &m->rope_freqs);
    md->rope->forward(d->kr, d->kn, d->pos, n, K, E, &m->rope_freqs);
    if (prefill_seq >= 0) {
        md->sdpa->forward(d->att, d->lse, d->qr, d->kr, d->v, NULL, 1, (int)n, H, K, E);
        memcpy(cache_row(d, d->kc, l, prefill_seq, 0), d->kr, (size_t)(n * KE) * sizeof(float));
        memcpy(cache_row(d, d->vc, l, prefill_seq, 0), d->v, (size_t)(n * KE) * sizeof(float));
    } else {
        attend_cached(d, l, seq, n);
    }
    if (stream)
        gemv(d, &(GemvPart){pb->wo, d->xmid, D}, 1, d->att, n, H * E);
    else
        linear(d, md->wo, d->xmid, d->att, p->wo, pb->wo, n, H * E, D);
    if (md->ffn_norm->forward_add) {
        md->ffn_norm->forward_add(d->xmid, d->xn2, d->rstd, d->xmid, d->x, p->ffn_norm, n, D, eps);
    } else {
        for (long i = 0; i < n * D; i++)
            d->xmid[i] += d->x[i];
        md->ffn_norm->forward(d->xn2, d->rstd, d->xmid, p->ffn_norm, n, D, eps);
    }
    if (md->experts) {
        int X = s->num_experts, k = s->top_k;
        md->router->forward(d->router_logits, d->xn2, p->router_gate, n, D, X);
        moe_router_forward(d->probs, d->topk_idx, d->topk_w, d->router_logits, p->expert_bias, n, X,
                           k, s->norm_topk_prob, 0);
        md->experts->forward(d->out, &d->ex, d->xn2, d->topk_idx, d->topk_w, p->experts_w1,
                             p->experts_w3, p->experts_w2, n, k, D, s->moe_hidden_dim, X);
    } else if (stream) {
        GemvPart up[2] = {{pb->w1, d->h1, F}, {pb->w3, d->h3, F}};
        gemv(d, up, 2, d->xn2, n, D);
        simd_swiglu(d->g, d->h1, d->h3, n * F);
        gemv(d, &(GemvPart){pb->w2, d->out, D}, 1, d->g, n, F);
    } else if (m->bf16 && md->feed_forward->forward_bf16) {
        md->feed_forward->forward_bf16(d->out, d->h1, d->h3, d->g, d->xn2, pb->w1, pb->w3, pb->w2,
                                       d->scratch, n, D, F);
    } else {
        md->feed_forward->forward(d->out, d->h1, d->h3, d->g, d->xn2, p->w1, p->w3, p->w2,
                                  d->ffn_ws, n, D, F);
    }
    for (long i = 0; i < n * D; i++)
        d->x[i] = d->out[i] + d->xmid[i];
}

/* Final norm and lm_head on rows first..first+n-1 of d->x: logits (n, V). */
static void head(Decoder *d, long first, long n, float *logits) {
    Qwen3 *m = d->m;
    const ModelSpec *s = &m->spec;
    int D = s->dim;
    m->mod.norm->forward(d->xn, d->rstd, d->x + first * D, m->p.norm, n, D, (float)s->norm_eps);
    if (m->bf16 && !m->bf16_widened && n <= DECODE_GEMV_MAX_ROWS)
        gemv(d, &(GemvPart){m->pb.output, logits, s->vocab_size}, 1, d->xn, n, D);
    else
        linear(d, m->mod.lm_head, logits, d->xn, m->p.output, m->pb.output, n, D, s->vocab_size);
}

static void fetch(const Decoder *d, int unit) {
    if (d->fetch) d->fetch(d->fetch_ctx, unit);
}

/* The n rows of ids through the model (layer's prefill_seq, seq and step), each row's id
 * recorded at its position, which becomes its sequence's last filled one. */
static void run_rows(Decoder *d, const int32_t *ids, long n, int prefill_seq, const int *seq,
                     int step) {
    Qwen3 *m = d->m;
    fetch(d, 0);
    m->mod.tok_embeddings->forward(d->x, ids, m->p.tok_embeddings, n, m->spec.dim);
    for (int l = 0; l < m->spec.n_layers; l++) {
        fetch(d, 1 + l);
        layer(d, l, n, prefill_seq, seq, step);
    }
    for (long r = 0; r < n; r++) {
        int s = prefill_seq >= 0 ? prefill_seq : seq[r];
        d->ids[(long)s * d->C + d->pos[r]] = ids[r];
        d->len[s] = d->pos[r] + 1;
    }
    fetch(d, m->spec.n_layers + 1);
}

void decoder_prefill(Decoder *d, int s, const int32_t *ids, int T, float *logits) {
    for (int t = 0; t < T; t++)
        d->pos[t] = t;
    run_rows(d, ids, T, s, NULL, 0);
    head(d, T - 1, 1, logits);
}

void decoder_step(Decoder *d, const int *seq, const int32_t *ids, int n, float *logits) {
    for (int r = 0; r < n; r++) /* run_rows sets each length again after the rows */
        d->pos[r] = d->len[seq[r]]++;
    run_rows(d, ids, n, -1, seq, 1);
    head(d, 0, n, logits);
}

/* ids[0..T) after sequence s's cache (not empty), as a prompt's rows run. */
static void extend_rows(Decoder *d, int s, const int32_t *ids, int T) {
    int L = d->len[s];
    for (int t = 0; t < T; t++)
        d->pos[t] = L + t, d->row_seq[t] = s;
    run_rows(d, ids, T, -1, d->row_seq, 0);
}

void decoder_extend(Decoder *d, int s, const int32_t *ids, int T, float *logits) {
    if (d->len[s] == 0) {
        decoder_prefill(d, s, ids, T, logits);
        return;
    }
    extend_rows(d, s, ids, T);
    head(d, T - 1, 1, logits);
}

void decoder_truncate(Decoder *d, int s, int n) {
    if (n < d->len[s]) d->len[s] = n;
}

void decoder_copy(Decoder *d, int dst, int src) {
    long KE = (long)d->m->spec.n_kv_heads * d->m->spec.head_dim, n = d->len[src];
    for (int l = 0; l < d->m->spec.n_layers; l++) {
        memcpy(cache_row(d, d->kc, l, dst, 0), cache_row(d, d->kc, l, src, 0),
               (size_t)(n * KE) * sizeof(float));
        memcpy(cache_row(d, d->vc, l, dst, 0), cache_row(d, d->vc, l, src, 0),
               (size_t)(n * KE) * sizeof(float));
    }
    memcpy(d->ids + (long)dst * d->C, d->ids + (long)src * d->C, (size_t)n * sizeof *d->ids);
    d->len[dst] = (int)n;
}

int decoder_reuse(Decoder *d, int s, const int32_t *ids, int T) {
    const int32_t *held = d->ids + (long)s * d->C;
    int n = 0;
    while (n < d->len[s] && n < T - 1 && held[n] == ids[n])
        n++;
    d->len[s] = n;
    return n;
}
