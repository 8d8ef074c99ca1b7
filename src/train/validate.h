/* Validation during training (the [validation] section): every validation.freq steps and at
 * the last step, the loss of the model on a held-out dataset's first epoch (in source order,
 * packed and masked as training packs; infer/dataset_eval.h): text documents, or, when
 * training.data_format names a conversation shape, conversations of that shape rendered and
 * masked as training's are (the loss of their assistant targets), printed as
 *   validate step: N  loss: X  perplexity: Y  tokens: Z  time: Ts
 * and written to metrics.jsonl. It runs forward only, on the training model's activations
 * (validation rows x seq_len must fit the training micro-batch's tokens), and puts back the
 * MoE routing counts the step's balancing update reads, so training continues bitwise as
 * without it. On a mesh every data-parallel rank takes rows rank, rank + dp, ... (the ranks of
 * one tensor-parallel group the same rows) through the sharded model, whose forward gathers
 * the units as in training; the loss and token sums are then added over the data-parallel ranks
 * (and over the tensor-parallel group under sequence parallelism, where each rank's loss covers
 * its share of the tokens), giving the one-process figures up to rounding. */
#ifndef QT_VALIDATE_H
#define QT_VALIDATE_H

#include <stdint.h>

#include "core/config.h"
#include "core/err.h"
#include "dist/mesh.h"
#include "model/qwen3.h"
#include "text/chat_data.h"
#include "text/dataset.h"
#include "train/metrics.h"

typedef struct Validator {
    Qwen3 *m;         /* the training model (this rank's, when sharded); not owned */
    const Mesh *mesh; /* the job's mesh; not owned */
    Dataset ds;
    ChatData chat; /* instead of ds for chat data */
    int is_chat;
    int freq, rows_per_forward;
    int64_t max_targets; /* 0 = the whole first epoch; text: targets, chat data: rows */
    double *counts;      /* (L, X) saved MoE routing counts */
} Validator;

/* Opens the validation dataset with tok (the training tokenizer) for m, this rank's model on
 * mesh. */
int validator_open(Validator *v, const JobConfig *cfg, Qwen3 *m, const Mesh *mesh,
                   const Tokenizer *tok, Err *err);
void validator_close(Validator *v);
/* Validates when step is a multiple of freq or last; collective over the mesh. mw may be NULL
 * (no record written: ranks other than 0). */
int validator_after_step(Validator *v, int64_t step, int last, MetricsWriter *mw, Err *err);

#endif
