/* generation_config.json read as transformers resolves it (see gen_config.h). */
#include "infer/gen_config.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/fs.h"
#include "core/json.h"
#include "infer/generate.h"
#include "text/jsonl.h"

/* The number under key, when it is there and not null, into *out (else *out is kept): it must
 * lie in [lo, hi] (above lo when lo_open) and be whole when `whole`; `range` says so in the
 * sentence otherwise. */
static int number(const json_t *root, const char *key, const char *file, double lo, int lo_open,
                  double hi, int whole, const char *range, double *out, Err *err) {
    const json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v))
        return err_set(err, "%s: \"%s\" must be a number or null, found %s", file, key,
                       json_kind(v));
    double x = json_number_value(v);
    if (!(lo_open ? x > lo : x >= lo) || !(x <= hi) || (whole && x != floor(x)))
        return err_set(err, "%s: \"%s\" must be %s, found %g", file, key, range, x);
    *out = x;
    return 0;
}

/* A token id of a list under key: an integer in [0, INT32_MAX] into *out. */
static int token_id(const json_t *v, const char *file, const char *key, int32_t *out, Err *err) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
        return err_set(err, "%s: \"%s\" must hold token ids (integers >= 0), found %s", file, key,
                       json_is_integer(v) ? "a negative or too large integer" : json_kind(v));
    *out = (int32_t)json_integer_value(v);
    return 0;
}

/* The list of ids under key (absent or null: none) appended to ids[*n ..], at most cap. */
static int id_list(const json_t *v, const char *file, const char *key, int32_t *ids, int cap,
                   int *n, Err *err) {
    if (!v || json_is_null(v)) return 0;
    if (!json_is_array(v))
        return err_set(err, "%s: \"%s\" must be a list of token ids or null, found %s", file, key,
                       json_kind(v));
    if ((long)json_array_size(v) > cap - *n)
        return err_set(err, "%s: \"%s\" holds more than the %d ids qtitan takes", file, key, cap);
    for (size_t i = 0; i < json_array_size(v); i++)
        TRY(token_id(json_array_get(v, i), file, key, &ids[(*n)++], err));
    return 0;
}

/* bad_words_ids: a non-empty list of non-empty lists of ids, or null. */
static int bad_words(const json_t *root, const char *file, LogitProcs *b, Err *err) {
    const json_t *v = json_object_get(root, "bad_words_ids");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_array(v) || json_array_size(v) == 0)
        return err_set(err,
                       "%s: \"bad_words_ids\" must be a non-empty list of lists of token ids "
                       "or null",
                       file);
    if (json_array_size(v) > LOGIT_PROCS_MAX_WORDS)
        return err_set(err, "%s: \"bad_words_ids\" holds more than the %d words qtitan takes", file,
                       LOGIT_PROCS_MAX_WORDS);
    int used = 0;
    for (size_t w = 0; w < json_array_size(v); w++) {
        const json_t *word = json_array_get(v, w);
        if (!json_is_array(word) || json_array_size(word) == 0)
            return err_set(err,
                           "%s: \"bad_words_ids\" entry %zu must be a non-empty list of token "
                           "ids",
                           file, w);
        TRY(id_list(word, file, "bad_words_ids", b->words, LOGIT_PROCS_MAX_IDS, &used, err));
        b->word_end[b->n_words++] = used;
    }
    return 0;
}

/* sequence_bias: a non-empty list of [[ids...], bias] pairs, or null; a sequence given twice
 * keeps its last bias (transformers makes a dict of the list). */
static int sequence_bias(const json_t *root, const char *file, LogitProcs *b, Err *err) {
    const json_t *v = json_object_get(root, "sequence_bias");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_array(v) || json_array_size(v) == 0)
        return err_set(err,
                       "%s: \"sequence_bias\" must be a non-empty list of [[token ids], bias] "
                       "pairs or null",
                       file);
    if (json_array_size(v) > LOGIT_PROCS_MAX_WORDS)
        return err_set(err, "%s: \"sequence_bias\" holds more than the %d sequences qtitan takes",
                       file, LOGIT_PROCS_MAX_WORDS);
    int used = 0;
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *pair = json_array_get(v, i), *ids = json_array_get(pair, 0);
        const json_t *bias = json_array_get(pair, 1);
        if (!json_is_array(pair) || json_array_size(pair) != 2 || !json_is_array(ids) ||
            json_array_size(ids) == 0 || !json_is_number(bias) ||
            !isfinite((float)json_number_value(bias)))
            return err_set(err,
                           "%s: \"sequence_bias\" entry %zu must be [[token ids], bias]: a "
                           "non-empty list of ids and a number of float range",
                           file, i);
        int start = used;
        TRY(id_list(ids, file, "sequence_bias", b->seq, LOGIT_PROCS_MAX_IDS, &used, err));
        float f = (float)json_number_value(bias);
        int n = used - start, same = -1;
        for (int s = 0, st = 0; s < b->n_seqs && same < 0; st = b->seq_end[s++])
            if (b->seq_end[s] - st == n &&
                memcmp(b->seq + st, b->seq + start, (size_t)n * sizeof *b->seq) == 0)
                same = s;
        if (same >= 0)
            b->seq_bias[same] = f, used = start;
        else
            b->seq_bias[b->n_seqs] = f, b->seq_end[b->n_seqs++] = used;
    }
    return 0;
}

/* exponential_decay_length_penalty: [start, factor] (start a whole number >= 0, factor > 0),
 * or null. */
static int length_decay(const json_t *root, const char *file, LogitProcs *b, Err *err) {
    const json_t *v = json_object_get(root, "exponential_decay_length_penalty");
    if (!v || json_is_null(v)) return 0;
    const json_t *start = json_array_get(v, 0), *factor = json_array_get(v, 1);
    if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_integer(start) ||
        json_integer_value(start) < 0 || json_integer_value(start) > 1000000000 ||
        !json_is_number(factor) || !(json_number_value(factor) > 0) ||
        !isfinite(json_number_value(factor)))
        return err_set(err,
                       "%s: \"exponential_decay_length_penalty\" must be [start, factor]: a "
                       "whole number >= 0 and a number > 0, or null",
                       file);
    b->decay_start = (int)json_integer_value(start);
    b->decay_factor = json_number_value(factor);
    return 0;
}

/* The processors of sample.h's LogitProcs. */
static int procs(const json_t *root, const char *file, LogitProcs *b, Err *err) {
    double mnt = 0, ml = 0, erp = 1.0, eng = 0;
    TRY(number(root, "min_new_tokens", file, 0, 0, 1e9, 1, "a whole number >= 0", &mnt, err));
    TRY(number(root, "min_length", file, 0, 0, 1e9, 1, "a whole number >= 0", &ml, err));
    TRY(number(root, "encoder_repetition_penalty", file, 0, 1, 1e30, 0, "> 0", &erp, err));
    TRY(number(root, "encoder_no_repeat_ngram_size", file, 0, 0, 1e6, 1, "a whole number >= 0",
               &eng, err));
    b->min_new_tokens = (int)mnt, b->min_length = (int)ml;
    b->encoder_repetition_penalty = erp, b->encoder_no_repeat_ngram_size = (int)eng;
    TRY(id_list(json_object_get(root, "suppress_tokens"), file, "suppress_tokens", b->suppress,
                LOGIT_PROCS_MAX_IDS, &b->n_suppress, err));
    TRY(id_list(json_object_get(root, "begin_suppress_tokens"), file, "begin_suppress_tokens",
                b->begin_suppress, LOGIT_PROCS_MAX_IDS, &b->n_begin_suppress, err));
    const json_t *bos = json_object_get(root, "forced_bos_token_id");
    if (bos && !json_is_null(bos)) {
        TRY(token_id(bos, file, "forced_bos_token_id", &b->forced_bos, err));
        b->n_forced_bos = 1;
    }
    /* forced_eos_token_id: an id or a list of them */
    const json_t *fe = json_object_get(root, "forced_eos_token_id");
    if (fe && !json_is_null(fe)) {
        if (json_is_array(fe))
            TRY(id_list(fe, file, "forced_eos_token_id", b->forced_eos, LOGIT_PROCS_MAX_FORCED,
                        &b->n_forced_eos, err));
        else
            TRY(token_id(fe, file, "forced_eos_token_id", &b->forced_eos[b->n_forced_eos++], err));
    }
    TRY(sequence_bias(root, file, b, err));
    TRY(length_decay(root, file, b, err));
    return bad_words(root, file, b, err);
}

/* Appends "key = value" to gc->ignored when the file sets key to something other than `off`
 * (the value at which transformers leaves the output unchanged). */
static void note_unapplied(GenConfig *gc, const json_t *root, const char *key, double off) {
    const json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return;
    if ((json_is_number(v) && json_number_value(v) == off) || json_is_false(v)) return;
    if (json_is_array(v) && json_array_size(v) == 0) return;
    char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    size_t used = strlen(gc->ignored);
    snprintf(gc->ignored + used, sizeof gc->ignored - used, "%s%s = %.60s", used ? ", " : "", key,
             text ? text : "?");
    free(text);
}

int gen_config_read(const char *dir, GenConfig *gc, Err *err) {
    memset(gc, 0, sizeof *gc);
    char *file = fs_join(dir, "generation_config.json"), *text = NULL;
    size_t len = 0;
    int rc = 0;
    if (fs_exists(file)) {
        rc = fs_read_all(file, &text, &len, err);
        if (rc == 0) rc = gen_config_parse(text, len, file, gc, err);
    }
    free(text);
    free(file);
    return rc;
}

int gen_config_parse(const char *text, size_t len, const char *file, GenConfig *gc, Err *err) {
    memset(gc, 0, sizeof *gc);
    json_t *root = json_load_mem(text, len, file, err);
    int rc = root ? 0 : -1;
    if (rc == 0 && !json_is_object(root))
        rc = err_set(err, "%s: expected a JSON object, found %s", file, json_kind(root));
    const json_t *ds = rc == 0 ? json_object_get(root, "do_sample") : NULL;
    if (rc == 0 && ds && !json_is_null(ds) && !json_is_boolean(ds))
        rc = err_set(err, "%s: \"do_sample\" must be true, false or null, found %s", file,
                     json_kind(ds));
    /* transformers' defaults for what the file leaves out. A temperature of 0 is refused only
     * where it would be used (transformers raises). */
    double t = 1.0, k = 50, p = 1.0, mp = 0, mnt = 0, rp = 1.0, nr = 0, nb = 1, lpen = 1.0;
    double typ = 1.0, eps = 0, eta = 0;
    int sample = rc == 0 && json_is_true(ds);
    if (rc == 0)
        rc = number(root, "temperature", file, 0, sample, 1e30, 0,
                    sample ? "> 0 when do_sample is true" : ">= 0", &t, err);
    if (rc == 0) rc = number(root, "top_k", file, 0, 0, 1e9, 1, "a whole number >= 0", &k, err);
    if (rc == 0) rc = number(root, "top_p", file, 0, 1, 1, 0, "in (0, 1]", &p, err);
    if (rc == 0) rc = number(root, "min_p", file, 0, 0, 1, 0, "in [0, 1]", &mp, err);
    if (rc == 0) rc = number(root, "typical_p", file, 0, 1, 1, 0, "in (0, 1]", &typ, err);
    if (rc == 0)
        rc = number(root, "epsilon_cutoff", file, 0, 0, 0x1.fffffffffffffp-1, 0, "in [0, 1)", &eps,
                    err);
    if (rc == 0)
        rc =
            number(root, "eta_cutoff", file, 0, 0, 0x1.fffffffffffffp-1, 0, "in [0, 1)", &eta, err);
    /* Logits processors: greedy decoding takes them too. */
    if (rc == 0) rc = number(root, "repetition_penalty", file, 0, 1, 1e30, 0, "> 0", &rp, err);
    if (rc == 0)
        rc = number(root, "no_repeat_ngram_size", file, 0, 0, 1e6, 1, "a whole number >= 0", &nr,
                    err);
    if (rc == 0)
        rc = number(root, "max_new_tokens", file, 1, 0, 1e9, 1, "a whole number >= 1", &mnt, err);
    /* Beam search. */
    if (rc == 0)
        rc = number(root, "num_beams", file, 1, 0, 1e6, 1, "a whole number >= 1", &nb, err);
    if (rc == 0)
        rc = number(root, "length_penalty", file, -1e30, 0, 1e30, 0, "a number in [-1e30, 1e30]",
                    &lpen, err);
    if (rc == 0) rc = procs(root, file, &gc->procs, err);
    double plt = 0, mng = 0;
    if (rc == 0)
        rc = number(root, "prompt_lookup_num_tokens", file, 0, 0, GEN_MAX_CANDIDATES, 1,
                    "a whole number from 0 to 256", &plt, err);
    if (rc == 0)
        rc = number(root, "max_matching_ngram_size", file, 0, 0, 64, 1,
                    "a whole number from 0 to 64", &mng, err);
    double nat = 0, act = -1;
    if (rc == 0)
        rc = number(root, "num_assistant_tokens", file, 1, 0, GEN_MAX_CANDIDATES, 1,
                    "a whole number from 1 to 256", &nat, err);
    if (rc == 0)
        rc = number(root, "assistant_confidence_threshold", file, 0, 0, 1, 0, "in [0, 1]", &act,
                    err);
    gc->lookup_tokens = (int)plt, gc->lookup_ngram = (int)mng;
    gc->assistant_tokens = (int)nat, gc->assistant_confidence = (float)act;
    BeamStop stop = BEAM_STOP_HEURISTIC;
    const json_t *es = rc == 0 ? json_object_get(root, "early_stopping") : NULL;
    if (rc == 0 && es && !json_is_null(es)) {
        if (json_is_boolean(es))
            stop = json_is_true(es) ? BEAM_STOP_EARLY : BEAM_STOP_HEURISTIC;
        else if (json_is_string(es) && !strcmp(json_string_value(es), "never"))
            stop = BEAM_STOP_NEVER;
        else
            rc = err_set(err, "%s: \"early_stopping\" must be true, false or \"never\"", file);
    }
    const json_t *eos = rc == 0 ? json_object_get(root, "eos_token_id") : NULL;
    if (rc == 0 && eos && !json_is_null(eos)) {
        size_t n = json_is_array(eos) ? json_array_size(eos) : 1;
        for (size_t i = 0; i < n && rc == 0; i++) {
            const json_t *e = json_is_array(eos) ? json_array_get(eos, i) : eos;
            if (!json_is_integer(e) || json_integer_value(e) < 0 ||
                json_integer_value(e) > INT32_MAX)
                rc =
                    err_set(err, "%s: \"eos_token_id\" must be a token id or a list of them", file);
            else if (gc->n_eos < GEN_CONFIG_MAX_EOS)
                gc->eos[gc->n_eos++] = (int32_t)json_integer_value(e);
        }
    }
    if (rc == 0) {
        gc->found = 1;
        gc->do_sample = json_is_true(ds);
        gc->sp = (SampleParams){.temperature = gc->do_sample ? (float)t : 0.0f,
                                .top_k = (int)k,
                                .top_p = (float)p,
                                .min_p = (float)mp,
                                .typical_p = (float)typ,
                                .epsilon = (float)eps,
                                .eta = (float)eta,
                                .repetition_penalty = (float)rp,
                                .no_repeat_ngram_size = (int)nr};
        gc->max_new_tokens = (long)mnt;
        gc->beams = (BeamParams){.num_beams = gc->do_sample ? 1 : (int)nb,
                                 .length_penalty = (float)lpen,
                                 .early_stopping = stop};
        if (gc->do_sample && nb > 1) /* beam sampling */
            note_unapplied(gc, root, "num_beams", 1);
        /* What changes transformers' output and qtitan does not compute. */
        static const struct {
            const char *key;
            double off;
        } UNAPPLIED[] = {{"top_h", -1},
                         {"penalty_alpha", 0},
                         {"guidance_scale", 1},
                         {"dola_layers", 0},
                         {"num_beam_groups", 1},
                         {"diversity_penalty", 0},
                         {"renormalize_logits", 0},
                         {"token_healing", 0},
                         {"watermarking_config", 0},
                         {"force_words_ids", 0},
                         {"constraints", 0},
                         {"stop_strings", 0}};
        for (size_t i = 0; i < sizeof UNAPPLIED / sizeof UNAPPLIED[0]; i++)
            note_unapplied(gc, root, UNAPPLIED[i].key, UNAPPLIED[i].off);
    }
    json_decref(root);
    return rc;
}
