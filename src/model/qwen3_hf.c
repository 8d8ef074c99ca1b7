/* qtitan <-> HF parameter names for dense Qwen3 and the weight loader. The name table is
 * private to the model until src/io/hf_keys lands; then this file uses that table. */
#include "model/qwen3_hf.h"

#include <stdio.h>
#include <string.h>

#include "io/hf_keys.h"

/* Suffix after "layers.{i}." in qtitan and HF naming. */
static const char *const LAYER_NAMES[][2] = {
    {"attention_norm.weight", "input_layernorm.weight"},
    {"attention.wq.weight", "self_attn.q_proj.weight"},
    {"attention.wk.weight", "self_attn.k_proj.weight"},
    {"attention.wv.weight", "self_attn.v_proj.weight"},
    {"attention.wo.weight", "self_attn.o_proj.weight"},
    {"attention.q_norm.weight", "self_attn.q_norm.weight"},
    {"attention.k_norm.weight", "self_attn.k_norm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"feed_forward.w1.weight", "mlp.gate_proj.weight"},
    {"feed_forward.w3.weight", "mlp.up_proj.weight"},
    {"feed_forward.w2.weight", "mlp.down_proj.weight"},
};

int qwen3_hf_name(char *out, size_t cap, const char *qt_name) {
    if (strcmp(qt_name, "tok_embeddings.weight") == 0)
        return snprintf(out, cap, "model.embed_tokens.weight") < (int)cap ? 0 : -1;
    if (strcmp(qt_name, "norm.weight") == 0)
        return snprintf(out, cap, "model.norm.weight") < (int)cap ? 0 : -1;
    if (strcmp(qt_name, "output.weight") == 0)
        return snprintf(out, cap, "lm_head.weight") < (int)cap ? 0 : -1;
    int layer, n = 0;
    if (sscanf(qt_name, "layers.%d.%n", &layer, &n) != 1 || n == 0) return -1;
    for (size_t i = 0; i < sizeof LAYER_NAMES / sizeof LAYER_NAMES[0]; i++)
        if (strcmp(qt_name + n, LAYER_NAMES[i][0]) == 0)
            return snprintf(out, cap, "model.layers.%d.%s", layer, LAYER_NAMES[i][1]) < (int)cap
                       ? 0
                       : -1;
    return -1;
}

/* MoE router and stacked experts through io/hf_keys, which knows the per-expert tensors;
 * expert_bias has no HF tensor and starts at zero. */
static int load_moe(Qwen3 *m, const StSet *set, Err *err) {
    HfKeyTable keys;
    hf_keys_build(&keys, &m->spec);
    int rc = 0;
    for (int i = 0; i < m->nparams && rc == 0; i++) {
        Qwen3Param *p = &m->table[i];
        if (!strstr(p->name, ".moe.")) continue;
        if (p->is_buffer) {
            memset(p->data, 0, (size_t)p->numel * sizeof(float));
            continue;
        }
        int k = hf_keys_find_param(&keys, p->name);
        rc = k < 0 ? err_set(err, "parameter %s has no Hugging Face name", p->name)
                   : hf_keys_load_param(p->data, &keys, k, set, err);
    }
    hf_keys_free(&keys);
    return rc;
}

int qwen3_load_hf(Qwen3 *m, const StSet *set, Err *err) {
    if (m->n_moe_layers) TRY(load_moe(m, set, err));
    for (int i = 0; i < m->nparams; i++) {
        Qwen3Param *p = &m->table[i];
        if (strstr(p->name, ".moe.")) continue;
        char hf[160];
        if (qwen3_hf_name(hf, sizeof hf, p->name))
            return err_set(err, "parameter %s has no Hugging Face name", p->name);
        const StTensor *t = st_set_find(set, hf);
        if (!t) return err_set(err, "the checkpoint has no tensor %s (for %s)", hf, p->name);
        int ok = t->ndim == p->ndim && t->numel == p->numel;
        for (int d = 0; ok && d < p->ndim; d++)
            ok = t->shape[d] == p->shape[d];
        if (!ok) {
            char want[64], got[64];
            int w = 0, g = 0;
            for (int d = 0; d < p->ndim; d++)
                w += snprintf(want + w, sizeof want - w, "%s%lld", d ? ", " : "",
                              (long long)p->shape[d]);
            for (int d = 0; d < t->ndim && g < (int)sizeof got - 24; d++)
                g += snprintf(got + g, sizeof got - g, "%s%lld", d ? ", " : "",
                              (long long)t->shape[d]);
            return err_set(err, "tensor %s has shape (%s), expected (%s) from config.json", hf, got,
                           want);
        }
        if (t->dtype != DT_F32 && t->dtype != DT_BF16 && t->dtype != DT_F16)
            return err_set(err, "tensor %s has dtype %s, expected F32, BF16 or F16", hf,
                           dtype_name(t->dtype));
        st_to_f32(t, p->data);
    }
    return 0;
}
