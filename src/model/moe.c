/* Qwen3-MoE routing (softmax, biased top-k, renormalisation), its backward, the HF auxiliary
 * loss, and torchtitan's auxiliary-loss-free bias update. */
#include "model/moe.h"

#include <math.h>
#include <string.h>

void moe_router_forward(float *probs, int32_t *idx, float *gw, const float *logits,
                        const float *bias, long N, int X, int k, int norm_topk_prob,
                        int round_robin) {
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++) {
        const float *l = logits + n * X;
        float *p = probs + n * X;
        float mx = l[0];
        for (int e = 1; e < X; e++)
            mx = fmaxf(mx, l[e]);
        float sum = 0.0f;
        for (int e = 0; e < X; e++) {
            p[e] = expf(l[e] - mx);
            sum += p[e];
        }
        float inv = 1.0f / sum;
        for (int e = 0; e < X; e++)
            p[e] *= inv;
        /* Selection by insertion into a sorted list of k: strict > keeps the lower id first
         * among equal scores. k is small (8 for the published models). */
        int32_t *ix = idx + n * k;
        float top[k];
        int have = 0;
        for (int j = 0; round_robin && j < k; j++)
            ix[j] = (int32_t)((n * k + j) % X);
        for (int e = 0; !round_robin && e < X; e++) {
            float s = p[e] + (bias ? bias[e] : 0.0f);
            if (have == k && !(s > top[k - 1])) continue;
            int pos = have < k ? have++ : k - 1;
            while (pos > 0 && s > top[pos - 1]) {
                top[pos] = top[pos - 1];
                ix[pos] = ix[pos - 1];
                pos--;
            }
            top[pos] = s;
            ix[pos] = e;
        }
        float *w = gw + n * k, tot = 0.0f;
        for (int j = 0; j < k; j++) {
            w[j] = p[ix[j]];
            tot += w[j];
        }
        if (norm_topk_prob)
            for (int j = 0; j < k; j++)
                w[j] /= tot;
    }
}

void moe_router_backward(float *dlogits, const float *dgw, const float *probs, const int32_t *idx,
                         const float *aux_dprob, long N, int X, int k, int norm_topk_prob) {
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++) {
        const float *p = probs + n * X, *dw = dgw + n * k;
        const int32_t *ix = idx + n * k;
        float *dp = dlogits + n * X; /* holds d probs until the softmax step */
        for (int e = 0; e < X; e++)
            dp[e] = aux_dprob ? aux_dprob[e] : 0.0f;
        if (norm_topk_prob) {
            /* w_j = p_j / S: dp_j = (dw_j - sum_i dw_i w_i) / S */
            float S = 0.0f, dot = 0.0f;
            for (int j = 0; j < k; j++)
                S += p[ix[j]];
            for (int j = 0; j < k; j++)
                dot += dw[j] * (p[ix[j]] / S);
            for (int j = 0; j < k; j++)
                dp[ix[j]] += (dw[j] - dot) / S;
        } else {
            for (int j = 0; j < k; j++)
                dp[ix[j]] += dw[j];
        }
        float s = 0.0f;
        for (int e = 0; e < X; e++)
            s += dp[e] * p[e];
        for (int e = 0; e < X; e++)
            dp[e] = p[e] * (dp[e] - s);
    }
}

void moe_count_add(double *counts, const int32_t *idx, long N, int k) {
    for (long a = 0; a < N * k; a++)
        counts[idx[a]] += 1.0;
}

void moe_prob_sum_add(double *psum, const float *probs, long N, int X) {
    for (long n = 0; n < N; n++)
        for (int e = 0; e < X; e++)
            psum[e] += probs[n * X + e];
}

double moe_aux_loss(const double *counts, const double *psum, double rows, int X) {
    if (rows <= 0) return 0.0;
    double s = 0.0;
    for (int e = 0; e < X; e++)
        s += (counts[e] / rows) * (psum[e] / rows);
    return s * X;
}

void moe_aux_dprob(float *dprob, const double *counts, double rows, int X, double coef) {
    for (int e = 0; e < X; e++)
        dprob[e] = rows > 0 ? (float)(coef * X * counts[e] / (rows * rows)) : 0.0f;
}

void moe_update_expert_bias(float *bias, const double *counts, int X, double coeff) {
    if (!(coeff > 0) || X < 1) return;
    double mean = 0.0;
    for (int e = 0; e < X; e++)
        mean += counts[e];
    mean /= X;
    double dmean = 0.0;
    for (int e = 0; e < X; e++) {
        double d = mean - counts[e];
        dmean += d > 0 ? coeff : d < 0 ? -coeff : 0.0;
    }
    dmean /= X;
    for (int e = 0; e < X; e++) {
        double d = mean - counts[e];
        double delta = (d > 0 ? coeff : d < 0 ? -coeff : 0.0) - dmean;
        bias[e] = (float)(bias[e] + delta);
    }
}

void moe_load_stats(MoeLoadStats *out, const double *counts, int L, int X) {
    memset(out, 0, sizeof *out);
    int first = 1;
    for (int l = 0; l < L; l++) {
        const double *c = counts + (long)l * X;
        double mx = c[0], mn = c[0], sum = 0.0;
        for (int e = 0; e < X; e++) {
            mx = fmax(mx, c[e]);
            mn = fmin(mn, c[e]);
            sum += c[e];
        }
        if (sum <= 0) continue;
        out->min_tokens = first ? mn : fmin(out->min_tokens, mn);
        out->max_tokens = first ? mx : fmax(out->max_tokens, mx);
        out->imbalance = fmax(out->imbalance, mx / (sum / X));
        first = 0;
    }
}
