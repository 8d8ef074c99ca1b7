/* LoRA adapters in HF peft's folder format: adapter_config.json and adapter_model.safetensors
 * with peft's key names, which derive from the HF module names of io/hf_keys.h. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/fs.h"
#include "core/json.h"
#include "io/hf_keys.h"
#include "io/safetensors.h"
#include "model/lora.h"
#include "ops/gemm.h"

void lora_hf_module(char *out, size_t cap, const HfKeyTable *t, int layer, LoraSite site) {
    char mod[64], name[HF_KEY_MAX];
    lora_module_name(mod, sizeof mod, layer, site);
    snprintf(name, sizeof name, "%s.weight", mod);
    int p = hf_keys_find_param(t, name);
    out[0] = 0;
    for (int i = 0; i < t->nhf; i++)
        if (t->hf[i].param == p && t->hf[i].expert < 0) {
            snprintf(out, cap, "%.*s", (int)(strlen(t->hf[i].name) - strlen(".weight")),
                     t->hf[i].name);
            return;
        }
}

/* The HF module name of adapter ad's base linear. */
static void hf_module(char *out, size_t cap, const HfKeyTable *t, const LoraAdapter *ad) {
    lora_hf_module(out, cap, t, ad->layer, ad->site);
}

static void key_with(char *out, size_t cap, const HfKeyTable *t, const LoraAdapter *ad,
                     char which) {
    char mod[HF_KEY_MAX];
    hf_module(mod, sizeof mod, t, ad);
    snprintf(out, cap, "base_model.model.%s.lora_%c.weight", mod, which);
}

void lora_peft_key(char *out, size_t cap, const ModelSpec *spec, const LoraAdapter *ad,
                   char which) {
    HfKeyTable t;
    hf_keys_build(&t, spec);
    key_with(out, cap, &t, ad, which);
    hf_keys_free(&t);
}

/* The last component of an HF module name: peft's target_modules entry. */
static const char *leaf(const char *mod) {
    const char *dot = strrchr(mod, '.');
    return dot ? dot + 1 : mod;
}

/* peft settings whose adapters compute something other than y += s B A x, or that carry more
 * than A and B: set to anything but their default, they are refused, never ignored. Those
 * `merged` are read where an adapter is merged into the weights (lora_peft_merge: generate,
 * eval); training refuses them all. */
static const struct {
    const char *key, *what;
    int merged;
} VARIANTS[] = {
    {"use_dora", "DoRA, a magnitude vector per weight", 1},
    {"rank_pattern", "a rank per module", 1},
    {"alpha_pattern", "a lora_alpha per module", 1},
    {"modules_to_save", "whole modules saved beside the adapters", 1},
    {"trainable_token_indices", "embedding rows trained beside the adapters", 1},
    {"lora_bias", "a bias on lora_B", 0},
    {"layer_replication", "layers replicated in the base model", 0},
    {"target_parameters", "adapters on parameters such as MoE experts", 0},
    {"alora_invocation_tokens", "activated LoRA, adapters on only after invocation tokens", 0},
    {"use_qalora", "QA-LoRA, pooled adapter inputs", 0},
    {"use_bdlora", "block-diagonal LoRA", 0},
    {"arrow_config", "Arrow routing among adapters", 0},
    {"monteclora_config", "MonteCLoRA", 0},
    {"kasa_config", "KaSA", 0},
};

/* peft's default for the settings above: absent, null, false, {} or []. */
static int is_default(const json_t *v) {
    return !v || json_is_null(v) || json_is_false(v) ||
           (json_is_object(v) && !json_object_size(v)) || (json_is_array(v) && !json_array_size(v));
}

/* merging: the variants lora_peft_merge reads are accepted. */
static int parse_config(const json_t *cfg, const char *path, int merging, LoraPeftConfig *out,
                        Err *err) {
    if (!json_is_object(cfg))
        return err_set(err, "%s: expected a JSON object (peft's adapter_config.json)", path);
    const json_t *type = json_object_get(cfg, "peft_type");
    if (type && !(json_is_string(type) && !strcmp(json_string_value(type), "LORA")))
        return err_set(err,
                       "%s: peft_type is %s where qtitan reads LoRA adapters only (peft_type "
                       "\"LORA\")",
                       path, json_is_string(type) ? json_string_value(type) : "not a string");
    for (size_t i = 0; i < sizeof VARIANTS / sizeof VARIANTS[0]; i++)
        if (!is_default(json_object_get(cfg, VARIANTS[i].key)) && !(merging && VARIANTS[i].merged))
            return err_set(err,
                           VARIANTS[i].merged
                               ? "%s: \"%s\" is set (%s), a LoRA variant qtitan merges into the "
                                 "weights for generate and eval (--adapter) but does not train "
                                 "or resume; training reads plain LoRA and rsLoRA adapters (y += "
                                 "s B A x)"
                               : "%s: \"%s\" is set (%s), a LoRA variant qtitan does not "
                                 "implement; it reads plain LoRA and rsLoRA adapters (y += s B A "
                                 "x), and merges DoRA, rank and alpha patterns, modules_to_save "
                                 "and trainable tokens",
                           path, VARIANTS[i].key, VARIANTS[i].what);
    *out = (LoraPeftConfig){0};
    TRY(json_req_int(cfg, "r", &out->r, path, err));
    TRY(json_req_num(cfg, "lora_alpha", &out->alpha, path, err));
    TRY(json_opt_bool(cfg, "use_rslora", &out->rslora, path, err));
    if (out->r < 1 || out->r > INT32_MAX)
        return err_set(err, "%s: r = %lld must be an integer from 1 to %d", path, (long long)out->r,
                       INT32_MAX);
    if (!(out->alpha > 0) || !isfinite(out->alpha))
        return err_set(err, "%s: lora_alpha = %g must be a finite number > 0", path, out->alpha);
    return 0;
}

int lora_peft_config_parse(const char *text, size_t len, const char *path, LoraPeftConfig *out,
                           Err *err) {
    json_t *cfg = json_load_mem(text, len, path, err);
    int rc = cfg ? parse_config(cfg, path, 0, out, err) : -1;
    json_decref(cfg);
    return rc;
}

static int read_config(const char *path, LoraPeftConfig *out, Err *err) {
    json_t *cfg = json_load_path(path, err);
    int rc = cfg ? parse_config(cfg, path, 0, out, err) : -1;
    json_decref(cfg);
    return rc;
}

int lora_load_peft(Lora *lo, const ModelSpec *spec, const char *dir, Err *err) {
    char *cfg_path = fs_join(dir, "adapter_config.json");
    char *st_path = fs_join(dir, "adapter_model.safetensors");
    LoraPeftConfig pc;
    int rc = read_config(cfg_path, &pc, err);
    if (rc == 0 && (pc.r != lo->rank || pc.alpha != lo->alpha || pc.rslora != lo->rslora))
        rc = err_set(err,
                     "%s: r = %lld, lora_alpha = %g and use_rslora = %s, but [lora] has rank = "
                     "%d, alpha = %g and use_rslora = %s",
                     cfg_path, (long long)pc.r, pc.alpha, pc.rslora ? "true" : "false", lo->rank,
                     lo->alpha, lo->rslora ? "true" : "false");
    StFile f;
    int opened = rc == 0 && st_open(&f, st_path, err) == 0;
    if (rc == 0 && !opened) rc = -1;
    HfKeyTable t;
    hf_keys_build(&t, spec);
    int problems = 0;
    char first[512] = "";
    for (int i = 0; rc == 0 && i < lo->n; i++) {
        LoraAdapter *ad = &lo->ad[i];
        for (int w = 0; w < 2; w++) {
            char key[HF_KEY_MAX + 48];
            key_with(key, sizeof key, &t, ad, w ? 'B' : 'A');
            int64_t rows = w ? ad->out : lo->rank, cols = w ? lo->rank : ad->in;
            const StTensor *tt = st_find(&f, key);
            if (!tt || tt->ndim != 2 || tt->shape[0] != rows || tt->shape[1] != cols) {
                if (!problems++)
                    snprintf(first, sizeof first, "%s %s (expected [%lld, %lld])", key,
                             tt ? "is misshaped" : "is missing", (long long)rows, (long long)cols);
                continue;
            }
            st_to_f32(tt, w ? ad->b : ad->a);
        }
    }
    /* Adapters on linears [lora] does not target would be dropped without a word. */
    if (rc == 0 && 2 * lo->n != f.n && !problems) {
        problems++;
        snprintf(first, sizeof first,
                 "it holds %d tensors where [lora] targets %d linears (%d tensors)", f.n, lo->n,
                 2 * lo->n);
    }
    if (rc == 0 && problems)
        rc = err_set(err,
                     "%s: does not fit the model's [lora] adapters (%d problem(s); the "
                     "first: %s)",
                     st_path, problems, first);
    if (opened) st_close(&f);
    hf_keys_free(&t);
    free(cfg_path);
    free(st_path);
    return rc;
}

int lora_open_peft(Lora *lo, const ModelSpec *spec, const char *dir, long max_tokens, Err *err) {
    memset(lo, 0, sizeof *lo);
    char *cfg_path = fs_join(dir, "adapter_config.json");
    char *st_path = fs_join(dir, "adapter_model.safetensors");
    LoraPeftConfig pc;
    int rc = read_config(cfg_path, &pc, err);
    StFile f;
    int opened = rc == 0 && st_open(&f, st_path, err) == 0;
    if (rc == 0 && !opened) rc = -1;
    char(*names)[64] = xcalloc((size_t)spec->n_layers * LORA_NSITES, sizeof *names);
    char **targets = xcalloc((size_t)spec->n_layers * LORA_NSITES + 1, sizeof *targets);
    int nt = 0;
    HfKeyTable t;
    hf_keys_build(&t, spec);
    for (int l = 0; rc == 0 && l < spec->n_layers; l++)
        for (int s = 0; s < LORA_NSITES; s++) {
            LoraAdapter probe = {.layer = l, .site = (LoraSite)s};
            char key[HF_KEY_MAX + 48];
            key_with(key, sizeof key, &t, &probe, 'A');
            if (!st_find(&f, key)) continue;
            lora_module_name(names[nt], sizeof names[nt], l, (LoraSite)s);
            targets[nt] = names[nt];
            nt++;
        }
    hf_keys_free(&t);
    if (opened) st_close(&f);
    if (rc == 0 && nt == 0)
        rc = err_set(err,
                     "%s: holds no LoRA adapter of this model's linears (keys like "
                     "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight)",
                     st_path);
    if (rc == 0)
        rc = lora_create(lo, spec, (int)pc.r, pc.alpha, pc.rslora, targets, nt, max_tokens,
                         &(LoraWhere){cfg_path, cfg_path, cfg_path}, 1, err);
    if (rc == 0 && lora_load_peft(lo, spec, dir, err) != 0) {
        lora_free(lo);
        rc = -1;
    }
    free(names);
    free(targets);
    free(cfg_path);
    free(st_path);
    return rc;
}

int lora_save_peft(const Lora *lo, const ModelSpec *spec, const char *dir, const char *base_model,
                   const float *param, Err *err) {
    TRY(fs_mkdirs(dir, err));
    HfKeyTable t;
    hf_keys_build(&t, spec);
    StWriter w;
    st_writer_init(&w);
    st_writer_set_metadata(&w, "format", "pt");
    /* target_modules: the module leaves when every layer has the same adapted sites, else a
     * regular expression naming each module (peft full-matches a string against module
     * names). */
    unsigned sites[QT_MAX_LAYERS] = {0};
    for (int i = 0; i < lo->n; i++) {
        const LoraAdapter *ad = &lo->ad[i];
        char key[HF_KEY_MAX + 48];
        int64_t sa[2] = {lo->rank, ad->in}, sb[2] = {ad->out, lo->rank};
        key_with(key, sizeof key, &t, ad, 'A');
        st_writer_add_f32(&w, key, DT_F32, 2, sa, param + ad->at);
        key_with(key, sizeof key, &t, ad, 'B');
        st_writer_add_f32(&w, key, DT_F32, 2, sb, param + ad->at + sa[0] * sa[1]);
        sites[ad->layer] |= 1u << ad->site;
    }
    int uniform = 1;
    for (int l = 1; l < spec->n_layers; l++)
        uniform &= sites[l] == sites[0];
    json_t *targets;
    if (uniform) {
        targets = json_array();
        for (int i = 0; i < lo->n && lo->ad[i].layer == lo->ad[0].layer; i++) {
            char mod[HF_KEY_MAX];
            hf_module(mod, sizeof mod, &t, &lo->ad[i]);
            json_array_append_new(targets, json_string(leaf(mod)));
        }
    } else {
        size_t cap = (size_t)lo->n * (HF_KEY_MAX + 8) + 1, len = 0;
        char *re = xmalloc(cap);
        re[0] = 0;
        for (int i = 0; i < lo->n; i++) {
            char mod[HF_KEY_MAX];
            hf_module(mod, sizeof mod, &t, &lo->ad[i]);
            if (i) re[len++] = '|';
            for (const char *c = mod; *c; c++) {
                if (*c == '.') re[len++] = '\\';
                re[len++] = *c;
            }
            re[len] = 0;
        }
        targets = json_string(re);
        free(re);
    }
    json_t *cfg =
        json_pack("{sssssisfsfsbsssosssbsb}", "peft_type", "LORA", "task_type", "CAUSAL_LM", "r",
                  lo->rank, "lora_alpha", lo->alpha, "lora_dropout", lo->dropout, "use_rslora",
                  lo->rslora, "bias", "none", "target_modules", targets, "base_model_name_or_path",
                  base_model, "fan_in_fan_out", 0, "inference_mode", 1);
    char *text = json_dumps(cfg, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(cfg);
    char *cfg_path = fs_join(dir, "adapter_config.json");
    char *st_path = fs_join(dir, "adapter_model.safetensors");
    int rc = fs_write_atomic(cfg_path, text, strlen(text), err);
    if (rc == 0) rc = st_write_finish(&w, st_path, err);
    free(text);
    free(cfg_path);
    free(st_path);
    st_writer_free(&w);
    hf_keys_free(&t);
    return rc;
}

/* ---- merging an adapter folder into the weights (lora_peft_merge) ---- */

/* Whether peft's pattern rule matches module name mod with pattern key: re.match of
 * "(.*\.)?(KEY)$" (peft's get_pattern_key). A key that is not a valid expression is a
 * sentence. */
static int pattern_matches(const char *key, const char *mod, const char *path, const char *field,
                           int *hit, Err *err) {
    size_t len = strlen(key) + 16;
    char *re_text = xmalloc(len);
    snprintf(re_text, len, "(?:.*\\.)?(?:%s)$", key);
    int code;
    PCRE2_SIZE at;
    pcre2_code *re =
        pcre2_compile((PCRE2_SPTR)re_text, PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED, &code, &at, NULL);
    free(re_text);
    if (!re)
        return err_set(err, "%s: %s key \"%s\" is not a regular expression peft can match", path,
                       field, key);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    *hit = pcre2_match(re, (PCRE2_SPTR)mod, strlen(mod), 0, 0, md, NULL) >= 0;
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return 0;
}

/* The value under the first key of pattern (rank_pattern, alpha_pattern: an object) that
 * matches module mod, as peft picks it; *found 0 when none does. */
static int pattern_value(const json_t *cfg, const char *field, const char *mod, const char *path,
                         double *out, int *found, Err *err) {
    const json_t *pat = json_object_get(cfg, field);
    *found = 0;
    if (!pat || json_is_null(pat)) return 0;
    if (!json_is_object(pat))
        return err_set(err, "%s: %s must be an object of module patterns and numbers", path, field);
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)pat, key, v) {
        int hit = 0;
        TRY(pattern_matches(key, mod, path, field, &hit, err));
        if (!hit) continue;
        if (!json_is_number(v) || !(json_number_value(v) > 0))
            return err_set(err, "%s: %s[\"%s\"] must be a number > 0", path, field, key);
        *out = json_number_value(v), *found = 1;
        return 0;
    }
    return 0;
}

/* What a merge has read of the file, so that a tensor it did not use is named. */
typedef struct MergeRead {
    const StFile *f;
    uint8_t *used; /* (f->n) */
} MergeRead;

static const StTensor *take(MergeRead *mr, const char *key) {
    const StTensor *t = st_find(mr->f, key);
    if (t) mr->used[t - mr->f->tensors] = 1;
    return t;
}

/* One linear's adapter merged: W (O, I) += s B A, then with DoRA each row scaled to its
 * magnitude m[o] over the merged row's norm (peft's merge of a DoRA layer:
 * m / ||W + s B A||_row * (W + s B A)). */
static int merge_linear(MergeRead *mr, const json_t *cfg, const LoraPeftConfig *pc, int dora,
                        const char *mod, float *w, int64_t O, int64_t I, const char *path,
                        int apply, Err *err) {
    char ka[HF_KEY_MAX + 64], kb[HF_KEY_MAX + 64], km[HF_KEY_MAX + 64];
    snprintf(ka, sizeof ka, "base_model.model.%s.lora_A.weight", mod);
    snprintf(kb, sizeof kb, "base_model.model.%s.lora_B.weight", mod);
    snprintf(km, sizeof km, "base_model.model.%s.lora_magnitude_vector", mod);
    const StTensor *a = take(mr, ka), *b = take(mr, kb), *m = take(mr, km);
    if (!a && (b || m))
        return err_set(err, "%s: holds %s but not %s", mr->f->path, b ? kb : km, ka);
    if (!a) return 0;
    double r = (double)pc->r, alpha = pc->alpha;
    int found;
    TRY(pattern_value(cfg, "rank_pattern", mod, path, &r, &found, err));
    TRY(pattern_value(cfg, "alpha_pattern", mod, path, &alpha, &found, err));
    int64_t R = (int64_t)r;
    if (r != (double)R)
        return err_set(err, "%s: the rank of %s is %g, not a whole number", path, mod, r);
    if (a->ndim != 2 || a->shape[0] != R || a->shape[1] != I)
        return err_set(err, "%s: %s is misshaped (expected [%lld, %lld], rank %lld)", mr->f->path,
                       ka, (long long)R, (long long)I, (long long)R);
    if (!b || b->ndim != 2 || b->shape[0] != O || b->shape[1] != R)
        return err_set(err, "%s: %s is %s (expected [%lld, %lld])", mr->f->path, kb,
                       b ? "misshaped" : "missing", (long long)O, (long long)R);
    if (dora && (!m || m->ndim != 1 || m->shape[0] != O))
        return err_set(err, "%s: %s is %s (expected [%lld]; use_dora is true)", mr->f->path, km,
                       m ? "misshaped" : "missing", (long long)O);
    if (!dora && m)
        return err_set(err, "%s: holds %s, but %s does not set use_dora", mr->f->path, km, path);
    if (!apply) return 0;
    float *fa = xmalloc((size_t)(R * I + O * R + O) * sizeof *fa), *fb = fa + R * I,
          *fm = fb + O * R;
    st_to_f32(a, fa);
    st_to_f32(b, fb);
    if (dora) st_to_f32(m, fm);
    float s = lora_scale(alpha, r, pc->rslora);
    gemm_f32(0, 0, (int)O, (int)I, (int)R, s, fb, (int)R, fa, (int)I, 1.0f, w, (int)I);
    for (int64_t o = 0; dora && o < O; o++) {
        double sq = 0.0;
        for (int64_t i = 0; i < I; i++)
            sq += (double)w[o * I + i] * w[o * I + i];
        float scale = (float)(fm[o] / sqrt(sq));
        for (int64_t i = 0; i < I; i++)
            w[o * I + i] *= scale;
    }
    free(fa);
    return 0;
}

/* trainable_token_indices for module mod: a list (the input embedding's) or an object of module
 * names (peft's rule: equal, or ending in "." + the name) and lists; *idx NULL when none. */
static int token_indices(const json_t *cfg, const char *mod, const char *embed_mod,
                         const json_t **idx) {
    const json_t *v = json_object_get(cfg, "trainable_token_indices");
    *idx = NULL;
    if (json_is_array(v)) {
        if (!strcmp(mod, embed_mod)) *idx = v;
        return 0;
    }
    const char *key;
    const json_t *ids;
    json_object_foreach((json_t *)v, key, ids) {
        size_t lk = strlen(key), lm = strlen(mod);
        if (!strcmp(mod, key) ||
            (lm > lk && mod[lm - lk - 1] == '.' && !strcmp(mod + lm - lk, key)))
            *idx = ids;
    }
    return 0;
}

/* A tensor that is neither a LoRA factor nor a magnitude: modules_to_save's whole weights
 * ("base_model.model." + an HF weight name) or trainable tokens' rows
 * ("base_model.model.<embedding>.token_adapter.trainable_tokens_delta"). */
static int merge_other(MergeRead *mr, const json_t *cfg, const HfKeyTable *t, float *const *params,
                       const StTensor *x, const char *path, int apply, Err *err) {
    static const char PREFIX[] = "base_model.model.",
                      DELTA[] = ".token_adapter.trainable_tokens_delta";
    const char *name = x->name;
    if (strncmp(name, PREFIX, sizeof PREFIX - 1) != 0)
        return err_set(err, "%s: tensor %s is not one of peft's keys (base_model.model...)",
                       mr->f->path, name);
    name += sizeof PREFIX - 1;
    size_t n = strlen(name), nd = sizeof DELTA - 1;
    char hf[HF_KEY_MAX + 16];
    if (n > nd && !strcmp(name + n - nd, DELTA)) {
        char mod[HF_KEY_MAX];
        snprintf(mod, sizeof mod, "%.*s", (int)(n - nd), name);
        snprintf(hf, sizeof hf, "%s.weight", mod);
        int h = hf_keys_find_hf(t, hf);
        const json_t *idx;
        token_indices(cfg, mod, "model.embed_tokens", &idx);
        if (h < 0 || t->hf[h].ndim != 2)
            return err_set(err, "%s: %s names no embedding of this model", mr->f->path, x->name);
        if (!json_is_array(idx))
            return err_set(err,
                           "%s: holds trainable tokens of %s, but %s's trainable_token_indices "
                           "names no token ids for it",
                           mr->f->path, mod, path);
        int64_t rows = (int64_t)json_array_size(idx), D = t->hf[h].shape[1];
        if (x->ndim != 2 || x->shape[0] != rows || x->shape[1] != D)
            return err_set(err, "%s: %s is misshaped (expected [%lld, %lld])", mr->f->path, x->name,
                           (long long)rows, (long long)D);
        for (int64_t r = 0; r < rows; r++) {
            const json_t *id = json_array_get(idx, (size_t)r);
            if (!json_is_integer(id) || json_integer_value(id) < 0 ||
                json_integer_value(id) >= t->hf[h].shape[0])
                return err_set(err,
                               "%s: trainable_token_indices for %s must be token ids below %lld",
                               path, mod, (long long)t->hf[h].shape[0]);
        }
        if (!apply) return 0;
        float *v = xmalloc((size_t)(rows * D) * sizeof *v), *w = params[t->hf[h].param];
        st_to_f32(x, v);
        for (int64_t r = 0; r < rows; r++)
            memcpy(w + json_integer_value(json_array_get(idx, (size_t)r)) * D, v + r * D,
                   (size_t)D * sizeof *w);
        free(v);
        return 0;
    }
    if (t->tied && (!strcmp(name, "lm_head.weight") || !strcmp(name, "model.embed_tokens.weight")))
        return err_set(err,
                       "%s: replaces %s alone (modules_to_save), which would untie the model's "
                       "output from its embedding; qtitan keeps them tied",
                       mr->f->path, name);
    int h = hf_keys_find_hf(t, name);
    if (is_default(json_object_get(cfg, "modules_to_save")) || h < 0)
        return err_set(err,
                       "%s: tensor %s is no LoRA factor, magnitude or trainable token of "
                       "this model%s",
                       mr->f->path, x->name,
                       h < 0 ? "" : ", and adapter_config.json sets no modules_to_save");
    const HfTensor *ht = &t->hf[h];
    if (x->numel != ht->numel || x->ndim != ht->ndim || x->shape[0] != ht->shape[0])
        return err_set(err, "%s: %s is misshaped for this model's %s", mr->f->path, x->name, name);
    if (apply)
        st_to_f32(x, params[ht->param] + (ht->expert < 0 ? 0 : (int64_t)ht->expert * ht->numel));
    return 0;
}

int lora_peft_merge(const ModelSpec *spec, float *const *params, const char *dir, Err *err) {
    char *cfg_path = fs_join(dir, "adapter_config.json");
    char *st_path = fs_join(dir, "adapter_model.safetensors");
    LoraPeftConfig pc;
    json_t *cfg = json_load_path(cfg_path, err);
    int rc = cfg ? parse_config(cfg, cfg_path, 1, &pc, err) : -1;
    int dora = 0;
    if (rc == 0) rc = json_opt_bool(cfg, "use_dora", &dora, cfg_path, err);
    const json_t *tti = rc == 0 ? json_object_get(cfg, "trainable_token_indices") : NULL;
    if (rc == 0 && tti && !json_is_null(tti) && !json_is_array(tti) && !json_is_object(tti))
        rc = err_set(err,
                     "%s: trainable_token_indices must be a list of token ids or an object "
                     "of module names and lists",
                     cfg_path);
    StFile f;
    int opened = rc == 0 && st_open(&f, st_path, err) == 0;
    if (rc == 0 && !opened) rc = -1;
    HfKeyTable t;
    hf_keys_build(&t, spec);
    MergeRead mr = {.f = opened ? &f : NULL, .used = opened ? xcalloc((size_t)f.n, 1) : NULL};
    /* Everything is checked (pass 0) before anything is merged (pass 1). */
    for (int apply = 0; apply < 2 && rc == 0; apply++) {
        for (int l = 0; rc == 0 && l < spec->n_layers; l++)
            for (int s = 0; rc == 0 && s < LORA_NSITES; s++) {
                LoraAdapter probe = {.layer = l, .site = (LoraSite)s};
                char mod[HF_KEY_MAX], name[HF_KEY_MAX + 8];
                hf_module(mod, sizeof mod, &t, &probe);
                if (!mod[0]) continue;
                snprintf(name, sizeof name, "%s.weight", mod);
                const HfTensor *ht = &t.hf[hf_keys_find_hf(&t, name)];
                rc = merge_linear(&mr, cfg, &pc, dora, mod, params[ht->param], ht->shape[0],
                                  ht->shape[1], cfg_path, apply, err);
            }
        for (int i = 0; rc == 0 && i < f.n; i++)
            if (!strstr(f.tensors[i].name, ".lora_") && (apply || !mr.used[i])) {
                mr.used[i] = 1;
                rc = merge_other(&mr, cfg, &t, params, &f.tensors[i], cfg_path, apply, err);
            }
        for (int i = 0; rc == 0 && i < f.n; i++)
            if (!mr.used[i])
                rc = err_set(err,
                             "%s: tensor %s is not an adapter of this model's linears (peft "
                             "keys like base_model.model.model.layers.0.self_attn.q_proj."
                             "lora_A.weight)",
                             st_path, f.tensors[i].name);
    }
    if (rc == 0 && f.n == 0) rc = err_set(err, "%s: holds no tensors", st_path);
    free(mr.used);
    if (opened) st_close(&f);
    hf_keys_free(&t);
    json_decref(cfg);
    free(cfg_path);
    free(st_path);
    return rc;
}
