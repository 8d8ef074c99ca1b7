/* Gradient accumulation of the real model: backward adds into the parameter gradients, so a
 * batch run as two micro-batches (one backward each, both divided by the whole batch's count
 * of targets) gives the gradient of the batch run at once. Every other test runs one backward
 * after zeroing, which a backward that overwrote (=) instead of adding (+=) would also pass;
 * training with global_batch_size > local_batch_size would then silently drop all but the last
 * micro-batch. */
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
#include "model/qwen3.h"
#include "spec_util.h"

enum { B = 2, T = 6 };

/* Variant 0: untied dense, 1: tied dense, 2: MoE (top-2 of 4 experts, layer 1 dense, no
 * auxiliary loss, which is a function of the whole batch and would not split). */
static ModelSpec tiny_spec(int variant) {
    ModelSpec s = test_spec((TestShape){.D = 16,
                                        .L = 2,
                                        .H = 4,
                                        .K = 2,
                                        .E = 6,
                                        .F = 24,
                                        .V = 20,
                                        .T = 64,
                                        .rope_theta = 10000.0,
                                        .tied = variant == 1});
    if (variant == 2) {
        test_spec_moe(&s, 4, 2, 8);
        s.mlp_only_layers[1] = 1;
    }
    return s;
}

/* Row 0 packs two documents; row 1 is one document with an ignored last target. */
static const int32_t tok[B * T] = {1, 5, 19, 3, 3, 0, 7, 7, 2, 11, 4, 9};
static const int32_t tgt[B * T] = {5, 19, 3, 3, 0, 4, 7, 2, 11, 4, 9, CE_IGNORE};
static const int32_t pos[B * T] = {0, 1, 2, 0, 1, 2, 0, 1, 2, 3, 4, 5};
static const int32_t doc[B * T] = {0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0};

static float *grads_copy(const Qwen3 *m) {
    float *g = malloc(m->grad_arena.used);
    memcpy(g, m->grad_arena.base, m->grad_arena.used);
    return g;
}

/* Largest per-parameter relative L2 difference between two gradient arenas of m's layout.
 * A zero reference gradient proves nothing: dense models have none; in the MoE model only an
 * expert no token chose may, and its result must be zero too. */
static double worst_rel(const Qwen3 *m, const float *want, const float *got, double scale) {
    const float *base = (const float *)m->grad_arena.base;
    double worst = 0;
    for (int i = 0; i < m->nparams; i++) {
        const Qwen3Param *p = &m->table[i];
        if (p->kind->role == ROLE_BUFFER) continue;
        long off = p->grad - base;
        double d2 = 0, w2 = 0;
        for (long j = 0; j < p->numel; j++) {
            double w = scale * want[off + j], d = got[off + j] - w;
            d2 += d * d;
            w2 += w * w;
        }
        if (w2 == 0 && d2 == 0 && m->spec.num_experts > 0 && p->kind->role == ROLE_EXPERTS)
            continue;
        if (!(w2 > 0)) fail_msg("%s: zero gradient", p->name);
        double rel = sqrt(d2 / w2);
        if (isnan(rel) || rel > worst) worst = rel; /* a NaN sticks as the worst, and fails */
    }
    return worst;
}

static void test_micro_batches_add_up(void **state) {
    (void)state;
    static const char *const names[] = {"untied", "tied", "moe"};
    for (int variant = 0; variant < 3; variant++) {
        ModelSpec s = tiny_spec(variant);
        Qwen3 m;
        Err err;
        assert_int_equal(qwen3_create(&m, &s, B, T, AC_NONE, &err), 0);
        qwen3_init_params(&m, 7);
        /* Weights well above the 0.02 init so every path carries gradient. */
        Rng r;
        rng_seed(&r, 3, 0);
        for (int i = 0; i < m.nparams; i++) {
            Qwen3Param *p = &m.table[i];
            if (p->kind->role == ROLE_BUFFER) continue;
            for (long j = 0; j < p->numel; j++)
                p->data[j] =
                    p->kind->role == ROLE_NORM ? 0.6f + rng_uniform(&r) : 0.4f * rng_normal(&r);
        }
        /* The whole batch at once. */
        qwen3_zero_grads(&m);
        qwen3_forward(&m, tok, tgt, pos, doc, B, T);
        long n_valid = m.n_valid;
        assert_int_equal(n_valid, B * T - 1);
        qwen3_backward(&m, (double)n_valid);
        float *whole = grads_copy(&m);

        /* Two micro-batches of one row each, accumulated. */
        qwen3_zero_grads(&m);
        for (int row = 0; row < B; row++) {
            long o = (long)row * T;
            qwen3_forward(&m, tok + o, tgt + o, pos + o, doc + o, 1, T);
            qwen3_backward(&m, (double)n_valid);
        }
        float *micro = grads_copy(&m);
        double rel = worst_rel(&m, whole, micro, 1.0);
        printf("%s: two micro-batches vs whole batch, worst relative L2 %.2e\n", names[variant],
               rel);
        assert_true(rel < 1e-5);

        /* The same batch twice without zeroing: twice the gradient. */
        qwen3_zero_grads(&m);
        for (int k = 0; k < 2; k++) {
            qwen3_forward(&m, tok, tgt, pos, doc, B, T);
            qwen3_backward(&m, (double)n_valid);
        }
        float *twice = grads_copy(&m);
        rel = worst_rel(&m, whole, twice, 2.0);
        printf("%s: two backwards vs 2 x one, worst relative L2 %.2e\n", names[variant], rel);
        assert_true(rel < 1e-5);
        free(whole);
        free(micro);
        free(twice);
        qwen3_free(&m);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_micro_batches_add_up),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
