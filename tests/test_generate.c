/* Generation: greedy parity with transformers' generate(do_sample=False) on the fixtures of
 * tools/make_generate_fixtures.py (dense tied GQA, dense untied MHA, MoE; 64 new tokens;
 * prompts of different lengths batched together): the same ids, and log-probs within 1e-4.
 * The same after reusing cached prompt positions. The KV-cache decode, prompts run in pieces
 * and reused caches against full forwards of the training path (qwen3_forward), fp32 and
 * bf16. The sampling filters on hand-made distributions, and seeded reproducibility. A
 * completion's text as its ids come (GenText) against decoding all of them at every step. */
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
#include <unistd.h>

#include "core/fs.h"
#include "infer/decode.h"
#include "infer/gen_config.h"
#include "infer/generate.h"
#include "infer/infer_model.h"
#include "infer/sample.h"
#include "io/token_lines.h"
#include "parity_util.h"
#include "text/utf8.h"

#define NEW 64
#define TOL_LOGPROB 1e-4

/* Candidates prompt lookup kept over the parity cases (check_case); test_lookup_used reads it. */
static long lookup_kept;

static char *fixture(const char *name, const char *file) {
    const char *src = getenv("QT_SOURCE_DIR");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/generate/%s", src ? src : ".", name);
    return file ? fs_join(dir, file) : xstrdup(dir);
}

/* Lines of floats: row i's count[i] values into out[i * NEW ..]. */
static void read_logprobs(const char *path, double *out, int rows, const int *count) {
    char *data;
    size_t len;
    Err err;
    if (fs_read_all(path, &data, &len, &err)) fail_msg("%s", err.msg);
    char *p = data;
    for (int i = 0; i < rows; i++)
        for (int t = 0; t < count[i]; t++) {
            char *end;
            out[i * NEW + t] = strtod(p, &end);
            assert_true(end != p);
            p = end;
        }
    free(data);
}

/* Checks the completions out[0..n) of a parity case against transformers' (expected, lps, count)
 * and frees them: the same ids (how names the run in a failure); returns the largest
 * |log-prob difference|. */
static double compare_expected(const char *name, const char *how, GenOutput *out, int n,
                               const TokenLines *expected, const double *lps, const int *count) {
    double worst = 0.0;
    for (int i = 0; i < n; i++) {
        assert_int_equal(out[i].n, count[i]);
        for (int t = 0; t < count[i]; t++) {
            if (out[i].ids[t] != expected->ids[expected->start[i] + t])
                fail_msg("%s prompt %d token %d%s: got %d, transformers %d", name, i, t, how,
                         out[i].ids[t], expected->ids[expected->start[i] + t]);
            worst = fmax(worst, fabs(out[i].logprobs[t] - lps[i * NEW + t]));
        }
        gen_output_free(&out[i]);
    }
    return worst;
}

static void check_case(const char *name) {
    char *dir = fixture(name, NULL);
    InferModel im;
    Err err;
    if (infer_model_open(&im, dir, NULL, NULL, 1, 1, 0, &err)) fail_msg("%s", err.msg);
    int V = im.m.spec.vocab_size;
    char *pp = fixture(name, "prompts.txt"), *ep = fixture(name, "expected_ids.txt");
    char *lp = fixture(name, "expected_logprobs.txt");
    TokenLines prompts, expected;
    if (token_lines_read(&prompts, pp, V, 4096, &err)) fail_msg("%s", err.msg);
    if (token_lines_read(&expected, ep, V, 4096, &err)) fail_msg("%s", err.msg);
    assert_int_equal(prompts.n, expected.n);
    /* Each completion's length: NEW, or fewer where transformers ended it at an EOS id. */
    int *count = xcalloc((size_t)prompts.n, sizeof *count);
    for (int i = 0; i < prompts.n; i++) {
        count[i] = (int)(expected.start[i + 1] - expected.start[i]);
        assert_true(count[i] >= 1 && count[i] <= NEW);
    }
    double *lps = xcalloc((size_t)prompts.n * NEW, sizeof *lps);
    read_logprobs(lp, lps, prompts.n, count);

    const int32_t **ptr = xcalloc((size_t)prompts.n, sizeof *ptr);
    int *lens = xcalloc((size_t)prompts.n, sizeof *lens);
    int longest = 0;
    for (int i = 0; i < prompts.n; i++) {
        ptr[i] = prompts.ids + prompts.start[i];
        lens[i] = (int)(prompts.start[i + 1] - prompts.start[i]);
        if (lens[i] > longest) longest = lens[i];
    }
    Decoder d;
    if (decoder_create(&d, &im.m, prompts.n, longest + NEW, &err)) fail_msg("%s", err.msg);
    GenOptions o = {.max_new_tokens = NEW, .sample = {.temperature = 0.0f, .top_p = 1.0f}};
    /* A case made with generation settings keeps them in its generation_config.json (greedy,
     * with a repetition penalty, or the processors that forbid ids and an EOS id). */
    GenConfig gc;
    if (gen_config_read(dir, &gc, &err)) fail_msg("%s", err.msg);
    if (gc.found) o.sample = gc.sp, o.procs = &gc.procs, o.eos = gc.eos, o.n_eos = gc.n_eos;
    GenOutput *out = xcalloc((size_t)prompts.n, sizeof *out);
    if (generate(&d, NULL, ptr, lens, prompts.n, &o, out, NULL, NULL, NULL, &err))
        fail_msg("%s", err.msg);
    for (int i = 0; i < prompts.n; i++) {
        int32_t last = expected.ids[expected.start[i] + count[i] - 1];
        assert_string_equal(out[i].finish, gen_is_eos(&o, last) ? "eos" : "length");
    }
    double worst = compare_expected(name, "", out, prompts.n, &expected, lps, count);
    printf("%s: %d prompts x up to %d tokens identical, max |logprob diff| %.3g\n", name, prompts.n,
           NEW, worst);
    assert_true(worst < TOL_LOGPROB);
    /* A later call that keeps what the cache holds of its prompts (a conversation's next turn)
     * gives the same: the first halves of the prompts are cached by one call, the next runs
     * only the second halves, through decoder_extend, and must match transformers as well. */
    GenOptions half = o;
    half.max_new_tokens = 1;
    int *hl = xcalloc((size_t)prompts.n, sizeof *hl);
    long want_reused = 0;
    for (int i = 0; i < prompts.n; i++)
        want_reused += hl[i] = lens[i] / 2 > 0 ? lens[i] / 2 : 1;
    if (generate(&d, NULL, ptr, hl, prompts.n, &half, out, NULL, NULL, NULL, &err))
        fail_msg("%s", err.msg);
    for (int i = 0; i < prompts.n; i++) {
        gen_output_free(&out[i]);
        if (hl[i] == lens[i]) want_reused -= hl[i]; /* a prompt's last position is always run */
    }
    GenOptions again = o;
    again.reuse_cache = 1;
    GenStats st;
    if (generate(&d, NULL, ptr, lens, prompts.n, &again, out, NULL, NULL, &st, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(st.reused_tokens, want_reused);
    double worst_reused =
        compare_expected(name, " after reusing the cache", out, prompts.n, &expected, lps, count);
    printf("%s: the same after reusing %ld cached prompt positions, max |logprob diff| %.3g\n",
           name, st.reused_tokens, worst_reused);
    assert_true(worst_reused < TOL_LOGPROB);
    free(hl);
    /* Prompt lookup (candidates from each sequence's own ids, checked in one pass) gives the
     * same ids and log-probs in fewer passes. */
    GenOptions look = o;
    look.lookup_tokens = 4;
    if (generate(&d, NULL, ptr, lens, prompts.n, &look, out, NULL, NULL, &st, &err))
        fail_msg("%s", err.msg);
    double worst_look =
        compare_expected(name, " with prompt lookup", out, prompts.n, &expected, lps, count);
    printf("%s: the same with prompt lookup (%ld of %ld candidates kept, %ld passes), max "
           "|logprob diff| %.3g\n",
           name, st.lookup_accepted, st.lookup_proposed, st.passes, worst_look);
    assert_true(worst_look < TOL_LOGPROB);
    lookup_kept += st.lookup_accepted;
    /* Assisted decoding: another fixture model of the same vocabulary drafts, and then the
     * model itself (whose drafts are all kept); the same ids and log-probs either way. */
    for (int self = 0; self < 2; self++) {
        const char *dname = self                             ? name
                            : strcmp(name, "dense_tied_gqa") ? "dense_tied_gqa"
                                                             : "dense_untied_mha";
        char *ddir = fixture(dname, NULL);
        InferModel dm;
        Decoder dd;
        if (infer_model_open(&dm, ddir, NULL, NULL, 1, 1, 0, &err)) fail_msg("%s", err.msg);
        if (decoder_create(&dd, &dm.m, prompts.n, longest + NEW, &err)) fail_msg("%s", err.msg);
        GenOptions as = o;
        as.draft = &dd, as.draft_tokens = 5, as.draft_confidence = 0.0f;
        if (generate(&d, NULL, ptr, lens, prompts.n, &as, out, NULL, NULL, &st, &err))
            fail_msg("%s", err.msg);
        char how[64];
        snprintf(how, sizeof how, " drafted by %s", dname);
        double worst_as = compare_expected(name, how, out, prompts.n, &expected, lps, count);
        printf("%s: the same drafted by %s (%ld of %ld drafts kept, %ld passes), max |logprob "
               "diff| %.3g\n",
               name, dname, st.lookup_accepted, st.lookup_proposed, st.passes, worst_as);
        assert_true(worst_as < TOL_LOGPROB);
        /* A model drafting for itself (through the same processors) has every draft kept. */
        if (self) assert_int_equal(st.lookup_accepted, st.lookup_proposed);
        decoder_free(&dd);
        infer_model_close(&dm);
        free(ddir);
    }
    /* An EOS id ends a sequence there (kept as its last id); the others run on. (A case with
     * forbidden ids forbids its EOS.) */
    if (!gc.found || !sample_procs_on(&gc.procs)) {
        int32_t eos = expected.ids[expected.start[0] + 5];
        int stop_at = 0;
        while (expected.ids[expected.start[0] + stop_at] != eos)
            stop_at++;
        o.eos = &eos;
        o.n_eos = 1;
        if (generate(&d, NULL, ptr, lens, prompts.n, &o, out, NULL, NULL, NULL, &err))
            fail_msg("%s", err.msg);
        assert_int_equal(out[0].n, stop_at + 1);
        assert_int_equal(out[0].ids[stop_at], eos);
        assert_string_equal(out[0].finish, "eos");
        for (int i = 0; i < prompts.n; i++)
            gen_output_free(&out[i]);
    }
    decoder_free(&d);
    free(out), free(ptr), free(lens), free(lps), free(count);
    token_lines_free(&prompts), token_lines_free(&expected);
    infer_model_close(&im);
    free(dir), free(pp), free(ep), free(lp);
}

static void test_parity_dense_tied_gqa(void **state) {
    (void)state;
    check_case("dense_tied_gqa");
}
static void test_parity_dense_untied_mha(void **state) {
    (void)state;
    check_case("dense_untied_mha");
}
static void test_parity_moe(void **state) {
    (void)state;
    check_case("moe");
}
static void test_parity_dense_reppen(void **state) {
    (void)state;
    check_case("dense_reppen");
}
static void test_parity_dense_norepeat(void **state) {
    (void)state;
    check_case("dense_norepeat");
}
/* generation_config.json's min_new_tokens (with an EOS id), suppress_tokens,
 * begin_suppress_tokens and bad_words_ids, as transformers' processors forbid ids. */
static void test_parity_dense_bans(void **state) {
    (void)state;
    check_case("dense_bans");
}

/* The other processors of generation_config.json: sequence_bias, encoder_repetition_penalty,
 * encoder_no_repeat_ngram_size, forced_bos_token_id (a one-id prompt), begin_suppress_tokens
 * after it, forced_eos_token_id. */
static void test_parity_dense_procs(void **state) {
    (void)state;
    check_case("dense_procs");
}
/* exponential_decay_length_penalty with an EOS id: the completions end at different steps. */
static void test_parity_dense_decay(void **state) {
    (void)state;
    check_case("dense_decay");
}

/* The parity cases above ran prompt lookup with some candidates kept (their greedy ids repeat
 * n-grams), so its accepting path was checked, not only its rejecting one. */
static void test_lookup_used(void **state) {
    (void)state;
    printf("prompt lookup kept %ld candidates over the parity cases\n", lookup_kept);
    assert_true(lookup_kept > 10);
}

static void test_parity_dense_yarn(void **state) {
    (void)state;
    check_case("dense_yarn");
}

/* Prefill then decode steps give the logits a full forward of the same tokens gives at each
 * position (the training path, qwen3_forward), with the same precision. */
static void check_cache(const char *name, int bf16, double tol) {
    char *dir = fixture(name, NULL);
    enum { T = 24, P = 7 };
    InferModel im;
    Err err;
    if (infer_model_open(&im, dir, NULL, NULL, 1, T, bf16, &err)) fail_msg("%s", err.msg);
    int V = im.m.spec.vocab_size;
    int32_t ids[T];
    for (int t = 0; t < T; t++)
        ids[t] = (int32_t)((t * 37 + 11) % V);
    qwen3_forward(&im.m, ids, NULL, NULL, NULL, 1, T);
    float *full = xcalloc((size_t)T * V, sizeof *full);
    memcpy(full, im.m.a.logits, (size_t)T * V * sizeof *full);
    Decoder d;
    if (decoder_create(&d, &im.m, 1, T, &err)) fail_msg("%s", err.msg);
    float *lg = xcalloc((size_t)V, sizeof *lg);
    decoder_prefill(&d, 0, ids, P, lg);
    double worst = rel_err(lg, full + (long)(P - 1) * V, V);
    int seq = 0;
    for (int t = P; t < T; t++) {
        decoder_step(&d, &seq, ids + t, 1, lg);
        double e = rel_err(lg, full + (long)t * V, V);
        if (e > worst) worst = e;
    }
    printf("%s %s: KV-cache decode vs full forward, max rel err %.3g\n", name,
           bf16 ? "bf16" : "fp32", worst);
    assert_true(worst < tol);
    /* A prompt run in pieces (decoder_extend after a prefill), and a prompt that keeps only the
     * cached positions it shares (decoder_reuse), against full forwards of the same ids. */
    decoder_prefill(&d, 0, ids, 3, lg);
    decoder_extend(&d, 0, ids + 3, 1, lg);
    decoder_extend(&d, 0, ids + 4, T - 4, lg);
    worst = rel_err(lg, full + (long)(T - 1) * V, V);
    int32_t other[T];
    memcpy(other, ids, sizeof other);
    for (int t = 10; t < T; t++)
        other[t] = (int32_t)((t * 11 + 3) % V);
    assert_int_equal(decoder_reuse(&d, 0, other, T), 10);
    assert_int_equal(decoder_reuse(&d, 0, other, 8), 7); /* the last position is run again */
    assert_int_equal(decoder_reuse(&d, 0, other, T), 7); /* and what it dropped is gone */
    decoder_extend(&d, 0, other + 7, T - 7, lg);
    qwen3_forward(&im.m, other, NULL, NULL, NULL, 1, T);
    double e = rel_err(lg, im.m.a.logits + (long)(T - 1) * V, V);
    if (e > worst) worst = e;
    printf("%s %s: prompts in pieces and reused cache vs full forward, max rel err %.3g\n", name,
           bf16 ? "bf16" : "fp32", worst);
    assert_true(worst < tol);
    decoder_free(&d);
    free(lg), free(full), free(dir);
    infer_model_close(&im);
}

static void test_cache_matches_forward(void **state) {
    (void)state;
    check_cache("dense_tied_gqa", 0, 1e-5);
    check_cache("dense_tied_gqa", 1, 1e-2);
    check_cache("moe", 0, 1e-5);
    check_cache("moe", 1, 1e-2);
}

/* bf16 inference (infer_model_open with bf16) holds the matmul weights in bf16 only: their
 * fp32 entries are NULL, the parameter arena shrinks, and decoding gives bit for bit the
 * logits of the same model run with fp32 masters cast to bf16 (training's mixed precision). */
static void check_bf16_only(const char *name) {
    char *dir = fixture(name, NULL);
    enum { T = 16, P = 5 };
    InferModel lean, ref;
    Err err;
    if (infer_model_open(&lean, dir, NULL, NULL, 1, 1, 1, &err)) fail_msg("%s", err.msg);
    if (infer_model_open(&ref, dir, NULL, NULL, 1, 1, 0, &err)) fail_msg("%s", err.msg);
    if (qwen3_enable_bf16_for_gemv(&ref.m, &err)) fail_msg("%s", err.msg);
    qwen3_refresh_bf16(&ref.m);
    int dropped = 0;
    for (int i = 0; i < lean.m.nparams; i++)
        if (!lean.m.table[i].data) {
            assert_int_equal(lean.m.table[i].kind->role, ROLE_LINEAR);
            dropped++;
        }
    assert_true(dropped > 0);
    assert_true(lean.m.param_arena.capacity < ref.m.param_arena.capacity);
    /* Loaded straight into bf16, each such weight holds the rounding of the fp32 load. */
    for (int i = 0; i < lean.m.nparams; i++) {
        const Qwen3Param *p = &lean.m.table[i];
        for (long k = 0; !p->data && k < p->numel; k++)
            if (p->data_bf16[k] != f32_to_bf16(ref.m.table[i].data[k]))
                fail_msg("%s: %s[%ld] differs from the fp32 load rounded", name, p->name, k);
    }
    int V = lean.m.spec.vocab_size;
    int32_t ids[T];
    for (int t = 0; t < T; t++)
        ids[t] = (int32_t)((t * 53 + 5) % V);
    Decoder a, b;
    if (decoder_create(&a, &lean.m, 1, T, &err) || decoder_create(&b, &ref.m, 1, T, &err))
        fail_msg("%s", err.msg);
    float *la = xcalloc((size_t)V, sizeof *la), *lb = xcalloc((size_t)V, sizeof *lb);
    decoder_prefill(&a, 0, ids, P, la);
    decoder_prefill(&b, 0, ids, P, lb);
    assert_memory_equal(la, lb, (size_t)V * sizeof *la);
    int seq = 0;
    for (int t = P; t < T; t++) {
        decoder_step(&a, &seq, ids + t, 1, la);
        decoder_step(&b, &seq, ids + t, 1, lb);
        assert_memory_equal(la, lb, (size_t)V * sizeof *la);
    }
    printf("%s bf16 only: %d weights without fp32 masters, parameter arena %zu -> %zu bytes, "
           "logits identical\n",
           name, dropped, ref.m.param_arena.capacity, lean.m.param_arena.capacity);
    decoder_free(&a), decoder_free(&b);
    free(la), free(lb), free(dir);
    infer_model_close(&lean), infer_model_close(&ref);
}

static void test_bf16_only(void **state) {
    (void)state;
    check_bf16_only("dense_tied_gqa");
    check_bf16_only("dense_untied_mha");
    check_bf16_only("moe");
    /* BF16 files (transformers' own), whose values are copied into the bf16 weights. */
    check_bf16_only("../hf_tiny/dense_tied");
    check_bf16_only("../hf_tiny/moe_sharded");
}

/* logits = log(probs): softmax gives the probs back. */
static void set_probs(float *logits, const double *p, int V) {
    for (int v = 0; v < V; v++)
        logits[v] = (float)log(p[v]);
}

static void expect_kept(Sampler *s, const float *logits, SampleParams sp, const char *want) {
    uint8_t keep[16];
    int n = sample_filter(s, logits, &sp, keep);
    char got[17];
    for (int v = 0; v < s->V; v++)
        got[v] = keep[v] ? '1' : '0';
    got[s->V] = '\0';
    if (strcmp(got, want) != 0)
        fail_msg("top_k %d top_p %g min_p %g temperature %g: kept %s, the definitions keep %s",
                 sp.top_k, sp.top_p, sp.min_p, sp.temperature, got, want);
    int count = 0;
    for (const char *c = want; *c; c++)
        count += *c == '1';
    assert_int_equal(n, count);
}

/* The repetition penalty as transformers' RepetitionPenaltyLogitsProcessor: seen ids' positive
 * logits divided, negative ones multiplied, unseen ones untouched; 1 and 0 are off. */
static void test_repetition_penalty(void **state) {
    (void)state;
    const float lg[6] = {2.0f, -1.5f, 0.0f, 3.0f, -4.0f, 1.0f};
    const uint8_t seen[6] = {1, 1, 1, 0, 0, 1};
    SampleParams sp = {.repetition_penalty = 2.0f};
    assert_true(sample_penalizes(&sp));
    float out[6];
    sample_penalize(out, lg, 6, seen, &sp);
    const float want[6] = {1.0f, -3.0f, 0.0f, 3.0f, -4.0f, 0.5f};
    assert_memory_equal(out, want, sizeof want);
    sp.repetition_penalty = 1.0f;
    assert_false(sample_penalizes(&sp));
    sp.repetition_penalty = 0.0f;
    assert_false(sample_penalizes(&sp));
    /* Below 1 it favours repeats: seen id 0 (2.0 -> 4.0) overtakes unseen id 3 (3.0). */
    sp.repetition_penalty = 0.5f;
    sample_penalize(out, lg, 6, seen, &sp);
    assert_true(out[0] == 4.0f && out[1] == -0.75f);
    Sampler smp;
    sampler_init(&smp, 6);
    Rng r;
    rng_seed(&r, 1, 0);
    assert_int_equal(sample_next(&smp, out, &sp, &r), 0);
    sampler_free(&smp);
}

/* The n-gram ban as transformers' NoRepeatNGramLogitsProcessor: the ids that followed each
 * earlier occurrence of the last n - 1 ids are banned; nothing before n ids; n = 1 bans every
 * id seen. */
static void test_no_repeat_ngrams(void **state) {
    (void)state;
    const int32_t hist[] = {1, 2, 3, 1, 2, 4, 1, 2};
    SampleParams sp = {.no_repeat_ngram_size = 3};
    assert_true(sample_penalizes(&sp));
    float sc[6];
    for (int v = 0; v < 6; v++)
        sc[v] = (float)v;
    sample_ban_ngrams(sc, 6, hist, 8, &sp); /* "1 2" was followed by 3 and 4 */
    const float want[6] = {0, 1, 2, -INFINITY, -INFINITY, 5};
    assert_memory_equal(sc, want, sizeof want);
    for (int v = 0; v < 6; v++)
        sc[v] = (float)v;
    sample_ban_ngrams(sc, 6, hist, 2, &sp); /* fewer than 3 ids: nothing */
    for (int v = 0; v < 6; v++)
        assert_true(sc[v] == (float)v);
    sp.no_repeat_ngram_size = 1;
    sample_ban_ngrams(sc, 6, hist, 8, &sp);
    for (int v = 0; v < 6; v++)
        assert_true(v >= 1 && v <= 4 ? isinf(sc[v]) : sc[v] == (float)v);
    sp.no_repeat_ngram_size = 0;
    assert_false(sample_penalizes(&sp));
}

/* The processors that forbid ids, on hand-made rows: min_length counts the prompt, min_new_tokens
 * the completion; begin_suppress_tokens only before the first new id; a bad word's last id
 * only after the ids before it, and not when the word is longer than the ids so far; a bad word
 * that is an EOS id is dropped. */
static void test_token_bans(void **state) {
    (void)state;
    enum { V = 8 };
    LogitProcs b = {.min_new_tokens = 2,
                    .min_length = 5,
                    .suppress = {6},
                    .n_suppress = 1,
                    .begin_suppress = {1},
                    .n_begin_suppress = 1,
                    .words = {7, 3, 4, 0, 2, 3, 4},
                    .word_end = {1, 3, 4, 7},
                    .n_words = 4};
    int32_t eos[1] = {0};
    int32_t hist[4] = {5, 3, 2, 3};
    struct {
        long len, n_new;
        const char *banned; /* ids at -inf */
    } cases[] = {
        /* EOS (no new id yet), 1 (the first new id), 6, 7, and 4 after 3; [2 3 4] is longer
         * than the ids so far */
        {2, 0, "01467"},
        {3, 1, "067"},  /* EOS (1 new id < 2), 6, 7; the ids end in 2 */
        {4, 2, "0467"}, /* EOS (4 ids < min_length 5), 6, 7, 4 after 3 and after 2 3 */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float row[V];
        for (int v = 0; v < V; v++)
            row[v] = (float)v;
        sample_ban_tokens(row, V, &b, hist, cases[c].len, cases[c].n_new, eos, 1);
        char got[V + 1];
        int n = 0;
        for (int v = 0; v < V; v++)
            if (isinf(row[v])) got[n++] = (char)('0' + v);
        got[n] = '\0';
        if (strcmp(got, cases[c].banned) != 0)
            fail_msg("case %zu: banned %s, want %s", c, got, cases[c].banned);
    }
    /* min_length and min_new_tokens met, a word longer than the ids so far */
    float row[V] = {0, 1, 2, 3, 4, 5, 6, 7};
    LogitProcs w = {.words = {1, 2, 3}, .word_end = {3}, .n_words = 1, .min_new_tokens = 1};
    int32_t h2[2] = {1, 2};
    sample_ban_tokens(row, V, &w, h2, 2, 1, eos, 1);
    for (int v = 0; v < V; v++)
        assert_false(isinf(row[v]));
    assert_false(sample_procs_on(NULL));
    assert_true(sample_procs_on(&w));
    char text[160];
    sample_procs_describe(text, sizeof text, &b);
    assert_string_equal(text,
                        ", min-new-tokens 2, min-length 5, 1 suppressed ids, 1 ids suppressed "
                        "at the start, 4 bad words");
}

/* sample_process on hand-made rows, each processor against its definition: sequence biases
 * that meet on one id sum, a longer sequence's bias only after its prefix; the prompt's ids
 * scaled by the encoder repetition penalty (up where positive); an id completing a prompt
 * n-gram forbidden (n = 1: every prompt id); the forced BOS id only after a one-id history,
 * the forced EOS ids only for the last new id, with suppress_tokens still applied after them;
 * the EOS decay once the completion is longer than its start. */
static void test_processors(void **state) {
    (void)state;
    enum { V = 6 };
    const float lg[V] = {1.0f, -2.0f, 3.0f, -4.0f, 0.5f, 2.0f};
    int32_t eos[1] = {5};
    uint8_t seen[V] = {0};
    int32_t hist[4] = {1, 2, 4, 2}; /* prompt 1 2 4, completion 2 */
    for (int t = 0; t < 4; t++)
        seen[hist[t]] |= t < 3 ? SEEN_ID | SEEN_PROMPT : SEEN_ID;
    ProcSeq q = {
        .seen = seen, .hist = hist, .len = 4, .n_new = 1, .max_new = 8, .eos = eos, .n_eos = 1};
    SampleParams sp = {.top_p = 1.0f};
    float out[V];

    LogitProcs b = {.seq = {3, 3, 2, 3, 1, 0},
                    .seq_end = {1, 2, 4, 6},
                    .seq_bias = {1.0f, 0.5f, 2.0f, 7.0f},
                    .n_seqs = 4};
    sample_process(out, lg, V, &sp, &b, &q);
    /* [3] +1 and [3] +0.5 always; [2 3] after the history's last id 2: +2; [1 0] not here */
    assert_true(out[3] == -4.0f + 3.5f && out[0] == 1.0f && out[2] == 3.0f);

    LogitProcs r = {.encoder_repetition_penalty = 2.0};
    sample_process(out, lg, V, &sp, &r, &q);
    assert_true(out[1] == -1.0f && out[2] == 6.0f && out[4] == 1.0f && out[0] == 1.0f &&
                out[3] == -4.0f);

    LogitProcs ng = {.encoder_no_repeat_ngram_size = 2};
    sample_process(out, lg, V, &sp, &ng, &q); /* prompt "2 4" follows the last id 2 */
    assert_true(isinf(out[4]) && !isinf(out[2]) && !isinf(out[1]));
    ng.encoder_no_repeat_ngram_size = 1;
    sample_process(out, lg, V, &sp, &ng, &q);
    assert_true(isinf(out[1]) && isinf(out[2]) && isinf(out[4]) && !isinf(out[0]));

    LogitProcs f = {.forced_bos = 3,
                    .n_forced_bos = 1,
                    .forced_eos = {4, 0},
                    .n_forced_eos = 2,
                    .suppress = {0},
                    .n_suppress = 1,
                    .begin_suppress = {2},
                    .n_begin_suppress = 1};
    sample_process(out, lg, V, &sp, &f, &q); /* neither forced here */
    assert_true(isinf(out[0]) && out[3] == -4.0f && out[4] == 0.5f);
    ProcSeq one = {.seen = seen, .hist = hist, .len = 1, .n_new = 0, .max_new = 8};
    sample_process(out, lg, V, &sp, &f, &one);
    for (int v = 0; v < V; v++)
        assert_true(v == 3 ? out[v] == 0.0f : isinf(out[v]));
    /* with a one-id prompt and a forced BOS id, begin_suppress_tokens wait one id */
    ProcSeq two = {.seen = seen, .hist = hist, .len = 2, .n_new = 1, .max_new = 8};
    sample_process(out, lg, V, &sp, &f, &two);
    assert_true(isinf(out[2]));
    ProcSeq last = q;
    last.n_new = 7, last.len = 10;
    int32_t h10[10] = {1, 2, 4, 2, 2, 2, 2, 2, 2, 2};
    last.hist = h10;
    sample_process(out, lg, V, &sp, &f, &last); /* EOS forced, suppressed 0 stays out */
    for (int v = 0; v < V; v++)
        assert_true(v == 4 ? out[v] == 0.0f : isinf(out[v]));

    LogitProcs d = {.decay_start = 2, .decay_factor = 1.5};
    q.n_new = 2;
    sample_process(out, lg, V, &sp, &d, &q);
    assert_true(out[5] == 2.0f);
    q.n_new = 4;
    sample_process(out, lg, V, &sp, &d, &q); /* 2 + |2| (1.5^2 - 1) */
    assert_float_equal(out[5], 2.0 + 2.0 * 1.25, 1e-6);
    char text[320];
    sample_procs_describe(text, sizeof text, &f);
    assert_string_equal(text, ", 1 suppressed ids, 1 ids suppressed at the start, a forced BOS "
                              "id, forced EOS ids at the end");
}

/* typical_p, epsilon_cutoff and eta_cutoff beside the other warpers: the ids kept on random rows
 * equal those transformers' warpers keep (tests/fixtures/generate/warpers.json). */
static void test_warpers_parity(void **state) {
    (void)state;
    char *path = fixture("", "warpers.json");
    json_t *cases = json_load_file(path, 0, NULL);
    assert_non_null(cases);
    size_t i, r;
    json_t *c, *row;
    int rows = 0;
    json_array_foreach(cases, i, c) {
        const json_t *p = json_object_get(c, "params");
        const json_t *t = json_object_get(p, "temperature"), *tk = json_object_get(p, "top_k");
        const json_t *tp = json_object_get(p, "top_p"), *mp = json_object_get(p, "min_p");
        const json_t *ty = json_object_get(p, "typical_p"),
                     *ep = json_object_get(p, "epsilon_cutoff");
        const json_t *et = json_object_get(p, "eta_cutoff");
        SampleParams sp = {.temperature = t ? (float)json_number_value(t) : 1.0f,
                           .top_k = (int)json_integer_value(tk),
                           .top_p = tp ? (float)json_number_value(tp) : 1.0f,
                           .min_p = mp ? (float)json_number_value(mp) : 0.0f,
                           .typical_p = ty ? (float)json_number_value(ty) : 1.0f,
                           .epsilon = ep ? (float)json_number_value(ep) : 0.0f,
                           .eta = et ? (float)json_number_value(et) : 0.0f};
        json_array_foreach(json_object_get(c, "rows"), r, row) {
            const json_t *lg = json_object_get(row, "logits"), *kept = json_object_get(row, "kept");
            int V = (int)json_array_size(lg);
            float *logits = xcalloc((size_t)V, sizeof *logits);
            for (int v = 0; v < V; v++)
                logits[v] = (float)json_number_value(json_array_get(lg, (size_t)v));
            Sampler smp;
            sampler_init(&smp, V);
            uint8_t *keep = xcalloc((size_t)V, 1);
            int n = sample_filter(&smp, logits, &sp, keep);
            assert_int_equal(n, (int)json_array_size(kept));
            for (size_t k = 0; k < json_array_size(kept); k++)
                if (!keep[json_integer_value(json_array_get(kept, k))])
                    fail_msg("case %zu row %zu: id %lld is dropped, transformers keeps it", i, r,
                             (long long)json_integer_value(json_array_get(kept, k)));
            sampler_free(&smp);
            free(keep), free(logits);
            rows++;
        }
    }
    assert_true(rows >= 20);
    json_decref(cases);
    free(path);
}

static void test_filters(void **state) {
    (void)state;
    Sampler s;
    sampler_init(&s, 5);
    float lg[5];
    /* ids 0..4 with probabilities 0.05, 0.5, 0.15, 0.3, 0.0 (tiny) */
    double p[5] = {0.05, 0.5, 0.15, 0.3, 1e-9};
    set_probs(lg, p, 5);
    SampleParams base = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f};
    SampleParams sp = base;
    expect_kept(&s, lg, sp, "11111");
    sp.top_k = 2;
    expect_kept(&s, lg, sp, "01010");
    sp.top_k = 1;
    expect_kept(&s, lg, sp, "01000");
    /* top-p: the most probable tokens until their sum reaches p. */
    sp = base;
    sp.top_p = 0.4f;
    expect_kept(&s, lg, sp, "01000");
    sp.top_p = 0.75f;
    expect_kept(&s, lg, sp, "01010");
    sp.top_p = 0.85f;
    expect_kept(&s, lg, sp, "01110");
    sp.top_p = 0.99f;
    expect_kept(&s, lg, sp, "11110");
    sp.top_p = 1e-6f; /* always at least one */
    expect_kept(&s, lg, sp, "01000");
    /* min-p: probability >= min_p * the largest. */
    sp = base;
    sp.min_p = 0.25f; /* floor 0.125 */
    expect_kept(&s, lg, sp, "01110");
    sp.min_p = 0.7f; /* floor 0.35 */
    expect_kept(&s, lg, sp, "01000");
    sp.min_p = 0.09f; /* floor 0.045 */
    expect_kept(&s, lg, sp, "11110");
    /* top-p after top-k sees the renormalised top-k distribution: with top_k 3 the three keep
     * 0.5/0.95, 0.3/0.95, 0.15/0.95; the first two sum to 0.842 >= 0.82, so the third goes
     * (on the raw probabilities 0.8 < 0.82 would keep it). */
    sp = base;
    sp.top_k = 3;
    sp.top_p = 0.82f;
    expect_kept(&s, lg, sp, "01010");
    /* Ties at the k-th logit all stay, as torch's `scores < kth value` keeps them. */
    double tie[5] = {0.3, 0.3, 0.2, 0.1, 0.1};
    set_probs(lg, tie, 5);
    sp = base;
    sp.top_k = 1;
    expect_kept(&s, lg, sp, "11000");
    sp.top_k = 4;
    expect_kept(&s, lg, sp, "11111");
    /* Temperature sharpens before top-p: at T = 0.5 the probabilities of {0.5, 0.3, 0.15,
     * 0.05} become proportional to their squares, {0.6944, 0.25, 0.0625, 0.0069}/..., so p =
     * 0.9 keeps two tokens where T = 1 keeps three. */
    set_probs(lg, p, 5);
    sp = base;
    sp.top_p = 0.9f;
    expect_kept(&s, lg, sp, "01110");
    sp.temperature = 0.5f;
    expect_kept(&s, lg, sp, "01010");
    sampler_free(&s);
}

static void test_draws(void **state) {
    (void)state;
    Sampler s;
    sampler_init(&s, 4);
    double p[4] = {0.2, 0.5, 0.3, 1e-12};
    float lg[4];
    set_probs(lg, p, 4);
    SampleParams sp = {.temperature = 1.0f, .top_p = 1.0f};
    Rng r;
    rng_seed(&r, 7, 0);
    long count[4] = {0};
    enum { DRAWS = 20000 };
    for (int i = 0; i < DRAWS; i++)
        count[sample_next(&s, lg, &sp, &r)]++;
    for (int v = 0; v < 4; v++)
        assert_true(fabs((double)count[v] / DRAWS - p[v]) < 0.015);
    /* Greedy: the first of equal maxima, as torch.argmax. */
    float flat[4] = {1.0f, 3.0f, 3.0f, 2.0f};
    sp.temperature = 0.0f;
    assert_int_equal(sample_next(&s, flat, &sp, &r), 1);
    sampler_free(&s);
}

/* Writes text to dir/generation_config.json (a fresh temporary dir). */
static void write_gen_config(char *dir, const char *text) {
    Err err;
    strcpy(dir, "/tmp/qt_gencfg_XXXXXX");
    assert_non_null(mkdtemp(dir));
    char *p = fs_join(dir, "generation_config.json");
    assert_int_equal(fs_write_atomic(p, text, strlen(text), &err), 0);
    free(p);
}

/* generation_config.json resolved as transformers' generate() resolves it
 * (tests/fixtures/generate/gen_configs.json, made with transformers); settings qtitan does not
 * apply are listed; bad values are sentences naming the file and the key. */
static void test_gen_config(void **state) {
    (void)state;
    Err err;
    char *path = fixture("", "gen_configs.json");
    json_t *cases = json_load_file(path, 0, NULL);
    assert_non_null(cases);
    assert_true(json_array_size(cases) >= 8);
    size_t i;
    json_t *c;
    int sampled = 0, greedy = 0;
    json_array_foreach(cases, i, c) {
        char dir[64], *text = json_dumps(json_object_get(c, "file"), JSON_COMPACT);
        write_gen_config(dir, text);
        free(text);
        GenConfig gc;
        if (gen_config_read(dir, &gc, &err)) fail_msg("case %zu: %s", i, err.msg);
        assert_int_equal(gc.found, 1);
        int ds = json_is_true(json_object_get(c, "do_sample"));
        assert_int_equal(gc.do_sample, ds);
        if (ds) {
            assert_float_equal(gc.sp.temperature,
                               json_number_value(json_object_get(c, "temperature")), 1e-6);
            assert_int_equal(gc.sp.top_k, json_integer_value(json_object_get(c, "top_k")));
            assert_float_equal(gc.sp.top_p, json_number_value(json_object_get(c, "top_p")), 1e-6);
            assert_float_equal(gc.sp.min_p, json_number_value(json_object_get(c, "min_p")), 1e-6);
            sampled++;
        } else {
            assert_true(gc.sp.temperature == 0.0f); /* greedy */
            greedy++;
        }
        assert_int_equal(gc.max_new_tokens,
                         json_integer_value(json_object_get(c, "max_new_tokens")));
        const json_t *eos = json_object_get(c, "eos");
        assert_int_equal(gc.n_eos, (int)json_array_size(eos));
        for (int e = 0; e < gc.n_eos; e++)
            assert_int_equal(gc.eos[e], json_integer_value(json_array_get(eos, (size_t)e)));
        /* repetition_penalty is applied (greedy too), as transformers resolves it; num_beams
         * above 1 searches beams unless do_sample is true (beam sampling, listed). */
        assert_float_equal(gc.sp.repetition_penalty,
                           json_number_value(json_object_get(c, "repetition_penalty")), 1e-6);
        assert_int_equal(gc.sp.no_repeat_ngram_size,
                         json_integer_value(json_object_get(c, "no_repeat_ngram_size")));
        int nb = (int)json_integer_value(json_object_get(c, "num_beams"));
        int listed = strstr(gc.ignored, "num_beams = ") != NULL;
        assert_int_equal(listed, ds && nb > 1);
        assert_int_equal(gc.beams.num_beams, ds ? 1 : nb);
        assert_float_equal(gc.beams.length_penalty,
                           json_number_value(json_object_get(c, "length_penalty")), 1e-6);
        const json_t *es = json_object_get(c, "early_stopping");
        assert_string_equal(beam_stop_name(gc.beams.early_stopping), json_is_string(es)
                                                                         ? json_string_value(es)
                                                                     : json_is_true(es) ? "true"
                                                                                        : "false");
        char *f = fs_join(dir, "generation_config.json");
        unlink(f);
        free(f);
        rmdir(dir);
    }
    assert_true(sampled >= 3 && greedy >= 3);
    json_decref(cases);
    free(path);

    /* No file: nothing found, no error. */
    GenConfig gc;
    assert_int_equal(gen_config_read("/nonexistent_qt_dir", &gc, &err), 0);
    assert_int_equal(gc.found, 0);
    static const char *const bad[][2] = {
        {"[1]", "expected a JSON object, found an array"},
        {"{\"do_sample\": 1}", "\"do_sample\" must be true, false or null, found a number"},
        {"{\"temperature\": \"hot\"}", "\"temperature\" must be a number or null, found a string"},
        {"{\"do_sample\": true, \"temperature\": 0}", "\"temperature\" must be > 0"},
        {"{\"top_k\": 2.5}", "\"top_k\" must be a whole number >= 0"},
        {"{\"top_p\": 0}", "\"top_p\" must be in (0, 1]"},
        {"{\"min_p\": 2}", "\"min_p\" must be in [0, 1]"},
        {"{\"repetition_penalty\": 0}", "\"repetition_penalty\" must be > 0"},
        {"{\"no_repeat_ngram_size\": 1.5}", "\"no_repeat_ngram_size\" must be a whole number >= 0"},
        {"{\"max_new_tokens\": 0}", "\"max_new_tokens\" must be a whole number >= 1"},
        {"{\"eos_token_id\": [\"x\"]}", "\"eos_token_id\" must be a token id"},
        {"{\"num_beams\": 0}", "\"num_beams\" must be a whole number >= 1"},
        {"{\"length_penalty\": \"long\"}", "\"length_penalty\" must be a number or null"},
        {"{\"early_stopping\": \"soon\"}", "\"early_stopping\" must be true, false or \"never\""},
        {"{\"min_new_tokens\": -1}", "\"min_new_tokens\" must be a whole number >= 0"},
        {"{\"typical_p\": 0}", "\"typical_p\" must be in (0, 1]"},
        {"{\"epsilon_cutoff\": 1}", "\"epsilon_cutoff\" must be in [0, 1)"},
        {"{\"eta_cutoff\": -0.1}", "\"eta_cutoff\" must be in [0, 1)"},
        {"{\"suppress_tokens\": 5}", "\"suppress_tokens\" must be a list of token ids or null"},
        {"{\"begin_suppress_tokens\": [-1]}", "\"begin_suppress_tokens\" must hold token ids"},
        {"{\"bad_words_ids\": []}", "\"bad_words_ids\" must be a non-empty list of lists"},
        {"{\"bad_words_ids\": [[1], []]}", "\"bad_words_ids\" entry 1 must be a non-empty list"},
        {"{\"sequence_bias\": []}", "\"sequence_bias\" must be a non-empty list of [[token ids]"},
        {"{\"sequence_bias\": [[[1], 2], [[], 1.0]]}", "\"sequence_bias\" entry 1 must be"},
        {"{\"sequence_bias\": [[[1], \"x\"]]}", "\"sequence_bias\" entry 0 must be"},
        {"{\"sequence_bias\": [[[-3], 1.0]]}", "\"sequence_bias\" must hold token ids"},
        {"{\"encoder_repetition_penalty\": 0}", "\"encoder_repetition_penalty\" must be > 0"},
        {"{\"encoder_no_repeat_ngram_size\": -2}",
         "\"encoder_no_repeat_ngram_size\" must be a whole number >= 0"},
        {"{\"forced_bos_token_id\": 1.5}", "\"forced_bos_token_id\" must hold token ids"},
        {"{\"forced_eos_token_id\": [1, \"x\"]}", "\"forced_eos_token_id\" must hold token ids"},
        {"{\"exponential_decay_length_penalty\": [3]}",
         "\"exponential_decay_length_penalty\" must be [start, factor]"},
        {"{\"prompt_lookup_num_tokens\": -1}",
         "\"prompt_lookup_num_tokens\" must be a whole number from 0 to 256"},
        {"{\"num_assistant_tokens\": 0}", "\"num_assistant_tokens\" must be a whole number from 1"},
        {"{\"assistant_confidence_threshold\": 2}",
         "\"assistant_confidence_threshold\" must be in [0, 1]"},
        {"{\"exponential_decay_length_penalty\": [3, 0]}",
         "\"exponential_decay_length_penalty\" must be [start, factor]"},
        {"{\"do_sample\": true", "generation_config.json"},
    };
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        char dir[64];
        write_gen_config(dir, bad[b][0]);
        assert_int_not_equal(gen_config_read(dir, &gc, &err), 0);
        fprintf(stderr, "expected error: %s\n", err.msg);
        assert_non_null(strstr(err.msg, dir));
        assert_non_null(strstr(err.msg, bad[b][1]));
        char *f = fs_join(dir, "generation_config.json");
        unlink(f);
        free(f);
        rmdir(dir);
    }
}

/* rounds seeds from o->seed on: the two prompts of rp sampled with o as it is and with cand
 * (o with candidates: prompt lookup or a draft) give the same ids; returns the candidates kept. */
static long same_sampled(Decoder *d, GenOptions o, GenOptions cand, const int32_t *const *rp,
                         const int *rl, int rounds) {
    GenOutput r1[2], r2[2];
    GenStats gs;
    Err err;
    long kept = 0;
    for (int t = 0; t < rounds; t++, o.seed++, cand.seed++) {
        assert_int_equal(generate(d, NULL, rp, rl, 2, &o, r1, NULL, NULL, NULL, &err), 0);
        assert_int_equal(generate(d, NULL, rp, rl, 2, &cand, r2, NULL, NULL, &gs, &err), 0);
        kept += gs.lookup_accepted;
        for (int i = 0; i < 2; i++) {
            assert_int_equal(r1[i].n, r2[i].n);
            assert_memory_equal(r1[i].ids, r2[i].ids, (size_t)r1[i].n * sizeof(int32_t));
            gen_output_free(&r1[i]), gen_output_free(&r2[i]);
        }
    }
    return kept;
}

/* The same seed gives the same completions; another seed others. */
static void test_seeded(void **state) {
    (void)state;
    char *dir = fixture("dense_tied_gqa", NULL);
    InferModel im;
    Err err;
    if (infer_model_open(&im, dir, NULL, NULL, 1, 1, 0, &err)) fail_msg("%s", err.msg);
    Decoder d;
    if (decoder_create(&d, &im.m, 2, 40, &err)) fail_msg("%s", err.msg);
    int32_t a[3] = {1, 2, 3}, b[5] = {9, 8, 7, 6, 5};
    const int32_t *prompts[2] = {a, b};
    int lens[2] = {3, 5};
    GenOptions o = {.max_new_tokens = 32,
                    .sample = {.temperature = 1.5f, .top_k = 50, .top_p = 0.95f},
                    .seed = 1234};
    GenOutput r1[2], r2[2], r3[2];
    assert_int_equal(generate(&d, NULL, prompts, lens, 2, &o, r1, NULL, NULL, NULL, &err), 0);
    assert_int_equal(generate(&d, NULL, prompts, lens, 2, &o, r2, NULL, NULL, NULL, &err), 0);
    o.seed = 1235;
    assert_int_equal(generate(&d, NULL, prompts, lens, 2, &o, r3, NULL, NULL, NULL, &err), 0);
    int differ = 0;
    for (int i = 0; i < 2; i++) {
        assert_memory_equal(r1[i].ids, r2[i].ids, 32 * sizeof(int32_t));
        differ |= memcmp(r1[i].ids, r3[i].ids, 32 * sizeof(int32_t)) != 0;
        gen_output_free(&r1[i]), gen_output_free(&r2[i]), gen_output_free(&r3[i]);
    }
    assert_true(differ);
    /* Prompt lookup draws once per chosen id, as steps do: the same sampled ids, and for a
     * prompt that repeats itself some candidates kept. */
    int32_t rep[8] = {4, 5, 6, 4, 5, 6, 4, 5};
    const int32_t *rp[2] = {rep, rep};
    int rl[2] = {8, 8};
    o.seed = 99;
    GenOptions look = o;
    look.lookup_tokens = 3;
    long kept = same_sampled(&d, o, look, rp, rl, 8);
    printf("sampling with prompt lookup: the same ids, %ld candidates kept\n", kept);
    /* And with a draft model (here the model itself): the same sampled ids. */
    Decoder dd;
    if (decoder_create(&dd, &im.m, 2, 40, &err)) fail_msg("%s", err.msg);
    o.seed += 8; /* the seeds after the lookup's */
    GenOptions drafted = o;
    drafted.draft = &dd, drafted.draft_tokens = 4, drafted.draft_confidence = 0.0f;
    kept = same_sampled(&d, o, drafted, rp, rl, 4);
    printf("sampling with a draft model: the same ids, %ld drafts kept\n", kept);
    assert_true(kept > 0);
    decoder_free(&dd);
    /* A prompt that does not fit the cache with its new tokens is refused. */
    o.max_new_tokens = 36;
    assert_int_not_equal(generate(&d, NULL, prompts, lens, 2, &o, r1, NULL, NULL, NULL, &err), 0);
    assert_non_null(strstr(err.msg, "prompt 2 has 5 tokens"));
    decoder_free(&d);
    infer_model_close(&im);
    free(dir);
}

static Tokenizer *tiny_tokenizer(void) {
    const char *src = getenv("QT_SOURCE_DIR");
    char *p = fs_join(src ? src : ".", "tests/fixtures/tokenizer/tiny_gpt2");
    Err err;
    Tokenizer *t = tokenizer_load(p, &err);
    if (!t) fail_msg("%s", err.msg);
    free(p);
    return t;
}

/* The id of byte b's own token in a GPT-2 byte-level vocabulary: printable bytes stand for
 * themselves, the others for U+0100 on, in byte order. */
static int32_t byte_id(const Tokenizer *t, unsigned b) {
    uint32_t cp = b, n = 0;
    for (unsigned c = 0; c < 256; c++) {
        int printable = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174;
        if (c == b && !printable) cp = 256 + n;
        n += !printable;
    }
    char s[5];
    s[utf8_encode(s, cp)] = '\0';
    int64_t id = tokenizer_token_id(t, s);
    assert_true(id >= 0);
    return (int32_t)id;
}

static void append_bytes(const Tokenizer *t, IdVec *ids, const char *s) {
    for (; *s; s++)
        idvec_push(ids, (uint32_t)byte_id(t, (unsigned char)*s));
}

typedef struct Sink {
    char *buf;
    size_t len;
    int calls;
} Sink;

/* Keeps the streamed bytes; each piece is whole UTF-8 characters. */
static void sink_fn(void *ctx, int i, const char *text, size_t len) {
    Sink *k = ctx;
    assert_int_equal(i, 3);
    assert_int_equal(utf8_valid_prefix(text, len), len);
    memcpy(k->buf + k->len, text, len);
    k->len += len;
    k->calls++;
}

/* A long completion of multi-byte characters, each split over byte tokens and merged ones, a
 * character cut short by the next token (U+FFFD for good), an id without a token, then a stop
 * string over several tokens: at every id the text equals decoding all the ids so far (cut at
 * the stop string), the streamed bytes are a prefix of it, and at the end they are all of it.
 * The stop string is found at the token that completes it and cuts at its first byte. */
static void test_text_incremental(void **state) {
    (void)state;
    Tokenizer *t = tiny_tokenizer();
    Err err;
    const char *unit = "h\xC3\xA9llo \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x99\x82 the w\xC3\xB6rld, ";
    const char *stop[2] = {"\xF0\x9F\x99\x82\xE2\x82\xAC!", "never"}; /* U+1F642 U+20AC ! */
    IdVec ids = {0};
    for (int r = 0; r < 120; r++) {
        if (r % 2) {
            append_bytes(t, &ids, unit);
        } else { /* merged tokens where the tokenizer has them */
            assert_int_equal(tokenizer_encode(t, unit, strlen(unit), &ids, &err), 0);
        }
        if (r == 50) append_bytes(t, &ids, "\xE6\x97"); /* cut short by the next character */
        if (r == 60) idvec_push(&ids, 5000);            /* no such token */
    }
    size_t want_len = 0; /* the text before the stop string */
    {
        char *full;
        size_t fl;
        IdVec known = {0};
        for (size_t k = 0; k < ids.n; k++)
            if (tokenizer_has_id(t, ids.ids[k])) idvec_push(&known, ids.ids[k]);
        assert_int_equal(tokenizer_decode(t, known.ids, known.n, &full, &fl, &err), 0);
        want_len = fl + strlen("ab");
        free(full), idvec_free(&known);
    }
    append_bytes(t, &ids, "ab");
    append_bytes(t, &ids, stop[0]);
    size_t stop_last = ids.n - 1;
    append_bytes(t, &ids, "cd");
    int32_t eos = 0;
    GenOptions o = {
        .max_new_tokens = (int)ids.n, .eos = &eos, .n_eos = 1, .stop = stop, .n_stop = 2};
    GenText g;
    gen_text_init(&g, &o, 16); /* small, so that it grows */
    Sink sink = {.buf = xmalloc(8 * ids.n + 64)};
    IdVec known = {0};
    size_t k = 0;
    for (;; k++) {
        assert_true(k < ids.n);
        int rc = gen_text_push(&g, t, &o, (int32_t)ids.ids[k], &err);
        assert_true(rc >= 0);
        if (tokenizer_has_id(t, ids.ids[k])) idvec_push(&known, ids.ids[k]);
        char *ref;
        size_t rl;
        assert_int_equal(tokenizer_decode(t, known.ids, known.n, &ref, &rl, &err), 0);
        size_t cut = rl;
        for (size_t at = 0; at + strlen(stop[0]) <= rl && cut == rl; at++)
            if (memcmp(ref + at, stop[0], strlen(stop[0])) == 0) cut = at;
        assert_int_equal(rc, cut < rl);
        assert_int_equal(g.ds.len, cut);
        assert_memory_equal(g.ds.text, ref, cut);
        assert_int_equal(g.ds.text[cut], '\0');
        gen_text_stream(&g, rc == 1, 3, sink_fn, &sink);
        assert_true(sink.len <= cut);
        assert_memory_equal(sink.buf, ref, sink.len);
        free(ref);
        if (rc == 1) break;
    }
    assert_int_equal(k, stop_last);
    assert_int_equal(g.ds.len, want_len);
    assert_int_equal(sink.len, g.ds.len);
    assert_memory_equal(sink.buf, g.ds.text, sink.len);
    assert_true(sink.calls > 100);
    int fffd = 0; /* the character cut short */
    for (size_t at = 0; at + 3 <= g.ds.len; at++)
        fffd += memcmp(g.ds.text + at, "\xEF\xBF\xBD", 3) == 0;
    assert_int_equal(fffd, 1);
    /* The last byte, which could start "x!", is held back, and with it the character it is
     * part of; an EOS id adds no text and ends the stream. */
    gen_text_free(&g);
    const char *bang[1] = {"x!"};
    o.stop = bang, o.n_stop = 1;
    gen_text_init(&g, &o, 0);
    idvec_free(&known);
    append_bytes(t, &known, "\xC3\xA9x");
    sink.len = 0;
    for (size_t j = 0; j < known.n; j++) {
        assert_int_equal(gen_text_push(&g, t, &o, (int32_t)known.ids[j], &err), 0);
        gen_text_stream(&g, 0, 3, sink_fn, &sink);
        assert_int_equal(sink.len, j < 2 ? 0 : 2);
    }
    assert_int_equal(gen_text_push(&g, t, &o, eos, &err), 0);
    assert_int_equal(g.ds.len, 3);
    gen_text_stream(&g, 1, 3, sink_fn, &sink);
    assert_int_equal(sink.len, 3);
    assert_memory_equal(sink.buf, "\xC3\xA9x", 3);
    gen_text_free(&g);
    free(sink.buf);
    idvec_free(&known), idvec_free(&ids);
    tokenizer_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parity_dense_tied_gqa),
        cmocka_unit_test(test_parity_dense_untied_mha),
        cmocka_unit_test(test_parity_dense_yarn),
        cmocka_unit_test(test_parity_dense_reppen),
        cmocka_unit_test(test_parity_dense_norepeat),
        cmocka_unit_test(test_parity_dense_bans),
        cmocka_unit_test(test_parity_dense_procs),
        cmocka_unit_test(test_parity_dense_decay),
        cmocka_unit_test(test_lookup_used),
        cmocka_unit_test(test_processors),
        cmocka_unit_test(test_token_bans),
        cmocka_unit_test(test_repetition_penalty),
        cmocka_unit_test(test_no_repeat_ngrams),
        cmocka_unit_test(test_parity_moe),
        cmocka_unit_test(test_cache_matches_forward),
        cmocka_unit_test(test_bf16_only),
        cmocka_unit_test(test_filters),
        cmocka_unit_test(test_warpers_parity),
        cmocka_unit_test(test_draws),
        cmocka_unit_test(test_seeded),
        cmocka_unit_test(test_gen_config),
        cmocka_unit_test(test_text_incremental),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
