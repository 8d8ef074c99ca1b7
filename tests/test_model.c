/* Qwen3 model driver: activation checkpointing (full, selective, layer-wise) gives bit-identical
 * gradients,
 * results do not depend on the thread count, packed documents equal separate rows, init follows
 * the parameter table's rules, and every op call goes through the module instance's pointer. */
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

#include "model/qwen3.h"
#include "spec_util.h"

static ModelSpec spec(int tied) {
    return test_spec((TestShape){
        .D = 24, .L = 5, .H = 4, .K = 2, .E = 8, .F = 40, .V = 50, .T = 64, .tied = tied});
}

#define B_ 2
#define T_ 9
static int32_t tok[B_ * T_], tgt[B_ * T_], pos[B_ * T_], doc[B_ * T_];

static void make_batch(void) {
    for (int i = 0; i < B_ * T_; i++) {
        tok[i] = (i * 37 + 11) % 50;
        tgt[i] = (i * 17 + 3) % 50;
        /* Row 0 packs two documents (5 + 4 tokens); row 1 is one document. */
        int t = i % T_, row = i / T_;
        doc[i] = row == 0 && t >= 5 ? 1 : 0;
        pos[i] = row == 0 && t >= 5 ? t - 5 : t;
    }
    tgt[4] = CE_IGNORE;
    tgt[B_ * T_ - 1] = CE_IGNORE;
}

/* Builds, inits, runs forward + backward; returns the gradient arena copy. */
static float *run(AcMode ac, int tied, float *loss, size_t *nbytes) {
    ModelSpec s = spec(tied);
    Qwen3 m;
    Err err;
    assert_int_equal(qwen3_create(&m, &s, B_, T_, ac, &err), 0);
    qwen3_init_params(&m, 99);
    /* Scale up so the gradients are far from zero everywhere. */
    for (long i = 0; i < (long)(m.param_arena.used / sizeof(float)); i++)
        ((float *)m.param_arena.base)[i] *= 10.0f;
    *loss = qwen3_forward(&m, tok, tgt, pos, doc, B_, T_);
    qwen3_backward(&m, 0);
    *nbytes = m.grad_arena.used;
    float *g = malloc(*nbytes);
    memcpy(g, m.grad_arena.base, *nbytes);
    qwen3_free(&m);
    return g;
}

static void test_checkpointing_is_bit_identical(void **state) {
    (void)state;
    for (int tied = 0; tied <= 1; tied++) {
        float l0;
        size_t n0;
        float *g0 = run(AC_NONE, tied, &l0, &n0);
        /* Layer-wise over 5 layers: every 2nd checkpoints layers 1 and 3 (1 recomputed, 0, 2
         * and 4 keep everything); every 3rd layer 2 alone; every 6th none. */
        const AcMode modes[] = {AC_FULL, AC_SELECTIVE, ac_every(2), ac_every(3), ac_every(6)};
        for (int mi = 0; mi < 5; mi++) {
            float l;
            size_t n;
            float *g = run(modes[mi], tied, &l, &n);
            assert_true(l == l0);
            assert_true(n == n0);
            assert_memory_equal(g0, g, n0);
            free(g);
        }
        free(g0);
    }
}

static void test_thread_count_invariant(void **state) {
    (void)state;
    int keep = omp_get_max_threads();
    float l1, l2, l3;
    size_t n1, n2, n3;
    omp_set_num_threads(1);
    float *g1 = run(AC_NONE, 0, &l1, &n1);
    omp_set_num_threads(3);
    float *g2 = run(AC_NONE, 0, &l2, &n2);
    float *g3 = run(AC_NONE, 0, &l3, &n3);
    omp_set_num_threads(keep);
    assert_true(l1 == l2 && l2 == l3);
    assert_memory_equal(g1, g2, n1);
    assert_memory_equal(g2, g3, n1);
    free(g1);
    free(g2);
    free(g3);
}

/* Row 0 of the batch packs two documents; running them as separate rows must give the same
 * logits, since the mask and positions isolate them. */
static void test_packed_equals_separate(void **state) {
    (void)state;
    ModelSpec s = spec(0);
    Qwen3 m;
    Err err;
    assert_int_equal(qwen3_create(&m, &s, B_, T_, AC_NONE, &err), 0);
    qwen3_init_params(&m, 5);
    for (long i = 0; i < (long)(m.param_arena.used / sizeof(float)); i++)
        ((float *)m.param_arena.base)[i] *= 10.0f;
    long V = s.vocab_size;
    qwen3_forward(&m, tok, NULL, pos, doc, B_, T_);
    float *packed = malloc((size_t)T_ * V * sizeof(float));
    memcpy(packed, m.a.logits, (size_t)T_ * V * sizeof(float));
    /* Equal up to fp32 rounding: the GEMMs of a 9-row and a 5-row batch may sum in different
     * orders (dnnl_sgemm does), and the x10 weights make logits of tens of units and amplify
     * rounding layer by layer (measured: 1.1e-4 at max |logit| 35). */
    double big = 1.0;
    for (long i = 0; i < T_ * V; i++)
        big = fabs(packed[i]) > big ? fabs(packed[i]) : big;
    double tol = 1e-5 * big;
    /* Document 0 alone (5 tokens), then document 1 alone (4 tokens). */
    qwen3_forward(&m, tok, NULL, NULL, NULL, 1, 5);
    for (long i = 0; i < 5 * V; i++)
        assert_float_equal(m.a.logits[i], packed[i], tol);
    qwen3_forward(&m, tok + 5, NULL, NULL, NULL, 1, 4);
    for (long i = 0; i < 4 * V; i++)
        assert_float_equal(m.a.logits[i], packed[5 * V + i], tol);
    /* Without the mask the second document sees the first: logits differ. */
    qwen3_forward(&m, tok, NULL, pos, NULL, 1, T_);
    double diff = 0;
    for (long i = 5 * V; i < T_ * V; i++)
        diff += fabs(m.a.logits[i] - packed[i]);
    printf("max |logit| %.3f, tolerance %.2e, unmasked differs by %.3f in sum\n", big, tol, diff);
    assert_true(diff > 1e3 * tol);
    free(packed);
    qwen3_free(&m);
}

static void test_init_and_table(void **state) {
    (void)state;
    ModelSpec s = spec(1);
    Qwen3 m;
    Err err;
    assert_int_equal(qwen3_create(&m, &s, 1, 4, AC_NONE, &err), 0);
    /* tok_embeddings + 11 per layer + norm; no output.weight when tied. */
    assert_int_equal(m.nparams, 1 + 11 * s.n_layers + 1);
    assert_null(qwen3_find_param(&m, "output.weight"));
    assert_true(m.p.output == m.p.tok_embeddings && m.g.output == m.g.tok_embeddings);
    const Qwen3Param *wk = qwen3_find_param(&m, "layers.2.attention.wk.weight");
    assert_non_null(wk);
    assert_true(wk->shape[0] == s.n_kv_heads * s.head_dim && wk->shape[1] == s.dim);
    qwen3_init_params(&m, 3);
    float first = wk->data[0];
    double sq = 0;
    for (long i = 0; i < wk->numel; i++)
        sq += (double)wk->data[i] * wk->data[i];
    assert_true(fabs(sqrt(sq / wk->numel) - 0.02) < 0.004);
    const Qwen3Param *qn = qwen3_find_param(&m, "layers.0.attention.q_norm.weight");
    for (long i = 0; i < qn->numel; i++)
        assert_true(qn->data[i] == 1.0f);
    qwen3_init_params(&m, 3);
    assert_true(wk->data[0] == first);
    /* Loss at init is close to ln V. */
    int32_t t[4] = {1, 2, 3, 4}, y[4] = {2, 3, 4, CE_IGNORE};
    float loss = qwen3_forward(&m, t, y, NULL, NULL, 1, 4);
    assert_true(fabs(loss - log(50.0)) < 0.1);
    int32_t bad[3] = {0, CE_IGNORE, 50};
    assert_int_equal(qwen3_check_tokens(&m, bad, 2, 1, "targets", &err), 0);
    assert_int_equal(qwen3_check_tokens(&m, bad, 2, 0, "tokens", &err), -1);
    assert_non_null(strstr(err.msg, "tokens[1] = -100"));
    assert_int_equal(qwen3_check_tokens(&m, bad, 3, 1, "targets", &err), -1);
    assert_non_null(strstr(err.msg, "targets[2] = 50 is outside the vocabulary [0, 50)"));
    qwen3_free(&m);
}

/* A wrapper rmsnorm that counts its calls proves the model calls through the pointer. */
static int calls;
static void counting_forward(float *out, float *rstd, const float *x, const float *w, long R, int C,
                             float eps) {
    calls++;
    rmsnorm_forward(out, rstd, x, w, R, C, eps);
}
static const RmsnormOp counting_rmsnorm = {
    {"counting", OP_RMSNORM, "cpu", 0}, counting_forward, rmsnorm_backward, 0, 0};

static void test_module_slots(void **state) {
    (void)state;
    ModelSpec s = spec(0);
    Qwen3 m;
    Err err;
    assert_int_equal(qwen3_create(&m, &s, 1, 4, AC_NONE, &err), 0);
    assert_int_equal(m.nslots, 1 + 9 * s.n_layers + 3);
    const ModuleSlot *target = NULL, *sdpa = NULL;
    for (int i = 0; i < m.nslots; i++) {
        assert_string_equal(module_slot_get(&m.slots[i])->name, "reference");
        if (strcmp(m.slots[i].fqn, "layers.1.ffn_norm") == 0) target = &m.slots[i];
        if (strcmp(m.slots[i].fqn, "layers.2.attention.sdpa") == 0) sdpa = &m.slots[i];
    }
    assert_non_null(target);
    assert_non_null(sdpa);
    assert_int_equal(sdpa->kind, OP_SDPA);
    assert_int_equal(module_slot_set(sdpa, &counting_rmsnorm.h), -1); /* wrong kind */
    assert_int_equal(module_slot_set(target, &counting_rmsnorm.h), 0);
    assert_string_equal(module_slot_get(target)->name, "counting");
    int32_t t[4] = {1, 2, 3, 4};
    calls = 0;
    qwen3_forward(&m, t, NULL, NULL, NULL, 1, 4);
    assert_int_equal(calls, 1);
    qwen3_free(&m);
}

int main(void) {
    make_batch();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checkpointing_is_bit_identical),
        cmocka_unit_test(test_thread_count_invariant),
        cmocka_unit_test(test_packed_equals_separate),
        cmocka_unit_test(test_init_and_table),
        cmocka_unit_test(test_module_slots),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
