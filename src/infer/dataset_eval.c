/* Loss and byte counts of a dataset's first epoch (see dataset_eval.h). */
#include "infer/dataset_eval.h"

#include <stdlib.h>
#include <string.h>

#include "ops/cross_entropy.h"

EvalPlan eval_plan(const Dataset *ds, int64_t max_targets) {
    EvalPlan p;
    p.n_targets = ds->epoch_len - 1;
    if (max_targets > 0 && max_targets < p.n_targets) p.n_targets = max_targets;
    p.n_rows = (p.n_targets + ds->opt.seq_len - 1) / ds->opt.seq_len;
    return p;
}

EvalPlan eval_plan_chat(ChatData *cd, int64_t max_rows) {
    EvalPlan p;
    p.n_rows = chat_data_epoch_rows(cd, 0);
    if (max_rows > 0 && max_rows < p.n_rows) p.n_rows = max_rows;
    p.n_targets = INT64_MAX / 2;
    return p;
}

static int dataset_row(void *ctx, int64_t r, Batch *one, Err *err) {
    return dataset_rows(ctx, r, 1, one, err);
}

static int chat_row(void *ctx, int64_t r, Batch *one, Err *err) {
    return chat_data_rows(ctx, r, 1, one, NULL, err);
}

EvalSource eval_source_dataset(Dataset *ds) {
    return (EvalSource){ds->opt.seq_len, dataset_row, ds};
}

EvalSource eval_source_chat(ChatData *cd) {
    return (EvalSource){cd->opt.seq_len, chat_row, cd};
}

/* Rows first, first + stride, ... below n_rows. */
static int64_t rows_from(int64_t first, int64_t stride, int64_t n_rows) {
    return first < n_rows ? (n_rows - first + stride - 1) / stride : 0;
}

int eval_rows(Qwen3 *m, const EvalSource *src, const EvalPlan *plan, int64_t first, int64_t stride,
              int B, double *loss_sum, int64_t *n_valid, Err *err) {
    int T = src->T;
    int64_t forwards = (rows_from(0, stride, plan->n_rows) + B - 1) / B;
    Batch one, many;
    batch_alloc(&one, 1, T);
    batch_alloc(&many, B, T);
    int rc = 0;
    int64_t row = first;
    for (int64_t f = 0; f < forwards && rc == 0; f++) {
        int b = 0;
        for (; b < B && row < plan->n_rows; b++, row += stride) {
            rc = src->row(src->ctx, row, &one, err);
            if (rc) break;
            long o = (long)b * T;
            memcpy(many.tokens + o, one.tokens, (size_t)T * sizeof *one.tokens);
            memcpy(many.positions + o, one.positions, (size_t)T * sizeof *one.positions);
            memcpy(many.doc_ids + o, one.doc_ids, (size_t)T * sizeof *one.doc_ids);
            for (int t = 0; t < T; t++)
                many.targets[o + t] =
                    row * T + t + 1 <= plan->n_targets ? one.targets[t] : CE_IGNORE;
        }
        if (rc) break;
        if (b == 0) { /* this rank's rows ran out: a row of token 0, predicting nothing */
            b = 1;
            for (int t = 0; t < T; t++) {
                many.tokens[t] = 0, many.positions[t] = t, many.doc_ids[t] = 0;
                many.targets[t] = CE_IGNORE;
            }
        }
        qwen3_forward(m, (const int32_t *)many.tokens, many.targets, many.positions, many.doc_ids,
                      b, T);
        *loss_sum += m->loss_sum;
        *n_valid += m->n_valid;
    }
    batch_free(&one);
    batch_free(&many);
    return rc;
}

int eval_windows_check(long stride, long T, Err *err) {
    if (stride >= 1 && stride < T) return 0;
    return err_set(err,
                   "--stride %ld: expected an integer from 1 to %ld, below the sequence length %ld "
                   "(windows that do not overlap would leave each one's first token unpredicted)",
                   stride, T - 1, T);
}

int eval_windows_open(EvalWindows *w, Dataset *ds, int64_t n_targets, int stride, Err *err) {
    memset(w, 0, sizeof *w);
    int T = ds->opt.seq_len;
    TRY(eval_windows_check(stride, T, err));
    w->ds = ds, w->T = T, w->S = stride;
    w->L = n_targets + 1 < ds->epoch_len ? n_targets + 1 : ds->epoch_len;
    w->ids = xmalloc((size_t)T * sizeof *w->ids);
    return 0;
}

void eval_windows_close(EvalWindows *w) {
    free(w->ids);
    memset(w, 0, sizeof *w);
}

/* Window r covers stream [r S, min(r S + T, L)); the last is the first to reach L. */
static int64_t window_end(const EvalWindows *w, int64_t r) {
    int64_t end = r * w->S + w->T;
    return end < w->L ? end : w->L;
}

EvalPlan eval_windows_plan(const EvalWindows *w) {
    EvalPlan p = {.n_targets = INT64_MAX / 2, .n_rows = 1};
    while (window_end(w, p.n_rows - 1) < w->L)
        p.n_rows++;
    return p;
}

static int window_row(void *ctx, int64_t r, Batch *one, Err *err) {
    EvalWindows *w = ctx;
    int64_t begin = r * w->S, end = window_end(w, r);
    int64_t first = r == 0 ? 1 : window_end(w, r - 1); /* the first stream index it predicts */
    TRY(dataset_read_stream(w->ds, begin, end - begin, w->ids, err));
    for (int t = 0; t < w->T; t++) {
        int64_t p = begin + t;
        one->tokens[t] = p < end ? w->ids[t] : 0;
        one->positions[t] = t;
        one->doc_ids[t] = 0;
        one->targets[t] = p + 1 >= first && p + 1 < end ? (int32_t)w->ids[t + 1] : CE_IGNORE;
    }
    return 0;
}

EvalSource eval_source_windows(EvalWindows *w) {
    return (EvalSource){w->T, window_row, w};
}

int eval_plan_bytes(const Dataset *ds, const EvalPlan *plan, const Tokenizer *tok, int64_t *bytes,
                    Err *err) {
    *bytes = 0;
    int64_t start = 0; /* stream position of document d's first id */
    for (int64_t d = 0; d < ds->n_docs && start <= plan->n_targets; d++) {
        int64_t len = (int64_t)(ds->offsets[d + 1] - ds->offsets[d]);
        int64_t lo = start > 0 ? start : 1, hi = start + len;
        if (hi > plan->n_targets + 1) hi = plan->n_targets + 1;
        if (hi > lo) {
            char *text;
            size_t n;
            TRY(tokenizer_decode(tok, ds->ids + ds->offsets[d] + (lo - start), (size_t)(hi - lo),
                                 &text, &n, err));
            free(text);
            *bytes += (int64_t)n;
        }
        start += len + 1; /* the EOS after the document */
    }
    return 0;
}

int eval_chat_bytes(const ChatData *cd, const Tokenizer *tok, const uint32_t *skip, int nskip,
                    int64_t *bytes, Err *err) {
    *bytes = 0;
    uint32_t *run = xmalloc(((size_t)cd->n_tokens + 1) * sizeof *run);
    int rc = 0;
    for (int64_t c = 0; c < cd->n_conv && rc == 0; c++) {
        size_t n = 0;
        for (int64_t i = cd->off[c]; i <= cd->off[c + 1] && rc == 0; i++) {
            int take = i < cd->off[c + 1] && cd->targets[i] != CE_IGNORE;
            for (int k = 0; take && k < nskip; k++)
                take = (uint32_t)cd->targets[i] != skip[k];
            if (take) {
                run[n++] = (uint32_t)cd->targets[i];
                continue;
            }
            if (n == 0) continue;
            char *text;
            size_t len;
            rc = tokenizer_decode(tok, run, n, &text, &len, err);
            if (rc == 0) {
                free(text);
                *bytes += (int64_t)len;
            }
            n = 0;
        }
    }
    free(run);
    return rc;
}
