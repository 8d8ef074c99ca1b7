/* Greedy choice and the sampling warpers (see sample.h). */
#include "infer/sample.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"

void sampler_init(Sampler *s, int V) {
    s->V = V;
    s->scaled = xcalloc((size_t)V, sizeof *s->scaled);
    s->order = xcalloc((size_t)V, sizeof *s->order);
    s->prob = xcalloc((size_t)V, sizeof *s->prob);
    s->dev = xcalloc((size_t)V, sizeof *s->dev);
    s->by = xcalloc((size_t)V, sizeof *s->by);
}

void sampler_free(Sampler *s) {
    free(s->scaled), free(s->order), free(s->prob), free(s->dev), free(s->by);
    memset(s, 0, sizeof *s);
}

void sample_describe(char *out, size_t cap, const SampleParams *p) {
    int used = p->temperature > 0
                   ? snprintf(out, cap, "temperature %g, top-k %d, top-p %g, min-p %g",
                              (double)p->temperature, p->top_k, (double)p->top_p, (double)p->min_p)
                   : snprintf(out, cap, "greedy");
    const struct {
        float v, off;
        const char *name;
    } warpers[] = {{p->typical_p, 1.0f, "typical-p"},
                   {p->epsilon, 0.0f, "epsilon-cutoff"},
                   {p->eta, 0.0f, "eta-cutoff"}};
    for (size_t i = 0; i < sizeof warpers / sizeof warpers[0] && p->temperature > 0; i++)
        if (warpers[i].v > 0 && warpers[i].v != warpers[i].off && (size_t)used < cap)
            used += snprintf(out + used, cap - (size_t)used, ", %s %g", warpers[i].name,
                             (double)warpers[i].v);
    if (p->repetition_penalty > 0 && p->repetition_penalty != 1.0f && (size_t)used < cap)
        used += snprintf(out + used, cap - (size_t)used, ", repetition-penalty %g",
                         (double)p->repetition_penalty);
    if (p->no_repeat_ngram_size > 0 && (size_t)used < cap)
        snprintf(out + used, cap - (size_t)used, ", no-repeat-ngram-size %d",
                 p->no_repeat_ngram_size);
}

int sample_penalizes(const SampleParams *p) {
    return (p->repetition_penalty > 0 && p->repetition_penalty != 1.0f) ||
           p->no_repeat_ngram_size > 0;
}

void sample_penalize(float *out, const float *logits, int V, const uint8_t *seen,
                     const SampleParams *p) {
    float r = p->repetition_penalty;
    int on = r > 0 && r != 1.0f;
    for (int v = 0; v < V; v++)
        out[v] = !on || !seen[v] ? logits[v] : logits[v] < 0 ? logits[v] * r : logits[v] / r;
}

/* Sets scores[t] = -inf for every t that follows, in hist[0..search), an occurrence of the n - 1
 * ids that end hist[0..len). */
static void ban_following(float *scores, int V, const int32_t *hist, long len, long search,
                          long n) {
    if (n <= 0 || len < n - 1) return;
    const int32_t *prefix = hist + len - (n - 1);
    for (long j = 0; j + n <= search; j++)
        if (memcmp(hist + j, prefix, (size_t)(n - 1) * sizeof *hist) == 0) {
            int32_t t = hist[j + n - 1];
            if (t >= 0 && t < V) scores[t] = -INFINITY;
        }
}

void sample_ban_ngrams(float *scores, int V, const int32_t *hist, long len, const SampleParams *p) {
    if (len >= p->no_repeat_ngram_size)
        ban_following(scores, V, hist, len, len, p->no_repeat_ngram_size);
}

int sample_procs_on(const LogitProcs *b) {
    return b && (b->min_new_tokens > 0 || b->min_length > 0 || b->n_suppress > 0 ||
                 b->n_begin_suppress > 0 || b->n_words > 0 || b->n_seqs > 0 ||
                 (b->encoder_repetition_penalty > 0 && b->encoder_repetition_penalty != 1.0) ||
                 b->encoder_no_repeat_ngram_size > 0 || b->n_forced_bos > 0 ||
                 b->n_forced_eos > 0 || b->decay_factor > 0);
}

void sample_procs_describe(char *out, size_t cap, const LogitProcs *b) {
    size_t used = 0;
    out[0] = '\0';
    if (!sample_procs_on(b)) return;
    const struct {
        int n;
        const char *what;
    } parts[] = {{b->min_new_tokens, "min-new-tokens %d"},
                 {b->min_length, "min-length %d"},
                 {b->n_suppress, "%d suppressed ids"},
                 {b->n_begin_suppress, "%d ids suppressed at the start"},
                 {b->n_words, "%d bad words"},
                 {b->n_seqs, "%d biased sequences"},
                 {b->encoder_no_repeat_ngram_size, "prompt-no-repeat-ngram-size %d"},
                 {b->n_forced_bos, "a forced BOS id"},
                 {b->n_forced_eos, "forced EOS ids at the end"}};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0] && used < cap; i++) {
        if (parts[i].n <= 0) continue;
        used += (size_t)snprintf(out + used, cap - used, ", ");
        if (used < cap) used += (size_t)snprintf(out + used, cap - used, parts[i].what, parts[i].n);
    }
    double r = b->encoder_repetition_penalty;
    if (r > 0 && r != 1.0 && used < cap)
        used += (size_t)snprintf(out + used, cap - used, ", prompt-repetition-penalty %g", r);
    if (b->decay_factor > 0 && used < cap)
        snprintf(out + used, cap - used, ", EOS length decay %g after %d", b->decay_factor,
                 b->decay_start);
}

static void ban_ids(float *scores, int V, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < V) scores[ids[i]] = -INFINITY;
}

/* suppress_tokens, and begin_suppress_tokens at their step. */
static void ban_suppressed(float *scores, int V, const LogitProcs *b, long len, long n_new) {
    ban_ids(scores, V, b->suppress, b->n_suppress);
    long begin = len - n_new > 1 || b->n_forced_bos == 0 ? 0 : 1;
    if (n_new == begin) ban_ids(scores, V, b->begin_suppress, b->n_begin_suppress);
}

/* Whether the n ids at w end hist[0..len) but for their last (always, for one id). */
static int ends_with_prefix(const int32_t *hist, long len, const int32_t *w, long n) {
    return n == 1 ||
           (n - 1 <= len && memcmp(hist + len - (n - 1), w, (size_t)(n - 1) * sizeof *w) == 0);
}

void sample_ban_tokens(float *scores, int V, const LogitProcs *b, const int32_t *hist, long len,
                       long n_new, const int32_t *eos, int n_eos) {
    if (!sample_procs_on(b)) return;
    for (int w = 0, start = 0; w < b->n_words; start = b->word_end[w++]) {
        const int32_t *word = b->words + start;
        long n = b->word_end[w] - start;
        int is_eos = 0;
        for (int e = 0; n == 1 && e < n_eos; e++)
            is_eos |= word[0] == eos[e];
        if (is_eos || n > len + (n == 1)) continue;
        if (ends_with_prefix(hist, len, word, n)) ban_ids(scores, V, word + n - 1, 1);
    }
    if (n_new < b->min_new_tokens || len < b->min_length) ban_ids(scores, V, eos, n_eos);
    ban_suppressed(scores, V, b, len, n_new);
}

/* sequence_bias: out[t] += the biases of the sequences that end in t here. */
static void bias_sequences(float *out, int V, const LogitProcs *b, const int32_t *hist, long len) {
    for (int s = 0, start = 0; s < b->n_seqs; start = b->seq_end[s++]) {
        long n = b->seq_end[s] - start;
        int32_t t = b->seq[b->seq_end[s] - 1];
        if (t < 0 || t >= V || !ends_with_prefix(hist, len, b->seq + start, n)) continue;
        /* Once per id, at its first sequence that applies: the biases that meet on it summed
         * first, as transformers sums them into one bias row. */
        int first = 1;
        for (int e = 0, st = 0; e < s && first; st = b->seq_end[e++])
            first = !(b->seq[b->seq_end[e] - 1] == t &&
                      ends_with_prefix(hist, len, b->seq + st, b->seq_end[e] - st));
        if (!first) continue;
        float sum = 0.0f;
        for (int e = s, st = start; e < b->n_seqs; st = b->seq_end[e++])
            if (b->seq[b->seq_end[e] - 1] == t &&
                ends_with_prefix(hist, len, b->seq + st, b->seq_end[e] - st))
                sum += b->seq_bias[e];
        out[t] += sum;
    }
}

/* Forced ids: all scores -inf but ids[0..n), which get 0. */
static void force(float *out, int V, const int32_t *ids, int n) {
    for (int v = 0; v < V; v++)
        out[v] = -INFINITY;
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < V) out[ids[i]] = 0.0f;
}

void sample_process(float *out, const float *logits, int V, const SampleParams *p,
                    const LogitProcs *b, const ProcSeq *q) {
    if (out != logits) memcpy(out, logits, (size_t)V * sizeof *out);
    int on = sample_procs_on(b);
    if (on && b->n_seqs > 0) bias_sequences(out, V, b, q->hist, q->len);
    if (on && b->encoder_repetition_penalty > 0 && b->encoder_repetition_penalty != 1.0) {
        /* transformers keeps 1 / R and multiplies (negative) or divides by it, in float */
        float inv = (float)(1.0 / b->encoder_repetition_penalty);
        for (int v = 0; v < V; v++)
            if (q->seen[v] & SEEN_PROMPT) out[v] = out[v] < 0 ? out[v] * inv : out[v] / inv;
    }
    if (sample_penalizes(p)) {
        sample_penalize(out, out, V, q->seen, p);
        sample_ban_ngrams(out, V, q->hist, q->len, p);
    }
    if (!on) return;
    long prompt_n = q->len - q->n_new, ng = b->encoder_no_repeat_ngram_size;
    if (ng > 0 && prompt_n >= ng) ban_following(out, V, q->hist, q->len, prompt_n, ng);
    sample_ban_tokens(out, V, b, q->hist, q->len, q->n_new, q->eos, q->n_eos);
    int forced = 0;
    if (b->n_forced_bos > 0 && q->len == 1) force(out, V, &b->forced_bos, 1), forced = 1;
    if (b->n_forced_eos > 0 && q->n_new == q->max_new - 1)
        force(out, V, b->forced_eos, b->n_forced_eos), forced = 1;
    if (forced) ban_suppressed(out, V, b, q->len, q->n_new); /* transformers' later processors */
    if (b->decay_factor > 0 && q->n_new > b->decay_start) {
        float f = (float)(pow(b->decay_factor, (double)(q->n_new - b->decay_start)) - 1.0);
        for (int e = 0; e < q->n_eos; e++) {
            int32_t t = q->eos[e];
            if (t >= 0 && t < V && isfinite(out[t])) out[t] += fabsf(out[t]) * f;
        }
    }
}

/* Descending logit, then ascending id, so equal logits have one order. */
static int by_logit_desc(const void *a, const void *b, void *ctx) {
    const float *x = ctx;
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (x[i] != x[j]) return x[i] > x[j] ? -1 : 1;
    return (i > j) - (i < j);
}

/* prob[0..n) = softmax of the n first tokens of order. */
static void softmax_prefix(Sampler *s, int n) {
    double mx = s->scaled[s->order[0]], sum = 0.0;
    for (int i = 0; i < n; i++) {
        s->prob[i] = exp((double)s->scaled[s->order[i]] - mx);
        sum += s->prob[i];
    }
    for (int i = 0; i < n; i++)
        s->prob[i] /= sum;
}

/* The entropy of prob[0..n). */
static double entropy(const Sampler *s, int n) {
    double h = 0;
    for (int i = 0; i < n; i++)
        if (s->prob[i] > 0) h -= s->prob[i] * log(s->prob[i]);
    return h;
}

/* Keeps the first tokens of order[0..n) whose probability is >= floor, and those as likely as
 * the first. */
static int cutoff(Sampler *s, int n, double floor) {
    int keep = 1;
    while (keep < n && (s->prob[keep] >= floor || s->prob[keep] == s->prob[0]))
        keep++;
    softmax_prefix(s, keep);
    return keep;
}

/* Ascending deviation (ctx: the deviations), then ascending position. */
static int by_dev(const void *a, const void *b, void *ctx) {
    const double *dev = ctx;
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (dev[i] != dev[j]) return dev[i] < dev[j] ? -1 : 1;
    return (i > j) - (i < j);
}

/* TypicalLogitsWarper on the kept tokens order[0..n): by |-log p - H| ascending, the tokens
 * until their probabilities sum to >= mass, and every token as close as the last of those;
 * the survivors stay in logit order. */
static int typical(Sampler *s, int n, double mass) {
    double h = entropy(s, n), *dev = s->dev;
    int32_t *by = s->by;
    for (int i = 0; i < n; i++) {
        dev[i] = fabs(-log(s->prob[i]) - h);
        by[i] = i;
    }
    qsort_r(by, (size_t)n, sizeof *by, by_dev, dev);
    double cum = 0;
    int last = 0; /* transformers: the count of cumulative sums below the mass, at most n - 1 */
    for (int i = 0; i < n; i++) {
        cum += s->prob[by[i]];
        if (cum < mass) last++;
    }
    if (last > n - 1) last = n - 1;
    double limit = dev[by[last]];
    int keep = 0;
    for (int i = 0; i < n; i++)
        if (dev[i] <= limit) s->order[keep++] = s->order[i];
    softmax_prefix(s, keep);
    return keep;
}

/* Leaves the kept tokens in order[0..n) and their renormalised probabilities in prob[0..n). */
static int filter(Sampler *s, const float *logits, const SampleParams *p) {
    int V = s->V, n = V;
    for (int v = 0; v < V; v++) {
        s->scaled[v] = logits[v] / p->temperature;
        s->order[v] = v;
    }
    qsort_r(s->order, (size_t)V, sizeof *s->order, by_logit_desc, s->scaled);
    if (p->top_k > 0 && p->top_k < n) {
        float kth = s->scaled[s->order[p->top_k - 1]];
        n = p->top_k;
        while (n < V && s->scaled[s->order[n]] >= kth)
            n++;
    }
    softmax_prefix(s, n);
    if (p->top_p < 1.0f) {
        double before = 0.0;
        int keep = 0;
        while (keep < n && (keep == 0 || before < p->top_p))
            before += s->prob[keep++];
        n = keep;
        softmax_prefix(s, n);
    }
    if (p->min_p > 0.0f) {
        double floor = p->min_p * s->prob[0];
        int keep = 1;
        while (keep < n && s->prob[keep] >= floor)
            keep++;
        n = keep;
        softmax_prefix(s, n);
    }
    if (p->typical_p > 0.0f && p->typical_p < 1.0f) n = typical(s, n, p->typical_p);
    if (p->epsilon > 0.0f && p->epsilon < 1.0f) n = cutoff(s, n, p->epsilon);
    if (p->eta > 0.0f && p->eta < 1.0f)
        n = cutoff(s, n, fmin(p->eta, sqrt(p->eta) * exp(-entropy(s, n))));
    return n;
}

int sample_filter(Sampler *s, const float *logits, const SampleParams *p, uint8_t *keep) {
    int n = filter(s, logits, p);
    memset(keep, 0, (size_t)s->V);
    for (int i = 0; i < n; i++)
        keep[s->order[i]] = 1;
    return n;
}

int32_t sample_argmax(const float *logits, int V) {
    int32_t best = 0;
    for (int v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    return best;
}

int32_t sample_next(Sampler *s, const float *logits, const SampleParams *p, Rng *r) {
    if (p->temperature <= 0.0f) return sample_argmax(logits, s->V);
    int n = filter(s, logits, p);
    double u = rng_uniform(r), cum = 0.0;
    for (int i = 0; i < n; i++) {
        cum += s->prob[i];
        if (u < cum) return s->order[i];
    }
    return s->order[n - 1];
}

double sample_logsumexp(const float *logits, int V) {
    double mx = logits[0], sum = 0.0;
    for (int v = 1; v < V; v++)
        if (logits[v] > mx) mx = logits[v];
    for (int v = 0; v < V; v++)
        sum += exp((double)logits[v] - mx);
    return mx + log(sum);
}

double sample_logprob(const float *logits, int V, int32_t id) {
    return (double)logits[id] - sample_logsumexp(logits, V);
}
