/* Validation during training (see validate.h). */
#include "train/validate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/timer.h"
#include "infer/dataset_eval.h"
#include "text/chat_template.h"

int validator_open(Validator *v, const JobConfig *cfg, Qwen3 *m, const Mesh *mesh,
                   const Tokenizer *tok, Err *err) {
    memset(v, 0, sizeof *v);
    int T = cfg->validation.seq_len > 0 ? cfg->validation.seq_len : cfg->training.seq_len;
    if (mesh->dims.sequence_parallel && T % mesh->dims.tp != 0)
        return err_set(err,
                       "validation.seq_len = %d: sequence parallelism splits every row over the "
                       "%d tensor-parallel ranks, so it must be a multiple of %d",
                       T, mesh->dims.tp, mesh->dims.tp);
    long capacity = (long)m->max_B * m->max_T;
    if (T > capacity)
        return err_set(err,
                       "validation.seq_len = %d is longer than the %ld tokens of a training "
                       "micro-batch, whose activations validation reuses",
                       T, capacity);
    v->m = m;
    v->mesh = mesh;
    v->freq = cfg->validation.freq;
    v->rows_per_forward = cfg->validation.local_batch_size;
    if (v->rows_per_forward > capacity / T) v->rows_per_forward = (int)(capacity / T);
    v->is_chat = cfg->training.data_format != DATA_TEXT;
    if (cfg->validation.steps > 0)
        v->max_targets = (int64_t)cfg->validation.steps * cfg->validation.local_batch_size *
                         (v->is_chat ? 1 : T);
    char *path;
    TRY(config_validation_dataset_path(cfg, &path, err));
    DatasetEncoder enc;
    int rc = dataset_encoder_for_tokenizer(&enc, tok, err);
    if (rc == 0 && v->is_chat) {
        /* The held-out conversations as training renders, packs and masks its own, in source
         * order. */
        ChatFormat *cf = chat_format_load_at(tok, cfg->training.chat_template_path, err);
        ChatDataOptions copt = {.path = path,
                                .format = cfg->training.data_format,
                                .seq_len = T,
                                .shuffle = 0,
                                .packing = cfg->training.packing,
                                .train_on_all_tokens = cfg->training.train_on_all_tokens,
                                .too_long = cfg->training.long_conversations,
                                .what = "validation chat data"};
        rc = cf ? chat_data_open(&v->chat, &copt, cf, enc.eos_id, err) : -1;
        chat_format_free(cf);
        if (rc) err_wrap(err, "validation.dataset_path (conversations, as training.data_format)");
    } else if (rc == 0) {
        DatasetOptions opt;
        dataset_options_default(&opt);
        opt.path = path;
        opt.seq_len = T;
        opt.shuffle = 0;
        opt.document_mask = cfg->training.document_mask;
        opt.text_field = cfg->training.dataset_text_field;
        rc = dataset_open(&v->ds, &opt, &enc, err);
    }
    free(path);
    TRY(rc);
    if (m->n_moe_layers)
        v->counts = xcalloc((size_t)m->spec.n_layers * m->spec.num_experts, sizeof *v->counts);
    log_info("validation: every %d steps on %lld %s, %d x %d tokens per forward", v->freq,
             (long long)(v->is_chat ? v->chat.n_conv : v->ds.n_docs),
             v->is_chat ? "conversations" : "documents", v->rows_per_forward, T);
    return 0;
}

void validator_close(Validator *v) {
    if (!v->m) return;
    dataset_close(&v->ds);
    chat_data_close(&v->chat);
    free(v->counts);
    memset(v, 0, sizeof *v);
}

int validator_after_step(Validator *v, int64_t step, int last, MetricsWriter *mw, Err *err) {
    if (!last && step % v->freq != 0) return 0;
    Qwen3 *m = v->m;
    size_t nc = v->counts ? (size_t)m->spec.n_layers * m->spec.num_experts : 0;
    if (nc) memcpy(v->counts, m->moe_counts, nc * sizeof *v->counts);
    double t0 = now_seconds(), loss_sum = 0;
    int64_t n = 0;
    EvalPlan plan =
        v->is_chat ? eval_plan_chat(&v->chat, v->max_targets) : eval_plan(&v->ds, v->max_targets);
    EvalSource src = v->is_chat ? eval_source_chat(&v->chat) : eval_source_dataset(&v->ds);
    const MeshDims *md = &v->mesh->dims;
    int rc =
        eval_rows(m, &src, &plan, md->dp_rank, md->dp, v->rows_per_forward, &loss_sum, &n, err);
    if (nc) memcpy(m->moe_counts, v->counts, nc * sizeof *v->counts);
    TRY(rc);
    /* Token counts stay exact as doubles (below 2^53). */
    double sums[2] = {loss_sum, (double)n};
    if (md->dp > 1) TRY(comm_all_reduce_sum(v->mesh->dp, sums, 2, COMM_F64, err));
    if (md->sequence_parallel) TRY(comm_all_reduce_sum(v->mesh->tp, sums, 2, COMM_F64, err));
    loss_sum = sums[0], n = (int64_t)sums[1];
    double dt = now_seconds() - t0, loss = n ? loss_sum / (double)n : 0.0;
    log_info("validate step: %lld  loss: %.5f  perplexity: %.4f  tokens: %lld  time: %.2fs",
             (long long)step, loss, exp(loss), (long long)n, dt);
    if (!mw) return 0;
    json_t *o = json_object();
    json_object_set_new(o, "step", json_integer(step));
    json_object_set_new(o, "validation_loss", json_real(loss));
    json_object_set_new(o, "validation_perplexity", json_real(exp(loss)));
    json_object_set_new(o, "validation_tokens", json_integer(n));
    json_object_set_new(o, "validation_time_s", json_real(dt));
    rc = metrics_writer_write_json(mw, o, err);
    json_decref(o);
    /* The same scalars as TensorBoard tags (nothing when TensorBoard is off). */
    const MetricsExtra kv[] = {{"validation_loss", loss},
                               {"validation_perplexity", exp(loss)},
                               {"validation_tokens", (double)n},
                               {"validation_time_s", dt}};
    if (rc == 0) rc = metrics_log_scalars(mw, step, kv, 4, err);
    return rc;
}
