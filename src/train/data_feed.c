/* The trainer's view of a Dataset: steps to global rows, ranks and micro-batches to rows. */
#include "train/data_feed.h"

#include <stdlib.h>
#include <string.h>

void data_feed_init(DataFeed *f, Dataset *ds, const MeshDims *dims) {
    memset(f, 0, sizeof *f);
    f->ds = ds;
    f->dims = *dims;
    f->B = (int)(dims->global_batch / ((long)dims->dp * dims->grad_accum_steps));
    f->base_step = 1;
    int T = ds->opt.seq_len;
    batch_alloc(&f->raw, f->B, T);
    f->tokens = xmalloc((size_t)f->B * T * sizeof *f->tokens);
}

void data_feed_free(DataFeed *f) {
    batch_free(&f->raw);
    free(f->tokens);
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
    /* Packed rows have a target at every position; tokens are this rank's (throughput is per
     * device), valid labels the whole step's (the loss denominator). */
    *valid = (int64_t)f->dims.global_batch * f->ds->opt.seq_len;
    *tokens = *valid / f->dims.dp;
    return 0;
}

static int feed_next(void *ctx, int64_t step, int micro, const void **batch, Err *err) {
    DataFeed *f = ctx;
    TRY(bind_step(f, step, err));
    if (micro < 0 || micro >= f->dims.grad_accum_steps)
        return err_set(err, "micro-batch %d of %d is out of range", micro,
                       f->dims.grad_accum_steps);
    int64_t row = f->base_row + (step - f->base_step) * (int64_t)f->dims.global_batch +
                  mesh_first_row(&f->dims, f->B, micro);
    TRY(dataset_rows(f->ds, row, f->B, &f->raw, err));
    int T = f->ds->opt.seq_len;
    for (long i = 0; i < (long)f->B * T; i++)
        f->tokens[i] = (int32_t)f->raw.tokens[i];
    f->mb = (TrainQwen3Batch){.B = f->B,
                              .T = T,
                              .tokens = f->tokens,
                              .targets = f->raw.targets,
                              .positions = f->raw.positions,
                              .doc = f->raw.doc_ids};
    f->last_step = step;
    *batch = &f->mb;
    return 0;
}

static json_t *feed_position(void *ctx) {
    DataFeed *f = ctx;
    int64_t done =
        f->base_step >= 0 && f->last_step >= f->base_step ? f->last_step - f->base_step + 1 : 0;
    f->ds->next_row = f->base_row + done * (int64_t)f->dims.global_batch;
    DatasetState st;
    dataset_state_save(f->ds, &st);
    return dataset_state_to_json(&st);
}

static int feed_restore(void *ctx, const json_t *position, Err *err) {
    DataFeed *f = ctx;
    DatasetState st;
    TRY(dataset_state_from_json(position, &st, "checkpoint data_position", err));
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
