/* LoRA adapters in HF peft's folder format: adapter_config.json and adapter_model.safetensors
 * with peft's key names, which derive from the HF module names of io/hf_keys.h. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "core/json.h"
#include "io/hf_keys.h"
#include "io/safetensors.h"
#include "model/lora.h"

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
 * than A and B: set to anything but their default, they are refused, never ignored. */
static const struct {
    const char *key, *what;
} VARIANTS[] = {
    {"use_dora", "DoRA, a magnitude vector per weight"},
    {"rank_pattern", "a rank per module"},
    {"alpha_pattern", "a lora_alpha per module"},
    {"modules_to_save", "whole modules saved beside the adapters"},
    {"trainable_token_indices", "embedding rows trained beside the adapters"},
    {"lora_bias", "a bias on lora_B"},
    {"layer_replication", "layers replicated in the base model"},
    {"target_parameters", "adapters on parameters such as MoE experts"},
    {"alora_invocation_tokens", "activated LoRA, adapters on only after invocation tokens"},
    {"use_qalora", "QA-LoRA, pooled adapter inputs"},
    {"use_bdlora", "block-diagonal LoRA"},
    {"arrow_config", "Arrow routing among adapters"},
    {"monteclora_config", "MonteCLoRA"},
    {"kasa_config", "KaSA"},
};

/* peft's default for the settings above: absent, null, false, {} or []. */
static int is_default(const json_t *v) {
    return !v || json_is_null(v) || json_is_false(v) ||
           (json_is_object(v) && !json_object_size(v)) || (json_is_array(v) && !json_array_size(v));
}

static int parse_config(const json_t *cfg, const char *path, LoraPeftConfig *out, Err *err) {
    if (!json_is_object(cfg))
        return err_set(err, "%s: expected a JSON object (peft's adapter_config.json)", path);
    const json_t *type = json_object_get(cfg, "peft_type");
    if (type && !(json_is_string(type) && !strcmp(json_string_value(type), "LORA")))
        return err_set(err,
                       "%s: peft_type is %s where qtitan reads LoRA adapters only (peft_type "
                       "\"LORA\")",
                       path, json_is_string(type) ? json_string_value(type) : "not a string");
    for (size_t i = 0; i < sizeof VARIANTS / sizeof VARIANTS[0]; i++)
        if (!is_default(json_object_get(cfg, VARIANTS[i].key)))
            return err_set(err,
                           "%s: \"%s\" is set (%s), a LoRA variant qtitan does not implement; it "
                           "reads plain LoRA and rsLoRA adapters (y += s B A x)",
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
    int rc = cfg ? parse_config(cfg, path, out, err) : -1;
    json_decref(cfg);
    return rc;
}

static int read_config(const char *path, LoraPeftConfig *out, Err *err) {
    json_t *cfg = json_load_path(path, err);
    int rc = cfg ? parse_config(cfg, path, out, err) : -1;
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
