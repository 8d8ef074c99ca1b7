/* The mapping between qtitan parameters and HF Qwen3 / Qwen3-MoE checkpoint keys, built for a
 * ModelSpec from the parameter table (core/param_table.h, which names both sides): every
 * qtitan parameter, and every HF tensor with its shape and the parameter (and expert slice)
 * it maps to.
 *
 * Expert e of a stacked (X, ...) parameter is the contiguous slice at e * (numel / X), in the
 * same row-major layout as the HF per-expert tensor, so no transposes are needed.
 *
 * Tied embeddings (tie_embeddings): there is no output.weight parameter and lm_head.weight is
 * not exported, which is what transformers' save_pretrained writes. When loading, an
 * lm_head.weight present in a tied checkpoint is ignored if its shape is (V, D) (transformers
 * re-ties it to the embedding as well) and reported as misshaped otherwise.
 *
 * A layer uses the MoE block when model_spec_layer_is_moe says so (transformers'
 * Qwen3MoeDecoderLayer rule). The spec must have passed model_spec_validate. */
#ifndef QT_HF_KEYS_H
#define QT_HF_KEYS_H

#include <stdint.h>

#include "core/err.h"
#include "core/model_spec.h"
#include "core/param_table.h"
#include "io/safetensors.h"

#define HF_KEY_MAX PARAM_NAME_MAX

typedef struct HfTensor {
    char name[HF_KEY_MAX];
    int ndim;
    int64_t shape[2];
    int64_t numel;
    int param;  /* index into HfKeyTable.params */
    int expert; /* -1: the whole parameter; else slice e of a stacked expert parameter */
} HfTensor;

typedef struct HfKeyTable {
    ParamInfo *params; /* in model order (param_list) */
    int nparams;
    HfTensor *hf; /* in transformers' state_dict order */
    int nhf;
    int tied;
    int64_t vocab, dim;
    int *param_by_name; /* indices sorted by name, for lookups */
    int *hf_by_name;
} HfKeyTable;

void hf_keys_build(HfKeyTable *t, const ModelSpec *spec);
void hf_keys_free(HfKeyTable *t);
/* Index of a parameter / HF tensor by name, or -1. */
int hf_keys_find_param(const HfKeyTable *t, const char *name);
int hf_keys_find_hf(const HfKeyTable *t, const char *hf_name);

/* Checks a set of safetensors files against the table. Lists are malloc'd sentences (one per
 * key), e.g. missing "model.norm.weight (expected [16])", unexpected "x.y [3, 4]", wrong
 * "model.norm.weight: shape [8], expected [16]" or "...: dtype I32, expected F32, BF16, F16
 * or F8_E4M3 with block scales". Returns the total number of problems. */
typedef struct HfCheck {
    char **missing, **unexpected, **wrong;
    int nmissing, nunexpected, nwrong;
} HfCheck;
int hf_keys_check(HfCheck *out, const HfKeyTable *t, const StSet *set);
void hf_check_free(HfCheck *c);

/* Fills parameter p (fp32, its full shape) from the HF tensors that map to it, converting
 * BF16/F16. Missing or misshaped tensors, and tensors holding a NaN or an infinity, are errors
 * naming the HF key (and, for a non-finite value, the element; checked in the conversion's own
 * pass, dtype_convert). */
int hf_keys_load_param(float *dst, const HfKeyTable *t, int p, const StSet *set, Err *err);
/* The same for elements [lo, lo + n) of the parameter (flattened) alone, into dst (n floats):
 * a large weight loaded a piece at a time. */
int hf_keys_load_param_range(float *dst, const HfKeyTable *t, int p, const StSet *set, int64_t lo,
                             int64_t n, Err *err);
/* Bytes an element of parameter p takes in the files: its first HF tensor's dtype (0 when the
 * set lacks it). */
size_t hf_keys_file_elem_size(const HfKeyTable *t, int p, const StSet *set);
/* hf_keys_load_param into bf16, for a weight held in bf16 only: BF16 tensors are copied as
 * they are, F32 and F16 ones rounded as f32_to_bf16 rounds (the bits an fp32 load then a cast
 * give), with the same errors. */
int hf_keys_load_param_bf16(uint16_t *dst, const HfKeyTable *t, int p, const StSet *set, Err *err);
/* Adds every exported HF tensor to w, reading from params[p] (fp32, full shape of parameter
 * p) and converting to dtype while the file is written. */
void hf_keys_add_to_writer(StWriter *w, const HfKeyTable *t, const float *const *params,
                           DType dtype);
/* Parameter p's values pulled in chunks while the file is written (st_writer_add_f32_source)
 * instead of read from params[p]: a value made on the fly, never whole in fp32. */
typedef struct HfKeySource {
    StF32Source pull; /* NULL: read params[p] */
    void *ctx;
} HfKeySource;
/* The same with params[p] in the memory of devices[p] (NULL, or devices NULL: host memory),
 * read through the device copy-out path (st_writer_add_f32_on), or pulled from sources[p]
 * when sources (may be NULL) has one for p (expert e of a stacked parameter pulled from its
 * offset on). */
void hf_keys_add_to_writer_on(StWriter *w, const HfKeyTable *t, const float *const *params,
                              const Device *const *devices, const HfKeySource *sources,
                              DType dtype);

#endif
