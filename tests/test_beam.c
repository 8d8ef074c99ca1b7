/* Beam search (infer/beam.h) against transformers' generate(num_beams = k, do_sample = False)
 * on the cases of tests/fixtures/generate/beams.json (tools/make_generate_fixtures.py): dense
 * and MoE models, 2 to 4 beams, length penalties -1 to 2, early_stopping false / true /
 * "never", one or two EOS ids that end beams at different steps, the repetition penalty and
 * n-gram ban on log-probabilities, several returned beams. The same ids, scores within 2e-5 and
 * each id's log-probability within 1e-4; prompts searched side by side as alone; and the
 * sentences for what beams do not take. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h> /* after the headers it relies on */

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "infer/beam.h"
#include "infer/gen_config.h"
#include "infer/infer_model.h"

#define TOL_SCORE 2e-5
#define TOL_LOGPROB 1e-4

static char *fixture(const char *name) {
    const char *src = getenv("QT_SOURCE_DIR");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/generate/%s", src ? src : ".", name);
    return xstrdup(dir);
}

static int32_t *ints(const json_t *a, int *n) {
    *n = (int)json_array_size(a);
    int32_t *v = xcalloc((size_t)*n + 1, sizeof *v);
    for (int i = 0; i < *n; i++)
        v[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    return v;
}

static BeamStop stop_of(const json_t *es) {
    if (json_is_string(es)) return BEAM_STOP_NEVER; /* the fixture's only string: "never" */
    return json_is_true(es) ? BEAM_STOP_EARLY : BEAM_STOP_HEURISTIC;
}

static void check_case(const json_t *c, size_t ci) {
    char *dir = fixture(json_string_value(json_object_get(c, "model")));
    InferModel im;
    Err err;
    if (infer_model_open(&im, dir, NULL, NULL, 1, 1, 0, &err)) fail_msg("%s", err.msg);
    int len, n_eos;
    int32_t *prompt = ints(json_object_get(c, "prompt"), &len);
    int32_t *eos = ints(json_object_get(c, "eos"), &n_eos);
    BeamParams bp = {
        .num_beams = (int)json_integer_value(json_object_get(c, "num_beams")),
        .length_penalty = (float)json_number_value(json_object_get(c, "length_penalty")),
        .early_stopping = stop_of(json_object_get(c, "early_stopping")),
    };
    /* The case's processors are keys of a generation_config.json, read as generate reads
     * the file. */
    char *text = json_dumps(c, JSON_COMPACT);
    GenConfig gc;
    if (gen_config_parse(text, strlen(text), "beams.json", &gc, &err))
        fail_msg("case %zu: %s", ci, err.msg);
    free(text);
    GenOptions o = {
        .max_new_tokens = (int)json_integer_value(json_object_get(c, "max_new_tokens")),
        .sample = {.temperature = 0.0f,
                   .top_p = 1.0f,
                   .repetition_penalty = gc.sp.repetition_penalty,
                   .no_repeat_ngram_size = gc.sp.no_repeat_ngram_size},
        .eos = eos,
        .n_eos = n_eos,
        .procs = &gc.procs,
    };
    const json_t *seqs = json_object_get(c, "sequences");
    int n_out = (int)json_array_size(seqs);
    Decoder d;
    if (decoder_create(&d, &im.m, bp.num_beams, len + o.max_new_tokens, &err))
        fail_msg("%s", err.msg);
    GenOutput *out = xcalloc((size_t)n_out, sizeof *out);
    GenStats st;
    const int32_t *one = prompt;
    if (beam_search(&d, im.tok, &one, &len, 1, &o, &bp, out, n_out, &st, &err))
        fail_msg("case %zu: %s", ci, err.msg);
    for (int r = 0; r < n_out; r++) {
        int n;
        int32_t *want = ints(json_array_get(seqs, (size_t)r), &n);
        if (out[r].n != n || memcmp(out[r].ids, want, (size_t)n * sizeof *want) != 0) {
            fprintf(stderr, "case %zu (%s, %d beams) sequence %d: got", ci, dir, bp.num_beams, r);
            for (int t = 0; t < out[r].n; t++)
                fprintf(stderr, " %d", out[r].ids[t]);
            fprintf(stderr, "; want");
            for (int t = 0; t < n; t++)
                fprintf(stderr, " %d", want[t]);
            fprintf(stderr, "\n");
            fail();
        }
        double score = json_number_value(json_array_get(json_object_get(c, "scores"), (size_t)r));
        assert_true(fabs(out[r].score - score) <= TOL_SCORE * fmax(1.0, fabs(score)));
        const json_t *lp = json_array_get(json_object_get(c, "logprobs"), (size_t)r);
        for (int t = 0; t < n; t++)
            assert_true(fabs(out[r].logprobs[t] -
                             json_number_value(json_array_get(lp, (size_t)t))) <= TOL_LOGPROB);
        int ended = 0;
        for (int e = 0; e < n_eos && n > 0; e++)
            ended |= want[n - 1] == eos[e];
        assert_string_equal(out[r].finish, ended ? "eos" : "length");
        free(want);
        gen_output_free(&out[r]);
    }
    assert_true(st.new_tokens > 0 && st.prompt_tokens == len);
    free(out);
    decoder_free(&d);
    infer_model_close(&im);
    free(prompt), free(eos), free(dir);
}

static void test_transformers_parity(void **state) {
    (void)state;
    char *path = fixture("beams.json");
    json_t *cases = json_load_file(path, 0, NULL);
    assert_non_null(cases);
    assert_true(json_array_size(cases) >= 8);
    size_t i;
    json_t *c;
    int ended_early = 0, penalized = 0, never = 0, biased = 0;
    json_array_foreach(cases, i, c) {
        check_case(c, i);
        const json_t *seqs = json_object_get(c, "sequences");
        int M = (int)json_integer_value(json_object_get(c, "max_new_tokens"));
        ended_early += (int)json_array_size(json_array_get(seqs, 0)) < M;
        penalized += json_object_get(c, "repetition_penalty") != NULL;
        never += json_is_string(json_object_get(c, "early_stopping"));
        biased += json_object_get(c, "sequence_bias") != NULL;
    }
    /* The fixture covers beams that end at an EOS, the processors and "never". */
    assert_true(ended_early >= 2 && penalized >= 1 && never >= 2 && biased >= 2);
    json_decref(cases);
    free(path);
}

/* Several prompts searched side by side give what each gives alone: every fixture prompt on
 * the first case's model, 2 beams, the EOS ids of all cases (so the searches end at different
 * steps), early_stopping true, alone and then all in one call. */
static void test_batched(void **state) {
    (void)state;
    char *path = fixture("beams.json");
    json_t *cases = json_load_file(path, 0, NULL);
    assert_non_null(cases);
    const json_t *c0 = json_array_get(cases, 0);
    char *dir = fixture(json_string_value(json_object_get(c0, "model")));
    InferModel im;
    Err err;
    if (infer_model_open(&im, dir, NULL, NULL, 1, 1, 0, &err)) fail_msg("%s", err.msg);
    int n = (int)json_array_size(cases), n_eos = 0, longest = 0;
    int32_t eos[64];
    int32_t **prompts = xcalloc((size_t)n, sizeof *prompts);
    int *lens = xcalloc((size_t)n, sizeof *lens);
    for (int p = 0; p < n; p++) {
        const json_t *c = json_array_get(cases, (size_t)p);
        prompts[p] = ints(json_object_get(c, "prompt"), &lens[p]);
        if (lens[p] > longest) longest = lens[p];
        int ne;
        int32_t *e = ints(json_object_get(c, "eos"), &ne);
        for (int i = 0; i < ne && n_eos < 64; i++)
            eos[n_eos++] = e[i];
        free(e);
    }
    BeamParams bp = {.num_beams = 2, .length_penalty = 1.0f, .early_stopping = BEAM_STOP_EARLY};
    GenOptions o = {.max_new_tokens = 16, .sample = {.top_p = 1.0f}, .eos = eos, .n_eos = n_eos};
    int k = bp.num_beams, n_out = 2;
    Decoder d;
    if (decoder_create(&d, &im.m, n * k, longest + o.max_new_tokens, &err)) fail_msg("%s", err.msg);
    GenOutput *alone = xcalloc((size_t)n * n_out, sizeof *alone);
    GenOutput *batch = xcalloc((size_t)n * n_out, sizeof *batch);
    for (int p = 0; p < n; p++) {
        const int32_t *one = prompts[p];
        if (beam_search(&d, NULL, &one, &lens[p], 1, &o, &bp, alone + p * n_out, n_out, NULL, &err))
            fail_msg("%s", err.msg);
    }
    GenStats st;
    if (beam_search(&d, NULL, (const int32_t *const *)prompts, lens, n, &o, &bp, batch, n_out, &st,
                    &err))
        fail_msg("%s", err.msg);
    int shortest = o.max_new_tokens, longest_out = 0;
    for (int i = 0; i < n * n_out; i++) {
        if (alone[i].n < shortest) shortest = alone[i].n;
        if (alone[i].n > longest_out) longest_out = alone[i].n;
        assert_int_equal(batch[i].n, alone[i].n);
        assert_memory_equal(batch[i].ids, alone[i].ids, (size_t)alone[i].n * sizeof *alone[i].ids);
        /* a product of more rows may add in another order */
        assert_true(fabs(batch[i].score - alone[i].score) <=
                    TOL_SCORE * fmax(1.0, fabs(alone[i].score)));
    }
    assert_true(shortest < longest_out); /* the searches ended at different steps */
    long total = 0;
    for (int p = 0; p < n; p++)
        total += lens[p];
    assert_int_equal(st.prompt_tokens, total);
    for (int i = 0; i < n * n_out; i++)
        gen_output_free(&alone[i]), gen_output_free(&batch[i]);
    for (int p = 0; p < n; p++)
        free(prompts[p]);
    free(prompts), free(lens), free(alone), free(batch);
    decoder_free(&d);
    infer_model_close(&im);
    json_decref(cases);
    free(dir), free(path);
}

/* What beam search refuses, each in a sentence. */
static void test_refusals(void **state) {
    (void)state;
    char *dir = fixture("dense_tied_gqa");
    InferModel im;
    Err err;
    if (infer_model_open(&im, dir, NULL, NULL, 1, 1, 0, &err)) fail_msg("%s", err.msg);
    Decoder d;
    if (decoder_create(&d, &im.m, 4, 16, &err)) fail_msg("%s", err.msg);
    int32_t prompt[3] = {1, 2, 3};
    const char *stop[1] = {"x"};
    GenOutput out[3];
    struct {
        GenOptions o;
        BeamParams bp;
        int n_out;
        const char *want;
    } bad[] = {
        {{.max_new_tokens = 4, .sample = {.temperature = 0.7f, .top_p = 1.0f}},
         {2, 1.0f, BEAM_STOP_HEURISTIC},
         1,
         "beam search with sampling"},
        {{.max_new_tokens = 4, .sample = {.top_p = 1.0f}, .stop = stop, .n_stop = 1},
         {2, 1.0f, BEAM_STOP_HEURISTIC},
         1,
         "stop strings do not apply"},
        {{.max_new_tokens = 4, .sample = {.top_p = 1.0f}},
         {2, 1.0f, BEAM_STOP_HEURISTIC},
         3,
         "num_return_sequences = 3 must be between 1 and num_beams = 2"},
        {{.max_new_tokens = 4, .sample = {.top_p = 1.0f}},
         {5, 1.0f, BEAM_STOP_HEURISTIC},
         1,
         "1 prompts of 5 beams for a decoder of 4 sequences"},
        {{.max_new_tokens = 14, .sample = {.top_p = 1.0f}},
         {2, 1.0f, BEAM_STOP_HEURISTIC},
         1,
         "a prompt of 3 tokens and 14 new ones in 16 positions"},
    };
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        const int32_t *one = prompt;
        int three = 3;
        assert_int_not_equal(beam_search(&d, NULL, &one, &three, 1, &bad[b].o, &bad[b].bp, out,
                                         bad[b].n_out, NULL, &err),
                             0);
        fprintf(stderr, "expected error: %s\n", err.msg);
        assert_non_null(strstr(err.msg, bad[b].want));
    }
    decoder_free(&d);
    infer_model_close(&im);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transformers_parity),
        cmocka_unit_test(test_batched),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
