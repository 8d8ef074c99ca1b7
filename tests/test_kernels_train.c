/* Training with overrides: 20 SGD steps of a tiny Qwen3 with every kernel of the library
 * swapped in (flash, rope_nogather, swiglu_fused, rmsnorm_fused on every norm, loss_chunked)
 * give the same losses as the references within the kernels' tolerances, the parameter
 * table (checkpoint / export keys) is the same, and the activation arena is smaller because
 * the chunked loss keeps no (N, V) logits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "kernels/kernels.h"
#include "model/overrides.h"
#include "model/qwen3.h"
#include "spec_util.h"

#define B_ 5
#define T_ 64 /* flash tile; B_ * T_ = 320 tokens cross one loss chunk */

static ModelSpec tiny(void) {
    return test_spec(
        (TestShape){.D = 32, .L = 2, .H = 4, .K = 2, .E = 8, .F = 48, .V = 97, .T = 128});
}

/* A plan choosing impl for every instance whose FQN contains `part` and whose kind matches. */
static void choose(OverridePlan *plan, const ModuleSlot *slots, int n, const char *part,
                   const OpHeader *impl) {
    for (int i = 0; i < n; i++) {
        if (slots[i].kind != impl->kind || !strstr(slots[i].fqn, part)) continue;
        OverrideChoice *c = &plan->choices[plan->n++];
        c->slot = i;
        snprintf(c->fqn, sizeof c->fqn, "%s", slots[i].fqn);
        c->impl = impl;
    }
}

static void train(Qwen3 *m, float *losses, int steps) {
    Rng r;
    rng_seed(&r, 42, 0);
    int32_t tok[B_ * T_], tgt[B_ * T_];
    for (int s = 0; s < steps; s++) {
        for (int i = 0; i < B_ * T_; i++) { /* a learnable pattern plus noise */
            tok[i] = (int32_t)((i * 7 + (int)rng_below(&r, 3)) % m->spec.vocab_size);
            tgt[i] = (tok[i] * 5 + 1) % m->spec.vocab_size;
        }
        tgt[3] = CE_IGNORE;
        qwen3_zero_grads(m);
        losses[s] = qwen3_forward(m, tok, tgt, NULL, NULL, B_, T_);
        qwen3_backward(m, 0);
        for (int p = 0; p < m->nparams; p++) {
            Qwen3Param *q = &m->table[p];
            for (long j = 0; j < q->numel; j++)
                q->data[j] -= 0.5f * q->grad[j];
        }
    }
}

static void test_train_with_overrides(void **state) {
    (void)state;
    ModelSpec s = tiny();
    Err err;
    ModuleSlot *slots;
    int n = overrides_tree(&s, &slots);
    OverridePlan plan = {.spec = s, .device = "cpu"};
    OverrideChoice choices[64];
    plan.choices = choices;
    choose(&plan, slots, n, "sdpa", &sdpa_flash.h);
    choose(&plan, slots, n, "rope", &rope_nogather.h);
    choose(&plan, slots, n, "feed_forward", &swiglu_fused.h);
    choose(&plan, slots, n, "norm", &rmsnorm_fused.h);
    choose(&plan, slots, n, "loss", &loss_chunked.h);
    free(slots);
    assert_int_equal(plan.n, 2 + 2 + 2 + 4 * 2 + 1 + 1);

    Qwen3Modules mod;
    assert_int_equal(overrides_apply(&plan, &mod), plan.n);
    assert_ptr_equal(mod.layers[1].sdpa, &sdpa_flash);
    assert_ptr_equal(mod.loss, &loss_chunked);

    Qwen3 ref, ker;
    assert_int_equal(qwen3_create(&ref, &s, B_, T_, AC_NONE, &err), 0);
    assert_int_equal(qwen3_create_with(&ker, &s, B_, T_, AC_NONE, &mod, &err), 0);
    /* Same parameter table, so the same checkpoint and export keys. */
    assert_int_equal(ref.nparams, ker.nparams);
    for (int i = 0; i < ref.nparams; i++) {
        assert_string_equal(ref.table[i].name, ker.table[i].name);
        assert_int_equal(ref.table[i].numel, ker.table[i].numel);
    }
    /* The chunked loss sizes its workspace instead of N x V logits: LOSS_CHUNK x V logits, or
     * on an AMX CPU its panels' buffers, which at this 97-token vocabulary hold more than the
     * logits (at real vocabularies a small fraction). */
    long saved = ((long)B_ * T_ * s.vocab_size -
                  loss_chunked.workspace_floats(B_ * T_, s.dim, s.vocab_size)) *
                 (long)sizeof(float);
    assert_true((long)ref.act_arena.capacity - (long)ker.act_arena.capacity >= saved - 4096);

    qwen3_init_params(&ref, 7);
    qwen3_init_params(&ker, 7);
    float lr[20], lk[20];
    train(&ref, lr, 20);
    train(&ker, lk, 20);
    for (int i = 0; i < 20; i++) {
        if (!(fabsf(lr[i] - lk[i]) <= 1e-4f * fabsf(lr[i]) + 1e-5f)) /* a NaN fails too */
            fail_msg("step %d: loss %.7f with references, %.7f with overrides", i + 1, lr[i],
                     lk[i]);
    }
    assert_true(lr[19] < lr[0] - 0.1f); /* it trained */
    qwen3_free(&ref);
    qwen3_free(&ker);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_train_with_overrides),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
