/* Loading a model for inference (see infer_model.h). */
#include "infer/infer_model.h"

#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "io/safetensors.h"
#include "model/overrides.h"
#include "model/qwen3_hf.h"

/* A checkpoint's model.safetensors holds the parameter table's own names, in F32. */
static int load_checkpoint_weights(Qwen3 *m, const char *step_dir, Err *err) {
    char *path = fs_join(step_dir, "model.safetensors");
    StFile f;
    int rc = st_open(&f, path, err);
    free(path);
    TRY(rc);
    for (int i = 0; i < m->nparams && rc == 0; i++) {
        const Qwen3Param *p = &m->table[i];
        const StTensor *t = st_find(&f, p->name);
        if (!t)
            rc = err_set(err, "%s: tensor %s of the model is missing", f.path, p->name);
        else if (t->numel != p->numel)
            rc = err_set(err, "%s: tensor %s has %lld values, the model's config needs %ld", f.path,
                         p->name, (long long)t->numel, p->numel);
        else if (p->data) {
            st_to_f32(t, p->data);
            qwen3_param_store(m, i, p->data); /* a bf16-only model's tied output copy */
        } else { /* held in bf16 only: rounded straight into its copy */
            st_convert_range(t, DT_BF16, p->data_bf16, 0, t->numel);
        }
    }
    st_close(&f);
    return rc;
}

void infer_model_add_eos(InferModel *im, int64_t id) {
    if (id < 0 || id >= im->m.spec.vocab_size) return;
    for (int i = 0; i < im->n_eos; i++)
        if (im->eos[i] == id) return;
    if (im->n_eos < (int)(sizeof im->eos / sizeof im->eos[0])) im->eos[im->n_eos++] = (int32_t)id;
}

/* Where the weights come from: an HF directory's safetensors, a checkpoint step's
 * model.safetensors, or a caller's InferWeights. */
typedef enum { FROM_HF, FROM_STEP, FROM_CALLER } WeightsFrom;

static int open_model(InferModel *im, const char *dir, WeightsFrom from, const InferWeights *w,
                      const char *adapter, int B, int T, int bf16, Err *err) {
    memset(im, 0, sizeof *im);
    const char *step_dir = from == FROM_HF ? NULL : dir;
    if (!fs_is_dir(dir))
        return err_set(err,
                       from == FROM_HF ? "model directory %s does not exist"
                                       : "checkpoint %s does not exist",
                       dir);
    im->dir = xstrdup(dir);
    char *cfg = fs_join(im->dir, "config.json");
    if (!fs_exists(cfg)) {
        err_set(err,
                step_dir ? "checkpoint %s has no config.json (the model's architecture); it was "
                           "written before checkpoints recorded it, or the file was removed"
                         : "%s has no config.json (an HF model directory needs one)",
                im->dir);
        free(cfg);
        infer_model_close(im);
        return -1;
    }
    ModelSpec spec;
    int rc = model_spec_from_hf_config_ex(&spec, &im->extra, cfg, err);
    free(cfg);
    /* HF weights are checked against config.json before the model's memory is sized: a wrong
     * vocab or shape costs a sentence, not gigabytes first. */
    StSet set;
    memset(&set, 0, sizeof set);
    if (rc == 0 && from == FROM_HF) {
        rc = qwen3_hf_open(&set, im->dir, err);
        if (rc == 0) rc = qwen3_hf_check(&spec, &set, im->dir, err);
    }
    Qwen3Modules *mod = xmalloc(sizeof *mod);
    if (rc == 0) {
        overrides_defaults(&spec, "cpu", mod);
        /* No gradients to infer; with bf16 weights no fp32 masters either, unless an adapter
         * must first be merged into them (the merge is fp32; the bf16 copies are cast after). */
        rc = bf16 && !adapter ? qwen3_create_inference_bf16(&im->m, &spec, B, T, mod, err)
                              : qwen3_create_forward(&im->m, &spec, B, T, mod, err);
    }
    free(mod);
    if (rc != 0) {
        st_set_close(&set);
        free(im->dir);
        im->dir = NULL;
        return -1;
    }
    rc = from == FROM_CALLER ? w->load(w->ctx, &im->m, err)
         : from == FROM_STEP ? load_checkpoint_weights(&im->m, im->dir, err)
                             : qwen3_load_hf(&im->m, &set, im->dir, err);
    st_set_close(&set);
    if (rc == 0 && adapter) rc = qwen3_merge_peft(&im->m, adapter, err);
    if (rc == 0 && adapter && bf16) {
        rc = qwen3_enable_bf16_for_gemv(&im->m, err);
        if (rc == 0) qwen3_refresh_bf16(&im->m);
    }
    if (rc == 0 && fs_exists_in(im->dir, "tokenizer.json")) {
        im->tok = tokenizer_load(im->dir, err);
        if (!im->tok) rc = -1;
    }
    if (rc != 0) {
        infer_model_close(im);
        return -1;
    }
    for (int i = 0; i < im->extra.n_eos; i++)
        infer_model_add_eos(im, im->extra.eos_token_id[i]);
    if (im->tok) {
        infer_model_add_eos(im, tokenizer_token_id(im->tok, "<|im_end|>"));
        infer_model_add_eos(im, tokenizer_token_id(im->tok, "<|endoftext|>"));
    }
    return 0;
}

int infer_model_open(InferModel *im, const char *hf_dir, const char *step_dir, const char *adapter,
                     int B, int T, int bf16, Err *err) {
    return open_model(im, step_dir ? step_dir : hf_dir, step_dir ? FROM_STEP : FROM_HF, NULL,
                      adapter, B, T, bf16, err);
}

int infer_model_open_from(InferModel *im, const char *dir, const InferWeights *w,
                          const char *adapter, int B, int T, int bf16, Err *err) {
    return open_model(im, dir, FROM_CALLER, w, adapter, B, T, bf16, err);
}

void infer_model_close(InferModel *im) {
    if (im->m.table) qwen3_free(&im->m);
    if (im->tok) tokenizer_free(im->tok);
    free(im->dir);
    memset(im, 0, sizeof *im);
}
