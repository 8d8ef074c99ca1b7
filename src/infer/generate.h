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

typedef struct GenOptions {
    int max_new_tokens;
    SampleParams sample;
    uint64_t seed; /* sequence i draws from rng stream i of seed */
    const int32_t *eos;
    int n_eos;
    const char *const *stop; /* stop strings, matched in the decoded completion */
    int n_stop;
} GenOptions;

typedef struct GenOutput {
    int32_t *ids;     /* (n) generated ids, an ending EOS included */
    double *logprobs; /* (n) the model's log-probability of each (sample_logprob) */
    int n;
    char *text; /* the completion's text without EOS, cut before a stop string; NULL
                 * without a tokenizer */
    size_t text_len;
    const char *finish; /* "eos", "stop" or "length" */
} GenOutput;

typedef struct GenStats {
    long prompt_tokens, new_tokens;
    double prefill_s, decode_s;
} GenStats;

/* Receives each sequence's text as it grows: the new bytes only, whole UTF-8 characters, never
 * a part that could still become a stop string. */
typedef void (*GenStreamFn)(void *ctx, int i, const char *text, size_t len);

/* Completes prompts[i] (lens[i] ids, checked against the vocabulary, at least one) for
 * i < n <= d->S into out[i] (free with gen_output_free). tok may be NULL (no text, no stop
 * strings); stream may be NULL. stats (may be NULL) gets the token counts and times. */
int generate(Decoder *d, const Tokenizer *tok, const int32_t *const *prompts, const int *lens,
             int n, const GenOptions *o, GenOutput *out, GenStreamFn stream, void *ctx,
             GenStats *stats, Err *err);
void gen_output_free(GenOutput *g);
/* Bytes a generate call allocates for n prompts of a model of V logits, besides the outputs:
 * the logits of every sequence and the sampler's three rows. */
double generate_buffer_bytes(int n, int V);

#endif
