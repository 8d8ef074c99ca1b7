/* LoRA adapters (see lora.h): creation from target globs, init, and the adapter's forward and
 * backward around a base linear. */
#include "model/lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/rng.h"
#include "core/strutil.h"
#include "io/hf_keys.h"
#include "ops/gemm.h"

/* Init streams of the adapters' A, apart from the model's parameter streams; and the dropout
 * masks' streams, one per (dataset row, adapter). */
#define LORA_STREAM 0x4C4F524100000000ull
#define LORA_DROP_STREAM 0x4C44524F50000000ull

static const char *const SITE_NAMES[LORA_NSITES] = {
    "attention.wq",    "attention.wk",    "attention.wv",    "attention.wo",
    "feed_forward.w1", "feed_forward.w3", "feed_forward.w2",
};

void lora_module_name(char *out, size_t cap, int layer, LoraSite s) {
    snprintf(out, cap, "layers.%d.%s", layer, SITE_NAMES[s]);
}

/* I and O of site s. */
static void site_shape(const ModelSpec *sp, LoraSite s, int *in, int *out) {
    int D = sp->dim, Q = sp->n_heads * sp->head_dim, KV = sp->n_kv_heads * sp->head_dim;
    int F = sp->hidden_dim;
    switch (s) {
    case LORA_WQ:
        *in = D, *out = Q;
        break;
    case LORA_WK:
    case LORA_WV:
        *in = D, *out = KV;
        break;
    case LORA_WO:
        *in = Q, *out = D;
        break;
    case LORA_W1:
    case LORA_W3:
        *in = D, *out = F;
        break;
    default:
        *in = F, *out = D;
        break;
    }
}

int lora_target_match(const char *target, const char *name, const char *hf_name) {
    if (!strcmp(target, "all-linear") || str_glob_match(target, name)) return 1;
    if (!hf_name[0]) return 0;
    size_t lt = strlen(target), lh = strlen(hf_name);
    return str_glob_match(target, hf_name) ||
           (lh > lt && hf_name[lh - lt - 1] == '.' && !strcmp(hf_name + lh - lt, target));
}

/* Whether site s of layer l gets an adapter: the layer has that linear (MoE layers have no
 * dense FFN linears) and a target names it (lora_target_match). hits (NULL: not counted)
 * counts, per target, the linears it matched, for the warning about targets that match none
 * (a glob naming only MoE layers' FFN linears matches none). */
static int site_adapted(const ModelSpec *spec, const HfKeyTable *hf, char *const *targets, int nt,
                        int l, int s, int *hits) {
    if (s >= LORA_W1 && spec->num_experts > 0 && model_spec_layer_is_moe(spec, l)) return 0;
    char name[64], hf_name[HF_KEY_MAX];
    lora_module_name(name, sizeof name, l, (LoraSite)s);
    lora_hf_module(hf_name, sizeof hf_name, hf, l, (LoraSite)s);
    int hit = 0;
    for (int t = 0; t < nt; t++)
        if (lora_target_match(targets[t], name, hf_name)) {
            hit = 1;
            if (hits) hits[t]++;
        }
    return hit;
}

int lora_create(Lora *lo, const ModelSpec *spec, int rank, double alpha, int rslora,
                char *const *targets, int nt, long max_tokens, const LoraWhere *set_at, int warn,
                Err *err) {
    memset(lo, 0, sizeof *lo);
    const char *where = set_at->targets;
    if (rank < 1) return err_set(err, "%s: lora.rank = %d must be >= 1", set_at->rank, rank);
    if (!(alpha > 0)) return err_set(err, "%s: lora.alpha = %g must be > 0", set_at->alpha, alpha);
    if (nt < 1)
        return err_set(err,
                       "%s: lora.targets is empty; name the linears to adapt, e.g. "
                       "[\"layers.*.attention.wq\", \"layers.*.attention.wv\"]",
                       where);
    int *hits = xcalloc((size_t)nt, sizeof *hits);
    HfKeyTable hf;
    hf_keys_build(&hf, spec);
    int n = 0;
    for (int l = 0; l < spec->n_layers; l++)
        for (int s = 0; s < LORA_NSITES; s++)
            n += site_adapted(spec, &hf, targets, nt, l, s, hits);
    for (int t = 0; t < nt; t++) {
        if (warn && !hits[t])
            log_warn("%s: lora target \"%s\" matches no linear layer (names look like "
                     "layers.0.attention.wq, layers.0.feed_forward.w2, or as peft names them "
                     "q_proj, mlp.down_proj, all-linear)",
                     where, targets[t]);
        if (warn && !strcmp(targets[t], "all-linear") && spec->num_experts > 0)
            log_info("%s: lora target \"all-linear\" adapts the attention linears and dense "
                     "FFN linears; the MoE layers' router and experts get no adapters",
                     where);
    }
    if (n == 0) {
        free(hits);
        hf_keys_free(&hf);
        return err_set(err, "%s: lora.targets match no linear layer of the model", where);
    }
    lo->rank = rank;
    lo->alpha = alpha;
    lo->rslora = rslora != 0;
    lo->scale = lora_scale(alpha, rank, rslora);
    lo->ad = xcalloc((size_t)n, sizeof *lo->ad);
    lo->max_tokens = max_tokens;
    int k = 0;
    for (int l = 0; l < spec->n_layers; l++)
        for (int s = 0; s < LORA_NSITES; s++) {
            if (!site_adapted(spec, &hf, targets, nt, l, s, NULL)) continue;
            LoraAdapter *ad = &lo->ad[k++];
            ad->layer = l;
            ad->site = (LoraSite)s;
            site_shape(spec, (LoraSite)s, &ad->in, &ad->out);
            int smaller = ad->in < ad->out ? ad->in : ad->out;
            if (rank > smaller) {
                char name[64];
                lora_module_name(name, sizeof name, l, (LoraSite)s);
                err_set(err, "%s: lora.rank = %d is larger than %s (%d x %d) allows (%d)",
                        set_at->rank, rank, name, ad->out, ad->in, smaller);
                free(hits);
                hf_keys_free(&hf);
                lo->n = k;
                lora_free(lo);
                return -1;
            }
            lo->at[l][s] = ad;
        }
    lo->n = n;
    free(hits);
    hf_keys_free(&hf);
    long total = lora_numel(lo), at = 0;
    lo->param = xcalloc((size_t)total, sizeof(float));
    lo->grad = xcalloc((size_t)total, sizeof(float));
    for (int i = 0; i < n; i++) {
        LoraAdapter *ad = &lo->ad[i];
        long na = (long)rank * ad->in, nb = (long)ad->out * rank;
        ad->at = at;
        ad->a = lo->param + at, ad->da = lo->grad + at;
        ad->b = lo->param + at + na, ad->db = lo->grad + at + na;
        at += na + nb;
        ad->xa = xcalloc((size_t)max_tokens * rank, sizeof(float));
        ad->in_l = ad->in, ad->out_l = ad->out;
    }
    lo->scratch = xcalloc((size_t)max_tokens * rank, sizeof(float));
    return 0;
}

void lora_free(Lora *lo) {
    for (int i = 0; i < lo->n; i++)
        free(lo->ad[i].xa);
    free(lo->ad);
    free(lo->param);
    free(lo->grad);
    free(lo->scratch);
    free(lo->xd);
    memset(lo, 0, sizeof *lo);
}

void lora_init(Lora *lo, uint64_t seed) {
    for (int i = 0; i < lo->n; i++) {
        LoraAdapter *ad = &lo->ad[i];
        Rng r;
        rng_seed(&r, seed, LORA_STREAM + (uint64_t)i);
        /* kaiming_uniform_(a = sqrt(5)) on (r, I): bound = sqrt(6 / ((1 + 5) * I)). */
        float bound = 1.0f / sqrtf((float)ad->in);
        for (long k = 0; k < (long)lo->rank * ad->in; k++)
            ad->a[k] = (2.0f * rng_uniform(&r) - 1.0f) * bound;
        memset(ad->b, 0, (size_t)ad->out * lo->rank * sizeof(float));
    }
}

void lora_zero_grads(Lora *lo) {
    memset(lo->grad, 0, (size_t)lora_numel(lo) * sizeof(float));
}

/* 1 when ad's base splits its output features (its weight's rows) under tensor parallelism. */
static int splits_outputs(const LoraAdapter *ad) {
    return PARAM_KINDS[lora_site_kind(ad->site)].tp == TP_ROWS;
}

void lora_set_tp(Lora *lo, int tp, int t) {
    for (int i = 0; i < lo->n; i++) {
        LoraAdapter *ad = &lo->ad[i];
        int rows = splits_outputs(ad);
        ad->in_l = rows ? ad->in : ad->in / tp;
        ad->out_l = rows ? ad->out / tp : ad->out;
        ad->in_off = rows ? 0 : t * ad->in_l;
        ad->out_off = rows ? t * ad->out_l : 0;
    }
}

int lora_tp_whole(const LoraAdapter *ad, char which) {
    int rows = splits_outputs(ad);
    return which == 'A' ? rows : !rows;
}

void lora_block(const Lora *lo, const LoraAdapter *ad, const float *a, const float *b, float *al,
                float *bl) {
    for (int j = 0; j < lo->rank; j++)
        memcpy(al + (long)j * ad->in_l, a + (long)j * ad->in + ad->in_off,
               (size_t)ad->in_l * sizeof *al);
    memcpy(bl, b + (long)ad->out_off * lo->rank, (size_t)ad->out_l * lo->rank * sizeof *bl);
}

long lora_numel(const Lora *lo) {
    long n = 0;
    for (int i = 0; i < lo->n; i++)
        n += (long)lo->rank * (lo->ad[i].in + lo->ad[i].out);
    return n;
}

void lora_set_dropout(Lora *lo, double p, uint64_t seed) {
    lo->dropout = p;
    lo->drop_seed = seed;
    free(lo->xd);
    lo->xd = NULL;
    if (p > 0) lo->xd = xcalloc((size_t)lo->max_tokens * lora_max_in(lo), sizeof(float));
}

int lora_max_in(const Lora *lo) {
    int in = 1;
    for (int i = 0; i < lo->n; i++)
        if (lo->ad[i].in > in) in = lo->ad[i].in;
    return in;
}

void lora_dropout_rows(Lora *lo, int64_t first_row, int T) {
    lo->dropping = first_row >= 0 && lo->dropout > 0;
    lo->drop_row0 = first_row;
    lo->drop_T = T;
}

/* out (N, in_l) = (add ? out : 0) + in * mask / (1 - p): the mask of adapter ad on the
 * micro-batch (lora_dropout_rows), element j of token t of row R kept when the 24-bit uniform
 * of counter t * I + j of stream (R, adapter index) is at least p; I and j count the whole
 * input's features, so a tensor-parallel rank's block draws one process's mask. */
static void drop(const Lora *lo, const LoraAdapter *ad, float *out, const float *in, long N,
                 int add) {
    uint64_t k = (uint64_t)(ad - lo->ad);
    int I = ad->in_l, T = lo->drop_T;
    uint64_t full = (uint64_t)ad->in, off = (uint64_t)ad->in_off;
    float p = (float)lo->dropout, keep = (float)(1.0 / (1.0 - lo->dropout));
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++) {
        uint64_t row = (uint64_t)(lo->drop_row0 + n / T), t = (uint64_t)(n % T);
        uint64_t stream = LORA_DROP_STREAM + (row << 20) + k;
        for (int j = 0; j < I; j++) {
            uint64_t h = rng_counter_u64(lo->drop_seed, stream, t * full + off + (uint64_t)j);
            float u = (float)(h >> 40) * (1.0f / 16777216.0f);
            float v = u < p ? 0.0f : in[n * I + j] * keep;
            out[n * I + j] = add ? out[n * I + j] + v : v;
        }
    }
}

void lora_forward(const Lora *lo, LoraAdapter *ad, float *y, const float *x, long N) {
    int r = lo->rank, I = ad->in_l, O = ad->out_l;
    if (lo->dropping) {
        drop(lo, ad, lo->xd, x, N, 0);
        x = lo->xd;
    }
    gemm_f32(0, 1, (int)N, r, I, 1.0f, x, I, ad->a, I, 0.0f, ad->xa, r);
    gemm_f32(0, 1, (int)N, O, r, lo->scale, ad->xa, r, ad->b, r, 1.0f, y, O);
}

void lora_backward(const Lora *lo, LoraAdapter *ad, float *dx, const float *dy, const float *x,
                   long N) {
    int r = lo->rank, I = ad->in_l, O = ad->out_l;
    float *dxa = lo->scratch; /* (N, r) s * dy B */
    const float *xin = x;
    if (lo->dropping) { /* the forward's dropout(x), drawn again */
        drop(lo, ad, lo->xd, x, N, 0);
        xin = lo->xd;
    }
    gemm_f32(1, 0, O, r, (int)N, lo->scale, dy, O, ad->xa, r, 1.0f, ad->db, r);
    gemm_f32(0, 0, (int)N, r, O, lo->scale, dy, O, ad->b, r, 0.0f, dxa, r);
    gemm_f32(1, 0, r, I, (int)N, 1.0f, dxa, r, xin, I, 1.0f, ad->da, I);
    if (!lo->dropping) {
        gemm_f32(0, 0, (int)N, I, r, 1.0f, dxa, r, ad->a, I, 1.0f, dx, I);
        return;
    }
    /* d dropout(x) = dxa A, then through the mask into dx */
    gemm_f32(0, 0, (int)N, I, r, 1.0f, dxa, r, ad->a, I, 0.0f, lo->xd, I);
    drop(lo, ad, dx, lo->xd, N, 1);
}

void lora_merge(const Lora *lo, const LoraAdapter *ad, const float *a, const float *b, float *w,
                int row0, int rows) {
    gemm_f32(0, 0, rows, ad->in, lo->rank, lo->scale, b + (long)row0 * lo->rank, lo->rank, a,
             ad->in, 1.0f, w, ad->in);
}

float lora_scale(double alpha, double rank, int rslora) {
    return (float)(rslora ? alpha / sqrt(rank) : alpha / rank);
}

ParamKindId lora_site_kind(LoraSite s) {
    static const ParamKindId kind[LORA_NSITES] = {PK_WQ, PK_WK, PK_WV, PK_WO, PK_W1, PK_W3, PK_W2};
    return kind[s];
}
