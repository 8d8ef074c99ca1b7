/* HF model directory export: config.json, safetensors shards + index, tokenizer files. */
#include "io/hf_export.h"

#include <ctype.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fs.h"
#include "io/hf_keys.h"
#include "io/safetensors.h"

/* chat_template.jinja: where transformers 5 saves a tokenizer's chat template (and reads it
 * first). */
const char *const HF_TOKENIZER_FILES[] = {"tokenizer.json",      "tokenizer_config.json",
                                          "chat_template.jinja", "special_tokens_map.json",
                                          "vocab.json",          "merges.txt",
                                          "added_tokens.json",   "generation_config.json"};
const int HF_NTOKENIZER_FILES = sizeof HF_TOKENIZER_FILES / sizeof HF_TOKENIZER_FILES[0];

static const char *torch_dtype_name(DType d) {
    return d == DT_F32 ? "float32" : d == DT_BF16 ? "bfloat16" : d == DT_F16 ? "float16" : NULL;
}

/* The HF name of element `elem` of parameter k (a stacked expert parameter: its expert's). */
static const char *hf_name_of(const HfKeyTable *tab, int k, int64_t elem) {
    const char *name = NULL;
    for (int j = 0; j < tab->nhf; j++) {
        const HfTensor *h = &tab->hf[j];
        if (h->param != k) continue;
        if (h->expert < 0 || elem / h->numel == h->expert) return h->name;
        if (!name) name = h->name;
    }
    return name ? name : tab->params[k].name;
}

/* An export must load into a working model: a NaN or an infinity, or a value that float16
 * rounds to an infinity (|x| >= 65520, as torch's .half() does), is an error naming the tensor
 * (qtitan's name and, as the files call it, the HF one) rather than a directory whose logits
 * come out NaN in transformers. */
static int check_values(const HfExportTensor *t, DType dtype, const HfKeyTable *tab, int k,
                        Err *err) {
    enum { STAGE = 4096 };
    float stage[STAGE];
    const Device *dev = t->device ? t->device : &device_cpu;
    const float *view = NULL;
    for (int64_t e = 0; e < t->numel; e++) {
        if (e % STAGE == 0) {
            int64_t m = t->numel - e < STAGE ? t->numel - e : STAGE;
            if (!t->data) {
                TRY(t->source.pull(t->source.ctx, stage, (size_t)e, (size_t)m, err));
                view = stage;
            } else {
                view = device_host_view(dev, stage, t->data + e, (size_t)m * sizeof *stage);
            }
        }
        float x = view[e % STAGE];
        if (!isfinite(x))
            return err_set(err, "tensor %s (%s) holds %s at element %lld; weights must be finite",
                           t->name, hf_name_of(tab, k, e), isnan(x) ? "a NaN" : "an infinity",
                           (long long)e);
        if (dtype == DT_F16 && fabsf(x) >= 65520.0f)
            return err_set(err,
                           "tensor %s (%s) holds %g at element %lld, beyond float16's range "
                           "(65504); export as bfloat16 or float32",
                           t->name, hf_name_of(tab, k, e), (double)x, (long long)e);
    }
    return 0;
}

static int copy_file(const char *from, const char *to, Err *err) {
    char *data;
    size_t len;
    TRY(fs_read_all(from, &data, &len, err));
    int rc = fs_write_atomic(to, data, len, err);
    free(data);
    return rc;
}

int hf_export_copy_tokenizer(const char *src, const char *dir, Err *err) {
    if (!src || !*src) return 0;
    if (!fs_is_dir(src)) {
        if (!fs_exists(src)) return err_set(err, "tokenizer %s does not exist", src);
        char *to = fs_join(dir, "tokenizer.json");
        int rc = copy_file(src, to, err);
        free(to);
        return rc;
    }
    int rc = 0;
    for (int i = 0; i < HF_NTOKENIZER_FILES && rc == 0; i++) {
        char *from = fs_join(src, HF_TOKENIZER_FILES[i]), *to = fs_join(dir, HF_TOKENIZER_FILES[i]);
        if (fs_exists(from)) rc = copy_file(from, to, err);
        free(from);
        free(to);
    }
    return rc;
}

/* 1 for a file name an export writes. */
static int export_file_name(const char *name) {
    if (strcmp(name, "config.json") == 0 || strcmp(name, "model.safetensors") == 0 ||
        strcmp(name, "model.safetensors.index.json") == 0)
        return 1;
    for (int i = 0; i < HF_NTOKENIZER_FILES; i++)
        if (strcmp(name, HF_TOKENIZER_FILES[i]) == 0) return 1;
    unsigned a, b;
    int end = 0;
    return sscanf(name, "model-%5u-of-%5u.safetensors%n", &a, &b, &end) == 2 && name[end] == 0 &&
           strlen(name) == strlen("model-00001-of-00001.safetensors");
}

int hf_export_check_out_dir(const char *out_dir, Err *err) {
    TRY(hf_export_check_not_checkpoint(out_dir, err));
    if (!fs_exists(out_dir)) return 0;
    if (!fs_is_dir(out_dir))
        return err_set(err, "%s exists and is not a directory; choose another output", out_dir);
    DIR *d = opendir(out_dir);
    SYS_CHECK(d != NULL, err, "cannot list %s", out_dir);
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0 &&
            !export_file_name(e->d_name))
            rc = err_set(err,
                         "%s holds %s, which an export does not write; the export replaces the "
                         "whole directory, so remove it or choose another output",
                         out_dir, e->d_name);
    closedir(d);
    return rc;
}

static int write_dir(const char *dir, const ModelSpec *spec, const float *const *params,
                     const Device *const *devices, const HfKeySource *sources, const HfKeyTable *t,
                     const HfExportOptions *o, Err *err) {
    size_t len;
    char *cfg = model_spec_hf_config_text(spec, o->extra, torch_dtype_name(o->dtype), &len, err);
    if (!cfg) return -1;
    char *path = fs_join(dir, "config.json");
    int rc = fs_write_atomic(path, cfg, len, err);
    free(path);
    free(cfg);
    TRY(rc);
    StWriter w;
    st_writer_init(&w);
    hf_keys_add_to_writer_on(&w, t, params, devices, sources, o->dtype);
    rc = st_write_hf_shards(&w, dir,
                            o->max_shard_bytes ? o->max_shard_bytes : HF_EXPORT_DEFAULT_SHARD, err);
    st_writer_free(&w);
    TRY(rc);
    TRY(hf_export_copy_tokenizer(o->tokenizer, dir, err));
    if (o->chat_template) {
        path = fs_join(dir, "chat_template.jinja");
        rc = fs_write_atomic(path, o->chat_template, o->chat_template_len, err);
        free(path);
        TRY(rc);
    }
    return fs_sync_dir(dir, err);
}

int hf_export_check_not_checkpoint(const char *out_dir, Err *err) {
    static const char *const marks[] = {"train_state.json", "latest.json"};
    for (int i = 0; i < 2; i++)
        if (fs_exists_in(out_dir, marks[i]))
            return err_set(err,
                           "%s is a training checkpoint (it holds %s), not an HF model "
                           "directory; choose another output",
                           out_dir, marks[i]);
    return 0;
}

int hf_export(const char *out_dir, const ModelSpec *spec, const HfExportTensor *tensors, int n,
              const HfExportOptions *o, Err *err) {
    if (!torch_dtype_name(o->dtype))
        return err_set(err, "export dtype %s is not one of float32, bfloat16, float16",
                       dtype_name(o->dtype));
    TRY(hf_export_check_out_dir(out_dir, err));
    HfKeyTable t;
    hf_keys_build(&t, spec);
    const float **params = xcalloc((size_t)t.nparams + 1, sizeof *params);
    const Device **devices = xcalloc((size_t)t.nparams + 1, sizeof *devices);
    HfKeySource *sources = xcalloc((size_t)t.nparams + 1, sizeof *sources);
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        const ParamKind *kind = param_kind_of_name(tensors[i].name, NULL);
        if (kind && !kind->hf) continue; /* training state (expert_bias), not in HF files */
        int k = hf_keys_find_param(&t, tensors[i].name);
        if (k < 0)
            rc = err_set(err, "tensor %s is not a parameter of the model described by config.json",
                         tensors[i].name);
        else if (t.params[k].numel != tensors[i].numel)
            rc =
                err_set(err, "tensor %s has %lld elements, the model expects %lld", tensors[i].name,
                        (long long)tensors[i].numel, (long long)t.params[k].numel);
        else if (!tensors[i].data && !tensors[i].source.pull)
            rc = err_set(err, "tensor %s has neither values nor a source", tensors[i].name);
        else
            rc = check_values(&tensors[i], o->dtype, &t, k, err);
        if (rc == 0) {
            params[k] = tensors[i].data, devices[k] = tensors[i].device;
            if (!tensors[i].data) sources[k] = tensors[i].source;
        }
    }
    for (int k = 0; k < t.nparams && rc == 0; k++)
        if (t.params[k].kind->hf && !params[k] && !sources[k].pull)
            rc = err_set(err, "no tensor for parameter %s", t.params[k].name);
    char *parent = fs_dir_of(out_dir);
    char *tmp = fs_tmp_name(out_dir), *old = fs_tmp_name(out_dir);
    Err ignore;
    if (rc == 0) rc = fs_mkdirs(parent, err);
    if (rc == 0) rc = fs_mkdirs(tmp, err);
    if (rc == 0) rc = write_dir(tmp, spec, params, devices, sources, &t, o, err);
    if (rc == 0 && fs_exists(out_dir) && rename(out_dir, old) != 0)
        rc = err_sys(err, "cannot move %s aside", out_dir);
    if (rc == 0 && rename(tmp, out_dir) != 0) {
        rc = err_sys(err, "cannot rename %s to %s", tmp, out_dir);
        if (fs_exists(old)) rename(old, out_dir);
    }
    if (rc == 0) rc = fs_sync_dir(parent, err);
    if (fs_exists(old)) fs_remove_tree(old, &ignore);
    if (fs_exists(tmp)) fs_remove_tree(tmp, &ignore);
    if (rc != 0) err_wrap(err, "HF export to %s failed", out_dir);
    free(tmp);
    free(old);
    free(parent);
    free(params);
    free(devices);
    free(sources);
    hf_keys_free(&t);
    return rc;
}

int hf_parse_size(const char *text, size_t *out, Err *err) {
    char *end;
    double v = strtod(text, &end);
    while (isspace((unsigned char)*end))
        end++;
    static const struct {
        const char *unit;
        double mult;
    } units[] = {{"", 1},
                 {"B", 1},
                 {"KB", 1e3},
                 {"MB", 1e6},
                 {"GB", 1e9},
                 {"TB", 1e12},
                 {"KIB", 1024.0},
                 {"MIB", 1048576.0},
                 {"GIB", 1073741824.0},
                 {"TIB", 1099511627776.0}};
    char unit[8];
    size_t k = 0;
    for (; end[k] && k < sizeof unit - 1; k++)
        unit[k] = (char)toupper((unsigned char)end[k]);
    unit[k] = '\0';
    if (end == text || end[k] || !(v > 0))
        return err_set(err,
                       "size \"%s\" is not a positive number with an optional unit (B, KB, "
                       "MB, GB, KiB, MiB, GiB)",
                       text);
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcmp(unit, units[i].unit) == 0) {
            double bytes = v * units[i].mult;
            if (bytes < 1 || bytes > 1e18) return err_set(err, "size \"%s\" is out of range", text);
            *out = (size_t)bytes;
            return 0;
        }
    return err_set(err, "size \"%s\" has an unknown unit (B, KB, MB, GB, KiB, MiB, GiB)", text);
}
