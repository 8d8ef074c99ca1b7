/* safetensors files: a little-endian u64 header length N, N bytes of JSON header mapping
 * tensor names to {dtype, shape, data_offsets}, then the data. Read through mmap with every
 * offset checked; written 8-byte aligned and atomically. HF model directories may shard the
 * weights over several files listed in model.safetensors.index.json. */
#ifndef QT_SAFETENSORS_H
#define QT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/device.h"
#include "core/dtype.h"
#include "core/err.h"

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER (100u * 1024u * 1024u)

typedef struct StTensor {
    char *name;
    DType dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    /* Points into the mapping. Files written by other tools need not align it to the element
     * size, so read it through st_to_f32 (or memcpy), not by casting. */
    const void *data;
    size_t nbytes;
    /* An F8_E4M3 weight read as block-quantized (st_set_pair_fp8): its values are the fp8
     * values times scale's element [row / block[0], col / block[1]]. */
    const struct StTensor *scale;
    int64_t block[2];
    int is_scale; /* this tensor is such a weight's scales, not a weight itself */
} StTensor;

typedef struct StFile {
    char *path;
    void *map;
    size_t map_len;
    StTensor *tensors; /* sorted by name */
    int n;
} StFile;

/* Maps and validates a file: header length and JSON, every dtype, shape and data_offsets,
 * and that no two tensors share bytes. `__metadata__` must be a map of strings; it is
 * checked and otherwise ignored. */
int st_open(StFile *f, const char *path, Err *err);
void st_close(StFile *f);
const StTensor *st_find(const StFile *f, const char *name);
/* Formats a shape as "[2, 3]" for error sentences. */
void st_shape_str(char *out, size_t cap, const int64_t *shape, int ndim);
/* dst[0..n) = elements [lo, lo + n) of t as dtype to (F32 or BF16), converted as
 * dtype_convert converts, integer types by value; a block-quantized F8_E4M3 weight's values
 * are multiplied by their blocks' scales in fp32 (as transformers and torch's quantized HF
 * reader dequantize), then rounded to `to`. Returns the index (from lo) of the first NaN or
 * infinity among them, or -1 when all are finite. */
int64_t st_convert_range(const StTensor *t, DType to, void *dst, int64_t lo, int64_t n);
/* Drops the mapped pages that lie wholly inside elements [lo, lo + n) of t from the process's
 * memory (they are read from the file again if touched): a loader that has converted a range
 * keeps no second copy of it in its resident memory. */
void st_release_range(const StTensor *t, int64_t lo, int64_t n);
/* The whole tensor into fp32 (st_convert_range). */
int64_t st_to_f32(const StTensor *t, float *dst);

/* Writer: collects tensors (pointers must stay valid until st_write_finish), then streams the
 * file to PATH.tmp, fsyncs it, renames it into place and fsyncs the directory. The layout is
 * the one the Python `safetensors` package writes, byte for byte: tensors ordered by dtype
 * (I64, F32, I32, BF16, F16, U8) then name, header in that order with `__metadata__` first,
 * padded with spaces so the data starts at an 8-byte aligned offset. */
/* What writing a file holds besides its tensors: the output buffer, and one chunk of fp32
 * values (ST_WRITE_CHUNK elements) pulled from a source or copied out of device memory. */
#define ST_WRITE_BUFFER_BYTES (1 << 20)
#define ST_WRITE_CHUNK (1 << 16)
/* Fills dst with elements [first, first + n) of a tensor as fp32 (st_writer_add_f32_source). */
typedef int (*StF32Source)(void *ctx, float *dst, size_t first, size_t n, Err *err);

typedef struct StWriteItem {
    char *name;
    DType dtype; /* dtype written to the file */
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;
    size_t nbytes;      /* bytes in the file (numel * dtype_size(dtype)) */
    int from_f32;       /* data is fp32 and is converted to dtype while writing */
    StF32Source source; /* when set (data NULL): the fp32 values are pulled from it */
    void *source_ctx;
    size_t source_first;  /* the tensor is the source's elements from here on */
    const Device *device; /* where data lives; its bytes are read through device_host_view */
} StWriteItem;

typedef struct StWriter {
    StWriteItem *items;
    int n, cap;
    char **meta; /* key, value, key, value, ... */
    int nmeta;
} StWriter;

void st_writer_init(StWriter *w);
/* Adds a tensor already in dtype (no conversion). */
void st_writer_add(StWriter *w, const char *name, DType dtype, int ndim, const int64_t *shape,
                   const void *data);
/* Adds an fp32 tensor to be stored as dtype (F32, BF16 or F16), converted in chunks while the
 * file is written so no converted copy of the model is ever held. */
void st_writer_add_f32(StWriter *w, const char *name, DType dtype, int ndim, const int64_t *shape,
                       const float *data);
/* The same for fp32 data in device dev's memory (a parameter, an AdamW moment): read in place
 * when dev is host-visible, else copied out chunk by chunk through a bounded staging buffer. */
void st_writer_add_f32_on(StWriter *w, const Device *dev, const char *name, DType dtype, int ndim,
                          const int64_t *shape, const float *data);
/* The same with the values pulled from source in chunks while the file is written, so the
 * tensor never exists whole in memory (HF export of a sharded checkpoint); the tensor is the
 * source's elements [first, first + numel), e.g. one expert of a stacked parameter. A failing
 * source fails the write with its sentence. */
void st_writer_add_f32_source(StWriter *w, const char *name, DType dtype, int ndim,
                              const int64_t *shape, StF32Source source, void *ctx, size_t first);
/* Sets one `__metadata__` entry (HF writes {"format": "pt"}); keys are written sorted. */
void st_writer_set_metadata(StWriter *w, const char *key, const char *value);
int st_write_finish(StWriter *w, const char *path, Err *err);
void st_writer_free(StWriter *w);

/* Writes the writer's tensors as an HF model's weights into dir (which must exist): one
 * model.safetensors when they fit in max_shard_bytes, else model-0000k-of-0000n.safetensors
 * shards filled in the order the tensors were added (a new shard starts when the next tensor
 * would overflow the current one; a tensor larger than the limit gets a shard of its own) and
 * model.safetensors.index.json with metadata.total_size and weight_map, written last. Each
 * file carries `__metadata__` {"format": "pt"} like transformers' save_pretrained. */
int st_write_hf_shards(StWriter *w, const char *dir, size_t max_shard_bytes, Err *err);

/* A set of safetensors files (one, or the shards of an HF directory) looked up by name. */
typedef struct StSet {
    StFile *files;
    int nfiles;
    /* "loading PATH" over the tensors' bytes, counted by st_set_progress: a multi-GB load on
     * a terminal shows it is moving. */
    struct Progress *progress;
} StSet;

/* path: a .safetensors file, an index file (*.safetensors.index.json), or a directory with
 * model.safetensors.index.json (preferred) or model.safetensors. With an index every listed shard
 * must exist and hold the tensors the weight_map assigns to it, and no tensor may appear in two
 * shards. */
int st_set_open(StSet *s, const char *path, Err *err);
void st_set_close(StSet *s);
/* Counts bytes of s's tensors as converted (the loaders call it per tensor). */
void st_set_progress(const StSet *s, size_t bytes);
/* The bytes the progress counts up to (st_set_open: all of the files'), for a reader that
 * reads a part of them (a sharded rank). */
void st_set_progress_total(const StSet *s, double bytes);
const StTensor *st_set_find(const StSet *s, const char *name);
/* Pairs every F8_E4M3 tensor W of s with its block scales W_scale_inv (F32, BF16 or F16, of
 * shape [ceil(rows / block[0]), ceil(cols / block[1])]), as fp8 block-quantized HF checkpoints
 * store them (quantization_config's weight_block_size gives block). An F8_E4M3 tensor that is
 * not a matrix or has no scales, or scales of another shape or dtype, is an error naming both
 * tensors and the file. Returns the number of weights paired, or -1. */
int st_set_pair_fp8(StSet *s, const int64_t block[2], Err *err);
/* 1 when s holds an F8_E4M3 tensor. */
int st_set_has_fp8(const StSet *s);

#endif
