/* Qwen3 as a TrainModel: the parameter table viewed as checkpoint tensors, and the model's
 * forward / backward behind the trainer's forward_backward call. */
#include "train/train_qwen3.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "io/hf_keys.h"
#include "io/safetensors.h"
#include "kernels/overrides.h"
#include "model/qwen3.h"
#include "train/moe_step.h"

struct TrainQwen3 {
    Qwen3 m;
    CkptTensor *params; /* (nparams) */
    float **grads;      /* (nparams) */
    int *decay;         /* (nparams) */
};

TrainQwen3 *train_qwen3_create(const ModelSpec *spec, int B, int T, int full_ac, Err *err) {
    return train_qwen3_create_with(spec, B, T, full_ac, NULL, err);
}

TrainQwen3 *train_qwen3_create_with(const ModelSpec *spec, int B, int T, int full_ac,
                                    const OverridePlan *plan, Err *err) {
    TrainQwen3 *q = xcalloc(1, sizeof *q);
    /* The fast CPU kernels by default; QT_KERNELS=reference runs the plain references. */
    Qwen3Modules *mod = xmalloc(sizeof *mod);
    if (plan)
        overrides_apply(plan, mod);
    else if (!overrides_cpu_defaults(spec, mod))
        log_info("kernels: references (QT_KERNELS=reference)");
    int rc = qwen3_create_with(&q->m, spec, B, T, full_ac ? AC_FULL : AC_NONE, mod, err);
    free(mod);
    if (rc != 0) {
        free(q);
        return NULL;
    }
    int n = q->m.nparams;
    q->params = xcalloc((size_t)n, sizeof *q->params);
    q->grads = xcalloc((size_t)n, sizeof *q->grads);
    q->decay = xcalloc((size_t)n, sizeof *q->decay);
    for (int i = 0; i < n; i++) {
        const Qwen3Param *p = &q->m.table[i];
        q->params[i] =
            (CkptTensor){p->name, p->ndim, {p->shape[0], p->shape[1], p->shape[2]}, p->data};
        q->grads[i] = p->grad;
    }
    return q;
}

void train_qwen3_free(TrainQwen3 *q) {
    if (!q) return;
    qwen3_free(&q->m);
    free(q->params);
    free(q->grads);
    free(q->decay);
    free(q);
}

int train_qwen3_enable_bf16(TrainQwen3 *q, Err *err) {
    return qwen3_enable_bf16(&q->m, err);
}

void train_qwen3_init(TrainQwen3 *q, uint64_t seed) {
    qwen3_init_params(&q->m, seed);
}

int train_qwen3_hf_name(char *out, size_t cap, const char *qt) {
    static const char *const map[][2] = {
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
    int layer, n = 0;
    if (sscanf(qt, "layers.%d.%n", &layer, &n) == 1 && n > 0) {
        for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
            if (strcmp(qt + n, map[i][0]) == 0) {
                snprintf(out, cap, "model.layers.%d.%s", layer, map[i][1]);
                return 0;
            }
        return -1;
    }
    if (strcmp(qt, "tok_embeddings.weight") == 0)
        snprintf(out, cap, "model.embed_tokens.weight");
    else if (strcmp(qt, "norm.weight") == 0)
        snprintf(out, cap, "model.norm.weight");
    else if (strcmp(qt, "output.weight") == 0)
        snprintf(out, cap, "lm_head.weight");
    else
        return -1;
    return 0;
}

int train_qwen3_load_hf(TrainQwen3 *q, const char *path, Err *err) {
    StSet set;
    TRY(st_set_open(&set, path, err));
    HfKeyTable keys = {0};
    if (q->m.n_moe_layers) hf_keys_build(&keys, &q->m.spec);
    int rc = 0;
    for (int i = 0; i < q->m.nparams && rc == 0; i++) {
        const Qwen3Param *p = &q->m.table[i];
        if (p->is_buffer) continue; /* moe.expert_bias: not in HF files, starts at zero */
        if (strstr(p->name, ".moe.")) {
            /* Router and stacked experts: io/hf_keys knows the per-expert HF tensors. */
            int k = hf_keys_find_param(&keys, p->name);
            if (k < 0) {
                rc = err_set(err, "model: parameter %s has no Hugging Face name", p->name);
                break;
            }
            rc = hf_keys_load_param(p->data, &keys, k, &set, err);
            if (rc) err_wrap(err, "%s", path);
            continue;
        }
        char name[160];
        if (train_qwen3_hf_name(name, sizeof name, p->name) != 0) {
            rc = err_set(err, "model: parameter %s has no Hugging Face name", p->name);
            break;
        }
        const StTensor *t = st_set_find(&set, name);
        if (!t) {
            rc = err_set(err, "%s: no tensor %s (for %s)", path, name, p->name);
            break;
        }
        int same = t->ndim == p->ndim && t->numel == p->numel;
        for (int k = 0; same && k < p->ndim; k++)
            same = t->shape[k] == p->shape[k];
        if (!same || (t->dtype != DT_F32 && t->dtype != DT_BF16 && t->dtype != DT_F16)) {
            rc = err_set(err,
                         "%s: tensor %s has dtype %s and %lld elements, expected F32, BF16 or "
                         "F16 with %ld elements",
                         path, name, dtype_name(t->dtype), (long long)t->numel, p->numel);
            break;
        }
        st_to_f32(t, p->data);
    }
    if (q->m.n_moe_layers) hf_keys_free(&keys);
    st_set_close(&set);
    return rc;
}

static int forward_backward(void *ctx, const void *batch, double divisor, double *loss_sum,
                            Err *err) {
    TrainQwen3 *q = ctx;
    const TrainQwen3Batch *b = batch;
    if (b->B > q->m.max_B || b->T > q->m.max_T)
        return err_set(err,
                       "model: a micro-batch of %d x %d tokens exceeds the %d x %d the "
                       "activations were sized for",
                       b->B, b->T, q->m.max_B, q->m.max_T);
    qwen3_forward(&q->m, b->tokens, b->targets, b->positions, b->doc, b->B, b->T);
    qwen3_backward(&q->m, divisor);
    *loss_sum = q->m.loss_sum;
    return 0;
}

/* MoE: expert_bias update from the step's routing counts and the load metrics. Single process
 * for now; with data parallelism the counts are summed over the ranks first (moe_step.h). */
static int before_optimizer_step(void *ctx, MetricsExtra *extra, int *nextra, Err *err) {
    TrainQwen3 *q = ctx;
    return moe_train_step(&q->m, NULL, extra, nextra, TRAIN_MAX_EXTRA, err);
}

void train_qwen3_set_micro_batches(TrainQwen3 *q, int micro_batches) {
    q->m.aux_weight = 1.0 / (micro_batches > 0 ? micro_batches : 1);
}

void train_qwen3_model(TrainQwen3 *q, TrainModel *out, int exempt) {
    for (int i = 0; i < q->m.nparams; i++)
        /* expert_bias is balancing state: zero gradient, and it must not decay. */
        q->decay[i] =
            q->m.table[i].is_buffer ? 0 : adamw_default_decay(q->m.table[i].name, exempt, exempt);
    *out = (TrainModel){.ctx = q,
                        .nparams = q->m.nparams,
                        .params = q->params,
                        .grads = q->grads,
                        .decay = q->decay,
                        .forward_backward = forward_backward,
                        .before_optimizer_step = q->m.n_moe_layers ? before_optimizer_step : NULL};
}
