/* libFuzzer target: arbitrary bytes as a model's generation_config.json. An accepted file gives
 * sampling that generate can run (temperature >= 0 and finite, 0 exactly when do_sample is off;
 * top_k >= 0; top_p in (0, 1]; min_p in [0, 1]; max_new_tokens >= 0; EOS ids >= 0; one beam or
 * more, one when sampling, a finite length penalty), a note that
 * is a terminated string, and the same result when read twice; a refused one a sentence naming
 * the file. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "infer/gen_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    GenConfig a, b;
    Err err;
    if (gen_config_parse((const char *)data, size, "fuzz.json", &a, &err) != 0) {
        if (strncmp(err.msg, "fuzz.json", 9) != 0) abort();
        return 0;
    }
    SampleParams p = a.sp;
    if (!isfinite(p.temperature) || p.temperature < 0 || (p.temperature == 0) != !a.do_sample ||
        p.top_k < 0 || !(p.top_p > 0 && p.top_p <= 1) || !(p.min_p >= 0 && p.min_p <= 1) ||
        !(p.typical_p > 0 && p.typical_p <= 1) || !(p.epsilon >= 0 && p.epsilon < 1) ||
        !(p.eta >= 0 && p.eta < 1) || a.max_new_tokens < 0 || a.n_eos < 0 ||
        a.n_eos > GEN_CONFIG_MAX_EOS || memchr(a.ignored, 0, sizeof a.ignored) == NULL)
        abort();
    for (int i = 0; i < a.n_eos; i++)
        if (a.eos[i] < 0) abort();
    /* beams: at least one, one when sampling (beam sampling is listed, not run) */
    BeamParams bp = a.beams;
    if (bp.num_beams < 1 || (a.do_sample && bp.num_beams != 1) || !isfinite(bp.length_penalty) ||
        (int)bp.early_stopping < BEAM_STOP_HEURISTIC || bp.early_stopping > BEAM_STOP_NEVER)
        abort();
    /* forbidden ids: within their arrays, ids >= 0, words ending in order */
    const LogitProcs *t = &a.procs;
    if (t->min_new_tokens < 0 || t->min_length < 0 || t->n_suppress < 0 ||
        t->n_suppress > LOGIT_PROCS_MAX_IDS || t->n_begin_suppress < 0 ||
        t->n_begin_suppress > LOGIT_PROCS_MAX_IDS || t->n_words < 0 ||
        t->n_words > LOGIT_PROCS_MAX_WORDS)
        abort();
    for (int i = 0; i < t->n_suppress; i++)
        if (t->suppress[i] < 0) abort();
    for (int i = 0; i < t->n_begin_suppress; i++)
        if (t->begin_suppress[i] < 0) abort();
    for (int w = 0, at = 0; w < t->n_words; at = t->word_end[w++])
        if (t->word_end[w] <= at || t->word_end[w] > LOGIT_PROCS_MAX_IDS) abort();
    /* the other processors: sequences ending in order with finite biases, forced ids >= 0 */
    if (t->n_seqs < 0 || t->n_seqs > LOGIT_PROCS_MAX_WORDS || t->n_forced_bos < 0 ||
        t->n_forced_bos > 1 || t->n_forced_eos < 0 || t->n_forced_eos > LOGIT_PROCS_MAX_FORCED ||
        !(t->encoder_repetition_penalty > 0) || t->encoder_no_repeat_ngram_size < 0 ||
        t->decay_start < 0 || !(t->decay_factor >= 0) || !isfinite(t->decay_factor))
        abort();
    for (int s = 0, at = 0; s < t->n_seqs; at = t->seq_end[s++])
        if (t->seq_end[s] <= at || t->seq_end[s] > LOGIT_PROCS_MAX_IDS || !isfinite(t->seq_bias[s]))
            abort();
    int n_ids = t->n_seqs ? t->seq_end[t->n_seqs - 1] : 0;
    for (int i = 0; i < n_ids; i++)
        if (t->seq[i] < 0) abort();
    for (int i = 0; i < t->n_forced_eos; i++)
        if (t->forced_eos[i] < 0) abort();
    if (t->n_forced_bos && t->forced_bos < 0) abort();
    /* prompt lookup and assisted decoding: in their ranges */
    if (a.lookup_tokens < 0 || a.lookup_tokens > 256 || a.lookup_ngram < 0 || a.lookup_ngram > 64 ||
        a.assistant_tokens < 0 || a.assistant_tokens > 256 || !(a.assistant_confidence <= 1) ||
        (a.assistant_confidence < 0 && a.assistant_confidence != -1))
        abort();
    if (gen_config_parse((const char *)data, size, "fuzz.json", &b, &err) != 0 ||
        memcmp(&a.sp, &b.sp, sizeof a.sp) != 0 || memcmp(&a.procs, &b.procs, sizeof a.procs) != 0 ||
        a.n_eos != b.n_eos || strcmp(a.ignored, b.ignored) != 0)
        abort();
    return 0;
}
