/* What a training job holds while it runs: its dump folder, locked against a second job, and
 * the agreement of every rank on which folder, dataset and tokenizer that is.
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

typedef struct TrainLock {
    int fd; /* -1 when not held (ranks other than 0 never hold it) */
    char *path;
} TrainLock;

/* Collective over world: every rank resolves cfg's dump folder, dataset and tokenizer to
 * real paths and compares them with rank 0's (relative paths from ranks started in different
 * directories would train on different data and split checkpoints between two folders); rank
 * 0 then takes the dump folder's lock. 0 on every rank, or -1 on every rank with one sentence. */
int train_lock_take(TrainLock *l, Comm *world, const JobConfig *cfg, Err *err);
/* Empties the lock file (so the next run sees a clean release) and releases the lock. */
void train_lock_release(TrainLock *l);

#endif
