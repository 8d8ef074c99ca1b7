/* Multiple-choice evaluation, as lm-evaluation-harness scores its multiple_choice tasks: each
 * question is a context and choices; a choice's score is the log-likelihood of its tokens
 * after the context's (a "loglikelihood" request), and the prediction is the best choice by
 * that score (acc), by the score over the choice's characters (acc_norm) or over its UTF-8
 * bytes (acc_bytes). `qtitan eval --choices FILE` (docs/eval.md).
 *
 * A request is encoded as lm-eval's HFLM encodes it (_encode_pair): trailing whitespace of the
 * context (as Python's str.rstrip() sees whitespace) moves to the front of the continuation;
 * the continuation's tokens are those of encode(context + continuation) after the first
 * len(encode(context)); an empty context is the prefix token instead (lm-eval's
 * prefix_token_id), unless the continuation starts with that token, which then becomes the
 * context. context + continuation is cut from the left to T + 1 tokens, and the model reads
 * all but the last. */
#ifndef QT_CHOICES_H
#define QT_CHOICES_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "model/qwen3.h"
#include "text/tokenizer.h"

typedef struct ChoiceItem {
    char *context;
    size_t context_len;
    char **choice;
    size_t *choice_len;
    int n;        /* choices, >= 1 */
    int label;    /* the right choice's index, -1: none given */
    int64_t line; /* in the file */
} ChoiceItem;

typedef struct ChoiceSet {
    ChoiceItem *item;
    int n;
    long n_choices; /* all items' */
} ChoiceSet;

/* Reads JSON Lines text[0..len) (`file` names it in sentences): one question an object a line,
 * "context" (a string, may be empty), "choices" (a non-empty array of strings) and "label" (an
 * index into choices, or null or absent); other fields are not read, blank lines skipped. A
 * bad line is a "FILE:LINE: ..." sentence; no question at all is one too. */
int choice_set_parse(ChoiceSet *cs, const char *text, size_t len, const char *file, Err *err);
int choice_set_read(ChoiceSet *cs, const char *path, Err *err);
void choice_set_free(ChoiceSet *cs);

/* The request (context, continuation) encoded as above into ctx and cont (cleared first).
 * prefix: the id an empty context stands for. A context of whitespace alone (lm-eval fails on
 * it) and an empty continuation (no token after the context's) are error sentences. */
int choice_encode(const Tokenizer *tok, const char *context, size_t context_len,
                  const char *continuation, size_t continuation_len, int32_t prefix, IdVec *ctx,
                  IdVec *cont, Err *err);

typedef struct ChoiceStats {
    long tokens; /* positions run through the model */
    long rows;   /* passes */
} ChoiceStats;

/* ll[k] = the log-likelihood of choice j of item i (k = the items' choices before it, + j),
 * through a decoder of m (infer/decode.h; m's own activations are not used) holding up to T
 * positions: a request's context runs
 * once for all the choices after it that share it (the same ids: those not cut), each choice's
 * ids then run after the cached context, which computes what the whole request alone computes.
 * A continuation longer than T tokens is an error sentence naming the line. */
int choice_score(Qwen3 *m, int T, const Tokenizer *tok, int32_t prefix, const ChoiceSet *cs,
                 double *ll, ChoiceStats *st, Err *err);

/* lm-eval's metrics of the labelled items: the share whose best choice (first of equal
 * scores, as numpy's argmax) is the label, by ll, ll / characters (Unicode code points) and
 * ll / UTF-8 bytes, with the standard error of each mean (sample deviation / sqrt(n)). pred
 * (3 per item, may be NULL): the three predictions. */
typedef struct ChoiceMetrics {
    double acc, acc_norm, acc_bytes;
    double acc_se, acc_norm_se, acc_bytes_se;
    int n; /* labelled items */
} ChoiceMetrics;
void choice_metrics(const ChoiceSet *cs, const double *ll, ChoiceMetrics *out, int *pred);

#endif
