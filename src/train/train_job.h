/* `qtitan train`: builds everything a job config describes (model spec, tokenizer, dataset,
 * model, optimizer, schedule, metrics, checkpoints) and runs the trainer. */
#ifndef QT_TRAIN_JOB_H
#define QT_TRAIN_JOB_H

#include "core/config.h"
#include "core/err.h"
#include "core/model_spec.h"
#include "dist/comm.h"

/* world: the job's communicator (comm_init), or NULL for one process without MPI. */
int train_job_run(const JobConfig *cfg, Comm *world, Err *err);
/* The model the job trains: the flavor or HF config.json, the [model] field replacements,
 * validated, and checked against training.seq_len (shared with `qtitan plan`). */
int train_job_spec(const JobConfig *cfg, ModelSpec *spec, Err *err);

#endif
