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
    const TokenBans *t = &a.bans;
    if (t->min_new_tokens < 0 || t->min_length < 0 || t->n_suppress < 0 ||
        t->n_suppress > TOKEN_BANS_MAX_IDS || t->n_begin_suppress < 0 ||
        t->n_begin_suppress > TOKEN_BANS_MAX_IDS || t->n_words < 0 ||
        t->n_words > TOKEN_BANS_MAX_WORDS)
        abort();
    for (int i = 0; i < t->n_suppress; i++)
        if (t->suppress[i] < 0) abort();
    for (int i = 0; i < t->n_begin_suppress; i++)
        if (t->begin_suppress[i] < 0) abort();
    for (int w = 0, at = 0; w < t->n_words; at = t->word_end[w++])
        if (t->word_end[w] <= at || t->word_end[w] > TOKEN_BANS_MAX_IDS) abort();
    if (gen_config_parse((const char *)data, size, "fuzz.json", &b, &err) != 0 ||
        memcmp(&a.sp, &b.sp, sizeof a.sp) != 0 || memcmp(&a.bans, &b.bans, sizeof a.bans) != 0 ||
        a.n_eos != b.n_eos || strcmp(a.ignored, b.ignored) != 0)
        abort();
    return 0;
}
