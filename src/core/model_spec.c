/* Native Qwen3 flavors (docs/config.md, model.flavor) and field replacement / validation of a
 * ModelSpec. The numbers of the published sizes are those of the Qwen/Qwen3-* config.json files. */
#include "core/model_spec.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/strutil.h"

typedef struct Flavor {
    const char *name;
    int dim, n_layers, n_heads, n_kv_heads, hidden_dim, vocab_size, max_seq_len, tie;
    int num_experts, top_k, moe_hidden_dim;
} Flavor;

static const Flavor FLAVORS[] = {
    /* name            dim  L   H   K  F      V       maxpos tie  E    k  moeF */
    {"debugmodel", 256, 8, 16, 8, 3072, 2048, 4096, 1, 0, 0, 0},
    {"debugmodel_moe", 256, 8, 16, 8, 3072, 2048, 4096, 0, 64, 8, 768},
    {"0.6B", 1024, 28, 16, 8, 3072, 151936, 40960, 1, 0, 0, 0},
    {"1.7B", 2048, 28, 16, 8, 6144, 151936, 40960, 1, 0, 0, 0},
    {"4B", 2560, 36, 32, 8, 9728, 151936, 40960, 1, 0, 0, 0},
    {"8B", 4096, 36, 32, 8, 12288, 151936, 40960, 0, 0, 0, 0},
    {"14B", 5120, 40, 40, 8, 17408, 151936, 40960, 0, 0, 0, 0},
    {"32B", 5120, 64, 64, 8, 25600, 151936, 40960, 0, 0, 0, 0},
    {"30B-A3B", 2048, 48, 32, 4, 6144, 151936, 40960, 0, 128, 8, 768},
    {"235B-A22B", 4096, 94, 64, 4, 12288, 151936, 40960, 0, 128, 8, 1536},
};
#define NFLAVORS ((int)(sizeof FLAVORS / sizeof FLAVORS[0]))

int model_spec_flavor(ModelSpec *spec, const char *flavor, Err *err) {
    const Flavor *f = NULL;
    for (int i = 0; i < NFLAVORS; i++)
        if (strcmp(FLAVORS[i].name, flavor) == 0) f = &FLAVORS[i];
    if (!f) {
        char list[512];
        size_t o = 0;
        for (int i = 0; i < NFLAVORS; i++)
            o += (size_t)snprintf(list + o, sizeof list - o, "%s\"%s\"", i ? ", " : "",
                                  FLAVORS[i].name);
        const char *names[NFLAVORS];
        for (int i = 0; i < NFLAVORS; i++)
            names[i] = FLAVORS[i].name;
        const char *near = str_nearest(flavor, names, NFLAVORS);
        if (near)
            return err_set(err, "unknown model flavor \"%s\"; did you mean \"%s\"? (flavors: %s)",
                           flavor, near, list);
        return err_set(err, "unknown model flavor \"%s\"; expected one of %s", flavor, list);
    }
    memset(spec, 0, sizeof *spec);
    snprintf(spec->flavor, sizeof spec->flavor, "%s", f->name);
    spec->dim = f->dim;
    spec->n_layers = f->n_layers;
    spec->n_heads = f->n_heads;
    spec->n_kv_heads = f->n_kv_heads;
    spec->head_dim = 128;
    spec->hidden_dim = f->hidden_dim;
    spec->vocab_size = f->vocab_size;
    spec->max_seq_len = f->max_seq_len;
    spec->norm_eps = 1e-6;
    spec->rope_theta = 1e6;
    model_spec_rope_defaults(&spec->rope_scaling);
    spec->tie_embeddings = f->tie;
    spec->num_experts = f->num_experts;
    spec->top_k = f->top_k;
    spec->moe_hidden_dim = f->moe_hidden_dim;
    spec->norm_topk_prob = f->num_experts > 0;
    spec->decoder_sparse_step = 1;
    spec->router_aux_loss_coef = 0.0;
    spec->load_balance_coeff = 1e-3;
    return 0;
}

typedef enum { F_INT, F_FLOAT, F_BOOL, F_ROPE_TYPE } FieldKind;

/* rope_scaling's values, RopeScalingType's order. */
static const char *const ROPE_TYPES[] = {"none", "linear", "yarn"};

typedef struct Field {
    const char *name;
    FieldKind kind;
    size_t off;
} Field;

static const Field FIELDS[] = {
    {"dim", F_INT, offsetof(ModelSpec, dim)},
    {"n_layers", F_INT, offsetof(ModelSpec, n_layers)},
    {"n_heads", F_INT, offsetof(ModelSpec, n_heads)},
    {"n_kv_heads", F_INT, offsetof(ModelSpec, n_kv_heads)},
    {"head_dim", F_INT, offsetof(ModelSpec, head_dim)},
    {"hidden_dim", F_INT, offsetof(ModelSpec, hidden_dim)},
    {"vocab_size", F_INT, offsetof(ModelSpec, vocab_size)},
    {"max_seq_len", F_INT, offsetof(ModelSpec, max_seq_len)},
    {"norm_eps", F_FLOAT, offsetof(ModelSpec, norm_eps)},
    {"rope_theta", F_FLOAT, offsetof(ModelSpec, rope_theta)},
    {"rope_scaling", F_ROPE_TYPE, offsetof(ModelSpec, rope_scaling.type)},
    {"rope_factor", F_FLOAT, offsetof(ModelSpec, rope_scaling.factor)},
    {"rope_original_max_seq_len", F_INT, offsetof(ModelSpec, rope_scaling.original_max_seq_len)},
    {"rope_attention_factor", F_FLOAT, offsetof(ModelSpec, rope_scaling.attention_factor)},
    {"rope_beta_fast", F_FLOAT, offsetof(ModelSpec, rope_scaling.beta_fast)},
    {"rope_beta_slow", F_FLOAT, offsetof(ModelSpec, rope_scaling.beta_slow)},
    {"rope_truncate", F_BOOL, offsetof(ModelSpec, rope_scaling.truncate)},
    {"tie_embeddings", F_BOOL, offsetof(ModelSpec, tie_embeddings)},
    {"num_experts", F_INT, offsetof(ModelSpec, num_experts)},
    {"top_k", F_INT, offsetof(ModelSpec, top_k)},
    {"moe_hidden_dim", F_INT, offsetof(ModelSpec, moe_hidden_dim)},
    {"norm_topk_prob", F_BOOL, offsetof(ModelSpec, norm_topk_prob)},
    {"decoder_sparse_step", F_INT, offsetof(ModelSpec, decoder_sparse_step)},
    {"router_aux_loss_coef", F_FLOAT, offsetof(ModelSpec, router_aux_loss_coef)},
    {"load_balance_coeff", F_FLOAT, offsetof(ModelSpec, load_balance_coeff)},
};
#define NFIELDS ((int)(sizeof FIELDS / sizeof FIELDS[0]))

const int MODEL_SPEC_NFIELDS = NFIELDS;

const char *model_spec_field_name(int i) {
    return FIELDS[i].name;
}

int model_spec_set_field(ModelSpec *spec, const char *field, const char *value, Err *err) {
    const Field *f = NULL;
    for (int i = 0; i < NFIELDS; i++)
        if (strcmp(FIELDS[i].name, field) == 0) f = &FIELDS[i];
    if (!f) {
        const char *names[NFIELDS];
        for (int i = 0; i < NFIELDS; i++)
            names[i] = FIELDS[i].name;
        const char *near = str_nearest(field, names, NFIELDS);
        if (near)
            return err_set(err, "unknown model field \"%s\"; did you mean \"%s\"?", field, near);
        return err_set(err, "unknown model field \"%s\"", field);
    }
    char *p = (char *)spec + f->off;
    char *end;
    switch (f->kind) {
    case F_INT: {
        errno = 0;
        long long v = strtoll(value, &end, 10);
        if (end == value || *end || errno == ERANGE || v < -2147483647LL || v > 2147483647LL)
            return err_set(err, "model field %s = \"%s\" is not an integer", field, value);
        *(int *)p = (int)v;
        return 0;
    }
    case F_FLOAT: {
        errno = 0;
        double v = strtod(value, &end);
        if (end == value || *end || !isfinite(v))
            return err_set(err, "model field %s = \"%s\" is not a finite number", field, value);
        *(double *)p = v;
        return 0;
    }
    case F_ROPE_TYPE:
        for (int t = 0; t < (int)(sizeof ROPE_TYPES / sizeof ROPE_TYPES[0]); t++)
            if (strcmp(value, ROPE_TYPES[t]) == 0) {
                *(RopeScalingType *)p = (RopeScalingType)t;
                return 0;
            }
        return err_set(err, "model field %s = \"%s\" is not one of \"none\", \"linear\", \"yarn\"",
                       field, value);
    case F_BOOL:
        if (strcmp(value, "true") == 0 || strcmp(value, "1") == 0) {
            *(int *)p = 1;
        } else if (strcmp(value, "false") == 0 || strcmp(value, "0") == 0) {
            *(int *)p = 0;
        } else {
            return err_set(err, "model field %s = \"%s\" is not a boolean (true or false)", field,
                           value);
        }
        return 0;
    }
    return err_set(err, "model field %s has no parser", field);
}

const char *model_spec_rope_name(RopeScalingType t) {
    return t >= 0 && t < (int)(sizeof ROPE_TYPES / sizeof ROPE_TYPES[0]) ? ROPE_TYPES[t] : "?";
}

int model_spec_field_is_string(const char *field) {
    for (int i = 0; i < NFIELDS; i++)
        if (strcmp(FIELDS[i].name, field) == 0) return FIELDS[i].kind == F_ROPE_TYPE;
    return 0;
}

void model_spec_rope_defaults(RopeScaling *r) {
    memset(r, 0, sizeof *r);
    r->beta_fast = 32;
    r->beta_slow = 1;
    r->truncate = 1;
}

int model_spec_field_is_bool(const char *field) {
    for (int i = 0; i < NFIELDS; i++)
        if (strcmp(FIELDS[i].name, field) == 0) return FIELDS[i].kind == F_BOOL;
    return 0;
}

int model_spec_layer_is_moe(const ModelSpec *spec, int layer) {
    if (spec->num_experts <= 0 || layer < 0 || layer >= QT_MAX_LAYERS) return 0;
    if (spec->mlp_only_layers[layer]) return 0;
    return spec->decoder_sparse_step > 0 && (layer + 1) % spec->decoder_sparse_step == 0;
}

/* Upper bounds keep every size product (dim * vocab, experts * dim * ffn, ...) far from int64
 * overflow; they are well above any published Qwen3. */
static int check_int(const char *name, int v, int lo, int hi, Err *err) {
    if (v < lo || v > hi)
        return err_set(err, "model %s = %d is out of range; expected an integer in [%d, %d]", name,
                       v, lo, hi);
    return 0;
}

int model_spec_validate(const ModelSpec *s, Err *err) {
    TRY(check_int("dim", s->dim, 1, 1 << 20, err));
    TRY(check_int("n_layers", s->n_layers, 1, QT_MAX_LAYERS, err));
    TRY(check_int("n_heads", s->n_heads, 1, 4096, err));
    TRY(check_int("n_kv_heads", s->n_kv_heads, 1, 4096, err));
    TRY(check_int("head_dim", s->head_dim, 1, 4096, err));
    TRY(check_int("vocab_size", s->vocab_size, 1, 1 << 24, err));
    TRY(check_int("max_seq_len", s->max_seq_len, 1, 1 << 24, err));
    if (s->n_heads % s->n_kv_heads != 0)
        return err_set(err, "model n_heads = %d is not a multiple of n_kv_heads = %d", s->n_heads,
                       s->n_kv_heads);
    if (s->head_dim % 2 != 0)
        return err_set(err, "model head_dim = %d must be even (RoPE rotates pairs)", s->head_dim);
    if (!(s->norm_eps > 0) || !isfinite(s->norm_eps))
        return err_set(err, "model norm_eps = %g must be a finite number > 0", s->norm_eps);
    if (!(s->rope_theta > 0) || !isfinite(s->rope_theta))
        return err_set(err, "model rope_theta = %g must be a finite number > 0", s->rope_theta);
    const RopeScaling *r = &s->rope_scaling;
    if (r->type != ROPE_PLAIN) {
        const char *t = model_spec_rope_name(r->type);
        if (!(r->factor > 0) || !isfinite(r->factor))
            return err_set(err,
                           "model rope_factor = %g must be a finite number > 0 (rope_scaling %s)",
                           r->factor, t);
        if (r->type == ROPE_YARN) {
            if (r->original_max_seq_len < 1 || r->original_max_seq_len > 1 << 24)
                return err_set(err,
                               "model rope_original_max_seq_len = %d: rope_scaling yarn needs the "
                               "context the model was trained with, an integer in [1, %d] (Qwen3: "
                               "32768)",
                               r->original_max_seq_len, 1 << 24);
            if (!(r->beta_fast > 0) || !isfinite(r->beta_fast) || !(r->beta_slow > 0) ||
                !isfinite(r->beta_slow))
                return err_set(err,
                               "model rope_beta_fast = %g and rope_beta_slow = %g must be finite "
                               "numbers > 0 (rope_scaling yarn)",
                               r->beta_fast, r->beta_slow);
            if (!(r->attention_factor >= 0) || !isfinite(r->attention_factor))
                return err_set(err,
                               "model rope_attention_factor = %g must be a finite number >= 0 (0 = "
                               "from rope_factor)",
                               r->attention_factor);
        }
    }
    TRY(check_int("num_experts", s->num_experts, 0, 4096, err));
    int any_dense = 0;
    for (int i = 0; i < s->n_layers; i++)
        any_dense |= !model_spec_layer_is_moe(s, i);
    if (any_dense) TRY(check_int("hidden_dim", s->hidden_dim, 1, 1 << 20, err));
    if (s->num_experts > 0) {
        TRY(check_int("decoder_sparse_step", s->decoder_sparse_step, 1, QT_MAX_LAYERS, err));
        TRY(check_int("moe_hidden_dim", s->moe_hidden_dim, 1, 1 << 20, err));
        if (s->top_k < 1 || s->top_k > s->num_experts)
            return err_set(err,
                           "model top_k = %d is out of range; expected 1 <= top_k <= "
                           "num_experts = %d",
                           s->top_k, s->num_experts);
        if (!(s->router_aux_loss_coef >= 0) || !isfinite(s->router_aux_loss_coef))
            return err_set(err, "model router_aux_loss_coef = %g must be a finite number >= 0",
                           s->router_aux_loss_coef);
        if (!(s->load_balance_coeff >= 0) || !isfinite(s->load_balance_coeff))
            return err_set(err, "model load_balance_coeff = %g must be a finite number >= 0",
                           s->load_balance_coeff);
    }
    return 0;
}
