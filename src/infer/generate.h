/* Generation: prompts of token ids in, one completion each out, through a Decoder (prefill,
 * then batched decode steps over the sequences still running) and a Sampler. A sequence ends
 * at an EOS id, at a stop string (with a tokenizer), or after max_new_tokens. Shared by
 * `qtitan generate` and the samples a training run prints. */
#ifndef QT_GENERATE_H
#define QT_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "infer/decode.h"
#include "infer/sample.h"
#include "text/tokenizer.h"

/* The most candidate ids a pass checks (prompt lookup, a draft model). */
#define GEN_MAX_CANDIDATES 256

typedef struct GenOptions {
    int max_new_tokens;
    SampleParams sample;
    uint64_t seed; /* sequence i draws from rng stream i of seed */
    const int32_t *eos;
    int n_eos;
    const char *const *stop; /* stop strings, matched in the decoded completion */
    int n_stop;
    const LogitProcs *procs; /* forbidden ids (infer/sample.h); NULL: none */
    /* 0: the decoder's cache is emptied first. 1: sequence i keeps what its cache holds of
     * prompts[i] (decoder_reuse: a conversation's earlier turns) and runs only the rest. Either
     * way the cache of sequence i ends holding prompts[i] and its generated ids but the last. */
    int reuse_cache;
    /* Prompt lookup (transformers' prompt_lookup_num_tokens and max_matching_ngram_size): with
     * lookup_tokens > 0, a sequence whose last lookup_ngram ids (down to 1) occurred before in
     * its prompt and completion takes up to lookup_tokens ids that followed that occurrence as
     * candidates, runs its last id and them through the model in the step's one pass
     * (decoder_step, beside the other sequences' rows; up to 64 candidates a pass in all, or
     * lookup_tokens if more) and chooses at each row as it would have one step at a time,
     * keeping candidates while they are what it chose; the rows past the first that differs
     * are dropped from its cache.
     * Each chosen id draws as a step does, so greedy and seeded sampling give the same ids as
     * without it (up to the float rounding of a pass of many rows); text that repeats itself
     * costs fewer passes. 0: off. lookup_ngram 0: 2. */
    int lookup_tokens, lookup_ngram;
    /* Assisted decoding (transformers' assistant_model): draft (NULL: off) decodes a smaller
     * model of the same vocabulary, with a cache row for each sequence and as many positions;
     * a step's candidates are the up to draft_tokens ids it chooses greedily after the
     * sequence's ids, ending after one whose probability under it is below draft_confidence
     * (assistant_confidence_threshold), checked as prompt lookup's are (instead of them). Its
     * cache keeps what still matches the sequence (decoder_reuse). */
    Decoder *draft;
    int draft_tokens;
    float draft_confidence;
} GenOptions;

typedef struct GenOutput {
    int32_t *ids;     /* (n) generated ids, an ending EOS included */
    double *logprobs; /* (n) the model's log-probability of each (sample_logprob) */
    int n;
    char *text; /* the completion's text without EOS, cut before a stop string; NULL
                 * without a tokenizer */
    size_t text_len;
    const char *finish; /* "eos", "stop" or "length" */
    double score;       /* beam search (infer/beam.h): transformers' sequences_scores */
} GenOutput;

typedef struct GenStats {
    long prompt_tokens, new_tokens;
    long reused_tokens; /* prompt tokens the cache held already (GenOptions.reuse_cache) */
    long lookup_proposed, lookup_accepted; /* candidate ids (prompt lookup or the draft model),
                                            * and those kept */
    long passes;                           /* model passes after the prompts (decode steps) */
    double prefill_s, decode_s;
} GenStats;

/* Receives each sequence's text as it grows: the new bytes only, whole UTF-8 characters, never
 * a part that could still become a stop string. */
typedef void (*GenStreamFn)(void *ctx, int i, const char *text, size_t len);

/* One sequence's text as its ids come (the state generate keeps for each; tests drive it
 * directly): decoded one id at a time (DecodeStream), searched for the stop strings only where
 * the new bytes can complete one, and streamed in bytes that can no longer change. Each push
 * costs the new token's bytes (and the stop strings' lengths), and allocates nothing once the
 * buffers have grown to the text. */
typedef struct GenText {
    DecodeStream ds; /* ds.text and ds.len are the text, cut before a stop string */
    size_t scan;     /* no stop string starts in text[0..scan) */
    size_t hold;     /* bytes a stop string may already have at the end: the longest, less 1 */
    size_t sent;     /* bytes of text streamed */
} GenText;

/* reserve: bytes of text to make room for up front. */
void gen_text_init(GenText *g, const GenOptions *o, size_t reserve);
/* Adds id's text (none for an EOS id or an id the tokenizer has no token for, as HF tokenizers'
 * decode skips a padded vocabulary's rows); returns 1 when the text holds a stop string, then
 * cut before the first. */
int gen_text_push(GenText *g, const Tokenizer *tok, const GenOptions *o, int32_t id, Err *err);
/* Passes fn (as sequence i) the bytes that can no longer change, all of them when done: the new
 * bytes only, whole UTF-8 characters, never a part that could still become a stop string. */
void gen_text_stream(GenText *g, int done, int i, GenStreamFn fn, void *ctx);
void gen_text_free(GenText *g);

/* Completes prompts[i] (lens[i] ids, checked against the vocabulary, at least one) for
 * i < n <= d->S into out[i] (free with gen_output_free). A prompt given again right after
 * itself (the same pointer and length: several completions of it) is run once, its cache
 * copied. tok may be NULL (no text, no stop
 * strings); stream may be NULL. stats (may be NULL) gets the token counts and times. */
int generate(Decoder *d, const Tokenizer *tok, const int32_t *const *prompts, const int *lens,
             int n, const GenOptions *o, GenOutput *out, GenStreamFn stream, void *ctx,
             GenStats *stats, Err *err);
void gen_output_free(GenOutput *g);
/* Whether id is one of o's EOS ids. */
int gen_is_eos(const GenOptions *o, int32_t id);
/* Whether o has logits processors (a repetition penalty, an n-gram ban, forbidden ids), which
 * need each sequence's ids. */
int gen_processes(const GenOptions *o);
/* Bytes a generate call allocates for n prompts of a model of V logits, besides the outputs:
 * the logits of every sequence and the sampler's three rows, and with a repetition penalty or
 * an n-gram ban (penalize) each sequence's seen ids, its id history of up to C ids (prompt and
 * completion) and a penalised row. */
double generate_buffer_bytes(int n, int V, int penalize, long C);

#endif
