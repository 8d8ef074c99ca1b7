/* The generation loop (see generate.h). */
#include "infer/generate.h"

#include <stdlib.h>
#include <string.h>

#include "core/timer.h"

typedef struct SeqState {
    int done;
    size_t sent; /* bytes of text already streamed */
    Rng rng;
} SeqState;

static int is_eos(const GenOptions *o, int32_t id) {
    for (int i = 0; i < o->n_eos; i++)
        if (o->eos[i] == id) return 1;
    return 0;
}

/* Re-decodes sequence i's completion; cuts it at the first stop string (returns 1 then). Ids
 * the tokenizer has no token for (rows of a vocabulary padded past the tokenizer's, as Qwen3's
 * 151936 for 151669 tokens, which an untrained model may well choose) give no text, as HF
 * tokenizers' decode skips them. */
static int update_text(const Tokenizer *tok, const GenOptions *o, GenOutput *g, Err *err) {
    int n = g->n;
    if (n > 0 && is_eos(o, g->ids[n - 1])) n--;
    free(g->text);
    g->text = NULL;
    uint32_t *known = xmalloc((size_t)(n > 0 ? n : 1) * sizeof *known);
    size_t k = 0;
    for (int t = 0; t < n; t++)
        if (tokenizer_has_id(tok, (uint32_t)g->ids[t])) known[k++] = (uint32_t)g->ids[t];
    int rc = tokenizer_decode(tok, known, k, &g->text, &g->text_len, err);
    free(known);
    TRY(rc);
    size_t cut = g->text_len;
    for (int s = 0; s < o->n_stop; s++) {
        char *at = strstr(g->text, o->stop[s]);
        if (at && (size_t)(at - g->text) < cut) cut = (size_t)(at - g->text);
    }
    if (cut == g->text_len) return 0;
    g->text[cut] = '\0';
    g->text_len = cut;
    return 1;
}

/* Streams the bytes of sequence i's text that can no longer change. */
static void stream_text(const GenOptions *o, GenOutput *g, SeqState *st, int i, GenStreamFn fn,
                        void *ctx) {
    size_t safe = g->text_len;
    if (!st->done) {
        /* A replacement character at the end may be a multi-byte character cut between
         * tokens; a tail may be the start of a stop string. */
        if (safe >= 3 && memcmp(g->text + safe - 3, "\xEF\xBF\xBD", 3) == 0) safe -= 3;
        size_t hold = 0;
        for (int s = 0; s < o->n_stop; s++)
            if (strlen(o->stop[s]) > hold + 1) hold = strlen(o->stop[s]) - 1;
        safe = safe > hold ? safe - hold : 0;
        /* Never split a UTF-8 character. */
        while (safe > st->sent && ((unsigned char)g->text[safe] & 0xC0) == 0x80)
            safe--;
    }
    if (safe > st->sent) {
        fn(ctx, i, g->text + st->sent, safe - st->sent);
        st->sent = safe;
    }
}

/* Records token id for sequence i and decides whether it ends there. */
static int accept(const Tokenizer *tok, const GenOptions *o, GenOutput *g, SeqState *st,
                  const float *logits, int V, int32_t id, int i, GenStreamFn fn, void *ctx,
                  Err *err) {
    g->ids[g->n] = id;
    g->logprobs[g->n] = sample_logprob(logits, V, id);
    g->n++;
    int stop = 0;
    if (tok) {
        stop = update_text(tok, o, g, err);
        if (stop < 0) return -1;
    }
    if (is_eos(o, id))
        g->finish = "eos", st->done = 1;
    else if (stop)
        g->finish = "stop", st->done = 1;
    else if (g->n >= o->max_new_tokens)
        g->finish = "length", st->done = 1;
    if (tok && fn) stream_text(o, g, st, i, fn, ctx);
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
    memset(out, 0, (size_t)n * sizeof *out);
    SeqState *st = xcalloc((size_t)n, sizeof *st);
    float *logits = xcalloc((size_t)n * V, sizeof *logits);
    int *seq = xcalloc((size_t)n, sizeof *seq);
    int32_t *next = xcalloc((size_t)n, sizeof *next);
    Sampler smp;
    sampler_init(&smp, V);
    GenStats gs = {0};
    int rc = 0;
    for (int i = 0; i < n; i++) {
        out[i].ids = xcalloc((size_t)o->max_new_tokens, sizeof *out[i].ids);
        out[i].logprobs = xcalloc((size_t)o->max_new_tokens, sizeof *out[i].logprobs);
        rng_seed(&st[i].rng, o->seed, (uint64_t)i);
    }

    decoder_reset(d);
    double t0 = now_seconds();
    for (int i = 0; i < n; i++) {
        decoder_prefill(d, i, prompts[i], lens[i], logits + (long)i * V);
        gs.prompt_tokens += lens[i];
    }
    gs.prefill_s = now_seconds() - t0;
    t0 = now_seconds();
    for (int i = 0; i < n && rc == 0; i++) {
        const float *lg = logits + (long)i * V;
        rc = accept(tok, o, &out[i], &st[i], lg, V, sample_next(&smp, lg, &o->sample, &st[i].rng),
                    i, stream, ctx, err);
    }
    for (;;) {
        int active = 0;
        for (int i = 0; i < n && rc == 0; i++)
            if (!st[i].done) {
                seq[active] = i;
                next[active++] = out[i].ids[out[i].n - 1];
            }
        if (active == 0 || rc != 0) break;
        decoder_step(d, seq, next, active, logits);
        for (int r = 0; r < active && rc == 0; r++) {
            int i = seq[r];
            const float *lg = logits + (long)r * V;
            rc = accept(tok, o, &out[i], &st[i], lg, V,
                        sample_next(&smp, lg, &o->sample, &st[i].rng), i, stream, ctx, err);
        }
    }
    gs.decode_s = now_seconds() - t0;
    for (int i = 0; i < n; i++)
        gs.new_tokens += out[i].n;
    if (stats) *stats = gs;
    sampler_free(&smp);
    free(st), free(logits), free(seq), free(next);
    if (rc != 0)
        for (int i = 0; i < n; i++)
            gen_output_free(&out[i]);
    return rc;
}

void gen_output_free(GenOutput *g) {
    free(g->ids), free(g->logprobs), free(g->text);
    memset(g, 0, sizeof *g);
}

double generate_buffer_bytes(int n, int V) {
    Sampler smp = {0};
    return (double)n * V * sizeof(float) +
           (double)V * (sizeof *smp.scaled + sizeof *smp.order + sizeof *smp.prob);
}
