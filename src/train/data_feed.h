/* Feeds the trainer (TrainData) from a Dataset: optimizer step s (1-based) takes global rows
 * [base + (s - s0) * G, ... + G) of the packed stream, where (base, s0) = (0, 1) for a fresh
 * run, so the rows depend only on the data, the seed and the step. Data-parallel rank r of N
 * reads rows [r * G/N, (r+1) * G/N) of them, in micro-batches of G/N/M consecutive rows. */
#ifndef QT_DATA_FEED_H
#define QT_DATA_FEED_H

#include "text/dataset.h"
#include "train/trainer.h"

typedef struct DataFeed {
    Dataset *ds;
    int global_rows; /* G: rows per optimizer step, all ranks together */
    int rank, ranks; /* this rank r of N data-parallel ranks */
    int micro_batches;
    int micro_rows; /* G / N / M */
    Batch batch;    /* (micro_rows, seq_len): what next() hands the model */
    int64_t base_row;
    int64_t base_step; /* -1: taken from the first step asked for after a restore */
    int64_t last_step; /* last step read, 0 before any */
} DataFeed;

/* Fails with a sentence when G is not a multiple of N * M. */
int data_feed_init(DataFeed *f, Dataset *ds, int global_rows, int rank, int ranks,
                   int micro_batches, Err *err);
void data_feed_free(DataFeed *f);
/* Points td at f: next() gives a `const Batch *`; count() gives this rank's input tokens and
 * the global number of labels (the loss denominator, all ranks and micro-batches). */
void data_feed_bind(DataFeed *f, TrainData *td);

#endif
