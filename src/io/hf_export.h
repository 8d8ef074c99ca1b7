/* Writes a Hugging Face model directory from fp32 parameters under qtitan names: config.json
 * (every field transformers needs, torch_dtype = the export dtype), the weights as
 * model.safetensors or shards with model.safetensors.index.json (through io/hf_keys' table, so
 * lm_head.weight is left out when the embeddings are tied and MoE expert_bias is never
 * written), and the tokenizer files. Used by `qtitan export` and checkpoint.last_save_in_hf.
 *
 * The directory is built under OUT.tmp-<pid> and renamed into place, so a failed export leaves
 * no half-written OUT; an existing OUT is replaced only when it is empty or an HF directory
 * (has config.json). */
#ifndef QT_HF_EXPORT_H
#define QT_HF_EXPORT_H

#include <stddef.h>
#include <stdint.h>

#include "core/device.h"
#include "core/dtype.h"
#include "core/err.h"
#include "core/model_spec.h"
#include "io/hf_config.h"
#include "io/hf_keys.h"

/* transformers' save_pretrained default max_shard_size, "5GB". */
#define HF_EXPORT_DEFAULT_SHARD ((size_t)5000 * 1000 * 1000)

/* Tokenizer files copied when present (transformers' names). */
extern const char *const HF_TOKENIZER_FILES[];
extern const int HF_NTOKENIZER_FILES;

/* Copies the tokenizer files of src (a folder: those of HF_TOKENIZER_FILES it holds; a file:
 * as tokenizer.json) into dir; src NULL or "" copies nothing. */
int hf_export_copy_tokenizer(const char *src, const char *dir, Err *err);

typedef struct HfExportOptions {
    DType dtype;                /* DT_F32, DT_BF16 or DT_F16 */
    size_t max_shard_bytes;     /* 0 = HF_EXPORT_DEFAULT_SHARD */
    const HfConfigExtra *extra; /* bos / eos token ids for config.json; NULL = none */
    const char *tokenizer;      /* directory holding tokenizer files, a tokenizer.json file, or
                                   NULL / "" = no tokenizer files */
    /* When not NULL: written as chat_template.jinja (which transformers reads before
     * tokenizer_config.json's chat_template), over the tokenizer's own: the template a run
     * trained with (training.chat_template_path). */
    const char *chat_template;
    size_t chat_template_len;
} HfExportOptions;

/* One parameter: qtitan name, element count and fp32 values. */
typedef struct HfExportTensor {
    const char *name;
    int64_t numel;
    const float *data; /* (numel) */
    /* The device data lives on (NULL = host memory): the export reads it only through
     * device_host_view, a bounded chunk at a time. */
    const Device *device;
    /* With data NULL: the values pulled from source in chunks instead (a weight made on the
     * fly, e.g. a bf16 base's weight widened with its LoRA adapter merged, or a sharded
     * model's parameter gathered one unit at a time), never whole in fp32 here. */
    HfKeySource source;
} HfExportTensor;

/* 0 unless out_dir is a training checkpoint: a step (train_state.json) or a sharded
 * checkpoint folder (latest.json). Both also hold a config.json, so an export there would
 * replace the checkpoint, e.g. on `qtitan export --checkpoint STEP --out STEP`. */
int hf_export_check_not_checkpoint(const char *out_dir, Err *err);
/* 0 when out_dir may be replaced by an export: absent, empty, or holding only the files an
 * export writes (config.json, model*.safetensors, the index, tokenizer files). Anything else
 * (a README, .git, a training checkpoint) is an error naming it: replacing the directory
 * would delete it. Every exporter checks here before it writes. */
int hf_export_check_out_dir(const char *out_dir, Err *err);
/* Writes out_dir for spec from the n tensors, which must hold every exported parameter of
 * spec's name table with its element count; a tensor that is not a parameter of spec is an
 * error, except MoE expert_bias (training state, skipped). */
int hf_export(const char *out_dir, const ModelSpec *spec, const HfExportTensor *tensors, int n,
              const HfExportOptions *o, Err *err);

/* Parses a size like "5GB", "500MB", "2GiB", "1000" (bytes) into *out. */
int hf_parse_size(const char *text, size_t *out, Err *err);

#endif
