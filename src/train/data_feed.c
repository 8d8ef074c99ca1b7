/* The trainer's view of a Dataset: steps to global rows, ranks and micro-batches to slices. */
#include "train/data_feed.h"

#include <string.h>

int data_feed_init(DataFeed *f, Dataset *ds, int global_rows, int rank, int ranks,
                   int micro_batches, Err *err) {
    memset(f, 0, sizeof *f);
    if (ranks < 1 || rank < 0 || rank >= ranks)
        return err_set(err, "data-parallel rank %d of %d is out of range", rank, ranks);
    if (micro_batches < 1)
        return err_set(err, "gradient accumulation steps %d must be >= 1", micro_batches);
    if (global_rows < 1 || global_rows % (ranks * micro_batches) != 0)
        return err_set(err,
                       "training.global_batch_size %d is not a positive multiple of %d "
                       "data-parallel rank(s) x %d micro-batch(es)",
                       global_rows, ranks, micro_batches);
    f->ds = ds;
    f->global_rows = global_rows;
    f->rank = rank;
    f->ranks = ranks;
    f->micro_batches = micro_batches;
    f->micro_rows = global_rows / ranks / micro_batches;
    f->base_step = 1;
    batch_alloc(&f->batch, f->micro_rows, ds->opt.seq_len);
    return 0;
}

void data_feed_free(DataFeed *f) {
    batch_free(&f->batch);
    memset(f, 0, sizeof *f);
}

static int bind_step(DataFeed *f, int64_t step, Err *err) {
    if (f->base_step < 0) f->base_step = step;
    if (step < f->base_step)
        return err_set(err, "data step %lld comes before the resumed step %lld", (long long)step,
                       (long long)f->base_step);
    return 0;
}

static int feed_count(void *ctx, int64_t step, int64_t *tokens, int64_t *valid, Err *err) {
    DataFeed *f = ctx;
    TRY(bind_step(f, step, err));
    int64_t T = f->ds->opt.seq_len;
    /* Packed rows have a label at every position. */
    *tokens = (int64_t)(f->global_rows / f->ranks) * T;
    *valid = (int64_t)f->global_rows * T;
    return 0;
}

static int feed_next(void *ctx, int64_t step, int micro, const void **batch, Err *err) {
    DataFeed *f = ctx;
    TRY(bind_step(f, step, err));
    if (micro < 0 || micro >= f->micro_batches)
        return err_set(err, "micro-batch %d of %d is out of range", micro, f->micro_batches);
    f->ds->next_row = f->base_row + (step - f->base_step) * f->global_rows;
    int first = f->rank * (f->global_rows / f->ranks) + micro * f->micro_rows;
    TRY(dataset_batch(f->ds, f->global_rows, first, f->micro_rows, &f->batch, err));
    f->last_step = step;
    *batch = &f->batch;
    return 0;
}

static json_t *feed_position(void *ctx) {
    DataFeed *f = ctx;
    int64_t done =
        f->base_step >= 0 && f->last_step >= f->base_step ? f->last_step - f->base_step + 1 : 0;
    f->ds->next_row = f->base_row + done * f->global_rows;
    DatasetState st;
    dataset_state_save(f->ds, &st);
    return dataset_state_to_json(&st);
}

static int feed_restore(void *ctx, const json_t *position, Err *err) {
    DataFeed *f = ctx;
    DatasetState st;
    TRY(dataset_state_from_json(position, &st, "train_state.json data position", err));
    TRY(dataset_state_restore(f->ds, &st, err));
    f->base_row = st.row;
    f->base_step = -1;
    f->last_step = 0;
    return 0;
}

void data_feed_bind(DataFeed *f, TrainData *td) {
    memset(td, 0, sizeof *td);
    td->ctx = f;
    td->count = feed_count;
    td->next = feed_next;
    td->position = feed_position;
    td->restore = feed_restore;
}
