/* The one builder of the small ModelSpecs unit tests run: shapes in the spec's letters, the
 * rest as the native flavors have it (norm_eps 1e-6, rope_theta 1e6 unless given), flavor
 * "test". MoE tests add their experts with test_spec_moe. */
#ifndef QT_TEST_SPEC_UTIL_H
#define QT_TEST_SPEC_UTIL_H

#include <stdio.h>
#include <string.h>

#include "core/model_spec.h"

typedef struct TestShape {
    int D, L, H, K, E, F, V; /* dim, layers, heads, kv heads, head dim, dense ffn dim, vocab */
    int T;                   /* max_seq_len */
    double rope_theta;       /* 0: 1e6 */
    int tied;                /* tie_embeddings */
} TestShape;

static inline ModelSpec test_spec(TestShape t) {
    ModelSpec s;
    memset(&s, 0, sizeof s);
    snprintf(s.flavor, sizeof s.flavor, "test");
    s.dim = t.D, s.n_layers = t.L, s.n_heads = t.H, s.n_kv_heads = t.K, s.head_dim = t.E;
    s.hidden_dim = t.F, s.vocab_size = t.V, s.max_seq_len = t.T;
    s.norm_eps = 1e-6;
    s.rope_theta = t.rope_theta > 0 ? t.rope_theta : 1e6;
    s.tie_embeddings = t.tied;
    return s;
}

/* Makes every layer of s an MoE layer with X experts, top_k k and expert ffn dim Fm
 * (normalised top-k weights, as Qwen3-MoE). */
static inline void test_spec_moe(ModelSpec *s, int X, int k, int Fm) {
    s->num_experts = X, s->top_k = k, s->moe_hidden_dim = Fm, s->norm_topk_prob = 1;
    s->decoder_sparse_step = 1;
}

#endif
