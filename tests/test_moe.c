/* MoE pieces: finite-difference checks of the experts op (both implementations) and of the
 * router (softmax, top-k renormalisation, auxiliary loss), grouped vs reference equality,
 * bitwise determinism, the routing rule (bias steers the choice, not the weights; ties go to
 * the lower id), the auxiliary-loss-free bias update, load statistics, and a small MoE model
 * whose loss falls under plain SGD on fixed data. Losses are reduced to a scalar by a fixed
 * random projection, loss = sum(out * R) in double. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h> /* after the headers it relies on */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "model/moe.h"
#include "model/qwen3.h"
#include "ops/moe_experts.h"
#include "train/metrics.h"

#define TOL_FD 1e-3

#include "fd_util.h"
#include "spec_util.h"

static double rel_l2(const float *a, const float *b, long n) {
    double d = 0, r = 0;
    for (long i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    return sqrt(d / (r + 1e-30));
}

/* ---- experts op ---- */

typedef struct Experts {
    const MoeExpertsOp *op;
    long N;
    int k, D, F, X;
    float *x, *gw, *w1, *w3, *w2, *R, *out;
    int32_t *idx;
    MoeExpertsBufs b;
    float *saved, *scratch;
    int32_t *ints;
} Experts;

static void experts_init(Experts *c, const MoeExpertsOp *op, long N, int k, int D, int F, int X) {
    memset(c, 0, sizeof *c);
    c->op = op, c->N = N, c->k = k, c->D = D, c->F = F, c->X = X;
    c->x = randn(N * D, 1.0f);
    c->gw = randn(N * k, 0.5f);
    c->w1 = randn((long)X * F * D, 0.3f);
    c->w3 = randn((long)X * F * D, 0.3f);
    c->w2 = randn((long)X * D * F, 0.3f);
    c->R = randn(N * D, 1.0f);
    c->out = zeros(N * D);
    c->idx = malloc((size_t)(N * k) * sizeof(int32_t));
    /* Distinct experts per token, every expert used, one expert deliberately left empty when
     * there are enough of them (the grouped path skips it). */
    int usable = X > k + 1 ? X - 1 : X;
    for (long n = 0; n < N; n++)
        for (int j = 0; j < k; j++)
            c->idx[n * k + j] = (int32_t)((n * 3 + j) % usable);
    c->saved = zeros(moe_experts_saved_floats(N, k, D, F));
    c->scratch = zeros(moe_experts_scratch_floats(N, k, D, F));
    c->ints = calloc((size_t)moe_experts_saved_ints(N, k, X), sizeof(int32_t));
    moe_experts_bufs_place(&c->b, c->saved, c->ints, c->scratch, N, k, D, F, X);
}

static void experts_free(Experts *c) {
    free(c->x), free(c->gw), free(c->w1), free(c->w3), free(c->w2), free(c->R), free(c->out);
    free(c->idx), free(c->saved), free(c->scratch), free(c->ints);
}

static double experts_loss(void *p) {
    Experts *c = p;
    c->op->forward(c->out, &c->b, c->x, c->idx, c->gw, c->w1, c->w3, c->w2, c->N, c->k, c->D, c->F,
                   c->X);
    return project(c->out, c->R, c->N * c->D);
}

typedef struct ExpertsGrads {
    float *dx, *dgw, *dw1, *dw3, *dw2;
} ExpertsGrads;

static void experts_backward(ExpertsGrads *g, Experts *c) {
    long N = c->N, XFD = (long)c->X * c->F * c->D;
    g->dx = zeros(N * c->D), g->dgw = zeros(N * c->k);
    g->dw1 = zeros(XFD), g->dw3 = zeros(XFD), g->dw2 = zeros(XFD);
    experts_loss(c);
    c->op->backward(g->dx, g->dgw, g->dw1, g->dw3, g->dw2, &c->b, c->R, c->x, c->idx, c->gw, c->w1,
                    c->w3, c->w2, N, c->k, c->D, c->F, c->X);
}

static void grads_free(ExpertsGrads *g) {
    free(g->dx), free(g->dgw), free(g->dw1), free(g->dw3), free(g->dw2);
}

static void test_experts_gradcheck(void **state) {
    (void)state;
    const MoeExpertsOp *ops[] = {&moe_experts_reference, &moe_experts_grouped};
    for (int o = 0; o < 2; o++) {
        printf("%s:\n", ops[o]->h.name);
        rng_seed(&rng, 7, (uint64_t)o);
        Experts c;
        experts_init(&c, ops[o], 7, 3, 6, 5, 5);
        ExpertsGrads g;
        experts_backward(&g, &c);
        long XFD = (long)c.X * c.F * c.D;
        fd_check("x", c.x, c.N * c.D, g.dx, experts_loss, &c, 1e-2f, 64, TOL_FD);
        fd_check("gate weights", c.gw, c.N * c.k, g.dgw, experts_loss, &c, 1e-2f, 64, TOL_FD);
        fd_check("w1", c.w1, XFD, g.dw1, experts_loss, &c, 1e-2f, 200, TOL_FD);
        fd_check("w3", c.w3, XFD, g.dw3, experts_loss, &c, 1e-2f, 200, TOL_FD);
        fd_check("w2", c.w2, XFD, g.dw2, experts_loss, &c, 1e-2f, 200, TOL_FD);
        grads_free(&g);
        experts_free(&c);
    }
}

/* Same inputs through both implementations; the grouped GEMMs sum in another order, so the
 * two agree to rounding, not bitwise. Also: repeated runs are bitwise equal and gradients
 * accumulate (+=). */
static void test_grouped_matches_reference(void **state) {
    (void)state;
    static const int shapes[][5] = {{33, 2, 16, 24, 8}, {64, 8, 32, 16, 64}, {5, 1, 8, 8, 3}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int *sh = shapes[s];
        Experts r, g;
        rng_seed(&rng, 11, s);
        experts_init(&r, &moe_experts_reference, sh[0], sh[1], sh[2], sh[3], sh[4]);
        rng_seed(&rng, 11, s);
        experts_init(&g, &moe_experts_grouped, sh[0], sh[1], sh[2], sh[3], sh[4]);
        ExpertsGrads gr, gg;
        experts_backward(&gr, &r);
        experts_backward(&gg, &g);
        long ND = r.N * r.D, XFD = (long)r.X * r.F * r.D;
        double e[6] = {rel_l2(g.out, r.out, ND),          rel_l2(gg.dx, gr.dx, ND),
                       rel_l2(gg.dgw, gr.dgw, r.N * r.k), rel_l2(gg.dw1, gr.dw1, XFD),
                       rel_l2(gg.dw3, gr.dw3, XFD),       rel_l2(gg.dw2, gr.dw2, XFD)};
        printf("N %d k %d D %d F %d X %d: out %.1e dx %.1e dgw %.1e dw1 %.1e dw3 %.1e dw2 %.1e\n",
               sh[0], sh[1], sh[2], sh[3], sh[4], e[0], e[1], e[2], e[3], e[4], e[5]);
        for (int i = 0; i < 6; i++)
            assert_true(e[i] < 1e-5);

        /* Determinism and accumulation: a second run gives bitwise the same out and dx,
         * and the weight gradients accumulate to exactly twice the first (g + g is exact). */
        float *out1 = malloc((size_t)ND * sizeof(float)), *dx1 = malloc((size_t)ND * sizeof(float));
        float *dw1 = malloc((size_t)XFD * sizeof(float));
        memcpy(out1, g.out, (size_t)ND * sizeof(float));
        memcpy(dx1, gg.dx, (size_t)ND * sizeof(float));
        memcpy(dw1, gg.dw2, (size_t)XFD * sizeof(float));
        experts_loss(&g);
        assert_memory_equal(out1, g.out, (size_t)ND * sizeof(float));
        g.op->backward(gg.dx, gg.dgw, gg.dw1, gg.dw3, gg.dw2, &g.b, g.R, g.x, g.idx, g.gw, g.w1,
                       g.w3, g.w2, g.N, g.k, g.D, g.F, g.X);
        assert_memory_equal(dx1, gg.dx, (size_t)ND * sizeof(float));
        for (long i = 0; i < XFD; i++)
            assert_true(gg.dw2[i] == 2.0f * dw1[i]);
        free(out1), free(dx1), free(dw1);
        grads_free(&gr), grads_free(&gg);
        experts_free(&r), experts_free(&g);
    }
}

/* ---- router ---- */

typedef struct Router {
    long N;
    int X, k, norm, round_robin;
    double coef; /* auxiliary loss weight, 0 = off */
    float *logits, *bias, *probs, *gw, *Rw, *dlogits, *aux_dprob;
    int32_t *idx, *idx0;
} Router;

/* loss = sum(gw * Rw) + coef * aux, with the expert choice frozen at idx0 (the analytic
 * gradient treats the discrete choice as constant, which holds within the differences' eps). */
static double router_loss(void *p) {
    Router *r = p;
    moe_router_forward(r->probs, r->idx, r->gw, r->logits, r->bias, r->N, r->X, r->k, r->norm,
                       r->round_robin);
    assert_memory_equal(r->idx, r->idx0, (size_t)(r->N * r->k) * sizeof(int32_t));
    double loss = project(r->gw, r->Rw, r->N * r->k);
    if (r->coef > 0) {
        double counts[16] = {0}, psum[16] = {0};
        moe_count_add(counts, r->idx, r->N, r->k);
        moe_prob_sum_add(psum, r->probs, r->N, r->X);
        loss += r->coef * moe_aux_loss(counts, psum, (double)r->N, r->X);
    }
    return loss;
}

static void test_router_gradcheck(void **state) {
    (void)state;
    for (int rr = 0; rr <= 1; rr++)
        for (int norm = 0; norm <= 1; norm++)
            for (int aux = 0; aux <= 1; aux++) {
                Router r = {.N = 9,
                            .X = 6,
                            .k = 3,
                            .norm = norm,
                            .coef = aux ? 0.7 : 0.0,
                            .round_robin = rr};
                rng_seed(&rng, 3, (uint64_t)(rr * 4 + norm * 2 + aux));
                r.logits = randn(r.N * r.X, 1.5f);
                r.bias = randn(r.X, 0.05f);
                r.probs = zeros(r.N * r.X), r.gw = zeros(r.N * r.k), r.Rw = randn(r.N * r.k, 1.0f);
                r.dlogits = zeros(r.N * r.X), r.aux_dprob = zeros(r.X);
                r.idx = malloc((size_t)(r.N * r.k) * sizeof(int32_t));
                r.idx0 = malloc((size_t)(r.N * r.k) * sizeof(int32_t));
                moe_router_forward(r.probs, r.idx0, r.gw, r.logits, r.bias, r.N, r.X, r.k, r.norm,
                                   r.round_robin);
                double counts[16] = {0};
                moe_count_add(counts, r.idx0, r.N, r.k);
                moe_aux_dprob(r.aux_dprob, counts, (double)r.N, r.X, r.coef);
                moe_router_backward(r.dlogits, r.Rw, r.probs, r.idx0, aux ? r.aux_dprob : NULL, r.N,
                                    r.X, r.k, r.norm);
                char what[64];
                snprintf(what, sizeof what, "router logits (norm %d, aux %d, round-robin %d)", norm,
                         aux, rr);
                fd_check(what, r.logits, r.N * r.X, r.dlogits, router_loss, &r, 1e-3f, 64, TOL_FD);
                free(r.logits), free(r.bias), free(r.probs), free(r.gw), free(r.Rw),
                    free(r.dlogits);
                free(r.aux_dprob), free(r.idx), free(r.idx0);
            }
}

static void test_router_rule(void **state) {
    (void)state;
    /* Token 0: probs ordered 3 > 1 > 0 > 2; token 1: all logits equal (ties). */
    float logits[8] = {0.5f, 1.0f, 0.0f, 2.0f, 1.0f, 1.0f, 1.0f, 1.0f};
    float probs[8], gw[4];
    int32_t idx[4];
    moe_router_forward(probs, idx, gw, logits, NULL, 2, 4, 2, 0, 0);
    assert_int_equal(idx[0], 3), assert_int_equal(idx[1], 1);
    assert_int_equal(idx[2], 0), assert_int_equal(idx[3], 1); /* ties: lower id first */
    double z = exp(0.5) + exp(1.0) + exp(0.0) + exp(2.0);
    assert_true(fabs(gw[0] - exp(2.0) / z) < 1e-6 && fabs(gw[1] - exp(1.0) / z) < 1e-6);
    assert_true(fabs(gw[2] - 0.25) < 1e-6 && fabs(gw[3] - 0.25) < 1e-6);
    /* norm_topk_prob: the chosen weights sum to one. */
    moe_router_forward(probs, idx, gw, logits, NULL, 2, 4, 2, 1, 0);
    assert_true(fabs(gw[0] - exp(2.0) / (exp(2.0) + exp(1.0))) < 1e-6);
    assert_true(fabs(gw[2] - 0.5) < 1e-6);
    /* A bias steers the choice; the weights stay the unbiased probabilities. */
    float bias[4] = {0.0f, 0.0f, 1.0f, 0.0f};
    moe_router_forward(probs, idx, gw, logits, bias, 2, 4, 2, 0, 0);
    assert_int_equal(idx[0], 2), assert_int_equal(idx[1], 3);
    assert_true(fabs(gw[0] - exp(0.0) / z) < 1e-6 && fabs(gw[1] - exp(2.0) / z) < 1e-6);
    assert_int_equal(idx[2], 2), assert_int_equal(idx[3], 0);
}

/* debug.moe_force_load_balance: 5 tokens, 4 experts, top-3. Slot j of token n goes to expert
 * (3n + j) mod 4 whatever the scores and the bias say (torchtitan's arange(N * k) % X), the
 * counts are 4, 4, 4, 3, and the weights are those experts' probabilities. */
static void test_router_round_robin(void **state) {
    (void)state;
    enum { N = 5, X = 4, K = 3 };
    float logits[N * X], probs[N * X], gw[N * K], bias[X] = {5.0f, 0.0f, 0.0f, -5.0f};
    int32_t idx[N * K];
    for (int i = 0; i < N * X; i++)
        logits[i] = (float)((i * 7) % 11) * 0.3f;
    for (int norm = 0; norm <= 1; norm++) {
        moe_router_forward(probs, idx, gw, logits, bias, N, X, K, norm, 1);
        double counts[X] = {0};
        moe_count_add(counts, idx, N, K);
        for (int n = 0; n < N; n++) {
            double S = 0.0;
            for (int j = 0; j < K; j++)
                S += probs[n * X + (n * K + j) % X];
            for (int j = 0; j < K; j++) {
                int e = (n * K + j) % X;
                assert_int_equal(idx[n * K + j], e);
                double want = probs[n * X + e] / (norm ? S : 1.0);
                assert_true(fabs(gw[n * K + j] - want) < 1e-6);
            }
        }
        assert_true(counts[0] == 4 && counts[1] == 4 && counts[2] == 4 && counts[3] == 3);
    }
}

/* HF's load_balancing_loss_func on a hand-sized case: 2 tokens, 2 experts, top-1. */
static void test_aux_loss_value(void **state) {
    (void)state;
    double counts[2] = {2, 0}, psum[2] = {1.4, 0.6};
    /* X * sum_e (c_e / R) (P_e / R) = 2 * (1 * 0.7 + 0) */
    assert_true(fabs(moe_aux_loss(counts, psum, 2.0, 2) - 1.4) < 1e-12);
    assert_true(moe_aux_loss(counts, psum, 0.0, 2) == 0.0);
}

static void test_bias_update(void **state) {
    (void)state;
    float bias[4] = {0.1f, -0.1f, 0.0f, 0.0f};
    double counts[4] = {10, 2, 4, 4}; /* mean 5: experts 0 over, 1..3 under */
    moe_update_expert_bias(bias, counts, 4, 1e-3);
    /* sign(mean - c) = (-1, +1, +1, +1), centred by its mean 0.5: (-1.5, .5, .5, .5) e-3 */
    assert_true(fabs(bias[0] - (0.1f - 1.5e-3f)) < 1e-7);
    assert_true(fabs(bias[1] - (-0.1f + 0.5e-3f)) < 1e-7);
    assert_true(fabs(bias[2] - 0.5e-3f) < 1e-7 && fabs(bias[3] - 0.5e-3f) < 1e-7);
    /* Even load: no change; coeff 0: disabled. */
    float b2[3] = {0.2f, 0.3f, -0.5f};
    double even[3] = {4, 4, 4};
    moe_update_expert_bias(b2, even, 3, 1e-3);
    assert_true(b2[0] == 0.2f && b2[1] == 0.3f && b2[2] == -0.5f);
    moe_update_expert_bias(b2, counts, 3, 0.0);
    assert_true(b2[0] == 0.2f && b2[1] == 0.3f && b2[2] == -0.5f);
}

static void test_load_stats(void **state) {
    (void)state;
    double counts[2 * 4] = {4, 4, 4, 4, 1, 9, 3, 3}; /* layer 0 even; layer 1 max 9, mean 4 */
    MoeLoadStats s;
    moe_load_stats(&s, counts, 2, 4);
    assert_true(s.min_tokens == 1 && s.max_tokens == 9);
    assert_true(fabs(s.imbalance - 9.0 / 4.0) < 1e-12);
    double none[4] = {0};
    moe_load_stats(&s, none, 1, 4);
    assert_true(s.min_tokens == 0 && s.max_tokens == 0 && s.imbalance == 0);
}

/* ---- model ---- */

static ModelSpec tiny_moe(void) {
    ModelSpec s = test_spec((TestShape){
        .D = 32, .L = 3, .H = 4, .K = 2, .E = 8, .F = 48, .V = 61, .T = 64, .rope_theta = 1e4});
    test_spec_moe(&s, 8, 2, 16);
    s.mlp_only_layers[1] = 1;
    s.load_balance_coeff = 1e-3;
    return s;
}

/* FLOPs count only the top_k active experts plus the router in MoE layers, the dense FFN
 * elsewhere (layer 1 here). */
static void test_flops_active_experts(void **state) {
    (void)state;
    ModelSpec s = tiny_moe();
    double D = 32, attn = D * 32 + 2 * D * 16 + 32 * D;
    double expect = 3 * attn + 2 * (D * 8 + 2 * 3 * D * 16) + 3 * D * 48 + 61 * D;
    assert_true(fabs(metrics_matmul_params(&s) - expect) < 0.5);
    assert_true(fabs(metrics_flops_per_token(&s, 10) - (6 * expect + 12.0 * 3 * 4 * 8 * 10)) < 1);
}

/* Plain SGD on one fixed batch: the loss must fall; counts accumulate over forwards, the bias
 * update moves the bias and keeps it zero-mean; two identical runs give bitwise the same
 * losses. */
static void sgd_run(float *losses, int steps, float *bias_out) {
    ModelSpec s = tiny_moe();
    Qwen3 m;
    Err err;
    int B = 2, T = 16;
    assert_int_equal(qwen3_create(&m, &s, B, T, AC_NONE, &err), 0);
    qwen3_init_params(&m, 1234);
    /* Larger weights than the 0.02 init so a few steps move the loss visibly. */
    for (int i = 0; i < m.nparams; i++)
        if (m.table[i].kind->role != ROLE_NORM && m.table[i].kind->role != ROLE_BUFFER)
            for (long j = 0; j < m.table[i].numel; j++)
                m.table[i].data[j] *= 5.0f;
    int32_t tok[32], tgt[32];
    for (int i = 0; i < B * T; i++)
        tok[i] = (int32_t)((i * 7 + 3) % s.vocab_size);
    for (int i = 0; i < B * T; i++)
        tgt[i] = (i + 1) % T ? tok[i + 1] : CE_IGNORE;
    for (int st = 0; st < steps; st++) {
        qwen3_zero_grads(&m);
        qwen3_moe_reset_counts(&m);
        losses[st] = qwen3_forward(&m, tok, tgt, NULL, NULL, B, T);
        qwen3_backward(&m, 0);
        double routed = 0;
        for (int e = 0; e < s.num_experts; e++) {
            routed += m.moe_counts[0 * s.num_experts + e];
            assert_true(m.moe_counts[1 * s.num_experts + e] == 0); /* dense layer */
        }
        assert_true(routed == (double)B * T * s.top_k);
        qwen3_moe_update_bias(&m, m.moe_counts);
        for (int i = 0; i < m.nparams; i++) {
            Qwen3Param *p = &m.table[i];
            if (p->kind->role == ROLE_BUFFER) continue;
            for (long j = 0; j < p->numel; j++)
                p->data[j] -= 0.5f * p->grad[j];
        }
    }
    const float *b = m.p.layers[2].expert_bias;
    double mean = 0, spread = 0;
    for (int e = 0; e < s.num_experts; e++)
        mean += b[e], spread += fabs(b[e]);
    assert_true(fabs(mean) < 1e-6 && spread > 0);
    memcpy(bias_out, b, (size_t)s.num_experts * sizeof(float));
    assert_null(m.p.layers[1].expert_bias);
    qwen3_free(&m);
}

static void test_moe_model_sgd(void **state) {
    (void)state;
    float l1[8], l2[8], b1[8], b2[8];
    sgd_run(l1, 8, b1);
    sgd_run(l2, 8, b2);
    for (int i = 0; i < 8; i++)
        printf("  step %d loss %.5f\n", i + 1, l1[i]);
    assert_true(l1[7] < l1[0] - 0.5f);
    assert_memory_equal(l1, l2, sizeof l1);
    assert_memory_equal(b1, b2, sizeof b1);
}

/* Activation checkpointing recomputes MoE layers in backward: gradients must be bitwise those
 * of keeping everything, and the routing counts must not count the recomputation. */
static void test_moe_activation_checkpointing(void **state) {
    (void)state;
    ModelSpec s = tiny_moe();
    s.n_layers = 4; /* MoE, dense, MoE, MoE: recomputation crosses both kinds */
    int B = 2, T = 12;
    int32_t tok[24], tgt[24];
    for (int i = 0; i < B * T; i++)
        tok[i] = (int32_t)((i * 11 + 5) % s.vocab_size),
        tgt[i] = (int32_t)((i * 5 + 1) % s.vocab_size);
    Qwen3 ref;
    Err err;
    assert_int_equal(qwen3_create(&ref, &s, B, T, AC_NONE, &err), 0);
    qwen3_init_params(&ref, 77);
    qwen3_zero_grads(&ref);
    float l0 = qwen3_forward(&ref, tok, tgt, NULL, NULL, B, T);
    qwen3_backward(&ref, 0);
    /* ac_every(2): layers 1 (dense) and 3 (MoE) share one set, layer 1 recomputed; 0 and 2
     * keep theirs */
    const AcMode modes[] = {AC_FULL, AC_SELECTIVE, ac_every(2)};
    for (int mi = 0; mi < 3; mi++) {
        Qwen3 m;
        assert_int_equal(qwen3_create(&m, &s, B, T, modes[mi], &err), 0);
        qwen3_init_params(&m, 77);
        qwen3_zero_grads(&m);
        float l = qwen3_forward(&m, tok, tgt, NULL, NULL, B, T);
        qwen3_backward(&m, 0);
        assert_true(l == l0);
        for (int i = 0; i < m.nparams; i++)
            assert_memory_equal(m.table[i].grad, ref.table[i].grad,
                                (size_t)m.table[i].numel * sizeof(float));
        assert_memory_equal(m.moe_counts, ref.moe_counts,
                            (size_t)s.n_layers * s.num_experts * sizeof(double));
        qwen3_free(&m);
    }
    double routed = 0;
    for (long i = 0; i < (long)s.n_layers * s.num_experts; i++)
        routed += ref.moe_counts[i];
    assert_true(routed == 3.0 * B * T * s.top_k); /* three MoE layers, counted once */
    qwen3_free(&ref);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_experts_gradcheck),
        cmocka_unit_test(test_grouped_matches_reference),
        cmocka_unit_test(test_router_gradcheck),
        cmocka_unit_test(test_router_rule),
        cmocka_unit_test(test_router_round_robin),
        cmocka_unit_test(test_aux_loss_value),
        cmocka_unit_test(test_bias_update),
        cmocka_unit_test(test_load_stats),
        cmocka_unit_test(test_flops_active_experts),
        cmocka_unit_test(test_moe_model_sgd),
        cmocka_unit_test(test_moe_activation_checkpointing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
