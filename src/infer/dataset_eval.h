/* Loss of a model on a dataset's first epoch, in source order: the packed rows of
 * text/dataset.h (documents each followed by EOS, document mask and positions as training
 * packs them), every stream token after the first a target once; or the rows of chat data
 * (text/chat_data.h), their assistant targets. Shared by `qtitan eval --dataset` and
 * validation during training. */
#ifndef QT_DATASET_EVAL_H
#define QT_DATASET_EVAL_H

#include <stdint.h>

#include "core/err.h"
#include "model/qwen3.h"
#include "text/chat_data.h"
#include "text/dataset.h"

/* Targets of one pass: rows [0, n_rows) of the stream; targets past `n_targets` (the end of
 * the epoch or a cap) are not counted. */
typedef struct EvalPlan {
    int64_t n_targets; /* stream positions 1..n_targets are predicted */
    int64_t n_rows;    /* ceil(n_targets / T) */
} EvalPlan;

/* The whole first epoch (L - 1 targets), or its first max_targets (> 0) targets. */
EvalPlan eval_plan(const Dataset *ds, int64_t max_targets);

/* The first epoch of chat data (text/chat_data.h, opened with shuffle off: its conversations
 * in source order, packed and masked as training packs them), or its first max_rows (> 0)
 * rows; every target the rows hold counts (n_targets has no cap). */
EvalPlan eval_plan_chat(ChatData *cd, int64_t max_rows);

/* Where eval_rows reads row r (of T tokens) into a batch of one row. */
typedef struct EvalSource {
    int T;
    int (*row)(void *ctx, int64_t r, Batch *one, Err *err);
    void *ctx;
} EvalSource;
EvalSource eval_source_dataset(Dataset *ds);
EvalSource eval_source_chat(ChatData *cd);

/* Adds to *loss_sum / *n_valid the summed cross-entropy and the count of the targets of rows
 * first, first + stride, ... (< plan rows) of src, run B rows at a time through m
 * (qwen3_forward; m sized for B x T). A dataset must be opened with shuffle off (its first
 * epoch is then the documents in source order). stride > 1 lets data-parallel ranks share the
 * rows: the sums are doubles, so adding the ranks' sums gives the one-process sum up to
 * rounding. Every caller with the same plan, stride and B runs the same number of forwards
 * (those of first = 0): a rank whose rows ran out runs one row without targets instead, so the
 * collectives of a sharded model's forward stay matched across the ranks. */
int eval_rows(Qwen3 *m, const EvalSource *src, const EvalPlan *plan, int64_t first, int64_t stride,
              int B, double *loss_sum, int64_t *n_valid, Err *err);

/* Hugging Face's sliding-window perplexity (`qtitan eval --stride S`): the stream's first
 * n_targets + 1 tokens (documents in source order, each followed by EOS) read in windows of T
 * tokens starting every S tokens (1 <= S < T), the last one cut at the stream's end, each a
 * row of its own with positions 0.. and no document mask (the text is one sequence, as a
 * joined corpus); window r predicts the stream tokens the windows before it did not (the first
 * all but its first token), each with up to T - S tokens of context before the window's part.
 * Every token after the first is predicted once: the same targets as eval_plan's. */
typedef struct EvalWindows {
    Dataset *ds; /* read with dataset_read_stream, opened with shuffle off */
    int64_t L;   /* stream tokens taken */
    int T, S;
    uint32_t *ids; /* (T) a window's ids */
} EvalWindows;
/* 0 when 1 <= stride < T, else -1 with the sentence (eval_windows_open checks it too). */
int eval_windows_check(long stride, long T, Err *err);
/* S outside [1, T) is refused with a sentence. */
int eval_windows_open(EvalWindows *w, Dataset *ds, int64_t n_targets, int stride, Err *err);
void eval_windows_close(EvalWindows *w);
/* The windows as eval_rows rows: every target a row holds counts (n_targets has no cap). */
EvalPlan eval_windows_plan(const EvalWindows *w);
EvalSource eval_source_windows(EvalWindows *w);

/* UTF-8 bytes of the text the targets of plan stand for (EOS ids excluded), by decoding each
 * document's targeted ids with tok. */
int eval_plan_bytes(const Dataset *ds, const EvalPlan *plan, const Tokenizer *tok, int64_t *bytes,
                    Err *err);
/* UTF-8 bytes of the text the counted targets of chat data stand for: each run of consecutive
 * targets of a conversation decoded with tok, the ids of skip[0 .. nskip) (the turn's end
 * token, EOS) left out as EOS is for text. */
int eval_chat_bytes(const ChatData *cd, const Tokenizer *tok, const uint32_t *skip, int nskip,
                    int64_t *bytes, Err *err);

#endif
