/* Unit tests for the native flavor table, field replacement and validation of ModelSpec. The
 * expected numbers are typed in from the published Qwen/Qwen3-* config.json files,
 * not taken from model_spec.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <string.h>

#include "core/model_spec.h"

typedef struct Published {
    const char *flavor;
    int dim, layers, heads, kv, ffn, moe_ffn, experts, top_k, tied, vocab, max_pos;
} Published;

static const Published PUBLISHED[] = {
    {"debugmodel", 256, 8, 16, 8, 3072, 0, 0, 0, 1, 2048, 4096},
    {"debugmodel_moe", 256, 8, 16, 8, 3072, 768, 64, 8, 0, 2048, 4096},
    {"0.6B", 1024, 28, 16, 8, 3072, 0, 0, 0, 1, 151936, 40960},
    {"1.7B", 2048, 28, 16, 8, 6144, 0, 0, 0, 1, 151936, 40960},
    {"4B", 2560, 36, 32, 8, 9728, 0, 0, 0, 1, 151936, 40960},
    {"8B", 4096, 36, 32, 8, 12288, 0, 0, 0, 0, 151936, 40960},
    {"14B", 5120, 40, 40, 8, 17408, 0, 0, 0, 0, 151936, 40960},
    {"32B", 5120, 64, 64, 8, 25600, 0, 0, 0, 0, 151936, 40960},
    {"30B-A3B", 2048, 48, 32, 4, 6144, 768, 128, 8, 0, 151936, 40960},
    {"235B-A22B", 4096, 94, 64, 4, 12288, 1536, 128, 8, 0, 151936, 40960},
};

static void test_flavors(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof PUBLISHED / sizeof PUBLISHED[0]; i++) {
        const Published *p = &PUBLISHED[i];
        ModelSpec s;
        Err err = {{0}};
        assert_int_equal(model_spec_flavor(&s, p->flavor, &err), 0);
        assert_string_equal(s.flavor, p->flavor);
        assert_int_equal(s.dim, p->dim);
        assert_int_equal(s.n_layers, p->layers);
        assert_int_equal(s.n_heads, p->heads);
        assert_int_equal(s.n_kv_heads, p->kv);
        assert_int_equal(s.head_dim, 128);
        assert_int_equal(s.hidden_dim, p->ffn);
        assert_int_equal(s.vocab_size, p->vocab);
        assert_int_equal(s.max_seq_len, p->max_pos);
        assert_int_equal(s.tie_embeddings, p->tied);
        assert_int_equal(s.num_experts, p->experts);
        assert_true(s.norm_eps == 1e-6);
        assert_true(s.rope_theta == 1e6);
        if (p->experts) {
            assert_int_equal(s.top_k, p->top_k);
            assert_int_equal(s.moe_hidden_dim, p->moe_ffn);
            assert_int_equal(s.norm_topk_prob, 1);
            assert_int_equal(s.decoder_sparse_step, 1);
            assert_true(s.load_balance_coeff == 1e-3);
            assert_true(s.router_aux_loss_coef == 0.0);
        }
        for (int l = 0; l < s.n_layers; l++)
            assert_int_equal(model_spec_layer_is_moe(&s, l), p->experts > 0);
        assert_int_equal(model_spec_validate(&s, &err), 0);
    }
}

static void test_unknown_flavor(void **state) {
    (void)state;
    ModelSpec s;
    Err err = {{0}};
    assert_int_equal(model_spec_flavor(&s, "0.6b", &err), -1);
    assert_non_null(strstr(err.msg, "unknown model flavor \"0.6b\"; did you mean \"0.6B\"?"));
    assert_non_null(strstr(err.msg, "\"235B-A22B\""));
    assert_int_equal(model_spec_flavor(&s, "zzzzzzzzzzzzzz", &err), -1);
    assert_non_null(strstr(err.msg, "expected one of \"debugmodel\""));
}

static void test_set_field(void **state) {
    (void)state;
    ModelSpec s;
    Err err = {{0}};
    assert_int_equal(model_spec_flavor(&s, "debugmodel", &err), 0);
    assert_int_equal(model_spec_set_field(&s, "n_layers", "2", &err), 0);
    assert_int_equal(s.n_layers, 2);
    assert_int_equal(model_spec_set_field(&s, "rope_theta", "10000.0", &err), 0);
    assert_true(s.rope_theta == 10000.0);
    assert_int_equal(model_spec_set_field(&s, "norm_eps", "1e-5", &err), 0);
    assert_true(s.norm_eps == 1e-5);
    assert_int_equal(model_spec_set_field(&s, "tie_embeddings", "false", &err), 0);
    assert_int_equal(s.tie_embeddings, 0);
    assert_int_equal(model_spec_set_field(&s, "num_experts", "4", &err), 0);
    assert_int_equal(model_spec_set_field(&s, "top_k", "2", &err), 0);
    assert_int_equal(model_spec_set_field(&s, "norm_topk_prob", "true", &err), 0);
    assert_int_equal(s.norm_topk_prob, 1);
    assert_int_equal(model_spec_set_field(&s, "n_layer", "2", &err), -1);
    assert_string_equal(err.msg, "unknown model field \"n_layer\"; did you mean \"n_layers\"?");
    assert_int_equal(model_spec_set_field(&s, "dim", "12x", &err), -1);
    assert_non_null(strstr(err.msg, "dim = \"12x\" is not an integer"));
    assert_int_equal(model_spec_set_field(&s, "dim", "1.5", &err), -1);
    assert_int_equal(model_spec_set_field(&s, "dim", "99999999999", &err), -1);
    assert_int_equal(model_spec_set_field(&s, "dim", "", &err), -1);
    assert_int_equal(model_spec_set_field(&s, "norm_eps", "small", &err), -1);
    assert_non_null(strstr(err.msg, "norm_eps = \"small\" is not a finite number"));
    assert_int_equal(model_spec_set_field(&s, "norm_eps", "inf", &err), -1);
    assert_int_equal(model_spec_set_field(&s, "tie_embeddings", "yes", &err), -1);
    assert_non_null(strstr(err.msg, "is not a boolean"));
    /* RoPE scaling: a string field and its numbers; the native flavors start with YaRN's
     * defaults ready (beta_fast 32, beta_slow 1, truncate). */
    assert_true(s.rope_scaling.type == ROPE_PLAIN && s.rope_scaling.beta_fast == 32 &&
                s.rope_scaling.beta_slow == 1 && s.rope_scaling.truncate == 1);
    assert_true(model_spec_field_is_string("rope_scaling") && !model_spec_field_is_string("dim"));
    assert_int_equal(model_spec_set_field(&s, "rope_scaling", "yarn", &err), 0);
    assert_int_equal(s.rope_scaling.type, ROPE_YARN);
    assert_int_equal(model_spec_set_field(&s, "rope_factor", "4", &err), 0);
    assert_int_equal(model_spec_set_field(&s, "rope_original_max_seq_len", "32768", &err), 0);
    assert_true(s.rope_scaling.factor == 4 && s.rope_scaling.original_max_seq_len == 32768);
    assert_int_equal(model_spec_set_field(&s, "rope_scaling", "dynamic", &err), -1);
    assert_string_equal(err.msg, "model field rope_scaling = \"dynamic\" is not one of \"none\", "
                                 "\"linear\", \"yarn\"");
    /* Every listed field name is settable. */
    for (int i = 0; i < MODEL_SPEC_NFIELDS; i++) {
        const char *name = model_spec_field_name(i);
        assert_int_equal(
            model_spec_set_field(&s, name, model_spec_field_is_string(name) ? "none" : "1", &err),
            0);
    }
}

static void expect_invalid(const ModelSpec *s, const char *frag) {
    Err err = {{0}};
    assert_int_equal(model_spec_validate(s, &err), -1);
    if (!strstr(err.msg, frag)) fail_msg("error '%s' lacks '%s'", err.msg, frag);
}

static void test_validate(void **state) {
    (void)state;
    ModelSpec base, s;
    Err err = {{0}};
    assert_int_equal(model_spec_flavor(&base, "debugmodel_moe", &err), 0);
    s = base;
    s.n_kv_heads = 6;
    expect_invalid(&s, "n_heads = 16 is not a multiple of n_kv_heads = 6");
    s = base;
    s.dim = 0;
    expect_invalid(&s, "model dim = 0 is out of range");
    s = base;
    s.n_layers = QT_MAX_LAYERS + 1;
    expect_invalid(&s, "n_layers = 257");
    s = base;
    s.top_k = 65;
    expect_invalid(&s, "top_k = 65 is out of range");
    s = base;
    s.top_k = 0;
    expect_invalid(&s, "top_k = 0");
    s = base;
    s.norm_eps = 0;
    expect_invalid(&s, "norm_eps");
    s = base;
    s.head_dim = 7;
    expect_invalid(&s, "head_dim = 7 must be even");
    s = base;
    s.moe_hidden_dim = -1;
    expect_invalid(&s, "moe_hidden_dim = -1");
    s = base;
    s.num_experts = -3;
    expect_invalid(&s, "num_experts = -3");
    s = base;
    s.vocab_size = 0;
    expect_invalid(&s, "vocab_size = 0");
    s = base;
    s.load_balance_coeff = -1;
    expect_invalid(&s, "load_balance_coeff");
    /* RoPE scaling: a factor, and for YaRN the original context and positive ramp bounds. */
    s = base;
    s.rope_scaling.type = ROPE_LINEAR;
    expect_invalid(&s, "rope_factor = 0 must be a finite number > 0 (rope_scaling linear)");
    s.rope_scaling.factor = 2;
    assert_int_equal(model_spec_validate(&s, &err), 0);
    s.rope_scaling.type = ROPE_YARN;
    expect_invalid(&s, "rope_original_max_seq_len = 0: rope_scaling yarn needs the context");
    s.rope_scaling.original_max_seq_len = 4096;
    assert_int_equal(model_spec_validate(&s, &err), 0);
    s.rope_scaling.beta_slow = 0;
    expect_invalid(&s, "rope_beta_slow = 0 must be");
    s.rope_scaling.beta_slow = 1;
    s.rope_scaling.attention_factor = -1;
    expect_invalid(&s, "rope_attention_factor = -1");
    /* A dense FFN size is needed only when some layer is dense. */
    s = base;
    s.hidden_dim = 0;
    assert_int_equal(model_spec_validate(&s, &err), 0);
    s.mlp_only_layers[3] = 1;
    expect_invalid(&s, "hidden_dim = 0");
}

static void test_layer_is_moe(void **state) {
    (void)state;
    ModelSpec s;
    Err err = {{0}};
    assert_int_equal(model_spec_flavor(&s, "debugmodel_moe", &err), 0);
    /* HF: layer i is sparse when not in mlp_only_layers and (i + 1) % step == 0. */
    s.decoder_sparse_step = 2;
    s.mlp_only_layers[5] = 1;
    const int want[8] = {0, 1, 0, 1, 0, 0, 0, 1};
    for (int l = 0; l < 8; l++)
        assert_int_equal(model_spec_layer_is_moe(&s, l), want[l]);
    assert_int_equal(model_spec_layer_is_moe(&s, -1), 0);
    assert_int_equal(model_spec_layer_is_moe(&s, QT_MAX_LAYERS), 0);
    s.num_experts = 0;
    assert_int_equal(model_spec_layer_is_moe(&s, 1), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flavors),      cmocka_unit_test(test_unknown_flavor),
        cmocka_unit_test(test_set_field),    cmocka_unit_test(test_validate),
        cmocka_unit_test(test_layer_is_moe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
