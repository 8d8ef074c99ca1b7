/* Finite-difference checks of every reference op's backward (and loss_chunked's), w.r.t.
 * every input and parameter, and of the whole model for a few parameters. Each op's output is
 * reduced to a scalar by a fixed random projection, loss = sum(out * R) (in double), so every
 * output element contributes; central differences of that loss are compared with the analytic
 * gradient by relative L2 error over the tensor. A dropped term in a backward gives O(1)
 * error; fp32 rounding and truncation stay near 1e-3. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h> /* after the headers it relies on */

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "kernels/kernels.h"
#include "model/qwen3.h"
#include "ops/cross_entropy.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/lm_head_loss.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/sdpa.h"
#include "ops/swiglu.h"

/* Ops are checked one at a time on O(1) data; the whole model stacks many non-linear ops,
 * so truncation error of the differences is larger there. */
#define TOL_OP 1e-3
#define TOL_MODEL 1.5e-2

#include "fd_util.h"
#include "spec_util.h"

/* ---- embedding ---- */
typedef struct {
    float *out, *table, *R;
    int32_t *tok;
    long N;
    int D;
} EmbCtx;
static double emb_loss(void *p) {
    EmbCtx *c = p;
    embedding_forward(c->out, c->tok, c->table, c->N, c->D);
    return project(c->out, c->R, c->N * c->D);
}
static void test_embedding(void **state) {
    (void)state;
    int V = 7, D = 5;
    long N = 12;
    int32_t tok[12] = {0, 3, 3, 6, 1, 3, 0, 2, 5, 6, 6, 3};
    EmbCtx c = {zeros(N * D), randn(V * D, 1.0f), randn(N * D, 1.0f), tok, N, D};
    float *dt = zeros(V * D);
    embedding_backward(dt, c.R, tok, N, D);
    fd_check("embedding dtable", c.table, V * D, dt, emb_loss, &c, 1e-2f, 1000, TOL_OP);
    free(c.out), free(c.table), free(c.R), free(dt);
}

/* ---- rmsnorm ---- */
typedef struct {
    float *out, *rstd, *x, *w, *R;
    long R_;
    int C;
} RmsCtx;
static double rms_loss(void *p) {
    RmsCtx *c = p;
    rmsnorm_forward(c->out, c->rstd, c->x, c->w, c->R_, c->C, 1e-6f);
    return project(c->out, c->R, c->R_ * c->C);
}
static void test_rmsnorm(void **state) {
    (void)state;
    long R = 6;
    int C = 16;
    RmsCtx c = {
        zeros(R * C), zeros(R), randn(R * C, 1.0f), randn(C, 1.0f), randn(R * C, 1.0f), R, C};
    float *dx = zeros(R * C), *dw = randn(C, 1.0f), *dw0 = malloc(C * sizeof(float));
    memcpy(dw0, dw, C * sizeof(float));
    rms_loss(&c);
    rmsnorm_backward(dx, dw, c.R, c.x, c.w, c.rstd, R, C);
    for (int j = 0; j < C; j++)
        dw[j] -= dw0[j]; /* dw accumulates onto what was there */
    fd_check("rmsnorm dx", c.x, R * C, dx, rms_loss, &c, 1e-2f, 1000, TOL_OP);
    fd_check("rmsnorm dw", c.w, C, dw, rms_loss, &c, 1e-2f, 1000, TOL_OP);
    free(c.out), free(c.rstd), free(c.x), free(c.w), free(c.R), free(dx), free(dw), free(dw0);
}

/* ---- rope ---- */
typedef struct {
    float *out, *x, *R;
    int32_t *pos;
    long N;
    int NH, E;
    const RopeFreqs *f;
} RopeCtx;
static double rope_loss(void *p) {
    RopeCtx *c = p;
    rope_forward(c->out, c->x, c->pos, c->N, c->NH, c->E, c->f);
    return project(c->out, c->R, c->N * c->NH * c->E);
}
/* Plain RoPE, and YaRN (factor 4 over an original context of 8: frequencies blended, cos and
 * sin scaled by 1 + 0.1 ln 4), whose backward is the scaled rotation's transpose. */
static void test_rope(void **state) {
    (void)state;
    long N = 6;
    int NH = 3, E = 8;
    int32_t pos[6] = {0, 1, 2, 0, 1, 17};
    long n = N * NH * E;
    ModelSpec yarn = {.head_dim = E,
                      .rope_theta = 10000.0,
                      .rope_scaling = {.type = ROPE_YARN,
                                       .factor = 4,
                                       .original_max_seq_len = 8,
                                       .beta_fast = 32,
                                       .beta_slow = 1,
                                       .truncate = 1}};
    RopeFreqs plain, scaled;
    rope_freqs_plain(&plain, 10000.0, E);
    rope_freqs(&scaled, &yarn);
    assert_true(fabsf(scaled.scale - (float)(1 + 0.1 * log(4.0))) < 1e-7f);
    for (int k = 0; k < 2; k++) {
        const RopeFreqs *f = k ? &scaled : &plain;
        RopeCtx c = {zeros(n), randn(n, 1.0f), randn(n, 1.0f), pos, N, NH, E, f};
        float *dx = zeros(n);
        rope_backward(dx, c.R, pos, N, NH, E, f);
        fd_check(k ? "rope (yarn) dx" : "rope dx", c.x, n, dx, rope_loss, &c, 1e-2f, 1000, TOL_OP);
        /* Position 0 only scales. */
        rope_forward(c.out, c.x, pos, N, NH, E, f);
        for (int j = 0; j < NH * E; j++)
            assert_true(c.out[j] == c.x[j] * f->scale);
        free(c.out), free(c.x), free(c.R), free(dx);
    }
}

/* ---- sdpa ---- */
typedef struct {
    float *out, *lse, *q, *k, *v, *R;
    int32_t *doc;
    int B, T, H, K, E;
} SdpaCtx;
static double sdpa_loss(void *p) {
    SdpaCtx *c = p;
    sdpa_forward(c->out, c->lse, c->q, c->k, c->v, c->doc, c->B, c->T, c->H, c->K, c->E);
    return project(c->out, c->R, (long)c->B * c->T * c->H * c->E);
}
static void sdpa_case(int H, int K, int with_doc) {
    int B = 2, T = 7, E = 4;
    int32_t doc[14] = {0, 0, 0, 1, 1, 2, 2, 5, 5, 5, 5, 5, 6, 6};
    long nq = (long)B * T * H * E, nk = (long)B * T * K * E;
    SdpaCtx c = {zeros(nq),
                 zeros((long)B * H * T),
                 randn(nq, 1.0f),
                 randn(nk, 1.0f),
                 randn(nk, 1.0f),
                 randn(nq, 1.0f),
                 with_doc ? doc : NULL,
                 B,
                 T,
                 H,
                 K,
                 E};
    float *dq = zeros(nq), *dk = zeros(nk), *dv = zeros(nk);
    sdpa_loss(&c);
    sdpa_backward(dq, dk, dv, c.R, c.q, c.k, c.v, c.out, c.lse, c.doc, B, T, H, K, E);
    char name[64];
    snprintf(name, sizeof name, "sdpa H%d K%d doc%d dq", H, K, with_doc);
    fd_check(name, c.q, nq, dq, sdpa_loss, &c, 1e-2f, 1000, TOL_OP);
    snprintf(name, sizeof name, "sdpa H%d K%d doc%d dk", H, K, with_doc);
    fd_check(name, c.k, nk, dk, sdpa_loss, &c, 1e-2f, 1000, TOL_OP);
    snprintf(name, sizeof name, "sdpa H%d K%d doc%d dv", H, K, with_doc);
    fd_check(name, c.v, nk, dv, sdpa_loss, &c, 1e-2f, 1000, TOL_OP);
    if (with_doc) {
        /* The first token of a document attends only itself: its output is its own v. */
        for (int h = 0; h < H; h++)
            for (int e = 0; e < E; e++)
                assert_float_equal(c.out[((long)3 * H + h) * E + e],
                                   c.v[((long)3 * K + h / (H / K)) * E + e], 1e-6);
    }
    free(c.out), free(c.lse), free(c.q), free(c.k), free(c.v), free(c.R);
    free(dq), free(dk), free(dv);
}
static void test_sdpa(void **state) {
    (void)state;
    sdpa_case(2, 2, 0);
    sdpa_case(4, 2, 0);
    sdpa_case(4, 1, 1);
    sdpa_case(3, 3, 1);
}

/* ---- swiglu ---- */
typedef struct {
    float *out, *h1, *h3, *g, *x, *w1, *w3, *w2, *R;
    long N;
    int D, F;
} SwiCtx;
static double swi_loss(void *p) {
    SwiCtx *c = p;
    swiglu_forward(c->out, c->h1, c->h3, c->g, c->x, c->w1, c->w3, c->w2, NULL, c->N, c->D, c->F);
    return project(c->out, c->R, c->N * c->D);
}
static void test_swiglu(void **state) {
    (void)state;
    long N = 5;
    int D = 6, F = 10;
    SwiCtx c = {zeros(N * D),
                zeros(N * F),
                zeros(N * F),
                zeros(N * F),
                randn(N * D, 1.0f),
                randn((long)F * D, 0.5f),
                randn((long)F * D, 0.5f),
                randn((long)D * F, 0.5f),
                randn(N * D, 1.0f),
                N,
                D,
                F};
    float *dx = zeros(N * D), *dw1 = zeros((long)F * D), *dw3 = zeros((long)F * D);
    float *dw2 = zeros((long)D * F), *dh1 = zeros(N * F), *dh3 = zeros(N * F);
    swi_loss(&c);
    swiglu_backward(dx, dw1, dw3, dw2, dh1, dh3, c.R, c.x, c.h1, c.h3, c.g, c.w1, c.w3, c.w2, NULL,
                    N, D, F);
    fd_check("swiglu dx", c.x, N * D, dx, swi_loss, &c, 1e-2f, 1000, TOL_OP);
    fd_check("swiglu dw1", c.w1, (long)F * D, dw1, swi_loss, &c, 1e-2f, 1000, TOL_OP);
    fd_check("swiglu dw3", c.w3, (long)F * D, dw3, swi_loss, &c, 1e-2f, 1000, TOL_OP);
    fd_check("swiglu dw2", c.w2, (long)D * F, dw2, swi_loss, &c, 1e-2f, 1000, TOL_OP);
    free(c.out), free(c.h1), free(c.h3), free(c.g), free(c.x), free(c.w1), free(c.w3);
    free(c.w2), free(c.R), free(dx), free(dw1), free(dw3), free(dw2), free(dh1), free(dh3);
}

/* ---- linear ---- */
typedef struct {
    float *out, *x, *w, *R;
    long N;
    int I, O;
} LinCtx;
static double lin_loss(void *p) {
    LinCtx *c = p;
    linear_forward(c->out, c->x, c->w, c->N, c->I, c->O);
    return project(c->out, c->R, c->N * c->O);
}
static void test_linear(void **state) {
    (void)state;
    long N = 4;
    int I = 7, O = 5;
    LinCtx c = {
        zeros(N * O), randn(N * I, 1.0f), randn((long)O * I, 1.0f), randn(N * O, 1.0f), N, I, O};
    float *dx = randn(N * I, 1.0f), *dw = zeros((long)O * I);
    linear_backward(dx, dw, c.R, c.x, c.w, N, I, O, 0.0f); /* dx_beta 0 overwrites */
    fd_check("linear dx", c.x, N * I, dx, lin_loss, &c, 1e-2f, 1000, TOL_OP);
    fd_check("linear dw", c.w, (long)O * I, dw, lin_loss, &c, 1e-2f, 1000, TOL_OP);
    /* dx_beta 1 adds: twice the gradient after a second call. */
    float *dx2 = malloc((size_t)N * I * sizeof(float)), *dw2 = zeros((long)O * I);
    memcpy(dx2, dx, (size_t)N * I * sizeof(float));
    linear_backward(dx2, dw2, c.R, c.x, c.w, N, I, O, 1.0f);
    for (long i = 0; i < N * I; i++)
        assert_float_equal(dx2[i], 2 * dx[i], 1e-5);
    free(c.out), free(c.x), free(c.w), free(c.R), free(dx), free(dw), free(dx2), free(dw2);
}

/* ---- cross-entropy ---- */
typedef struct {
    float *losses, *lse, *logits;
    int32_t *tgt;
    long N;
    int V;
    double scale;
} CeCtx;
static double ce_loss(void *p) {
    CeCtx *c = p;
    return cross_entropy_forward(c->losses, c->lse, c->logits, c->tgt, c->N, c->V) * c->scale;
}
static void test_cross_entropy(void **state) {
    (void)state;
    long N = 6;
    int V = 9;
    int32_t tgt[6] = {3, CE_IGNORE, 0, 8, CE_IGNORE, 3};
    CeCtx c = {zeros(N), zeros(N), randn(N * V, 2.0f), tgt, N, V, 1.0 / 3.0};
    double sum = cross_entropy_forward(c.losses, c.lse, c.logits, tgt, N, V);
    /* Independent value of one row's loss. */
    double z = 0.0;
    for (int j = 0; j < V; j++)
        z += exp(c.logits[j]);
    assert_float_equal(c.losses[0], log(z) - c.logits[3], 1e-5);
    assert_true(c.losses[1] == 0.0f);
    assert_true(sum > 0.0);
    float *d = zeros(N * V);
    cross_entropy_backward(d, c.logits, c.lse, tgt, N, V, (float)c.scale);
    fd_check("cross_entropy dlogits", c.logits, N * V, d, ce_loss, &c, 1e-2f, 1000, TOL_OP);
    for (int j = 0; j < V; j++)
        assert_true(d[1 * V + j] == 0.0f);
    /* In place gives the same numbers (the checks above left lse of a perturbed input). */
    cross_entropy_forward(c.losses, c.lse, c.logits, tgt, N, V);
    cross_entropy_backward(d, c.logits, c.lse, tgt, N, V, (float)c.scale);
    float *inplace = malloc((size_t)N * V * sizeof(float));
    memcpy(inplace, c.logits, (size_t)N * V * sizeof(float));
    cross_entropy_backward(inplace, inplace, c.lse, tgt, N, V, (float)c.scale);
    assert_memory_equal(inplace, d, (size_t)N * V * sizeof(float));
    free(c.losses), free(c.lse), free(c.logits), free(d), free(inplace);
}

/* ---- lm_head + loss ---- */
/* The model runs the reference as cross_entropy + linear itself, so the op kind's own
 * backward (the reference verify-kernels holds loss_chunked to) is checked here, and
 * loss_chunked with it on enough tokens for three chunks. */
typedef struct {
    const LmHeadLossOp *op;
    float *losses, *lse, *logits, *x, *w;
    int32_t *tgt;
    long N;
    int D, V;
    double scale;
} LmCtx;
static double lm_loss(void *p) {
    LmCtx *c = p;
    return c->op->forward(c->losses, c->lse, c->logits, c->x, c->w, NULL, NULL, c->tgt,
                          &linear_reference, c->N, c->D, c->V) *
           c->scale;
}
static void lm_head_loss_case(const LmHeadLossOp *op) {
    long N = 2 * LOSS_CHUNK + 5;
    int D = 6, V = 9;
    int32_t *tgt = malloc((size_t)N * sizeof(int32_t));
    for (long i = 0; i < N; i++)
        tgt[i] = i % 7 == 3 ? CE_IGNORE : (int32_t)((i * 5 + 1) % V);
    LmCtx c = {op,
               zeros(N),
               zeros(N),
               zeros(op->workspace_floats(N, D, V)),
               randn(N * D, 1.0f),
               randn((long)V * D, 0.5f),
               tgt,
               N,
               D,
               V,
               1.0 / 3.0};
    float *dx = randn(N * D, 1.0f), *dw = randn((long)V * D, 1.0f);
    float *dw0 = malloc((size_t)V * D * sizeof(float));
    memcpy(dw0, dw, (size_t)V * D * sizeof(float));
    lm_loss(&c);
    op->backward(dx, dw, c.logits, c.x, c.w, NULL, NULL, tgt, c.lse, &linear_reference, N, D, V,
                 (float)c.scale); /* dx written over the random start */
    for (long j = 0; j < (long)V * D; j++)
        dw[j] -= dw0[j]; /* dw accumulates onto what was there */
    char name[64];
    snprintf(name, sizeof name, "lm_head_loss %s dx", op->h.name);
    fd_check(name, c.x, N * D, dx, lm_loss, &c, 1e-2f, 1000, TOL_OP);
    snprintf(name, sizeof name, "lm_head_loss %s dw", op->h.name);
    fd_check(name, c.w, (long)V * D, dw, lm_loss, &c, 1e-2f, 1000, TOL_OP);
    if (op->forward_backward) {
        /* The fused path: the same loss and its gradients from one call. */
        float *fl = zeros(N), *flse = zeros(N), *fdx = randn(N * D, 1.0f),
              *fdw = zeros((long)V * D);
        double sum = op->forward_backward(fl, flse, fdx, fdw, c.logits, c.x, c.w, NULL, NULL, tgt,
                                          &linear_reference, N, D, V, (float)c.scale);
        assert_true(fabs(sum * c.scale - lm_loss(&c)) < 1e-5 * fabs(lm_loss(&c)));
        snprintf(name, sizeof name, "lm_head_loss %s fused dx", op->h.name);
        fd_check(name, c.x, N * D, fdx, lm_loss, &c, 1e-2f, 1000, TOL_OP);
        snprintf(name, sizeof name, "lm_head_loss %s fused dw", op->h.name);
        fd_check(name, c.w, (long)V * D, fdw, lm_loss, &c, 1e-2f, 1000, TOL_OP);
        free(fl), free(flse), free(fdx), free(fdw);
    }
    free(c.losses), free(c.lse), free(c.logits), free(c.x), free(c.w), free(tgt);
    free(dx), free(dw), free(dw0);
}
static void test_lm_head_loss(void **state) {
    (void)state;
    lm_head_loss_case(&lm_head_loss_reference);
    lm_head_loss_case(&loss_chunked);
}

/* ---- whole model ---- */
static ModelSpec tiny_spec(int tied) {
    return test_spec((TestShape){.D = 16,
                                 .L = 2,
                                 .H = 4,
                                 .K = 2,
                                 .E = 6,
                                 .F = 24,
                                 .V = 20,
                                 .T = 64,
                                 .rope_theta = 10000.0,
                                 .tied = tied});
}

typedef struct {
    Qwen3 *m;
    int32_t *tok, *tgt, *pos, *doc;
    int B, T;
} ModelCtx;
static double model_loss(void *p) {
    ModelCtx *c = p;
    qwen3_forward(c->m, c->tok, c->tgt, c->pos, c->doc, c->B, c->T);
    return c->m->loss_sum / c->m->n_valid;
}

static void test_model_gradcheck(void **state) {
    (void)state;
    for (int tied = 0; tied <= 1; tied++) {
        ModelSpec s = tiny_spec(tied);
        Qwen3 m;
        Err err;
        int B = 2, T = 6;
        assert_int_equal(qwen3_create(&m, &s, B, T, AC_NONE, &err), 0);
        qwen3_init_params(&m, 7);
        /* Larger weights than the 0.02 init, and norms away from 1, so every path matters. */
        for (int i = 0; i < m.nparams; i++) {
            Qwen3Param *p = &m.table[i];
            for (long j = 0; j < p->numel; j++)
                p->data[j] =
                    p->kind->role == ROLE_NORM ? 0.6f + rng_uniform(&rng) : 0.4f * rng_normal(&rng);
        }
        int32_t tok[12] = {1, 5, 19, 3, 3, 0, 7, 7, 2, 11, 4, 9};
        int32_t tgt[12] = {5, 19, 3, 3, 0, CE_IGNORE, 7, 2, 11, 4, 9, CE_IGNORE};
        int32_t pos[12] = {0, 1, 2, 0, 1, 2, 0, 1, 2, 3, 4, 5};
        int32_t doc[12] = {0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0};
        ModelCtx c = {&m, tok, tgt, pos, doc, B, T};
        qwen3_zero_grads(&m);
        model_loss(&c);
        qwen3_backward(&m, 0);
        const char *names[] = {"tok_embeddings.weight",
                               "layers.0.attention_norm.weight",
                               "layers.0.attention.wq.weight",
                               "layers.0.attention.wk.weight",
                               "layers.0.attention.wv.weight",
                               "layers.0.attention.wo.weight",
                               "layers.0.attention.q_norm.weight",
                               "layers.0.attention.k_norm.weight",
                               "layers.1.ffn_norm.weight",
                               "layers.1.feed_forward.w1.weight",
                               "layers.1.feed_forward.w2.weight",
                               "layers.1.feed_forward.w3.weight",
                               "norm.weight",
                               "output.weight"};
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            const Qwen3Param *p = qwen3_find_param(&m, names[i]);
            if (!p) {
                assert_true(tied && strcmp(names[i], "output.weight") == 0);
                continue;
            }
            char what[96];
            snprintf(what, sizeof what, "%s%s", tied ? "tied " : "", names[i]);
            fd_check(what, p->data, p->numel, p->grad, model_loss, &c, 1e-2f, 60, TOL_MODEL);
        }
        qwen3_free(&m);
    }
}

int main(void) {
    rng_seed(&rng, 1234, 0);
    /* Thousands of tiny forward passes: one thread avoids OpenMP barrier costs on a busy
     * machine; thread-count invariance is test_model's job. */
    omp_set_num_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_sdpa),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_lm_head_loss),
        cmocka_unit_test(test_model_gradcheck),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
