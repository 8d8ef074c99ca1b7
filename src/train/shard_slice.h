/* What one checkpoint file holds of one tensor, described so that any mesh can read any other
 * mesh's files: the tensor's whole shape, a box of it (the part one rank works on: a block of
 * rows or columns under tensor parallelism, a run of experts under expert parallelism, or the
 * whole tensor) and a run of that box's elements in row-major order (the rank's FSDP piece).
 * A resume on another mesh describes the slice each of its tensors wants the same way and
 * copies it out of the files' slices (shard_copy); no rank assembles whole tensors. */
#ifndef QT_SHARD_SLICE_H
#define QT_SHARD_SLICE_H

#include <jansson.h>
#include <stdint.h>

#include "core/err.h"
#include "train/checkpoint.h"

typedef struct ShardSlice {
    int ndim;
    int64_t shape[CKPT_MAX_DIMS];   /* the whole tensor */
    int64_t box_off[CKPT_MAX_DIMS]; /* the box: [box_off, box_off + box_len) in each dimension */
    int64_t box_len[CKPT_MAX_DIMS];
    int64_t start, numel; /* elements [start, start + numel) of the box, row-major */
} ShardSlice;

/* The whole tensor of ndim dimensions shape[]: the box is all of it, every element held. */
void shard_slice_whole(ShardSlice *s, int ndim, const int64_t *shape);
int64_t shard_slice_box_numel(const ShardSlice *s);
/* 1 when a and b describe the same elements of the same shape. */
int shard_slice_equal(const ShardSlice *a, const ShardSlice *b);

/* {"shape": [...], "box_offset": [...], "box_shape": [...], "start": S, "numel": N} */
json_t *shard_slice_to_json(const ShardSlice *s);
/* Parses and checks one such object (dimensions 1..CKPT_MAX_DIMS, the box inside the shape,
 * the run inside the box, no product overflowing); errors name `what` and `name`. */
int shard_slice_from_json(const json_t *j, ShardSlice *s, const char *what, const char *name,
                          Err *err);

/* One file's slice of a tensor and its F32 elements (maybe unaligned). */
typedef struct ShardSource {
    ShardSlice slice;
    const void *data; /* (slice.numel) floats */
    const char *file; /* for messages */
} ShardSource;

/* out (want->numel floats) = the elements want describes, copied from the sources (slices of
 * the same tensor: same shape; a source identical to an earlier one, such as a replicated
 * parameter on every tensor-parallel rank, is skipped). Fails with a sentence naming the first
 * element that no source, or more than one, holds. */
int shard_copy(const ShardSlice *want, float *out, const ShardSource *src, int nsrc,
               const char *name, Err *err);

#endif
