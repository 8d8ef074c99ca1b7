/* Checkpoints written beside training (checkpoint.async_mode = "async", torchtitan's): the
 * step's tensors and state are copied into a staging buffer between two steps, and a thread
 * writes them with ckpt_save (one process) or ckpt_dist_write (this rank's files of a sharded
 * checkpoint) while the next steps run. The files are those of a synchronous save, byte for
 * byte. A one-process step commits in the thread (the same rename); a sharded one is committed
 * by the trainer with ckpt_dist_commit, collectively, at the first step boundary after every
 * rank's write has finished (train/trainer.c). */
#ifndef QT_CKPT_ASYNC_H
#define QT_CKPT_ASYNC_H

#include "train/checkpoint.h"
#include "train/shard_slice.h"

typedef struct CkptAsync CkptAsync;

/* A writer with no staging yet (it grows on the first start). */
CkptAsync *ckpt_async_new(void);
/* Waits for a write in flight, then frees. */
void ckpt_async_free(CkptAsync *a);

/* Where a started write goes: a one-process root (ranks = 0; pruned to keep_latest_k there) or
 * rank `rank` of `ranks` under a sharded root with the job's mesh and each tensor's slice. */
typedef struct CkptAsyncTarget {
    const char *root;
    int keep_latest_k;
    int rank, ranks;
    const int *mesh;          /* [4], sharded only */
    const ShardSlice *slices; /* (nmodel) or NULL, sharded only */
} CkptAsyncTarget;

/* Copies st (the data position and config by deep copy; its extra files stay the caller's and
 * must outlive the write), model and optim into the staging buffer and starts the write. Only
 * one write at a time: call after ckpt_async_wait. -1 with a sentence when the thread cannot
 * start (nothing is written then). */
int ckpt_async_start(CkptAsync *a, const CkptAsyncTarget *to, const CkptState *st,
                     const CkptTensor *model, int nmodel, const CkptTensor *optim, int noptim,
                     Err *err);
/* 1 while a write is in flight and unfinished; 0 when none is or it has finished (wait then
 * returns at once). Never blocks. */
int ckpt_async_busy(const CkptAsync *a);
/* 1 when a write has been started and not yet waited for. */
int ckpt_async_pending(const CkptAsync *a);
/* Blocks until the write in flight finishes; 0 (or -1 with its sentence) for that write, 0 when
 * none was started. *step and *seconds (either may be NULL): its step and how long it took. */
int ckpt_async_wait(CkptAsync *a, int64_t *step, double *seconds, Err *err);
/* Bytes of staging it holds. */
size_t ckpt_async_staging_bytes(const CkptAsync *a);

#endif
