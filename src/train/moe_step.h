/* The MoE part of a training step for a Qwen3 model, for the trainer's before_optimizer_step
 * hook (train/trainer.h): the routing counts of the step's micro-batches (Qwen3.moe_counts)
 * are summed over the data-parallel ranks, the aux-loss-free rule updates every MoE layer's
 * expert_bias (model/moe.h), the step's load figures become metrics, and the counts restart
 * for the next step. Every rank applies the same update, so the biases stay identical. */
#ifndef QT_MOE_STEP_H
#define QT_MOE_STEP_H

#include "core/err.h"
#include "dist/comm.h"
#include "model/qwen3.h"
#include "train/metrics.h"

#define MOE_STEP_NEXTRA 3

/* comm: the data-parallel communicator (NULL or size 1: this process only). update = 0 (a
 * skipped step) restarts the counts and reports the load without touching expert_bias. Appends
 * moe_tokens_min, moe_tokens_max and moe_imbalance (max / mean tokens of an expert, largest
 * over layers; 1 = even) to extra at *nextra when the model has MoE layers and room is left
 * (cap entries in all). A dense model is left alone. */
int moe_train_step(Qwen3 *m, Comm *comm, int update, MetricsExtra *extra, int *nextra, int cap,
                   Err *err);

#endif
