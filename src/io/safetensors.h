/* safetensors files: a little-endian u64 header length N, N bytes of JSON header mapping
 * tensor names to {dtype, shape, data_offsets}, then the data. Read through mmap with every
 * offset checked; written 8-byte aligned and atomically. HF model directories may shard the
 * weights over several files listed in model.safetensors.index.json. */
#ifndef QT_SAFETENSORS_H
#define QT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

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
    const void *data; /* points into the mapping */
    size_t nbytes;
} StTensor;

typedef struct StFile {
    char *path;
    void *map;
    size_t map_len;
    StTensor *tensors; /* sorted by name */
    int n;
} StFile;

int st_open(StFile *f, const char *path, Err *err);
void st_close(StFile *f);
const StTensor *st_find(const StFile *f, const char *name);
/* Copies a tensor into fp32 (converting BF16/F16). */
void st_to_f32(const StTensor *t, float *dst);

/* Writer: collects tensors (pointers must stay valid until st_write_finish), then writes the
 * file to a temporary name, fsyncs and renames it into place. */
typedef struct StWriteItem {
    char *name;
    DType dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;
    size_t nbytes;
} StWriteItem;

typedef struct StWriter {
    StWriteItem *items;
    int n, cap;
} StWriter;

void st_writer_init(StWriter *w);
/* Adds a tensor already in dtype (no conversion). */
void st_writer_add(StWriter *w, const char *name, DType dtype, int ndim, const int64_t *shape,
                   const void *data);
int st_write_finish(StWriter *w, const char *path, Err *err);
void st_writer_free(StWriter *w);

/* A set of safetensors files (one, or the shards of an HF directory) looked up by name. */
typedef struct StSet {
    StFile *files;
    int nfiles;
} StSet;

/* path: a .safetensors file, or a directory with model.safetensors or an index file. */
int st_set_open(StSet *s, const char *path, Err *err);
void st_set_close(StSet *s);
const StTensor *st_set_find(const StSet *s, const char *name);

#endif
