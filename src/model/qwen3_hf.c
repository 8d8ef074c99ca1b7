/* Qwen3 weights from HF safetensors: checks the whole set against io/hf_keys' table first, so
 * that one error lists every problem, then converts each parameter to fp32 (or to bf16, for a
 * weight held in bf16 only). */
#include "model/qwen3_hf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "io/hf_config.h"
#include "io/hf_keys.h"
#include "model/lora.h"

/* Appends "label: a, b, c" to msg (of cap bytes) while it fits; the rest are counted. */
static void list_keys(char *msg, size_t cap, const char *label, char **keys, int n) {
    if (n == 0) return;
    size_t k = strlen(msg);
    k += (size_t)snprintf(msg + k, k < cap ? cap - k : 0, "%s%d %s (", k ? "; " : "", n, label);
    int shown = 0;
    for (; shown < n && k + strlen(keys[shown]) + 40 < cap; shown++)
        k += (size_t)snprintf(msg + k, cap - k, "%s%s", shown ? ", " : "", keys[shown]);
    if (k < cap && shown < n)
        k += (size_t)snprintf(msg + k, cap - k, "%s%d more", shown ? ", and " : "", n - shown);
    if (k < cap) snprintf(msg + k, cap - k, ")");
}

int qwen3_hf_open(StSet *set, const char *path, Err *err) {
    TRY(st_set_open(set, path, err));
    if (!st_set_has_fp8(set)) return 0;
    char *dir = fs_is_dir(path) ? xstrdup(path) : fs_dir_of(path);
    char *cfg = fs_join(dir, "config.json");
    ModelSpec spec;
    HfConfigExtra extra;
    int rc = 0;
    if (!fs_exists(cfg))
        rc = err_set(err,
                     "%s holds F8_E4M3 weights, but %s, whose quantization_config says how to read "
                     "them, does not exist",
                     path, cfg);
    else if (model_spec_from_hf_config_ex(&spec, &extra, cfg, err) != 0)
        rc = -1;
    else if (extra.fp8_block[0] == 0)
        rc = err_set(err,
                     "%s holds F8_E4M3 weights, but %s has no quantization_config with "
                     "quant_method \"fp8\" (the block size of their scales)",
                     path, cfg);
    else if (st_set_pair_fp8(set, extra.fp8_block, err) < 0)
        rc = -1;
    free(cfg);
    free(dir);
    if (rc != 0) st_set_close(set);
    return rc;
}

int qwen3_hf_check(const ModelSpec *spec, const StSet *set, const char *what, Err *err) {
    HfKeyTable t;
    hf_keys_build(&t, spec);
    HfCheck c;
    int rc = 0;
    if (hf_keys_check(&c, &t, set) != 0) {
        char msg[880] = "";
        list_keys(msg, sizeof msg, "missing", c.missing, c.nmissing);
        list_keys(msg, sizeof msg, "unexpected", c.unexpected, c.nunexpected);
        list_keys(msg, sizeof msg, "misshaped", c.wrong, c.nwrong);
        rc = err_set(err, "the Hugging Face weights in %s do not fit the model: %s", what, msg);
    }
    hf_check_free(&c);
    hf_keys_free(&t);
    return rc;
}

int qwen3_load_hf(Qwen3 *m, const StSet *set, const char *what, Err *err) {
    TRY(qwen3_hf_check(&m->spec, set, what, err));
    HfKeyTable t;
    hf_keys_build(&t, &m->spec);
    int rc = 0;
    for (int i = 0; i < m->nparams && rc == 0; i++) {
        Qwen3Param *p = &m->table[i];
        if (!p->kind->hf) { /* training state (expert_bias), not in HF files */
            memset(p->data, 0, (size_t)p->numel * sizeof(float));
            continue;
        }
        int k = hf_keys_find_param(&t, p->name);
        if (k < 0 || t.params[k].numel != p->numel)
            rc = err_set(err, "model parameter %s is not in the Hugging Face name table", p->name);
        /* A weight held in bf16 only is converted straight into its copy: a BF16 file's
         * values are copied, with no fp32 pass between. */
        else if (p->data ? hf_keys_load_param(p->data, &t, k, set, err)
                         : hf_keys_load_param_bf16(p->data_bf16, &t, k, set, err))
            rc = err_wrap(err, "%s", what);
        else if (p->data)
            qwen3_param_store(m, i, p->data); /* a bf16-only model's tied output copy */
    }
    hf_keys_free(&t);
    return rc;
}

int qwen3_merge_peft(Qwen3 *m, const char *dir, Err *err) {
    HfKeyTable t;
    hf_keys_build(&t, &m->spec);
    float **params = xcalloc((size_t)t.nparams, sizeof *params);
    int rc = 0;
    for (int i = 0; i < m->nparams; i++) {
        int k = m->table[i].kind->hf ? hf_keys_find_param(&t, m->table[i].name) : -1;
        if (k >= 0) params[k] = m->table[i].data;
    }
    for (int k = 0; k < t.nparams && rc == 0; k++)
        if (!params[k])
            rc = err_set(err, "merging %s: the model holds %s in bf16 only", dir, t.params[k].name);
    if (rc == 0) rc = lora_peft_merge(&m->spec, params, dir, err);
    free(params);
    hf_keys_free(&t);
    return rc;
}
