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
#include "model/lora.h"
#include "model/qwen3.h"
#include "model/qwen3_hf.h"
#include "train/moe_step.h"

struct TrainQwen3 {
    Qwen3 m;
    CkptTensor *params; /* (nparams) */
    float **grads;      /* (nparams) */
    int *decay;         /* (nparams) */
    /* With LoRA: the adapters' view, 2 tensors per adapter. */
    CkptTensor *lparams;
    float **lgrads;
    char (*lnames)[80];
};

TrainQwen3 *train_qwen3_create(const ModelSpec *spec, int B, int T, AcMode ac, Err *err) {
    return train_qwen3_create_with(spec, B, T, ac, NULL, 0, err);
}

struct Qwen3Modules *train_qwen3_modules(const ModelSpec *spec, const OverridePlan *plan,
                                         int verbose) {
    Qwen3Modules *mod = xmalloc(sizeof *mod);
    if (plan) {
        /* The module tree depends only on the layers, so a tensor-parallel rank's spec (fewer
         * heads and FFN columns) has the plan's instances; the defaults are chosen for spec. */
        OverridePlan on_spec = *plan;
        on_spec.spec = *spec;
        overrides_apply(&on_spec, mod);
    } else if (!overrides_cpu_defaults(spec, mod) && verbose) {
        log_info("kernels: references (QT_KERNELS=reference)");
    }
    return mod;
}

TrainQwen3 *train_qwen3_create_with(const ModelSpec *spec, int B, int T, AcMode ac,
                                    const OverridePlan *plan, int frozen, Err *err) {
    TrainQwen3 *q = xcalloc(1, sizeof *q);
    Qwen3Modules *mod = train_qwen3_modules(spec, plan, 1);
    int rc = frozen ? qwen3_create_frozen_with(&q->m, spec, B, T, ac, mod, err)
                    : qwen3_create_with(&q->m, spec, B, T, ac, mod, err);
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
    free(q->lparams);
    free(q->lgrads);
    free(q->lnames);
    free(q);
}

int train_qwen3_enable_bf16(TrainQwen3 *q, Err *err) {
    return qwen3_enable_bf16(&q->m, err);
}

void train_qwen3_init(TrainQwen3 *q, uint64_t seed) {
    qwen3_init_params(&q->m, seed);
}

int train_qwen3_load_hf(TrainQwen3 *q, const char *path, Err *err) {
    StSet set;
    TRY(st_set_open(&set, path, err));
    int rc = qwen3_load_hf(&q->m, &set, path, err);
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
static int before_optimizer_step(void *ctx, int update, MetricsExtra *extra, int *nextra,
                                 Err *err) {
    TrainQwen3 *q = ctx;
    return moe_train_step(&q->m, NULL, update, extra, nextra, TRAIN_MAX_EXTRA, err);
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

int train_qwen3_sizes(TrainQwen3Sizes *out, const ModelSpec *spec, int B, int T, AcMode ac, int sp,
                      const OverridePlan *plan, Err *err) {
    memset(out, 0, sizeof *out);
    Qwen3Modules *mod = train_qwen3_modules(spec, plan, 0);
    Qwen3Sizes z;
    int rc = qwen3_sizes(&z, spec, B, T, ac, sp, mod, err);
    free(mod);
    TRY(rc);
    out->param_bytes = z.param_bytes;
    out->grad_bytes = z.grad_bytes;
    out->act_bytes = z.act_bytes;
    out->bf16_bytes = z.bf16_bytes;
    out->frozen_grad_bytes = z.frozen_grad_bytes;
    out->nparams = z.nparams;
    return 0;
}

void train_qwen3_model_lora(TrainQwen3 *q, Lora *lo, TrainModel *out) {
    q->m.lora = lo;
    int n = 2 * lo->n;
    q->lparams = xcalloc((size_t)n, sizeof *q->lparams);
    q->lgrads = xcalloc((size_t)n, sizeof *q->lgrads);
    q->lnames = xcalloc((size_t)n, sizeof *q->lnames);
    for (int i = 0; i < lo->n; i++) {
        LoraAdapter *ad = &lo->ad[i];
        char mod[64];
        lora_module_name(mod, sizeof mod, ad->layer, ad->site);
        snprintf(q->lnames[2 * i], sizeof q->lnames[0], "%s.lora_A", mod);
        snprintf(q->lnames[2 * i + 1], sizeof q->lnames[0], "%s.lora_B", mod);
        q->lparams[2 * i] = (CkptTensor){q->lnames[2 * i], 2, {lo->rank, ad->in}, ad->a};
        q->lparams[2 * i + 1] = (CkptTensor){q->lnames[2 * i + 1], 2, {ad->out, lo->rank}, ad->b};
        q->lgrads[2 * i] = ad->da;
        q->lgrads[2 * i + 1] = ad->db;
    }
    *out = (TrainModel){.ctx = q,
                        .nparams = n,
                        .params = q->lparams,
                        .grads = q->lgrads,
                        .forward_backward = forward_backward};
}

int train_qwen3_export_merged(TrainQwen3 *q, const char *dir, const HfExportOptions *o, Err *err) {
    Lora *lo = q->m.lora;
    for (int i = 0; lo && i < lo->n; i++)
        lora_merge(lo, &lo->ad[i],
                   lora_site_weight(&q->m.p.layers[lo->ad[i].layer], lo->ad[i].site));
    q->m.lora = NULL;
    HfExportTensor *t = xcalloc((size_t)q->m.nparams, sizeof *t);
    for (int i = 0; i < q->m.nparams; i++)
        t[i] = (HfExportTensor){q->m.table[i].name, q->m.table[i].numel, q->m.table[i].data};
    int rc = hf_export(dir, &q->m.spec, t, q->m.nparams, o, err);
    free(t);
    return rc;
}
