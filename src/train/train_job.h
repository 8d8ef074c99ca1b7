/* `qtitan train`: builds everything a job config describes (model spec, tokenizer, dataset,
 * model, optimizer, schedule, metrics, checkpoints) and runs the trainer. */
#ifndef QT_TRAIN_JOB_H
#define QT_TRAIN_JOB_H

#include "core/config.h"
#include "core/err.h"

int train_job_run(const JobConfig *cfg, Err *err);

#endif
