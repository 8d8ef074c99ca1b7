/* Unit tests for src/core/param_table: every row placed in a model with dense and MoE layers
 * (shapes against sizes typed in by hand from the letters), name lookups (exact names only),
 * tensor-parallel splits and weight-decay groups. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka.h needs the four headers above first. */
#include <cmocka.h>

#include <string.h>

#include "core/param_table.h"
#include "spec_util.h"

/* D 24, H 4, K 2, E 6, F 40, V 50, X 3, Fm 10: every letter a different size. Four layers,
 * MoE every second one (1 and 3), with expert_bias. */
static ModelSpec spec(void) {
    ModelSpec s = test_spec((TestShape){.D = 24, .L = 4, .H = 4, .K = 2, .E = 6, .F = 40, .V = 50});
    test_spec_moe(&s, 3, 2, 10);
    s.decoder_sparse_step = 2;
    s.load_balance_coeff = 1e-3;
    return s;
}

static const ParamInfo *find(const ParamInfo *ps, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(ps[i].name, name) == 0) return &ps[i];
    return NULL;
}

static void expect(const ParamInfo *ps, int n, const char *name, int ndim, int64_t a, int64_t b,
                   int64_t c) {
    const ParamInfo *p = find(ps, n, name);
    if (!p) fail_msg("no parameter %s", name);
    assert_int_equal(p->ndim, ndim);
    assert_int_equal(p->shape[0], a);
    assert_int_equal(p->shape[1], b);
    assert_int_equal(p->shape[2], c);
    assert_int_equal(p->numel, a * (b ? b : 1) * (c ? c : 1));
}

static void test_every_row_placed(void **state) {
    (void)state;
    ModelSpec s = spec();
    ParamInfo ps[64];
    int n = param_list(&s, NULL);
    /* tok_embeddings, 4 x 8 attention side, 2 dense x 3, 2 MoE x 5, norm, output */
    assert_int_equal(n, 1 + 4 * 8 + 2 * 3 + 2 * 5 + 1 + 1);
    assert_int_equal(param_list(&s, ps), n);
    expect(ps, n, "tok_embeddings.weight", 2, 50, 24, 0);
    expect(ps, n, "layers.0.attention_norm.weight", 1, 24, 0, 0);
    expect(ps, n, "layers.0.attention.wq.weight", 2, 24, 24, 0);
    expect(ps, n, "layers.0.attention.wk.weight", 2, 12, 24, 0);
    expect(ps, n, "layers.0.attention.wv.weight", 2, 12, 24, 0);
    expect(ps, n, "layers.0.attention.wo.weight", 2, 24, 24, 0);
    expect(ps, n, "layers.0.attention.q_norm.weight", 1, 6, 0, 0);
    expect(ps, n, "layers.0.attention.k_norm.weight", 1, 6, 0, 0);
    expect(ps, n, "layers.0.ffn_norm.weight", 1, 24, 0, 0);
    expect(ps, n, "layers.0.feed_forward.w1.weight", 2, 40, 24, 0);
    expect(ps, n, "layers.0.feed_forward.w3.weight", 2, 40, 24, 0);
    expect(ps, n, "layers.2.feed_forward.w2.weight", 2, 24, 40, 0);
    expect(ps, n, "layers.1.moe.router.gate.weight", 2, 3, 24, 0);
    expect(ps, n, "layers.1.moe.experts.w1", 3, 3, 10, 24);
    expect(ps, n, "layers.3.moe.experts.w2", 3, 3, 24, 10);
    expect(ps, n, "layers.3.moe.experts.w3", 3, 3, 10, 24);
    expect(ps, n, "layers.3.moe.expert_bias", 1, 3, 0, 0);
    expect(ps, n, "norm.weight", 1, 24, 0, 0);
    expect(ps, n, "output.weight", 2, 50, 24, 0);
    assert_null(find(ps, n, "layers.1.feed_forward.w1.weight"));
    assert_null(find(ps, n, "layers.0.moe.experts.w1"));
    /* Model order: the embedding first, a layer's parameters in row order, output last. */
    assert_string_equal(ps[0].name, "tok_embeddings.weight");
    assert_string_equal(ps[5].name, "layers.0.attention.wo.weight");
    assert_string_equal(ps[n - 1].name, "output.weight");
    for (int i = 0; i < n; i++) {
        int layer = -2;
        assert_ptr_equal(param_kind_of_name(ps[i].name, &layer), ps[i].kind);
        assert_int_equal(layer, ps[i].layer);
    }
    s.tie_embeddings = 1;
    s.load_balance_coeff = 0;
    n = param_list(&s, ps);
    assert_int_equal(n, 1 + 4 * 8 + 2 * 3 + 2 * 4 + 1);
    assert_null(find(ps, n, "output.weight"));
    assert_null(find(ps, n, "layers.1.moe.expert_bias"));
}

static void test_names_are_exact(void **state) {
    (void)state;
    static const char *const bad[] = {"layers.03.ffn_norm.weight",
                                      "layers.+3.ffn_norm.weight",
                                      "layers.3.ffn_norm",
                                      "layers.3.norm.weight",
                                      "layers.x.attention.wq.weight",
                                      "layers.999.ffn_norm.weight",
                                      "norm",
                                      "model.norm.weight",
                                      "xlayers.0.ffn_norm.weight",
                                      ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (param_kind_of_name(bad[i], NULL)) fail_msg("\"%s\" matched a row", bad[i]);
    int layer = 0;
    assert_int_equal(param_kind_of_name("norm.weight", &layer)->id, PK_NORM);
    assert_int_equal(layer, -1);
    assert_int_equal(param_kind_of_name("layers.12.moe.experts.w2", &layer)->id, PK_EXPERTS_W2);
    assert_int_equal(layer, 12);
}

static void test_splits_and_decay(void **state) {
    (void)state;
    static const char *const rows[] = {
        "layers.0.attention.wq.weight", "layers.1.attention.wk.weight",
        "layers.2.attention.wv.weight", "layers.3.feed_forward.w1.weight",
        "layers.4.feed_forward.w3.weight"};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        assert_int_equal(tp_split_of(rows[i]), TP_ROWS);
    assert_int_equal(tp_split_of("layers.0.attention.wo.weight"), TP_COLS);
    assert_int_equal(tp_split_of("layers.0.feed_forward.w2.weight"), TP_COLS);
    assert_int_equal(tp_split_of("layers.0.moe.experts.w2"), TP_REPLICATED);
    assert_int_equal(tp_split_of("layers.0.attention.q_norm.weight"), TP_REPLICATED);
    assert_int_equal(tp_split_of("output.weight"), TP_REPLICATED);
    assert_int_equal(tp_split_of("not.a.parameter"), TP_REPLICATED);
    for (int norms = 0; norms < 2; norms++)
        for (int emb = 0; emb < 2; emb++) {
            assert_int_equal(param_decays(&PARAM_KINDS[PK_WQ], norms, emb), 1);
            assert_int_equal(param_decays(&PARAM_KINDS[PK_OUTPUT], norms, emb), 1);
            assert_int_equal(param_decays(&PARAM_KINDS[PK_Q_NORM], norms, emb), !norms);
            assert_int_equal(param_decays(&PARAM_KINDS[PK_NORM], norms, emb), !norms);
            assert_int_equal(param_decays(&PARAM_KINDS[PK_TOK_EMBEDDINGS], norms, emb), !emb);
            assert_int_equal(param_decays(&PARAM_KINDS[PK_EXPERT_BIAS], norms, emb), 0);
        }
    for (int k = 0; k < PK_COUNT; k++)
        assert_int_equal(PARAM_KINDS[k].id, k); /* rows are indexed by their kind */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_row_placed),
        cmocka_unit_test(test_names_are_exact),
        cmocka_unit_test(test_splits_and_decay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
