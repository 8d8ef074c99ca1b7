/* The generation loop (see generate.h). */
#include "infer/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"

typedef struct SeqState {
    int done;
    GenText text; /* with a tokenizer */
    Rng rng;
    /* With processors (gen_processes): the ids of the prompt and completion as a set; with
     * them or prompt lookup, in order; the prompt's length. */
    uint8_t *seen; /* (V) */
    int32_t *hist;
    long hist_n, prompt_n;
} SeqState;

int gen_processes(const GenOptions *o) {
    return sample_penalizes(&o->sample) || sample_procs_on(o->procs);
}

/* The next id of sequence st from its raw logits lg: through o's processors (infer/sample.h)
 * into pen (V scratch) first when it has any, then chosen by o's sampling. */
static int32_t choose(Sampler *smp, const GenOptions *o, SeqState *st, const float *lg,
                      float *pen) {
    if (!st->seen) {
        int32_t id = sample_next(smp, lg, &o->sample, &st->rng);
        if (st->hist) st->hist[st->hist_n++] = id;
        return id;
    }
    ProcSeq q = {.seen = st->seen,
                 .hist = st->hist,
                 .len = st->hist_n,
                 .n_new = st->hist_n - st->prompt_n,
                 .max_new = o->max_new_tokens,
                 .eos = o->eos,
                 .n_eos = o->n_eos};
    sample_process(pen, lg, smp->V, &o->sample, o->procs, &q);
    int32_t id = sample_next(smp, pen, &o->sample, &st->rng);
    st->seen[id] |= SEEN_ID;
    st->hist[st->hist_n++] = id;
    return id;
}

int gen_is_eos(const GenOptions *o, int32_t id) {
    for (int i = 0; i < o->n_eos; i++)
        if (o->eos[i] == id) return 1;
    return 0;
}

void gen_text_init(GenText *g, const GenOptions *o, size_t reserve) {
    memset(g, 0, sizeof *g);
    decode_stream_init(&g->ds, reserve);
    for (int s = 0; s < o->n_stop; s++)
        if (strlen(o->stop[s]) > g->hold + 1) g->hold = strlen(o->stop[s]) - 1;
}

/* Offset of the first occurrence of pat (m bytes) in s[from..n), or n. */
static size_t find(const char *s, size_t from, size_t n, const char *pat, size_t m) {
    for (size_t i = from; i + m <= n; i++)
        if (s[i] == pat[0] && memcmp(s + i, pat, m) == 0) return i;
    return n;
}

int gen_text_push(GenText *g, const Tokenizer *tok, const GenOptions *o, int32_t id, Err *err) {
    DecodeStream *ds = &g->ds;
    if (!gen_is_eos(o, id) && tokenizer_has_id(tok, (uint32_t)id))
        TRY(decode_stream_push(ds, tok, (uint32_t)id, err));
    size_t cut = ds->len;
    for (int s = 0; s < o->n_stop; s++) {
        size_t m = strlen(o->stop[s]);
        size_t at = m == 0 ? 0 : find(ds->text, g->scan, ds->len, o->stop[s], m);
        if (at < cut) cut = at;
    }
    /* A stop string that starts before final - hold lies in text that stays as it is, where
     * none was found. */
    g->scan = ds->final > g->hold ? ds->final - g->hold : 0;
    if (cut == ds->len) return 0;
    ds->text[cut] = '\0';
    ds->len = cut;
    return 1;
}

void gen_text_stream(GenText *g, int done, int i, GenStreamFn fn, void *ctx) {
    const char *text = g->ds.text;
    size_t safe = g->ds.len;
    if (!done) {
        /* Past final may be a character cut between tokens; a tail may be the start of a stop
         * string. */
        safe = g->ds.final > g->hold ? g->ds.final - g->hold : 0;
        /* Never split a UTF-8 character. */
        while (safe > g->sent && ((unsigned char)text[safe] & 0xC0) == 0x80)
            safe--;
    }
    if (safe > g->sent) {
        fn(ctx, i, text + g->sent, safe - g->sent);
        g->sent = safe;
    }
}

void gen_text_free(GenText *g) {
    decode_stream_free(&g->ds);
    memset(g, 0, sizeof *g);
}

/* Records token id for sequence i and decides whether it ends there. */
static int accept(const Tokenizer *tok, const GenOptions *o, GenOutput *g, SeqState *st,
                  const float *logits, int V, int32_t id, int i, GenStreamFn fn, void *ctx,
                  Err *err) {
    g->ids[g->n] = id;
    g->logprobs[g->n] = sample_logprob(logits, V, id);
    g->n++;
    int stop = tok ? gen_text_push(&st->text, tok, o, id, err) : 0;
    if (stop < 0) return -1;
    if (gen_is_eos(o, id))
        g->finish = "eos", st->done = 1;
    else if (stop)
        g->finish = "stop", st->done = 1;
    else if (g->n >= o->max_new_tokens)
        g->finish = "length", st->done = 1;
    if (tok && fn) gen_text_stream(&st->text, st->done, i, fn, ctx);
    return 0;
}

/* Prompt lookup's candidates for sequence st (GenOptions.lookup_tokens): after the earliest
 * earlier occurrence of its last g ids (g from lookup_ngram down to 1) that some id follows, up
 * to K of the ids that follow it, no more than the completion has room for after
 * one more id, and none past an EOS id. Returns how many (0: none) into out. */
static int lookup(const GenOptions *o, const SeqState *st, const GenOutput *g, int K,
                  int32_t *out) {
    long n = st->hist_n, room = o->max_new_tokens - g->n - 1;
    if (room > K) room = K;
    const int32_t *h = st->hist;
    for (long gram = o->lookup_ngram > 0 ? o->lookup_ngram : 2; gram >= 1 && room > 0; gram--) {
        if (gram >= n) continue;
        const int32_t *tail = h + n - gram;
        for (long j = 0; j + gram < n; j++) {
            if (memcmp(h + j, tail, (size_t)gram * sizeof *h) != 0) continue;
            int k = 0;
            for (long t = j + gram; t < n && k < room; t++) {
                out[k++] = h[t];
                if (gen_is_eos(o, h[t])) break;
            }
            return k;
        }
    }
    return 0;
}

/* The draft model's candidates for sequence i (GenOptions.draft): its cache brought to the
 * sequence's ids, then up to K greedy steps, no more than the completion has room for after one
 * more id, none past an EOS id or after one whose probability is below draft_confidence. With
 * processors (gen_processes) the draft's logits go through them as the model's do (its ids so
 * far written after the sequence's in st->hist, dseen a copy of st->seen with them), as
 * transformers hands the assistant the same processors. dlog, dpen: V scratch. */
static int draft_propose(const GenOptions *o, int i, SeqState *st, const GenOutput *g, int K,
                         int32_t *out, float *dlog, float *dpen, uint8_t *dseen) {
    Decoder *dd = o->draft;
    long n = st->hist_n, room = o->max_new_tokens - g->n - 1;
    int V = dd->m->spec.vocab_size, k = 0;
    if (room > K) room = K;
    if (room <= 0) return 0;
    int held = decoder_reuse(dd, i, st->hist, (int)n);
    decoder_extend(dd, i, st->hist + held, (int)(n - held), dlog);
    if (st->seen) memcpy(dseen, st->seen, (size_t)V);
    for (;;) {
        const float *sc = dlog;
        if (st->seen) {
            ProcSeq q = {.seen = dseen,
                         .hist = st->hist,
                         .len = n + k,
                         .n_new = n + k - st->prompt_n,
                         .max_new = o->max_new_tokens,
                         .eos = o->eos,
                         .n_eos = o->n_eos};
            sample_process(dpen, dlog, V, &o->sample, o->procs, &q);
            sc = dpen;
        }
        int32_t id = sample_argmax(sc, V);
        out[k++] = id;
        double p = exp(-sample_logsumexp(sc, V) + sc[id]);
        if (k == room || gen_is_eos(o, id) || p < o->draft_confidence) return k;
        st->hist[n + k - 1] = id; /* past hist_n: the draft's, until ids are chosen there */
        if (st->seen) dseen[id] |= SEEN_ID;
        decoder_step(dd, &i, &id, 1, dlog);
    }
}

/* Sequence i's rows of a pass, from row `first`: its last id, then k candidates (rows[first +
 * 1 ..]). Chooses at each row as a step would, until a choice differs from the candidate the next
 * row was given (that choice is still kept) or the sequence ends; its cache then keeps the rows
 * whose ids stand, after the L positions it held before the pass. */
static int take_rows(Decoder *d, const Tokenizer *tok, const GenOptions *o, Sampler *smp,
                     SeqState *st, GenOutput *g, const int32_t *ids, const float *logits, int k,
                     int L, float *pen, int i, GenStreamFn stream, void *ctx, GenStats *gs,
                     Err *err) {
    int V = smp->V, rows = 0;
    gs->lookup_proposed += k;
    for (int r = 0; r <= k && !st->done; r++) {
        const float *lg = logits + (long)r * V;
        int32_t id = choose(smp, o, st, lg, pen);
        TRY(accept(tok, o, g, st, lg, V, id, i, stream, ctx, err));
        rows++;
        if (r == k || id != ids[r + 1]) break;
        gs->lookup_accepted++;
    }
    decoder_truncate(d, i, L + rows);
    return 0;
}

int generate(Decoder *d, const Tokenizer *tok, const int32_t *const *prompts, const int *lens,
             int n, const GenOptions *o, GenOutput *out, GenStreamFn stream, void *ctx,
             GenStats *stats, Err *err) {
    int V = d->m->spec.vocab_size;
    if (n < 1 || n > d->S)
        return err_set(err, "generate: %d prompts for a decoder sized for %d", n, d->S);
    if (o->max_new_tokens < 1)
        return err_set(err, "generate: max_new_tokens must be at least 1 (got %d)",
                       o->max_new_tokens);
    for (int i = 0; i < n; i++) {
        if (lens[i] < 1)
            return err_set(err, "prompt %d is empty (it needs at least one token)", i + 1);
        if (lens[i] + o->max_new_tokens > d->C)
            return err_set(err,
                           "prompt %d has %d tokens; with %d new tokens that exceeds the %d "
                           "positions the decoder holds",
                           i + 1, lens[i], o->max_new_tokens, d->C);
    }
    if (o->draft && (o->draft->m->spec.vocab_size != V || o->draft->S < n || o->draft->C < d->C))
        return err_set(err,
                       "generate: the draft model's decoder (vocabulary %d, %d sequences of %d "
                       "positions) does not fit the model's (%d, %d of %d)",
                       o->draft->m->spec.vocab_size, o->draft->S, o->draft->C, V, n, d->C);
    memset(out, 0, (size_t)n * sizeof *out);
    SeqState *st = xcalloc((size_t)n, sizeof *st);
    Sampler smp;
    sampler_init(&smp, V);
    int penalize = gen_processes(o);
    /* Candidates a sequence takes at most: no more than the completion takes, nor
     * GEN_MAX_CANDIDATES; and a pass at most B in all (at least K, at most 64 beyond), within
     * the rows a decoder call takes. */
    int K = o->draft ? o->draft_tokens : o->lookup_tokens > 0 ? o->lookup_tokens : 0;
    K = K > o->max_new_tokens ? o->max_new_tokens : K > GEN_MAX_CANDIDATES ? GEN_MAX_CANDIDATES : K;
    long B = (long)n * K < (K > 64 ? K : 64) ? (long)n * K : (K > 64 ? K : 64);
    if (B > d->R - n) B = d->R - n;
    /* A pass: each running sequence's last id and candidates, as rows; their logits. */
    float *logits = xcalloc((size_t)(n + B) * V, sizeof *logits);
    int *seq = xcalloc((size_t)(n + B), sizeof *seq);
    int32_t *next = xcalloc((size_t)(n + B), sizeof *next);
    int *first = xcalloc((size_t)n, sizeof *first), *held = xcalloc((size_t)n, sizeof *held);
    float *pen = penalize ? xcalloc((size_t)V, sizeof *pen) : NULL;
    float *dlog = o->draft ? xcalloc((size_t)V, sizeof *dlog) : NULL;
    float *dpen = o->draft && penalize ? xcalloc((size_t)V, sizeof *dpen) : NULL;
    uint8_t *dseen = o->draft && penalize ? xcalloc((size_t)V, 1) : NULL;
    GenStats gs = {0};
    int rc = 0;
    for (int i = 0; i < n; i++) {
        out[i].ids = xcalloc((size_t)o->max_new_tokens, sizeof *out[i].ids);
        out[i].logprobs = xcalloc((size_t)o->max_new_tokens, sizeof *out[i].logprobs);
        rng_seed(&st[i].rng, o->seed, (uint64_t)i);
        if (penalize) {
            st[i].seen = xcalloc((size_t)V, 1);
            for (int t = 0; t < lens[i]; t++)
                if (prompts[i][t] >= 0 && prompts[i][t] < V)
                    st[i].seen[prompts[i][t]] = SEEN_ID | SEEN_PROMPT;
        }
        if (penalize || K) {
            st[i].hist = xcalloc((size_t)lens[i] + (size_t)o->max_new_tokens, sizeof *st[i].hist);
            memcpy(st[i].hist, prompts[i], (size_t)lens[i] * sizeof *st[i].hist);
            st[i].hist_n = st[i].prompt_n = lens[i];
        }
        /* Room for 4 bytes a token, about what Qwen3's tokens average on text; more grows. */
        if (tok) gen_text_init(&st[i].text, o, (size_t)o->max_new_tokens * 4);
    }

    if (!o->reuse_cache) decoder_reset(d);
    double t0 = now_seconds();
    for (int i = 0; i < n; i++) {
        if (i > 0 && !o->reuse_cache && prompts[i] == prompts[i - 1] && lens[i] == lens[i - 1]) {
            /* The same prompt again (several completions of it): its cache and logits. */
            decoder_copy(d, i, i - 1);
            memcpy(logits + (long)i * V, logits + (long)(i - 1) * V, (size_t)V * sizeof *logits);
            continue;
        }
        int held = o->reuse_cache ? decoder_reuse(d, i, prompts[i], lens[i]) : 0;
        decoder_extend(d, i, prompts[i] + held, lens[i] - held, logits + (long)i * V);
        gs.prompt_tokens += lens[i] - held;
        gs.reused_tokens += held;
    }
    gs.prefill_s = now_seconds() - t0;
    t0 = now_seconds();
    for (int i = 0; i < n && rc == 0; i++) {
        const float *lg = logits + (long)i * V;
        rc = accept(tok, o, &out[i], &st[i], lg, V, choose(&smp, o, &st[i], lg, pen), i, stream,
                    ctx, err);
    }
    for (;;) {
        int rows = 0;
        long budget = B;
        for (int i = 0; i < n && rc == 0; i++) {
            if (st[i].done) continue;
            int cap = K < budget ? K : (int)budget;
            int k = !cap       ? 0
                    : o->draft ? draft_propose(o, i, &st[i], &out[i], cap, next + rows + 1, dlog,
                                               dpen, dseen)
                               : lookup(o, &st[i], &out[i], cap, next + rows + 1);
            budget -= k;
            first[i] = rows, held[i] = d->len[i];
            next[rows] = out[i].ids[out[i].n - 1];
            for (int r = 0; r <= k; r++)
                seq[rows++] = i;
        }
        if (rc != 0 || rows == 0) break;
        gs.passes++;
        decoder_step(d, seq, next, rows, logits);
        for (int r = 0; r < rows && rc == 0;) {
            int i = seq[r], k = 0;
            while (r + 1 + k < rows && seq[r + 1 + k] == i)
                k++;
            rc = take_rows(d, tok, o, &smp, &st[i], &out[i], next + first[i],
                           logits + (long)first[i] * V, k, held[i], pen, i, stream, ctx, &gs, err);
            r += 1 + k;
        }
    }
    gs.decode_s = now_seconds() - t0;
    for (int i = 0; i < n; i++)
        gs.new_tokens += out[i].n;
    if (stats) *stats = gs;
    for (int i = 0; i < n && tok; i++) {
        out[i].text = st[i].text.ds.text, out[i].text_len = st[i].text.ds.len;
        st[i].text.ds.text = NULL;
        gen_text_free(&st[i].text);
    }
    sampler_free(&smp);
    for (int i = 0; i < n; i++)
        free(st[i].seen), free(st[i].hist);
    free(st), free(logits), free(seq), free(next), free(pen), free(dlog), free(first), free(held);
    free(dpen), free(dseen);
    if (rc != 0)
        for (int i = 0; i < n; i++)
            gen_output_free(&out[i]);
    return rc;
}

void gen_output_free(GenOutput *g) {
    free(g->ids), free(g->logprobs), free(g->text);
    memset(g, 0, sizeof *g);
}

double generate_buffer_bytes(int n, int V, int penalize, long C) {
    Sampler smp = {0};
    SeqState st;
    return (double)n * V * sizeof(float) +
           (double)V * (sizeof *smp.scaled + sizeof *smp.order + sizeof *smp.prob +
                        sizeof *smp.dev + sizeof *smp.by) +
           (penalize ? (double)n * (V * sizeof *st.seen + C * sizeof *st.hist) +
                           (double)V * sizeof(float)
                     : 0);
}
