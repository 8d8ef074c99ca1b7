/* qwen3_sizes (what `qtitan plan` reports) equals the arenas qwen3_create really allocates for
 * every activation-checkpointing mode, tied or not; train_qwen3_sizes maps the trainer's flag
 * the same way train_qwen3_create does; the bf16 weight arena is sized as qwen3_enable_bf16
 * allocates it; AdamW's state arena is exactly twice the gradient arena (the plan counts it
 * so); and under sequence parallelism each layer keeps its residual stream for its tokens
 * only. */
/* cmocka.h needs these four first. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "model/qwen3.h"
#include "ops/gemm.h"
#include "spec_util.h"
#include "train/adamw.h"
#include "train/train_qwen3.h"

static ModelSpec spec(int tied, int layers) {
    return test_spec((TestShape){
        .D = 24, .L = layers, .H = 4, .K = 2, .E = 8, .F = 40, .V = 50, .T = 64, .tied = tied});
}

static void test_sizes_match_create(void **state) {
    (void)state;
    const AcMode modes[] = {AC_NONE, AC_FULL, AC_SELECTIVE, ac_every(2)};
    for (int tied = 0; tied < 2; tied++)
        for (int k = 0; k < 4; k++)
            for (int layers = 1; layers <= 3; layers += 2) {
                ModelSpec s = spec(tied, layers);
                Err err;
                Qwen3Sizes z;
                assert_int_equal(qwen3_sizes(&z, &s, 3, 7, modes[k], 1, NULL, &err), 0);
                Qwen3 m;
                assert_int_equal(qwen3_create(&m, &s, 3, 7, modes[k], &err), 0);
                assert_int_equal(z.param_bytes, m.param_arena.capacity);
                assert_int_equal(z.grad_bytes, m.grad_arena.capacity);
                assert_int_equal(z.act_bytes, m.act_arena.capacity);
                assert_int_equal(z.nparams, m.nparams);
                assert_int_equal(qwen3_enable_bf16(&m, &err), 0);
                assert_int_equal(z.bf16_bytes[gemm_bf16_widens()] +
                                     (m.bf16_packed ? z.bf16_pack_bytes : 0),
                                 m.bf16_arena.capacity);
                qwen3_free(&m);
            }
    /* MoE: two of three layers sparse (decoder_sparse_step 1, layer 1 dense). */
    for (int k = 0; k < 3; k++) {
        ModelSpec s = spec(0, 3);
        s.num_experts = 4;
        s.top_k = 2;
        s.moe_hidden_dim = 16;
        s.decoder_sparse_step = 1;
        s.mlp_only_layers[1] = 1;
        Err err;
        Qwen3Sizes z;
        assert_int_equal(qwen3_sizes(&z, &s, 2, 5, modes[k], 1, NULL, &err), 0);
        Qwen3 m;
        assert_int_equal(qwen3_create(&m, &s, 2, 5, modes[k], &err), 0);
        assert_int_equal(z.param_bytes, m.param_arena.capacity);
        assert_int_equal(z.grad_bytes, m.grad_arena.capacity);
        assert_int_equal(z.act_bytes, m.act_arena.capacity);
        assert_int_equal(qwen3_enable_bf16(&m, &err), 0);
        assert_int_equal(z.bf16_bytes[gemm_bf16_widens()] + (m.bf16_packed ? z.bf16_pack_bytes : 0),
                         m.bf16_arena.capacity);
        qwen3_free(&m);
    }
    /* Full checkpointing keeps less than none for more than one layer. */
    ModelSpec s = spec(0, 3);
    Err err;
    Qwen3Sizes none, full;
    assert_int_equal(qwen3_sizes(&none, &s, 3, 7, AC_NONE, 1, NULL, &err), 0);
    assert_int_equal(qwen3_sizes(&full, &s, 3, 7, AC_FULL, 1, NULL, &err), 0);
    assert_true(full.act_bytes < none.act_bytes);
}

static void test_bad_input(void **state) {
    (void)state;
    ModelSpec s = spec(0, 0);
    Err err;
    Qwen3Sizes z;
    assert_int_equal(qwen3_sizes(&z, &s, 1, 1, AC_NONE, 1, NULL, &err), -1);
    s = spec(0, 2);
    assert_int_equal(qwen3_sizes(&z, &s, 0, 1, AC_NONE, 1, NULL, &err), -1);
    s.num_experts = 4;
    assert_int_equal(qwen3_sizes(&z, &s, 1, 1, AC_NONE, 1, NULL, &err), -1);
}

static void test_trainer_and_adamw(void **state) {
    (void)state;
    for (int full = 0; full < 2; full++) {
        ModelSpec s = spec(1, 3);
        Err err;
        TrainQwen3Sizes z;
        assert_int_equal(train_qwen3_sizes(&z, &s, 2, 5, full ? AC_FULL : AC_NONE, 1, NULL, &err),
                         0);
        Qwen3Sizes ref;
        assert_int_equal(qwen3_sizes(&ref, &s, 2, 5, full ? AC_FULL : AC_NONE, 1, NULL, &err), 0);
        assert_int_equal(z.act_bytes, ref.act_bytes);
        TrainQwen3 *q =
            train_qwen3_create(&s, 2, 5, full ? AC_FULL : AC_NONE, NULL, NULL, 0, 0, &err);
        assert_non_null(q);
        TrainModel tm;
        train_qwen3_model(q, &tm, 0);
        AdamWParam *ap = calloc((size_t)tm.nparams, sizeof *ap);
        size_t bytes = 0;
        for (int i = 0; i < tm.nparams; i++) {
            size_t n = 1;
            for (int d = 0; d < tm.params[i].ndim; d++)
                n *= (size_t)tm.params[i].shape[d];
            ap[i] = (AdamWParam){tm.params[i].name, tm.params[i].data, tm.grads[i], n, 1};
            bytes += n * sizeof(float);
        }
        /* The parameter table covers the arena up to alignment padding. */
        assert_true(bytes <= z.param_bytes && z.param_bytes < bytes + 64 * (size_t)tm.nparams);
        AdamW opt;
        AdamWConfig cfg = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
        assert_int_equal(adamw_init(&opt, &cfg, ap, tm.nparams, &err), 0);
        assert_int_equal(opt.state.capacity, 2 * z.grad_bytes);
        adamw_free(&opt);
        free(ap);
        train_qwen3_free(q);
    }
}

/* Sequence parallel over 2 ranks: the sizes equal qwen3_create_unowned's activation arena,
 * and each layer keeps its residual-stream tensors (x, xn1, xmid, xn2 and the two rstd) for
 * half the tokens. N = 2 x 16 = 32 tokens, n = 16 per rank; D = 24, so every tensor is a
 * multiple of the arena's 64-byte alignment and the difference is exact. */
static void test_sequence_parallel(void **state) {
    (void)state;
    const AcMode modes[] = {AC_NONE, AC_FULL, AC_SELECTIVE};
    for (int k = 0; k < 3; k++) {
        ModelSpec s = spec(1, 3);
        Err err;
        Qwen3Sizes z;
        assert_int_equal(qwen3_sizes(&z, &s, 2, 16, modes[k], 2, NULL, &err), 0);
        Qwen3 m;
        assert_int_equal(qwen3_create_unowned(&m, &s, 2, 16, modes[k], 2, &err), 0);
        assert_int_equal(z.act_bytes, m.act_arena.capacity);
        assert_int_equal(m.sp, 2);
        qwen3_free(&m);
    }
    size_t per_layer[2]; /* sp = 1, 2 */
    for (int sp = 1; sp <= 2; sp++) {
        ModelSpec one = spec(1, 1), three = spec(1, 3);
        Err err;
        Qwen3Sizes a, b;
        assert_int_equal(qwen3_sizes(&a, &one, 2, 16, AC_NONE, sp, NULL, &err), 0);
        assert_int_equal(qwen3_sizes(&b, &three, 2, 16, AC_NONE, sp, NULL, &err), 0);
        per_layer[sp - 1] = (b.act_bytes - a.act_bytes) / 2;
    }
    size_t n = 16, D = 24;
    assert_int_equal(per_layer[0] - per_layer[1], sizeof(float) * (4 * n * D + 2 * n));
    /* Tokens that do not split, and MoE, are refused. */
    ModelSpec s = spec(0, 2);
    Err err;
    Qwen3Sizes z;
    assert_int_equal(qwen3_sizes(&z, &s, 1, 7, AC_NONE, 2, NULL, &err), -1);
    s.num_experts = 4, s.top_k = 2, s.moe_hidden_dim = 16, s.decoder_sparse_step = 1;
    assert_int_equal(qwen3_sizes(&z, &s, 2, 16, AC_NONE, 2, NULL, &err), -1);
    assert_non_null(strstr(err.msg, "sequence parallelism is for dense models"));
}

/* Layer-wise checkpointing of every 2nd of 5 layers: layers 0, 2 and 4 keep a set of
 * activations each and layers 1 and 3 share one, 4 sets in all, against 5 without
 * checkpointing and 1 under full: NONE - every2 = one set, every2 - FULL = three. */
static void test_layer_wise_memory(void **state) {
    (void)state;
    ModelSpec s = spec(0, 5);
    Err err;
    Qwen3Sizes none, full, every2;
    assert_int_equal(qwen3_sizes(&none, &s, 2, 16, AC_NONE, 1, NULL, &err), 0);
    assert_int_equal(qwen3_sizes(&full, &s, 2, 16, AC_FULL, 1, NULL, &err), 0);
    assert_int_equal(qwen3_sizes(&every2, &s, 2, 16, ac_every(2), 1, NULL, &err), 0);
    size_t set = none.act_bytes - every2.act_bytes;
    assert_true(set > 0);
    assert_int_equal(every2.act_bytes - full.act_bytes, 3 * set);
    assert_int_equal(ac_recomputed_layers(ac_every(2), 5), 1);
    assert_int_equal(ac_recomputed_layers(AC_FULL, 5), 4);
    assert_int_equal(ac_recomputed_layers(ac_every(3), 5), 0);
    assert_int_equal(ac_recomputed_layers(AC_SELECTIVE, 5), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes_match_create), cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_trainer_and_adamw),  cmocka_unit_test(test_sequence_parallel),
        cmocka_unit_test(test_layer_wise_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
