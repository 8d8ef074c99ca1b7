/* A model folder's generation_config.json: the sampling transformers' generate() uses for the
 * model when the caller names none (GenerationMixin._prepare_generation_config: the file's
 * values, then transformers' defaults for what the file leaves out or sets to null: do_sample
 * false, temperature 1.0, top_k 50, top_p 1.0, min_p none, repetition_penalty 1.0,
 * no_repeat_ngram_size none, num_beams 1, length_penalty 1.0, early_stopping false, and none of
 * the other logits processors), for
 * `qtitan generate` to take as its defaults; and its eos_token_id(s). Settings that change what
 * transformers generates and that qtitan does not compute (beam sampling, guidance_scale, ...)
 * are listed for a note, not dropped in silence. */
#ifndef QT_GEN_CONFIG_H
#define QT_GEN_CONFIG_H

#include <stdint.h>

#include "core/err.h"
#include "infer/beam.h"
#include "infer/sample.h"

#define GEN_CONFIG_MAX_EOS 8

typedef struct GenConfig {
    int found;           /* the folder has generation_config.json */
    int do_sample;       /* 0: greedy, and sp.temperature is 0 */
    SampleParams sp;     /* what generate() samples with */
    long max_new_tokens; /* 0 when the file gives none */
    /* num_beams, length_penalty and early_stopping (transformers' 1, 1.0, false when absent);
     * num_beams above 1 with do_sample true (beam sampling) is listed in `ignored` and left at
     * 1. */
    BeamParams beams;
    /* The other logits processors (sample.h's LogitProcs: min_new_tokens, min_length,
     * suppress_tokens, begin_suppress_tokens, bad_words_ids, sequence_bias,
     * encoder_repetition_penalty, encoder_no_repeat_ngram_size, forced_bos_token_id,
     * forced_eos_token_id, exponential_decay_length_penalty; off when absent or null). */
    LogitProcs procs;
    /* prompt_lookup_num_tokens and max_matching_ngram_size (0 when absent or null). */
    int lookup_tokens, lookup_ngram;
    /* num_assistant_tokens (0 when absent) and assistant_confidence_threshold (-1 when
     * absent). */
    int assistant_tokens;
    float assistant_confidence;
    int32_t eos[GEN_CONFIG_MAX_EOS];
    int n_eos;
    char ignored[512]; /* "guidance_scale = 1.5, penalty_alpha = 0.6" or "" */
} GenConfig;

/* Reads dir/generation_config.json into gc (gc->found = 0 and 0 returned when there is none).
 * A file that is not a JSON object, or a known key with a value of the wrong type or range, is
 * a sentence naming the file and the key. */
int gen_config_read(const char *dir, GenConfig *gc, Err *err);
/* The same from the file's text[0..len), `file` naming it in sentences (for the fuzz target). */
int gen_config_parse(const char *text, size_t len, const char *file, GenConfig *gc, Err *err);

#endif
