/* Feeds the trainer (TrainData) from a Dataset: the one mapping from global rows to ranks and
 * micro-batches, which `qtitan train` runs and the tests check. Optimizer step s (1-based)
 * takes G = global_batch rows of the packed stream, [base + (s - s0) * G, ... + G), where
 * (base, s0) = (0, 1) for a fresh run, so the rows depend only on the data, the seed and the
 * step. Within the step, micro-batch k of data-parallel rank d reads local_batch rows from
 * mesh_first_row: micro-batch k of all ranks together is one run of consecutive rows, so 1, 2
 * or 4 processes (or more accumulation steps) see the same rows every step; tensor-parallel
 * peers read the same rows. How many micro-batches a step has, and the checks that G splits
 * evenly, are the mesh's (mesh_resolve: grad_accum_steps), which `qtitan plan` reports.
 * Chat data (text/chat_data.h) is fed the same way, by the same row numbers; its rows carry
 * -100 targets outside assistant output, so a step's labels are counted, not G x seq_len. */
#ifndef QT_DATA_FEED_H
#define QT_DATA_FEED_H

#include <stdint.h>

#include "dist/mesh.h"
#include "text/chat_data.h"
#include "text/dataset.h"
#include "train/train_qwen3.h"
#include "train/trainer.h"

typedef struct DataFeed {
    Dataset *ds;        /* packed text, or NULL */
    ChatData *chat;     /* chat rows, or NULL: exactly one of the two is set */
    int T;              /* seq_len */
    MeshDims dims;      /* the job's mesh: dp, dp_rank, global_batch, grad_accum_steps */
    int B;              /* rows per micro-batch: global_batch / (dp x grad_accum_steps) */
    Batch raw;          /* (B, seq_len) rows as the dataset reads them */
    int32_t *tokens;    /* (B, seq_len) raw.tokens as the model's int32 ids */
    TrainQwen3Batch mb; /* what next() hands the model */
    int64_t base_row;
    int64_t base_step; /* -1: taken from the first step asked for after a restore */
    int64_t last_step; /* last step read, 0 before any */
} DataFeed;

/* A feed of ds for the rank of dims (from mesh_resolve). */
void data_feed_init(DataFeed *f, Dataset *ds, const MeshDims *dims);
/* A feed of chat rows; its checkpoint position is {row, conversations, tokens}, the data's
 * size telling a changed file on resume. */
void data_feed_init_chat(DataFeed *f, ChatData *chat, const MeshDims *dims);
void data_feed_free(DataFeed *f);
/* Points td at f: next() gives a `const TrainQwen3Batch *`; count() gives this rank's input
 * tokens and the global number of labels (the loss denominator, all ranks and micro-batches). */
void data_feed_bind(DataFeed *f, TrainData *td);

#endif
