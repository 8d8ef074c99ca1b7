/* Sharded checkpoints for a run on many processes. Rank K writes its own checkpoint, in
 * ckpt_save's format and with its commit protocol (its slices of the parameters and the
 * optimizer state, and the train state), to {root}/rank-K/step-N/; no rank ever holds the
 * whole model. Once every rank has committed step N (a collective agreement), rank 0
 * atomically rewrites {root}/latest.json: {"format", "ranks", "mesh": [dp_replicate,
 * dp_shard, tp], "step": N, "steps": [...]}, the steps every rank holds, newest last. A
 * resume needs the same mesh. That file is the commit point of the job's
 * checkpoint: a crash before it leaves the previous step current; only after it do ranks
 * remove their steps that fell out of keep_latest_k. */
#ifndef QT_CKPT_DIST_H
#define QT_CKPT_DIST_H

#include "dist/comm.h"
#include "io/safetensors.h"
#include "train/checkpoint.h"

#define CKPT_DIST_MARKER "latest.json"

/* Collective over world: every rank passes its own tensors and the job's mesh
 * [dp_replicate, dp_shard, tp]; the same result on every rank. */
int ckpt_dist_save(Comm *world, const int mesh[3], const char *root, const CkptState *st,
                   const CkptTensor *model, int nmodel, const CkptTensor *optim, int noptim,
                   int keep_latest_k, Err *err);

/* Collective: 1 with *step and *path (this rank's step directory, malloc'd) when root has a
 * committed sharded checkpoint, 0 when it has none, -1 with the same sentence on every rank
 * (e.g. one saved by a different number of processes). Removes this rank's leftovers of
 * interrupted saves first. */
int ckpt_dist_find_latest(Comm *world, const int mesh[3], const char *root, int64_t *step,
                          char **path, Err *err);

/* Reads a committed sharded checkpoint without MPI and without holding the model: every
 * rank's parameter file is mapped, and a full parameter is assembled from the ranks' pieces
 * (which, in rank order, are consecutive runs of the flattened tensor: FSDP gives shard rank
 * k the k-th slice of each unit) one tensor at a time (HF export, inspection). */
typedef struct CkptDistReader {
    int ranks;
    int64_t step;
    StFile *files; /* (ranks) rank-K/step-N/model.safetensors */
} CkptDistReader;

/* Opens the newest committed step under root (latest.json); FSDP / HSDP only (tp = 1). */
int ckpt_dist_reader_open(CkptDistReader *r, const char *root, Err *err);
void ckpt_dist_reader_close(CkptDistReader *r);
/* out (numel floats) = parameter `name`; fails when the pieces do not add up to numel. */
int ckpt_dist_reader_tensor(const CkptDistReader *r, const char *name, float *out, size_t numel,
                            Err *err);

/* This rank's folder under root (malloc'd). */
char *ckpt_dist_rank_dir(const char *root, int rank);

#endif
