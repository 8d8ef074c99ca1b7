/* The trainer's view of a Dataset: steps to global rows, ranks and micro-batches to rows. */
#include "train/data_feed.h"

#include <stdlib.h>
#include <string.h>

#include "core/json.h"

static void init(DataFeed *f, Dataset *ds, ChatData *chat, int T, const MeshDims *dims) {
    memset(f, 0, sizeof *f);
    f->ds = ds;
    f->chat = chat;
    f->T = T;
    f->dims = *dims;
    f->B = (int)(dims->global_batch / ((long)dims->dp * dims->grad_accum_steps));
    f->base_step = 1;
    batch_alloc(&f->raw, f->B, T);
    f->tokens = xmalloc((size_t)f->B * T * sizeof *f->tokens);
}

void data_feed_init(DataFeed *f, Dataset *ds, const MeshDims *dims) {
    init(f, ds, NULL, ds->opt.seq_len, dims);
}

void data_feed_init_chat(DataFeed *f, ChatData *chat, const MeshDims *dims) {
    init(f, NULL, chat, chat->opt.seq_len, dims);
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

/* The first global row of step (bound). */
static int64_t step_row(const DataFeed *f, int64_t step) {
    return f->base_row + (step - f->base_step) * (int64_t)f->dims.global_batch;
}

static int feed_count(void *ctx, int64_t step, int64_t *tokens, int64_t *valid, Err *err) {
    DataFeed *f = ctx;
    TRY(bind_step(f, step, err));
    /* Tokens are this rank's (throughput is per device), valid labels the whole step's (the
     * loss denominator): every position of packed text, the unmasked targets of chat rows. */
    int64_t G = f->dims.global_batch;
    *tokens = G * f->T / f->dims.dp;
    *valid = f->chat ? chat_data_labels(f->chat, step_row(f, step), (int)G) : G * f->T;
    return 0;
}

static int feed_next(void *ctx, int64_t step, int micro, const void **batch, Err *err) {
    DataFeed *f = ctx;
    TRY(bind_step(f, step, err));
    if (micro < 0 || micro >= f->dims.grad_accum_steps)
        return err_set(err, "micro-batch %d of %d is out of range", micro,
                       f->dims.grad_accum_steps);
    int64_t row = step_row(f, step) + mesh_first_row(&f->dims, f->B, micro);
    if (f->chat)
        TRY(chat_data_rows(f->chat, row, f->B, &f->raw, NULL, err));
    else
        TRY(dataset_rows(f->ds, row, f->B, &f->raw, err));
    int T = f->T;
    for (long i = 0; i < (long)f->B * T; i++)
        f->tokens[i] = (int32_t)f->raw.tokens[i];
    f->mb = (TrainQwen3Batch){.B = f->B,
                              .T = T,
                              .tokens = f->tokens,
                              .targets = f->raw.targets,
                              .positions = f->raw.positions,
                              .doc = f->raw.doc_ids,
                              .row = row};
    f->last_step = step;
    *batch = &f->mb;
    return 0;
}

static json_t *feed_position(void *ctx) {
    DataFeed *f = ctx;
    int64_t done =
        f->base_step >= 0 && f->last_step >= f->base_step ? f->last_step - f->base_step + 1 : 0;
    int64_t next_row = f->base_row + done * (int64_t)f->dims.global_batch;
    /* Chat rows are a pure function of the row index and the data: the position is the row,
     * with the data's size to tell a changed file. */
    if (f->chat)
        return json_pack("{sIsIsI}", "row", (json_int_t)next_row, "conversations",
                         (json_int_t)f->chat->n_conv, "tokens", (json_int_t)f->chat->n_tokens);
    f->ds->next_row = next_row;
    DatasetState st;
    dataset_state_save(f->ds, &st);
    return dataset_state_to_json(&st);
}

static int chat_restore(DataFeed *f, const json_t *pos, Err *err) {
    int64_t row, conv, tokens;
    const char *what = "checkpoint data_position";
    TRY(json_req_int(pos, "row", &row, what, err));
    TRY(json_req_int(pos, "conversations", &conv, what, err));
    TRY(json_req_int(pos, "tokens", &tokens, what, err));
    if (conv != f->chat->n_conv || tokens != f->chat->n_tokens)
        return err_set(err,
                       "the chat data changed since the checkpoint (%lld conversations and %lld "
                       "tokens then, %lld and %lld now)",
                       (long long)conv, (long long)tokens, (long long)f->chat->n_conv,
                       (long long)f->chat->n_tokens);
    if (row < 0) return err_set(err, "%s: row = %lld, expected >= 0", what, (long long)row);
    f->base_row = row;
    f->base_step = -1;
    f->last_step = 0;
    return 0;
}

static int feed_restore(void *ctx, const json_t *position, Err *err) {
    DataFeed *f = ctx;
    if (f->chat) return chat_restore(f, position, err);
    DatasetState st;
    TRY(dataset_state_from_json(position, &st, "checkpoint data_position", err));
    TRY(dataset_state_restore(f->ds, &st, err));
    f->base_row = st.row;
    f->base_step = -1;
    f->last_step = 0;
    return 0;
}

static void feed_restart(void *ctx) {
    DataFeed *f = ctx;
    f->base_row = 0;
    f->base_step = -1;
    f->last_step = 0;
}

void data_feed_bind(DataFeed *f, TrainData *td) {
    memset(td, 0, sizeof *td);
    td->ctx = f;
    td->count = feed_count;
    td->next = feed_next;
    td->position = feed_position;
    td->restore = feed_restore;
    td->restart = feed_restart;
}
