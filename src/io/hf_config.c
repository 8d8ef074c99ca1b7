/* HF config.json reader and writer for Qwen3 (dense) and Qwen3-MoE; see hf_config.h for the
 * rules on defaults and unsupported features. */
#include "io/hf_config.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "core/json.h"

static const char *const ARCH_DENSE = "Qwen3ForCausalLM";
static const char *const ARCH_MOE = "Qwen3MoeForCausalLM";

#define HF_MAX_SIZE (1 << 24)
#define HF_MAX_EXPERTS 1024
#define HF_MAX_PARAM_NUMEL (1LL << 40)

/* An optional integer key in [lo, hi]; absent or null leaves *out unchanged. */
static int get_int(const json_t *o, const char *key, int *out, int64_t lo, int64_t hi,
                   const char *what, Err *err) {
    int64_t v = *out;
    TRY(json_opt_int(o, key, &v, what, err));
    const json_t *j = json_object_get(o, key);
    if (!j || json_is_null(j)) return 0;
    if (v < lo || v > hi)
        return err_set(err, "%s: key \"%s\" is %lld, expected an integer in [%lld, %lld]", what,
                       key, (long long)v, (long long)lo, (long long)hi);
    *out = (int)v;
    return 0;
}

static int get_num(const json_t *o, const char *key, double *out, double lo, const char *what,
                   Err *err) {
    double v = *out;
    TRY(json_opt_num(o, key, &v, what, err));
    if (!(v >= lo) || !isfinite(v))
        return err_set(err, "%s: key \"%s\" is %g, expected a finite number >= %g", what, key, v,
                       lo);
    *out = v;
    return 0;
}

/* Picks the architecture from `architectures` (first supported entry) or else `model_type`. */
static int pick_arch(const json_t *root, int *is_moe, const char *what, Err *err) {
    const json_t *archs = json_object_get(root, "architectures");
    const char *mt = NULL;
    TRY(json_opt_str(root, "model_type", &mt, what, err));
    if (archs && !json_is_null(archs)) {
        if (!json_is_array(archs))
            return err_set(err, "%s: key \"architectures\" must be a list of strings", what);
        const char *first = NULL;
        size_t i;
        const json_t *v;
        json_array_foreach(archs, i, v) {
            if (!json_is_string(v))
                return err_set(err, "%s: key \"architectures\" must be a list of strings", what);
            const char *s = json_string_value(v);
            if (!first) first = s;
            if (strcmp(s, ARCH_DENSE) == 0 || strcmp(s, ARCH_MOE) == 0) {
                *is_moe = strcmp(s, ARCH_MOE) == 0;
                const char *want = *is_moe ? "qwen3_moe" : "qwen3";
                if (mt && strcmp(mt, want) != 0)
                    return err_set(err,
                                   "%s: model_type \"%s\" does not match architecture %s "
                                   "(expected \"%s\")",
                                   what, mt, s, want);
                return 0;
            }
        }
        if (first)
            return err_set(err,
                           "%s: architecture \"%s\" is not supported; qtitan supports %s and %s",
                           what, first, ARCH_DENSE, ARCH_MOE);
    }
    if (mt && strcmp(mt, "qwen3") == 0) {
        *is_moe = 0;
        return 0;
    }
    if (mt && strcmp(mt, "qwen3_moe") == 0) {
        *is_moe = 1;
        return 0;
    }
    if (mt)
        return err_set(err,
                       "%s: model_type \"%s\" is not supported; qtitan supports %s (qwen3) and %s "
                       "(qwen3_moe)",
                       what, mt, ARCH_DENSE, ARCH_MOE);
    return err_set(err,
                   "%s: neither \"architectures\" nor \"model_type\" is set; expected %s or %s",
                   what, ARCH_DENSE, ARCH_MOE);
}

/* rope_parameters (5.x) or rope_scaling (4.x): plain RoPE (possibly carrying theta), "linear"
 * or "yarn", read as transformers' modeling_rope_utils reads them (max_position_embeddings
 * already in s; a top-level original_max_position_embeddings, top_original > 0, wins over the
 * one inside, as the rotary embedding's standardize_rope_params has it). */
static int parse_rope(const json_t *root, const char *key, ModelSpec *s, int top_original,
                      const char *what, Err *err) {
    const json_t *r = json_object_get(root, key);
    if (!r || json_is_null(r)) return 0;
    if (!json_is_object(r))
        return err_set(err, "%s: key \"%s\" must be an object or null", what, key);
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)r, k, v) {
        if (json_is_object(v))
            return err_set(err,
                           "%s: key \"%s\" holds per-layer-type RoPE settings (\"%s\"), which "
                           "qtitan does not implement",
                           what, key, k);
    }
    const char *type = "default";
    TRY(json_opt_str(r, "type", &type, what, err));
    TRY(json_opt_str(r, "rope_type", &type, what, err));
    double prf = 1.0;
    TRY(json_opt_num(r, "partial_rotary_factor", &prf, what, err));
    if (prf != 1.0)
        return err_set(err, "%s: %s partial_rotary_factor %g is not supported (only 1.0)", what,
                       key, prf);
    TRY(get_num(r, "rope_theta", &s->rope_theta, 1e-30, what, err));
    RopeScaling *sc = &s->rope_scaling;
    model_spec_rope_defaults(sc); /* padding zeroed too: specs are compared bytewise */
    if (strcmp(type, "default") == 0) return 0;
    char where[256];
    snprintf(where, sizeof where, "%s: %s", what, key);
    if (strcmp(type, model_spec_rope_name(ROPE_LINEAR)) == 0) {
        sc->type = ROPE_LINEAR;
        TRY(json_req_num(r, "factor", &sc->factor, where, err));
    } else if (strcmp(type, model_spec_rope_name(ROPE_YARN)) == 0) {
        sc->type = ROPE_YARN;
        sc->original_max_seq_len = s->max_seq_len;
        TRY(get_int(r, "original_max_position_embeddings", &sc->original_max_seq_len, 1, INT_MAX,
                    where, err));
        if (top_original > 0) sc->original_max_seq_len = top_original;
        /* factor null: the ratio of the context to the original one. */
        if (!json_object_get(r, "factor"))
            return err_set(err, "%s: key \"factor\" is missing (yarn needs it)", where);
        sc->factor = (double)s->max_seq_len / sc->original_max_seq_len;
        TRY(json_opt_num(r, "factor", &sc->factor, where, err));
        TRY(json_opt_num(r, "attention_factor", &sc->attention_factor, where, err));
        if (json_object_get(r, "attention_factor") &&
            !json_is_null(json_object_get(r, "attention_factor")) &&
            !(sc->attention_factor > 0 && isfinite(sc->attention_factor)))
            return err_set(err, "%s: key \"attention_factor\" is %g, expected a finite number > 0",
                           where, sc->attention_factor);
        TRY(get_num(r, "mscale", &sc->mscale, 0, where, err));
        TRY(get_num(r, "mscale_all_dim", &sc->mscale_all_dim, 0, where, err));
        /* 0 and null are transformers' defaults too (`or 32`, `or 1`). */
        TRY(get_num(r, "beta_fast", &sc->beta_fast, 0, where, err));
        TRY(get_num(r, "beta_slow", &sc->beta_slow, 0, where, err));
        if (sc->beta_fast == 0) sc->beta_fast = 32;
        if (sc->beta_slow == 0) sc->beta_slow = 1;
        TRY(json_opt_bool(r, "truncate", &sc->truncate, where, err));
    } else {
        return err_set(err,
                       "%s: %s type \"%s\" is not supported; qtitan implements plain RoPE "
                       "(%s null or type \"default\"), \"linear\" and \"yarn\"",
                       what, key, type, key);
    }
    if (!(sc->factor > 0) || !isfinite(sc->factor))
        return err_set(err, "%s: key \"factor\" is %g, expected a finite number > 0", where,
                       sc->factor);
    return 0;
}

static int get_token_ids(const json_t *root, const char *key, int64_t *ids, int *n, int *is_list,
                         const char *what, Err *err) {
    const json_t *v = json_object_get(root, key);
    *n = 0;
    if (is_list) *is_list = 0;
    if (!v || json_is_null(v)) return 0;
    if (json_is_integer(v)) {
        ids[0] = json_integer_value(v);
        *n = 1;
        return 0;
    }
    if (is_list && json_is_array(v) && json_array_size(v) <= HF_MAX_TOKEN_IDS) {
        size_t i;
        const json_t *e;
        json_array_foreach(v, i, e) {
            if (!json_is_integer(e)) break;
            ids[(*n)++] = json_integer_value(e);
        }
        if ((size_t)*n == json_array_size(v)) {
            *is_list = 1;
            return 0;
        }
    }
    return err_set(err, "%s: key \"%s\" must be %s", what, key,
                   is_list ? "an integer or a list of at most 8 integers" : "an integer");
}

/* quantization_config: nothing, or fp8 block quantization of the weights (HfConfigExtra). */
static int parse_quant(const json_t *root, int64_t block[2], const char *what, Err *err) {
    const json_t *q = json_object_get(root, "quantization_config");
    block[0] = block[1] = 0;
    if (!q || json_is_null(q)) return 0;
    if (!json_is_object(q))
        return err_set(err, "%s: key \"quantization_config\" must be an object or null", what);
    const char *method = NULL, *fmt = "e4m3", *act = "dynamic", *scale_fmt = "float";
    TRY(json_opt_str(q, "quant_method", &method, what, err));
    if (!method || strcmp(method, "fp8") != 0)
        return err_set(err,
                       "%s: quantization_config.quant_method %s%s%s is not read; qtitan reads "
                       "unquantized weights (F32, BF16, F16) and fp8 block-quantized ones "
                       "(quant_method \"fp8\")",
                       what, method ? "\"" : "", method ? method : "(absent)", method ? "\"" : "");
    TRY(json_opt_str(q, "fmt", &fmt, what, err));
    TRY(json_opt_str(q, "activation_scheme", &act, what, err));
    TRY(json_opt_str(q, "scale_fmt", &scale_fmt, what, err));
    if (strcmp(fmt, "e4m3") != 0)
        return err_set(err, "%s: quantization_config.fmt \"%s\" is not read (only \"e4m3\")", what,
                       fmt);
    if (strcmp(act, "dynamic") != 0)
        return err_set(err,
                       "%s: quantization_config.activation_scheme \"%s\" is not read (only "
                       "\"dynamic\": weights without activation scales)",
                       what, act);
    if (strcmp(scale_fmt, "float") != 0)
        return err_set(err, "%s: quantization_config.scale_fmt \"%s\" is not read (only \"float\")",
                       what, scale_fmt);
    const json_t *b = json_object_get(q, "weight_block_size");
    block[0] = block[1] = 128; /* transformers' FineGrainedFP8Config default */
    if (!b) return 0;
    for (int i = 0; i < 2; i++) {
        const json_t *v = json_array_get(b, (size_t)i);
        if (!json_is_array(b) || json_array_size(b) != 2 || !json_is_integer(v) ||
            json_integer_value(v) < 1 || json_integer_value(v) > HF_MAX_SIZE)
            return err_set(err,
                           "%s: quantization_config.weight_block_size must be a list of two "
                           "positive integers (rows, columns of a scaled block)",
                           what);
        block[i] = json_integer_value(v);
    }
    return 0;
}

static int parse_config(ModelSpec *s, HfConfigExtra *extra, const json_t *root, const char *what,
                        Err *err) {
    if (!json_is_object(root)) return err_set(err, "%s: expected a JSON object", what);
    int moe = 0;
    TRY(pick_arch(root, &moe, what, err));
    memset(s, 0, sizeof *s);
    model_spec_rope_defaults(&s->rope_scaling);
    snprintf(s->flavor, sizeof s->flavor, "hf");
    /* transformers' defaults (Qwen3Config / Qwen3MoeConfig) for absent keys. */
    s->vocab_size = 151936;
    s->dim = moe ? 2048 : 4096;
    s->hidden_dim = moe ? 6144 : 22016;
    s->n_layers = moe ? 24 : 32;
    s->n_heads = 32;
    s->max_seq_len = 32768;
    s->norm_eps = 1e-6;
    s->rope_theta = 10000.0;
    /* Caps far above any published model that keep every size product inside int64 and
     * the key table (layers x experts x 3 entries) allocatable. */
    const int big = HF_MAX_SIZE;
    TRY(get_int(root, "vocab_size", &s->vocab_size, 1, big, what, err));
    TRY(get_int(root, "hidden_size", &s->dim, 1, big, what, err));
    TRY(get_int(root, "intermediate_size", &s->hidden_dim, 1, big, what, err));
    TRY(get_int(root, "num_hidden_layers", &s->n_layers, 1, QT_MAX_LAYERS, what, err));
    TRY(get_int(root, "num_attention_heads", &s->n_heads, 1, big, what, err));
    /* Absent: 32 (dense) or 4 (MoE). A dense config's explicit null means n_heads. */
    s->n_kv_heads = moe ? 4 : 32;
    if (!moe && json_is_null(json_object_get(root, "num_key_value_heads")))
        s->n_kv_heads = s->n_heads;
    TRY(get_int(root, "num_key_value_heads", &s->n_kv_heads, 1, big, what, err));
    if (s->n_heads % s->n_kv_heads != 0)
        return err_set(err,
                       "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                       what, s->n_heads, s->n_kv_heads);
    /* Qwen3Config defaults head_dim to 128; the MoE model uses hidden_size / heads. */
    s->head_dim = moe ? s->dim / s->n_heads : 128;
    TRY(get_int(root, "head_dim", &s->head_dim, 1, big, what, err));
    if (s->head_dim < 1)
        return err_set(err,
                       "%s: head_dim is absent and hidden_size %d / num_attention_heads %d is 0",
                       what, s->dim, s->n_heads);
    TRY(get_int(root, "max_position_embeddings", &s->max_seq_len, 1, INT_MAX, what, err));
    TRY(get_num(root, "rms_norm_eps", &s->norm_eps, 0.0, what, err));
    TRY(get_num(root, "rope_theta", &s->rope_theta, 1e-30, what, err));
    int top_original = 0;
    TRY(get_int(root, "original_max_position_embeddings", &top_original, 1, INT_MAX, what, err));
    /* Both set: rope_scaling's settings are the ones transformers keeps. */
    TRY(parse_rope(root, "rope_parameters", s, top_original, what, err));
    TRY(parse_rope(root, "rope_scaling", s, top_original, what, err));
    TRY(json_opt_bool(root, "tie_word_embeddings", &s->tie_embeddings, what, err));

    int flag = 0;
    TRY(json_opt_bool(root, "attention_bias", &flag, what, err));
    if (flag)
        return err_set(err, "%s: attention_bias true is not supported (Qwen3 has no biases)", what);
    TRY(json_opt_bool(root, "use_sliding_window", &flag, what, err));
    if (flag)
        return err_set(err,
                       "%s: use_sliding_window true is not supported; qtitan implements full "
                       "causal attention only",
                       what);
    const char *act = "silu";
    TRY(json_opt_str(root, "hidden_act", &act, what, err));
    if (strcmp(act, "silu") != 0)
        return err_set(err, "%s: hidden_act \"%s\" is not supported (only \"silu\")", what, act);
    const json_t *lt = json_object_get(root, "layer_types");
    if (lt && !json_is_null(lt)) {
        size_t i;
        const json_t *v;
        if (!json_is_array(lt))
            return err_set(err, "%s: key \"layer_types\" must be a list of strings", what);
        json_array_foreach(lt, i, v) {
            if (!json_is_string(v) || strcmp(json_string_value(v), "full_attention") != 0)
                return err_set(err,
                               "%s: layer_types[%zu] is not \"full_attention\"; qtitan "
                               "implements full causal attention only",
                               what, i);
        }
    }

    if (moe) {
        s->num_experts = 128;
        s->top_k = 8;
        s->moe_hidden_dim = 768;
        s->decoder_sparse_step = 1;
        s->router_aux_loss_coef = 0.001;
        int local = -1;
        TRY(get_int(root, "num_experts", &s->num_experts, 0, HF_MAX_EXPERTS, what, err));
        TRY(get_int(root, "num_local_experts", &local, -1, HF_MAX_EXPERTS, what, err));
        if (local >= 0 && json_object_get(root, "num_experts") && local != s->num_experts)
            return err_set(err, "%s: num_experts %d and num_local_experts %d disagree", what,
                           s->num_experts, local);
        if (local >= 0) s->num_experts = local;
        TRY(get_int(root, "num_experts_per_tok", &s->top_k, 1, big, what, err));
        TRY(get_int(root, "moe_intermediate_size", &s->moe_hidden_dim, 1, big, what, err));
        TRY(get_int(root, "decoder_sparse_step", &s->decoder_sparse_step, 1, big, what, err));
        TRY(json_opt_bool(root, "norm_topk_prob", &s->norm_topk_prob, what, err));
        TRY(get_num(root, "router_aux_loss_coef", &s->router_aux_loss_coef, 0.0, what, err));
        if (s->num_experts > 0 && s->top_k > s->num_experts)
            return err_set(err, "%s: num_experts_per_tok %d exceeds num_experts %d", what, s->top_k,
                           s->num_experts);
        const json_t *mo = json_object_get(root, "mlp_only_layers");
        if (mo && !json_is_null(mo)) {
            if (!json_is_array(mo))
                return err_set(err, "%s: key \"mlp_only_layers\" must be a list of layer indices",
                               what);
            size_t i;
            const json_t *v;
            json_array_foreach(mo, i, v) {
                if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                    json_integer_value(v) >= s->n_layers)
                    return err_set(err, "%s: mlp_only_layers[%zu] must be a layer index in [0, %d)",
                                   what, i, s->n_layers);
                s->mlp_only_layers[json_integer_value(v)] = 1;
            }
        }
    }
    /* The largest weight matrix must stay a sane size (and its byte count inside int64). */
    double D = s->dim, biggest = (double)s->vocab_size * D;
    double mats[3] = {(double)s->n_heads * s->head_dim * D, (double)s->hidden_dim * D,
                      (double)s->num_experts * s->moe_hidden_dim * D};
    for (int i = 0; i < 3; i++)
        if (mats[i] > biggest) biggest = mats[i];
    if (biggest > HF_MAX_PARAM_NUMEL)
        return err_set(err, "%s: a weight of %.3g elements is over the %.3g-element limit", what,
                       biggest, (double)HF_MAX_PARAM_NUMEL);
    /* The same rules as for native flavors (e.g. an even head_dim for RoPE). */
    if (model_spec_validate(s, err) != 0) return err_wrap(err, "%s", what);
    /* Token ids are checked even when the caller does not want them. */
    HfConfigExtra unused;
    if (!extra) extra = &unused;
    {
        memset(extra, 0, sizeof *extra);
        TRY(get_token_ids(root, "bos_token_id", extra->bos_token_id, &extra->n_bos, NULL, what,
                          err));
        TRY(get_token_ids(root, "eos_token_id", extra->eos_token_id, &extra->n_eos,
                          &extra->eos_is_list, what, err));
        TRY(json_opt_bool(root, "output_router_logits", &extra->output_router_logits, what, err));
        if (moe) { /* as transformers resolves it: the default 0.001 when absent */
            extra->has_router_aux_loss_coef = 1;
            extra->router_aux_loss_coef = s->router_aux_loss_coef;
        }
        TRY(get_num(root, "attention_dropout", &extra->attention_dropout, 0.0, what, err));
        if (extra->attention_dropout > 1.0)
            return err_set(err,
                           "%s: key \"attention_dropout\" is %g, expected a probability in [0, 1]",
                           what, extra->attention_dropout);
        TRY(parse_quant(root, extra->fp8_block, what, err));
    }
    return 0;
}

int model_spec_from_hf_config_text(ModelSpec *spec, HfConfigExtra *extra, const char *text,
                                   size_t len, const char *what, Err *err) {
    json_t *root = json_load_mem(text, len, what, err);
    if (!root) return -1;
    int rc = parse_config(spec, extra, root, what, err);
    json_decref(root);
    return rc;
}

int model_spec_from_hf_config_ex(ModelSpec *spec, HfConfigExtra *extra,
                                 const char *config_json_path, Err *err) {
    json_t *root = json_load_path(config_json_path, err);
    if (!root) return -1;
    int rc = parse_config(spec, extra, root, config_json_path, err);
    json_decref(root);
    return rc;
}

int model_spec_from_hf_config(ModelSpec *spec, const char *config_json_path, Err *err) {
    return model_spec_from_hf_config_ex(spec, NULL, config_json_path, err);
}

/* The fewest significant digits (up to 17) that print x so that it reads back exactly. */
static int round_trip_digits(double x) {
    char buf[64];
    for (int p = 1; p < 17; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, x);
        if (strtod(buf, NULL) == x) return p;
    }
    return 17;
}

static json_t *token_ids_json(const int64_t *ids, int n, int as_list) {
    if (!as_list) return json_integer(ids[0]);
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_integer(ids[i]));
    return a;
}

/* rope_scaling as transformers 4.x writes it (5.x reads it into rope_parameters): null for
 * plain RoPE, else every setting that decides the frequencies, defaults written out. */
static json_t *rope_scaling_json(const RopeScaling *sc) {
    if (sc->type == ROPE_PLAIN) return json_null();
    json_t *r = json_object();
    json_object_set_new(r, "rope_type", json_string(model_spec_rope_name(sc->type)));
    json_object_set_new(r, "factor", json_real(sc->factor));
    if (sc->type == ROPE_YARN) {
        json_object_set_new(r, "original_max_position_embeddings",
                            json_integer(sc->original_max_seq_len));
        if (sc->attention_factor > 0)
            json_object_set_new(r, "attention_factor", json_real(sc->attention_factor));
        if (sc->mscale != 0) json_object_set_new(r, "mscale", json_real(sc->mscale));
        if (sc->mscale_all_dim != 0)
            json_object_set_new(r, "mscale_all_dim", json_real(sc->mscale_all_dim));
        json_object_set_new(r, "beta_fast", json_real(sc->beta_fast));
        json_object_set_new(r, "beta_slow", json_real(sc->beta_slow));
        json_object_set_new(r, "truncate", json_boolean(sc->truncate));
    }
    return r;
}

char *model_spec_hf_config_text(const ModelSpec *s, const HfConfigExtra *extra,
                                const char *torch_dtype, size_t *len, Err *err) {
    if (strcmp(torch_dtype, "float32") != 0 && strcmp(torch_dtype, "bfloat16") != 0 &&
        strcmp(torch_dtype, "float16") != 0) {
        err_set(err, "torch_dtype \"%s\" is not one of float32, bfloat16, float16", torch_dtype);
        return NULL;
    }
    int moe = s->num_experts > 0;
    /* The coefficient the model trained with; where it trained without one (route 1 with
     * output_router_logits false), the imported config's, which transformers ignores too. */
    double aux_coef = s->router_aux_loss_coef;
    if (aux_coef == 0 && extra && extra->has_router_aux_loss_coef)
        aux_coef = extra->router_aux_loss_coef;
    int router_logits = extra && extra->output_router_logits && s->router_aux_loss_coef > 0;
    /* Kept as given: eval and generation accept it (inactive there), training refuses it. */
    double dropout = extra ? extra->attention_dropout : 0.0;
    json_t *o = json_object();
    json_t *archs = json_array();
    json_array_append_new(archs, json_string(moe ? ARCH_MOE : ARCH_DENSE));
    json_object_set_new(o, "architectures", archs);
    json_object_set_new(o, "model_type", json_string(moe ? "qwen3_moe" : "qwen3"));
    json_object_set_new(o, "attention_bias", json_false());
    json_object_set_new(o, "attention_dropout", json_real(dropout));
    if (extra && extra->n_bos > 0)
        json_object_set_new(o, "bos_token_id", json_integer(extra->bos_token_id[0]));
    if (extra && extra->n_eos > 0)
        json_object_set_new(o, "eos_token_id",
                            token_ids_json(extra->eos_token_id, extra->n_eos, extra->eos_is_list));
    json_object_set_new(o, "head_dim", json_integer(s->head_dim));
    json_object_set_new(o, "hidden_act", json_string("silu"));
    json_object_set_new(o, "hidden_size", json_integer(s->dim));
    json_object_set_new(o, "initializer_range", json_real(0.02));
    json_object_set_new(o, "intermediate_size", json_integer(s->hidden_dim));
    json_object_set_new(o, "max_position_embeddings", json_integer(s->max_seq_len));
    json_object_set_new(o, "max_window_layers", json_integer(s->n_layers));
    json_object_set_new(o, "num_attention_heads", json_integer(s->n_heads));
    json_object_set_new(o, "num_hidden_layers", json_integer(s->n_layers));
    json_object_set_new(o, "num_key_value_heads", json_integer(s->n_kv_heads));
    json_object_set_new(o, "rms_norm_eps", json_real(s->norm_eps));
    json_object_set_new(o, "rope_scaling", rope_scaling_json(&s->rope_scaling));
    json_object_set_new(o, "rope_theta", json_real(s->rope_theta));
    json_object_set_new(o, "sliding_window", json_null());
    json_object_set_new(o, "tie_word_embeddings", json_boolean(s->tie_embeddings));
    json_object_set_new(o, "torch_dtype", json_string(torch_dtype));
    /* The first transformers release with Qwen3 and Qwen3-MoE. */
    json_object_set_new(o, "transformers_version", json_string("4.51.0"));
    json_object_set_new(o, "use_cache", json_true());
    json_object_set_new(o, "use_sliding_window", json_false());
    json_object_set_new(o, "vocab_size", json_integer(s->vocab_size));
    if (moe) {
        json_t *mo = json_array();
        for (int i = 0; i < s->n_layers && i < QT_MAX_LAYERS; i++)
            if (s->mlp_only_layers[i]) json_array_append_new(mo, json_integer(i));
        json_object_set_new(o, "decoder_sparse_step", json_integer(s->decoder_sparse_step));
        json_object_set_new(o, "mlp_only_layers", mo);
        json_object_set_new(o, "moe_intermediate_size", json_integer(s->moe_hidden_dim));
        json_object_set_new(o, "norm_topk_prob", json_boolean(s->norm_topk_prob));
        json_object_set_new(o, "num_experts", json_integer(s->num_experts));
        json_object_set_new(o, "num_experts_per_tok", json_integer(s->top_k));
        json_object_set_new(o, "output_router_logits", json_boolean(router_logits));
        json_object_set_new(o, "router_aux_loss_coef", json_real(aux_coef));
    }
    /* Print every real with as few digits as reads back exactly (1e-06, not 9.99...e-07). */
    int digits = round_trip_digits(s->norm_eps);
    int d2 = round_trip_digits(s->rope_theta), d3 = round_trip_digits(aux_coef);
    if (d2 > digits) digits = d2;
    if (d3 > digits) digits = d3;
    if (round_trip_digits(dropout) > digits) digits = round_trip_digits(dropout);
    const RopeScaling *sc = &s->rope_scaling;
    const double rope_reals[] = {sc->factor,         sc->attention_factor, sc->mscale,
                                 sc->mscale_all_dim, sc->beta_fast,        sc->beta_slow};
    for (size_t i = 0; i < sizeof rope_reals / sizeof rope_reals[0]; i++)
        if (round_trip_digits(rope_reals[i]) > digits) digits = round_trip_digits(rope_reals[i]);
    if (digits < 2) digits = 2;
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(digits));
    json_decref(o);
    size_t n = strlen(text);
    char *buf = xmalloc(n + 2);
    memcpy(buf, text, n);
    buf[n] = '\n';
    buf[n + 1] = '\0';
    free(text);
    *len = n + 1;
    return buf;
}

int model_spec_write_hf_config_ex(const ModelSpec *s, const HfConfigExtra *extra, const char *path,
                                  const char *torch_dtype, Err *err) {
    size_t len;
    char *text = model_spec_hf_config_text(s, extra, torch_dtype, &len, err);
    if (!text) return err_wrap(err, "%s", path);
    int rc = fs_write_atomic(path, text, len, err);
    free(text);
    return rc;
}

int model_spec_write_hf_config(const ModelSpec *spec, const char *path, const char *torch_dtype,
                               Err *err) {
    return model_spec_write_hf_config_ex(spec, NULL, path, torch_dtype, err);
}
