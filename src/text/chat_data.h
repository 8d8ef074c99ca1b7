/* Chat and instruction training data: JSONL conversations rendered with the model's chat
 * format (text/chat_template.h), targets -100 on every token that is not assistant output, and
 * rows of seq_len positions, several conversations packed into a row (attention kept inside
 * each) or one conversation a row; padding never counts. docs/finetune.md has the formats.
 *
 * Legend: T seq_len (positions per row), L tokens of one conversation.
 *
 * A conversation of L tokens takes min(L, T) positions of a row: position i holds token i and
 * the target token i+1 when that token is assistant output (or any token, with
 * train_on_all_tokens), else -100; its last position has no next token inside the row unless
 * it was truncated. Epoch e takes the conversations in a shuffled order (seed, e) and fills
 * rows greedily in that order, starting a new row when the next one does not fit; the rest of a
 * row is padding (token pad_id, target -100). Global row g is row g - (rows of the earlier
 * epochs) of its epoch, so the rows of a step depend only on the data, the seed and the step. */
#ifndef QT_CHAT_DATA_H
#define QT_CHAT_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "core/err.h"
#include "text/chat_template.h"
#include "text/dataset.h"

typedef struct ChatDataOptions {
    const char *path; /* one or more comma-separated JSONL files */
    DataFormat format;
    int seq_len;             /* T */
    uint64_t seed;           /* the conversation order of every epoch */
    int shuffle;             /* 0: source order every epoch */
    int packing;             /* 1: several conversations a row; 0: one a row */
    int train_on_all_tokens; /* 1: every next token is a target, prompts and headers too */
    TooLong too_long;        /* a conversation longer than T: truncated or dropped */
    const char *what;        /* the log line's first words; NULL: "chat data" */
} ChatDataOptions;

typedef struct ChatEpoch ChatEpoch;

typedef struct ChatData {
    ChatDataOptions opt; /* path points at a copy owned here */
    uint32_t pad_id;
    int64_t n_conv;                 /* conversations kept */
    int64_t n_truncated, n_dropped; /* longer than T (dropped ones are not in n_conv) */
    int64_t n_tokens;               /* tokens kept, over all conversations */
    int64_t n_labels;               /* targets that count, over all conversations */
    uint32_t *ids;                  /* (n_tokens,) conversation c is ids[off[c] .. off[c+1]) */
    int32_t *targets;               /* (n_tokens,) per position: the target or -100 */
    int64_t *off;                   /* (n_conv + 1,) */
    int64_t *labels;                /* (n_conv,) targets that count, per conversation */
    ChatEpoch *epochs[2];           /* the two most recently used epochs' row layouts */
    int64_t *epoch_start;           /* first global row of epochs 0 .. n_epoch_start - 1 */
    int64_t n_epoch_start;
} ChatData;

/* Reads, validates and renders every conversation of opt->path with cf (which must outlive
 * nothing: ids are copied). A malformed line is an error sentence naming FILE:LINE and what was
 * expected. Logs the counts (conversations, tokens, labels, truncated, dropped). */
int chat_data_open(ChatData *cd, const ChatDataOptions *opt, const ChatFormat *cf, uint32_t pad_id,
                   Err *err);
void chat_data_close(ChatData *cd);

/* Global rows [row, row + nrows) into out (out->B >= nrows, out->T == seq_len); *labels (when
 * not NULL) gets the number of targets that count in them. */
int chat_data_rows(ChatData *cd, int64_t row, int nrows, Batch *out, int64_t *labels, Err *err);
/* Rows of epoch e (its conversations packed in that epoch's order). */
int64_t chat_data_epoch_rows(ChatData *cd, int64_t epoch);
/* Targets that count in global rows [row, row + nrows), without building them. */
int64_t chat_data_labels(ChatData *cd, int64_t row, int nrows);

/* Parses one JSONL line of the given format into a conversation: msgs (malloc'd, strings
 * pointing into *root, which the caller json_decref's) and *tools, the line's tool definitions
 * ("tools", NULL when absent; inside *root). Exposed for the fuzz target. */
int chat_data_parse_line(const char *line, size_t len, DataFormat format, const char *file,
                         int64_t lineno, json_t **root, ChatMessage **msgs, size_t *n,
                         const json_t **tools, Err *err);

#endif
