/* Beam search: transformers' generate(num_beams = k, do_sample = False) for one prompt through
 * a Decoder. Each step scores every (running beam, token) pair by the beam's summed
 * log-probability plus the token's (log-softmax of the logits, then the repetition penalty and
 * n-gram ban of o->sample, applied to log-probabilities as transformers' processors are), keeps
 * the best max(2, 1 + number of EOS ids) * k, continues the best k of them that did not just
 * end (at an EOS id, or at max_new_tokens), and offers those of the best k that ended to the k
 * finished hypotheses, scored by their sum over (generated length) ^ length_penalty. The
 * search stops when no running beam can improve on the finished ones (early_stopping, below),
 * or at max_new_tokens. Scores are float32 and ties go to the lower (beam, token) index, as
 * torch computes them. The decoder's KV cache rows follow the beams: a beam continued once
 * keeps its row, and each further continuation of it takes the row of a beam that ended, with
 * a copy of the cache. */
#ifndef QT_BEAM_H
#define QT_BEAM_H

#include "core/err.h"
#include "infer/decode.h"
#include "infer/generate.h"
#include "text/tokenizer.h"

/* transformers' early_stopping: when the search may stop before max_new_tokens. */
typedef enum BeamStop {
    BEAM_STOP_HEURISTIC, /* false (its default): when the best running beam's score, with the
                          * length penalty at the current length, cannot beat the worst of k
                          * finished hypotheses */
    BEAM_STOP_EARLY,     /* true: as soon as k hypotheses have finished */
    BEAM_STOP_NEVER,     /* "never": as false, but a positive length penalty is taken at
                          * max_new_tokens (the canonical beam search) */
} BeamStop;

typedef struct BeamParams {
    int num_beams;        /* k; 1: no beam search */
    float length_penalty; /* exponent of the generated length a finished score is divided by */
    BeamStop early_stopping;
} BeamParams;

/* transformers' defaults: one beam, length penalty 1, early_stopping false. */
#define BEAM_PARAMS_DEFAULT ((BeamParams){.num_beams = 1, .length_penalty = 1.0f})

/* "true", "false" or "never". */
const char *beam_stop_name(BeamStop s);

/* Searches with bp->num_beams = k >= 2 beams from each of prompts[0..n) (lens[p] ids, checked
 * against the vocabulary), the n searches side by side (each step decodes the beams of every
 * search still running together), and writes the best n_out <= k finished hypotheses of
 * prompt p, best first, into out[p * n_out ..] (free each with gen_output_free): ids (an ending
 * EOS kept), the model's own log-probability of each, the text (tok may be NULL), finish "eos"
 * or "length", and score (transformers' sequences_scores). Each search is what it is alone. d
 * must hold n * k sequences of the longest prompt + o->max_new_tokens positions; its cache is
 * emptied first. Sampling (temperature > 0) and stop strings are an error sentence: beams here
 * are greedy. stats (may be NULL) counts the rows the decoder ran. */
int beam_search(Decoder *d, const Tokenizer *tok, const int32_t *const *prompts, const int *lens,
                int n, const GenOptions *o, const BeamParams *bp, GenOutput *out, int n_out,
                GenStats *stats, Err *err);

#endif
