/* What a training job holds while it runs: its dump folder (and an absolute checkpoint
 * folder), locked against a second job, and the agreement of every rank on which folder that
 * is.
 *
 * The lock is flock(2) on {dump_folder}/.qtitan.lock, taken by rank 0 before anything is
 * written there and held until the process ends: the kernel releases it on any exit, SIGKILL
 * included, so a crashed run never blocks the next one. The file records the holder's pid and
 * host; a second job on the folder stops with a sentence naming them. A lock file still holding
 * a pid when the lock is free is a run that died without releasing it: the new run takes it
 * over with a notice. */
#ifndef QT_TRAIN_LOCK_H
#define QT_TRAIN_LOCK_H

#include "core/config.h"
#include "core/err.h"
#include "dist/comm.h"

#define TRAIN_LOCK_FILE ".qtitan.lock"

/* The dump folder's lock, and an absolute checkpoint.folder's. */
#define TRAIN_LOCK_MAX 2

typedef struct TrainLock {
    int fd[TRAIN_LOCK_MAX]; /* -1 when not held (ranks other than 0 never hold one) */
    char *path[TRAIN_LOCK_MAX];
} TrainLock;

/* Collective over world: rank 0 takes the dump folder's lock, writing "pid P on HOST" into
 * it; every other rank then reads that line through its own job.dump_folder (a relative path
 * from another working directory names another folder and fails; one shared folder mounted
 * under different paths passes). A job with checkpoint.enable and an absolute
 * checkpoint.folder (outside the dump folder, whose lock covers a relative one) locks and
 * checks that folder the same way: two runs with their own dump folders would otherwise share
 * it, and ranks on hosts with their own disks would resume from different checkpoints. The
 * tokenizer, the data and the initial weights are compared by content once opened
 * (train_job.c). 0 on every rank, or -1 on every rank with one sentence. */
int train_lock_take(TrainLock *l, Comm *world, const JobConfig *cfg, Err *err);
/* Empties the lock file (so the next run sees a clean release) and releases the lock. */
void train_lock_release(TrainLock *l);

#endif
