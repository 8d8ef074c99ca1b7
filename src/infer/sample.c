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
}

void sampler_free(Sampler *s) {
    free(s->scaled), free(s->order), free(s->prob);
    memset(s, 0, sizeof *s);
}

void sample_describe(char *out, size_t cap, const SampleParams *p) {
    int used = p->temperature > 0
                   ? snprintf(out, cap, "temperature %g, top-k %d, top-p %g, min-p %g",
                              (double)p->temperature, p->top_k, (double)p->top_p, (double)p->min_p)
                   : snprintf(out, cap, "greedy");
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

void sample_ban_ngrams(float *scores, int V, const int32_t *hist, long len, const SampleParams *p) {
    long n = p->no_repeat_ngram_size;
    if (n <= 0 || len < n) return;
    const int32_t *prefix = hist + len - (n - 1);
    for (long j = 0; j + n <= len; j++)
        if (memcmp(hist + j, prefix, (size_t)(n - 1) * sizeof *hist) == 0) {
            int32_t t = hist[j + n - 1];
            if (t >= 0 && t < V) scores[t] = -INFINITY;
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
    return n;
}

int sample_filter(Sampler *s, const float *logits, const SampleParams *p, uint8_t *keep) {
    int n = filter(s, logits, p);
    memset(keep, 0, (size_t)s->V);
    for (int i = 0; i < n; i++)
        keep[s->order[i]] = 1;
    return n;
}

int32_t sample_next(Sampler *s, const float *logits, const SampleParams *p, Rng *r) {
    if (p->temperature <= 0.0f) {
        int32_t best = 0;
        for (int v = 1; v < s->V; v++)
            if (logits[v] > logits[best]) best = v;
        return best;
    }
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
