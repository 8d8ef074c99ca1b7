/* Qwen3-MoE routing and load balancing, the parts of an MoE block around its two module
 * instances (router gate: a linear op; experts: the "moe.experts" op):
 *
 *   logits = x Wg^T (X outputs, no bias)  ->  probs = softmax(logits) in fp32
 *   chosen = the k experts with the largest probs + expert_bias (ties: lower id first)
 *   gw[j]  = probs[chosen[j]], divided by their sum over the k when norm_topk_prob
 *
 * The bias steers only the choice; gate weights come from the unbiased probs (torchtitan's
 * auxiliary-loss-free balancing). With a zero bias this is HF's Qwen3MoeTopKRouter.
 *
 * Letters: N tokens, X experts, k experts per token, L layers. */
#ifndef QT_MOE_H
#define QT_MOE_H

#include <stdint.h>

/* probs (N, X) written; idx (N, k) the chosen experts in descending order of biased score;
 * gw (N, k) their gate weights. bias (X) may be NULL (no bias). logits (N, X) is read only.
 * round_robin (torchtitan's debug.moe_force_load_balance): the scores choose nothing; token n's
 * slot j goes to expert (n * k + j) mod X, so every expert gets the same number of slots to
 * within one, and the gate weights are those experts' probabilities (renormalised as usual). */
void moe_router_forward(float *probs, int32_t *idx, float *gw, const float *logits,
                        const float *bias, long N, int X, int k, int norm_topk_prob,
                        int round_robin);

/* dlogits (N, X) written from the gate weights' gradient dgw (N, k), through the
 * renormalisation and the softmax; aux_dprob (X), when not NULL, is added to every token's
 * probability gradient first (the auxiliary loss's gradient, see moe_aux_dprob). dlogits may
 * alias nothing else. */
void moe_router_backward(float *dlogits, const float *dgw, const float *probs, const int32_t *idx,
                         const float *aux_dprob, long N, int X, int k, int norm_topk_prob);

/* counts[e] += number of (token, slot) pairs routed to expert e; idx (N, k). */
void moe_count_add(double *counts, const int32_t *idx, long N, int k);
/* psum[e] += sum over tokens of probs[n, e]; probs (N, X). Summed in token order. */
void moe_prob_sum_add(double *psum, const float *probs, long N, int X);

/* HF's load_balancing_loss_func (Switch Transformer) without an attention mask, over every
 * MoE layer of one forward together: rows = tokens x MoE layers, counts and psum summed over
 * those layers; aux = X * sum_e (counts[e] / rows) * (psum[e] / rows). */
double moe_aux_loss(const double *counts, const double *psum, double rows, int X);
/* d(coef * aux) / d probs[row, e] = coef * X * counts[e] / rows^2, the same for every row of
 * every MoE layer (counts are piecewise constant); written to dprob (X). */
void moe_aux_dprob(float *dprob, const double *counts, double rows, int X, double coef);

/* torchtitan's auxiliary-loss-free update of one layer's bias from the tokens each expert got
 * over the whole optimizer step (all micro-batches and, when the caller all-reduced them, all
 * data-parallel ranks): delta[e] = coeff * sign(mean(counts) - counts[e]), centred to zero
 * mean, added to bias (X). coeff <= 0 leaves bias unchanged. */
void moe_update_expert_bias(float *bias, const double *counts, int X, double coeff);

/* Per-step load figures over L layers' counts (L, X) (tokens x top_k per layer when every
 * token routes): the fewest and most tokens any expert of any layer got, and the imbalance,
 * the largest max/mean of a layer (1 = perfectly even). All zero when no token was routed. */
typedef struct MoeLoadStats {
    double min_tokens, max_tokens, imbalance;
} MoeLoadStats;
void moe_load_stats(MoeLoadStats *out, const double *counts, int L, int X);

#endif
