/* Checkpoints that carry their model description, and HF export from a run or a checkpoint. */
#include "train/train_hf.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "core/log.h"
#include "core/timer.h"
#include "io/safetensors.h"
#include "text/chat_template.h"
#include "train/ckpt_dist.h"

static void add_file(TrainHf *h, const char *name, char *data, size_t len) {
    int i = h->nfiles++;
    h->names[i] = xstrdup(name);
    h->data[i] = data;
    h->files[i] = (CkptFile){h->names[i], data, len};
}

int train_hf_init(TrainHf *h, const JobConfig *cfg, const ModelSpec *spec,
                  const HfConfigExtra *extra, const char *tok_path, Comm *world, Err *err) {
    memset(h, 0, sizeof *h);
    h->spec = *spec;
    if (extra) h->extra = *extra;
    h->dtype = cfg->checkpoint.export_dtype;
    h->tokenizer = tok_path;
    h->world = world;
    h->root = fs_resolve(cfg->job.dump_folder, cfg->checkpoint.folder);
    size_t len;
    if (cfg->training.chat_template_path[0]) {
        char *file = NULL;
        int rc = chat_template_read(cfg->training.chat_template_path, &h->chat_template,
                                    &h->chat_template_len, &file, err);
        free(file);
        if (rc != 0) {
            train_hf_free(h);
            return -1;
        }
    }
    char *text = model_spec_hf_config_text(spec, &h->extra, "float32", &len, err);
    if (!text) return -1;
    add_file(h, "config.json", text, len);
    FILE *f = open_memstream(&text, &len);
    if (!f) return err_sys(err, "cannot dump the job config");
    config_dump(cfg, f);
    fclose(f);
    add_file(h, "job.toml", text, len);
    for (int i = 0; i < HF_NTOKENIZER_FILES && h->nfiles < TRAIN_HF_MAX_FILES; i++) {
        const char *name = HF_TOKENIZER_FILES[i];
        char *path = NULL;
        if (h->chat_template && strcmp(name, "chat_template.jinja") == 0) {
            char *copy = xmalloc(h->chat_template_len + 1);
            memcpy(copy, h->chat_template, h->chat_template_len + 1);
            add_file(h, name, copy, h->chat_template_len);
            continue;
        }
        if (fs_is_dir(tok_path))
            path = fs_join(tok_path, name);
        else if (strcmp(name, "tokenizer.json") == 0)
            path = xstrdup(tok_path);
        if (path && fs_exists(path)) {
            int rc = fs_read_all(path, &text, &len, err);
            free(path);
            if (rc != 0) {
                train_hf_free(h);
                return -1;
            }
            add_file(h, name, text, len);
        } else {
            free(path);
        }
    }
    return 0;
}

int train_hf_write_tokenizer(const TrainHf *h, const char *dir, Err *err) {
    int rc = 0;
    for (int i = 0; i < h->nfiles && rc == 0; i++)
        for (int k = 0; k < HF_NTOKENIZER_FILES && rc == 0; k++)
            if (strcmp(h->files[i].name, HF_TOKENIZER_FILES[k]) == 0) {
                char *path = fs_join(dir, h->files[i].name);
                rc = fs_write_atomic(path, h->files[i].data, h->files[i].len, err);
                free(path);
            }
    return rc;
}

void train_hf_free(TrainHf *h) {
    for (int i = 0; i < h->nfiles; i++) {
        free(h->names[i]);
        free(h->data[i]);
    }
    free(h->root);
    free(h->chat_template);
    memset(h, 0, sizeof *h);
}

static int64_t numel_of(const CkptTensor *t) {
    int64_t n = 1;
    for (int k = 0; k < t->ndim; k++)
        n *= t->shape[k];
    return n;
}

int train_hf_on_resumed(void *ctx, Err *err) {
    TrainHf *h = ctx;
    return h->world->size > 1 ? ckpt_dist_write_config(h->world, h->root, &h->spec, &h->extra,
                                                       h->files, h->nfiles, err)
                              : 0;
}

int train_hf_on_last_save(void *ctx, const char *step_dir, Err *err) {
    TrainHf *h = ctx;
    /* The last step's sharded checkpoint is committed: rank 0 exports it, a run of elements at
     * a time from the ranks' files (FSDP and tensor-parallel pieces joined). */
    if (h->world->size > 1)
        return ckpt_dist_last_save_hf(h->world, h->root, &h->spec, &h->extra, h->dtype, err);
    const TrainModel *m = h->model;
    HfExportTensor *ts = xcalloc((size_t)m->nparams + 1, sizeof *ts);
    for (int i = 0; i < m->nparams; i++)
        ts[i] = (HfExportTensor){.name = m->params[i].name,
                                 .numel = numel_of(&m->params[i]),
                                 .data = m->params[i].data,
                                 .device = m->params[i].device};
    HfExportOptions o = {.dtype = h->dtype,
                         .extra = &h->extra,
                         .tokenizer = h->tokenizer,
                         .chat_template = h->chat_template,
                         .chat_template_len = h->chat_template_len};
    char *out = fs_join(step_dir, "hf");
    double t0 = now_seconds();
    int rc = hf_export(out, &h->spec, ts, m->nparams, &o, err);
    if (rc == 0)
        log_info("[checkpoint] exported %s (%s) in %.2f s", out,
                 h->dtype == DT_F32    ? "float32"
                 : h->dtype == DT_BF16 ? "bfloat16"
                                       : "float16",
                 now_seconds() - t0);
    free(out);
    free(ts);
    return rc;
}

int train_hf_export_checkpoint(const char *step_dir, const char *out_dir, const HfExportOptions *o,
                               Err *err) {
    TRY(ckpt_verify(step_dir, 1, err));
    TRY(ckpt_refuse_lora(step_dir, err));
    ModelSpec spec;
    HfConfigExtra extra;
    char *cfg = fs_join(step_dir, "config.json");
    if (!fs_exists(cfg)) {
        free(cfg);
        return err_set(err,
                       "%s has no config.json (a checkpoint written before checkpoints recorded "
                       "the model); it cannot be exported",
                       step_dir);
    }
    int rc = model_spec_from_hf_config_ex(&spec, &extra, cfg, err);
    free(cfg);
    TRY(rc);
    char *model_path = fs_join(step_dir, "model.safetensors");
    StFile f;
    rc = st_open(&f, model_path, err);
    free(model_path);
    TRY(rc);
    HfExportTensor *ts = xcalloc((size_t)f.n + 1, sizeof *ts);
    float **copies = xcalloc((size_t)f.n + 1, sizeof *copies);
    for (int i = 0; i < f.n && rc == 0; i++) {
        const StTensor *t = &f.tensors[i];
        if (t->dtype != DT_F32) {
            rc = err_set(err, "%s: tensor %s has dtype %s, a checkpoint holds F32", f.path, t->name,
                         dtype_name(t->dtype));
            break;
        }
        const float *data = t->data;
        /* The mapping is used in place when aligned (our writer aligns); else a copy. */
        if ((uintptr_t)t->data % sizeof(float) != 0) {
            copies[i] = xmalloc((size_t)t->numel * sizeof(float) + 1);
            st_to_f32(t, copies[i]);
            data = copies[i];
        }
        ts[i] = (HfExportTensor){.name = t->name, .numel = t->numel, .data = data};
    }
    HfExportOptions opt = *o;
    opt.extra = &extra;
    if (!opt.tokenizer || !*opt.tokenizer) opt.tokenizer = step_dir;
    if (rc == 0) rc = hf_export(out_dir, &spec, ts, f.n, &opt, err);
    for (int i = 0; i < f.n; i++)
        free(copies[i]);
    free(copies);
    free(ts);
    st_close(&f);
    return rc;
}
