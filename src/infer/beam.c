/* Beam search (see beam.h), step by step as transformers' _beam_search computes it. */
#include "infer/beam.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"

/* transformers' "very large negative" score of beams that cannot be chosen. */
#define BEAM_OFF (-1.0e9f)

const char *beam_stop_name(BeamStop s) {
    return s == BEAM_STOP_EARLY ? "true" : s == BEAM_STOP_NEVER ? "never" : "false";
}

/* One hypothesis: its generated ids and their model log-probabilities, and its score. */
typedef struct Hyp {
    int32_t *ids;
    double *lp;
    int n;
    float score;
    int done; /* a finished hypothesis (is_sent_finished) */
} Hyp;

/* The K best of n scores, by descending value and then ascending index, into idx[0..K). */
static void top_k(const float *v, long n, int K, long *idx) {
    int have = 0;
    for (long i = 0; i < n; i++) {
        float x = v[i];
        if (have == K && !(x > v[idx[K - 1]])) continue;
        int at = have < K ? have++ : K - 1;
        while (at > 0 && x > v[idx[at - 1]]) {
            idx[at] = idx[at - 1];
            at--;
        }
        idx[at] = i;
    }
}

/* out[v] = log_softmax(row)[v], in float as torch gives it. */
static void log_softmax(float *out, const float *row, int V) {
    float lse = (float)sample_logsumexp(row, V);
    for (int v = 0; v < V; v++)
        out[v] = row[v] - lse;
}

/* h becomes parent's ids and log-probabilities followed by (id, lp). */
static void extend(Hyp *h, const Hyp *parent, int32_t id, double lp) {
    memcpy(h->ids, parent->ids, (size_t)parent->n * sizeof *h->ids);
    memcpy(h->lp, parent->lp, (size_t)parent->n * sizeof *h->lp);
    h->ids[parent->n] = id, h->lp[parent->n] = lp;
    h->n = parent->n + 1;
}

static void copy_hyp(Hyp *h, const Hyp *from) {
    memcpy(h->ids, from->ids, (size_t)from->n * sizeof *h->ids);
    memcpy(h->lp, from->lp, (size_t)from->n * sizeof *h->lp);
    h->n = from->n, h->score = from->score, h->done = from->done;
}

/* The search's state: k running beams (beam j in decoder row row[j]), their candidates'
 * successors, and k finished slots. */
typedef struct Search {
    int k, K, V, M;
    const int32_t *prompt;
    int len, unsatisfied, done;
    int *src;                         /* (k) the beam each next beam continues */
    int32_t *tok;                     /* (k) the id it adds */
    int *row, *next_row, *first;      /* (k) each */
    Hyp *run, *next, *fin, *fin_next; /* k each */
    float *logits;                    /* (k, V) the running beams' logits, in the caller's buffer */
    float *lp, *acc;                  /* (k, V) each */
    long *cand;                       /* (K) flat (beam, token) indices */
    float *merged_score;              /* (k + K) */
    long *pick;                       /* (k + K) */
    uint8_t *seen;                    /* (V) with a repetition penalty */
    int32_t *hist;                    /* the prompt and a beam's ids, with an n-gram ban */
} Search;

static void hyp_alloc(Hyp *h, int n, int M) {
    for (int i = 0; i < n; i++) {
        h[i].ids = xcalloc((size_t)M, sizeof *h[i].ids);
        h[i].lp = xcalloc((size_t)M, sizeof *h[i].lp);
    }
}

static void hyp_free(Hyp *h, int n) {
    for (int i = 0; h && i < n; i++)
        free(h[i].ids), free(h[i].lp);
    free(h);
}

/* acc (k, V): each running beam's score plus the processed log-probabilities of its logits. */
static void score_candidates(Search *s, const GenOptions *o, const int32_t *prompt, int len) {
    int V = s->V;
    for (int b = 0; b < s->k; b++) {
        float *lp = s->lp + (long)b * V, *acc = s->acc + (long)b * V;
        log_softmax(lp, s->logits + (long)b * V, V);
        const float *proc = lp;
        if (s->hist) { /* the processors, on log-probabilities */
            const Hyp *h = &s->run[b];
            memcpy(s->hist, prompt, (size_t)len * sizeof *s->hist);
            memcpy(s->hist + len, h->ids, (size_t)h->n * sizeof *s->hist);
            memset(s->seen, 0, (size_t)V);
            for (long t = 0; t < len + h->n; t++)
                if (s->hist[t] >= 0 && s->hist[t] < V)
                    s->seen[s->hist[t]] |= t < len ? SEEN_ID | SEEN_PROMPT : SEEN_ID;
            ProcSeq q = {.seen = s->seen,
                         .hist = s->hist,
                         .len = len + h->n,
                         .n_new = h->n,
                         .max_new = o->max_new_tokens,
                         .eos = o->eos,
                         .n_eos = o->n_eos};
            sample_process(acc, lp, V, &o->sample, o->procs, &q);
            proc = acc;
        }
        float base = s->run[b].score;
        for (int v = 0; v < V; v++)
            acc[v] = proc[v] + base;
    }
}

/* One step after the logits of the running beams: their successors into s->next (the decoder
 * rows to copy into src[j]), the finished slots updated; returns 1 when the search goes on. */
static int beam_step(Search *s, const GenOptions *o, const BeamParams *bp, int *unsatisfied,
                     int *src, int32_t *tok) {
    int k = s->k, K = s->K, V = s->V, g = s->run[0].n;
    top_k(s->acc, (long)k * V, K, s->cand);
    int all_hit = 1;
    float *run_score = s->merged_score; /* scratch (K) before the merge */
    for (int c = 0; c < K; c++) {
        int32_t id = (int32_t)(s->cand[c] % V);
        int hit = gen_is_eos(o, id) || g + 1 >= s->M;
        all_hit &= hit;
        run_score[c] = s->acc[s->cand[c]] + (hit ? BEAM_OFF : 0.0f);
    }
    long *keep = s->pick;
    top_k(run_score, K, k, keep);
    for (int j = 0; j < k; j++) {
        long c = s->cand[keep[j]];
        int b = (int)(c / V);
        src[j] = b;
        tok[j] = (int32_t)(c % V);
        extend(&s->next[j], &s->run[b], tok[j], s->lp[c]);
        s->next[j].score = run_score[keep[j]];
    }
    /* The finished slots: the best k of those held and the candidates among the best k that
     * just ended, each scored over its length to the length penalty. */
    int full = 1;
    for (int j = 0; j < k; j++)
        full &= s->fin[j].done;
    float div = (float)pow((double)(g + 1), (double)bp->length_penalty);
    for (int j = 0; j < k; j++)
        s->merged_score[j] = s->fin[j].score;
    for (int c = 0; c < K; c++) {
        int id = (int)(s->cand[c] % V);
        int ended = c < k && (gen_is_eos(o, id) || g + 1 >= s->M);
        float sc = s->acc[s->cand[c]] / div;
        sc += full && bp->early_stopping == BEAM_STOP_EARLY ? BEAM_OFF : 0.0f;
        sc += *unsatisfied ? 0.0f : BEAM_OFF;
        sc += ended ? 0.0f : BEAM_OFF;
        s->merged_score[k + c] = sc;
    }
    /* Only the k picked are written: a held one copied, a candidate built from its beam. */
    top_k(s->merged_score, k + K, k, s->pick);
    for (int j = 0; j < k; j++) {
        long m = s->pick[j];
        Hyp *h = &s->fin_next[j];
        if (m < k) {
            copy_hyp(h, &s->fin[m]);
        } else {
            long f = s->cand[m - k];
            int id = (int)(f % V);
            extend(h, &s->run[f / V], id, s->lp[f]);
            h->done = m - k < k && (gen_is_eos(o, id) || g + 1 >= s->M);
        }
        h->score = s->merged_score[m];
    }
    Hyp *held = s->fin;
    s->fin = s->fin_next, s->fin_next = held;
    /* Whether a running beam may still beat the worst finished one. */
    int hyp_len = bp->early_stopping == BEAM_STOP_NEVER && bp->length_penalty > 0 ? s->M : g + 1;
    float best = s->next[0].score / (float)pow((double)hyp_len, (double)bp->length_penalty);
    float worst = s->fin[0].score;
    full = 1;
    for (int j = 0; j < k; j++) {
        if (s->fin[j].score < worst) worst = s->fin[j].score;
        full &= s->fin[j].done;
    }
    int improvable = 0;
    for (int j = 0; j < k; j++)
        improvable |= best > (s->fin[j].done ? worst : BEAM_OFF);
    *unsatisfied &= improvable;
    Hyp *t = s->run;
    s->run = s->next, s->next = t;
    return *unsatisfied && !(full && bp->early_stopping == BEAM_STOP_EARLY) && !all_hit;
}

/* The caches follow the beams: new beam j continues old beam src[j]. The first new beam of an
 * old one keeps its row; a row whose beam ended is free, and each further new beam of an old
 * one takes a free row and a copy of the cache (its source row is kept, so no copy reads a row
 * already written). k - (distinct sources) copies. */
static void follow(Search *s, Decoder *d, const int *src) {
    int k = s->k, nfree = 0;
    for (int b = 0; b < k; b++)
        s->first[b] = -1;
    for (int j = 0; j < k; j++)
        if (s->first[src[j]] < 0) s->first[src[j]] = j;
    int *free_rows = s->next_row + k; /* scratch: the rows past k of next_row */
    for (int b = 0; b < k; b++)
        if (s->first[b] < 0) free_rows[nfree++] = s->row[b];
    for (int j = 0; j < k; j++) {
        int b = src[j];
        if (s->first[b] == j) {
            s->next_row[j] = s->row[b];
        } else {
            s->next_row[j] = free_rows[--nfree];
            decoder_copy(d, s->next_row[j], s->row[b]);
        }
    }
    memcpy(s->row, s->next_row, (size_t)k * sizeof *s->row);
}

static void search_free(Search *s) {
    hyp_free(s->run, s->k), hyp_free(s->next, s->k), hyp_free(s->fin, s->k);
    hyp_free(s->fin_next, s->k);
    free(s->lp), free(s->acc), free(s->cand), free(s->merged_score), free(s->src), free(s->tok);
    free(s->pick), free(s->seen), free(s->hist);
    free(s->row), free(s->next_row), free(s->first);
}

/* A search for prompt ids[0..len) in decoder rows row0 .. row0 + k - 1 (search_free frees it). */
static void search_init(Search *s, int k, int V, const GenOptions *o, const int32_t *ids, int len,
                        int row0) {
    int M = o->max_new_tokens;
    *s = (Search){.k = k, .K = (o->n_eos + 1 > 2 ? o->n_eos + 1 : 2) * k, .V = V, .M = M};
    if ((long)s->K > (long)k * V) s->K = k * V; /* a vocabulary smaller than the candidates */
    s->prompt = ids, s->len = len, s->unsatisfied = 1;
    s->run = xcalloc((size_t)k, sizeof *s->run), s->next = xcalloc((size_t)k, sizeof *s->next);
    s->fin = xcalloc((size_t)k, sizeof *s->fin);
    s->fin_next = xcalloc((size_t)k, sizeof *s->fin_next);
    hyp_alloc(s->run, k, M), hyp_alloc(s->next, k, M), hyp_alloc(s->fin, k, M);
    hyp_alloc(s->fin_next, k, M);
    s->lp = xcalloc((size_t)k * V, sizeof *s->lp);
    s->acc = xcalloc((size_t)k * V, sizeof *s->acc);
    s->cand = xcalloc((size_t)s->K, sizeof *s->cand);
    s->merged_score = xcalloc((size_t)(k + s->K), sizeof *s->merged_score);
    s->pick = xcalloc((size_t)(k + s->K), sizeof *s->pick);
    s->row = xcalloc((size_t)k, sizeof *s->row);
    s->next_row = xcalloc((size_t)2 * k, sizeof *s->next_row); /* and follow's free rows */
    s->first = xcalloc((size_t)k, sizeof *s->first);
    s->src = xcalloc((size_t)k, sizeof *s->src);
    s->tok = xcalloc((size_t)k, sizeof *s->tok);
    if (gen_processes(o)) {
        s->seen = xcalloc((size_t)V, 1);
        s->hist = xcalloc((size_t)(len + M), sizeof *s->hist);
    }
    for (int j = 0; j < k; j++) {
        s->run[j].score = j == 0 ? 0.0f : BEAM_OFF; /* only the first beam's tokens at first */
        s->fin[j].score = BEAM_OFF;
        s->row[j] = row0 + j;
    }
}

/* The best n_out finished hypotheses of s into out[0..n_out). */
static int search_output(const Search *s, const Tokenizer *tok, const GenOptions *o, GenOutput *out,
                         int n_out, Err *err) {
    int rc = 0;
    for (int i = 0; i < n_out && rc == 0; i++) {
        const Hyp *h = &s->fin[i];
        GenOutput *g = &out[i];
        g->ids = xcalloc((size_t)s->M, sizeof *g->ids);
        g->logprobs = xcalloc((size_t)s->M, sizeof *g->logprobs);
        memcpy(g->ids, h->ids, (size_t)h->n * sizeof *g->ids);
        memcpy(g->logprobs, h->lp, (size_t)h->n * sizeof *g->logprobs);
        g->n = h->n;
        g->score = h->score;
        g->finish = h->n > 0 && gen_is_eos(o, h->ids[h->n - 1]) ? "eos" : "length";
        if (!tok) continue;
        GenText text;
        gen_text_init(&text, o, (size_t)h->n * 4);
        for (int t = 0; t < h->n && rc == 0; t++)
            rc = gen_text_push(&text, tok, o, h->ids[t], err) < 0 ? -1 : 0;
        g->text = text.ds.text, g->text_len = text.ds.len;
        text.ds.text = NULL;
        gen_text_free(&text);
    }
    return rc;
}

int beam_search(Decoder *d, const Tokenizer *tok, const int32_t *const *prompts, const int *lens,
                int n, const GenOptions *o, const BeamParams *bp, GenOutput *out, int n_out,
                GenStats *stats, Err *err) {
    int k = bp->num_beams, V = d->m->spec.vocab_size, M = o->max_new_tokens;
    if (k < 2 || n < 1 || (long)n * k > d->S)
        return err_set(err, "beam search: %d prompts of %d beams for a decoder of %d sequences", n,
                       k, d->S);
    if (n_out < 1 || n_out > k)
        return err_set(err,
                       "num_return_sequences = %d must be between 1 and num_beams = %d (the "
                       "finished beams are what is returned)",
                       n_out, k);
    if (o->sample.temperature > 0)
        return err_set(err, "beam search with sampling (do_sample with num_beams > 1) is not "
                            "available: use temperature 0 with beams");
    if (o->n_stop > 0) return err_set(err, "stop strings do not apply to beam search");
    for (int p = 0; p < n; p++)
        if (M < 1 || lens[p] < 1 || lens[p] + M > d->C)
            return err_set(err,
                           "beam search: a prompt of %d tokens and %d new ones in %d positions",
                           lens[p], M, d->C);
    Search *s = xcalloc((size_t)n, sizeof *s);
    float *logits = xcalloc((size_t)n * k * V, sizeof *logits);
    int *rows = xcalloc((size_t)n * k, sizeof *rows);
    int32_t *next = xcalloc((size_t)n * k, sizeof *next);
    GenStats gs = {0};
    decoder_reset(d);
    double t0 = now_seconds();
    for (int p = 0; p < n; p++) {
        search_init(&s[p], k, V, o, prompts[p], lens[p], p * k);
        s[p].logits = logits + (long)p * k * V;
        decoder_extend(d, p * k, prompts[p], lens[p], s[p].logits);
        for (int j = 1; j < k; j++) {
            decoder_copy(d, p * k + j, p * k);
            memcpy(s[p].logits + (long)j * V, s[p].logits, (size_t)V * sizeof *logits);
        }
        gs.prompt_tokens += lens[p];
    }
    gs.prefill_s = now_seconds() - t0;
    t0 = now_seconds();
    for (;;) {
        /* Each running search takes its step; those that go on decode their beams together. */
        int nr = 0;
        for (int p = 0; p < n; p++) {
            Search *sp = &s[p];
            if (sp->done) continue;
            score_candidates(sp, o, sp->prompt, sp->len);
            if (!beam_step(sp, o, bp, &sp->unsatisfied, sp->src, sp->tok)) {
                sp->done = 1;
                continue;
            }
            follow(sp, d, sp->src);
            sp->logits = logits + (long)nr * V;
            memcpy(rows + nr, sp->row, (size_t)k * sizeof *rows);
            memcpy(next + nr, sp->tok, (size_t)k * sizeof *next);
            nr += k;
        }
        if (nr == 0) break;
        decoder_step(d, rows, next, nr, logits);
        gs.new_tokens += nr;
    }
    gs.decode_s = now_seconds() - t0;
    if (stats) *stats = gs;
    int rc = 0;
    memset(out, 0, (size_t)n * n_out * sizeof *out);
    for (int p = 0; p < n && rc == 0; p++)
        rc = search_output(&s[p], tok, o, out + (long)p * n_out, n_out, err);
    for (int p = 0; p < n; p++)
        search_free(&s[p]);
    free(s), free(logits), free(rows), free(next);
    if (rc != 0)
        for (int i = 0; i < n * n_out; i++)
            gen_output_free(&out[i]);
    return rc;
}
