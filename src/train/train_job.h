/* `qtitan train`: builds everything a job config describes (model spec, tokenizer, dataset,
 * model, optimizer, schedule, metrics, checkpoints) and runs the trainer. */
#ifndef QT_TRAIN_JOB_H
#define QT_TRAIN_JOB_H

#include "core/config.h"
#include "core/err.h"
#include "dist/comm.h"

/* world: the job's communicator (comm_init), or NULL for one process without MPI. */
int train_job_run(const JobConfig *cfg, Comm *world, Err *err);

#endif
