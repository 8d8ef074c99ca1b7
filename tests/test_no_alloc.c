/* Steps 2..N of training allocate nothing: the model's arenas, the kernels' declared workspaces
 * (kernel scratch arena) and the optimizer state are sized before the first step. This binary is
 * linked with -Wl,--wrap for malloc, calloc, realloc, aligned_alloc and posix_memalign
 * (CMakeLists.txt), so every such call made by qtitan's code goes through the counters below; a
 * step is forward, backward, gradient clipping and an AdamW update with the CPU default kernels,
 * in fp32 and bf16, for a dense and a MoE model. Decode steps (infer/decode.h, fp32 and
 * bf16-only weights) allocate nothing either, nor does generate's work per token (sampling, the
 * log-prob, decoding the text and looking for stop strings): a completion of 40 tokens allocates
 * as often as one of 4. Allocations inside oneDNN and the OpenMP runtime
 * (shared libraries) are not seen. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h> /* after the headers it relies on */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "infer/decode.h"
#include "infer/generate.h"
#include "model/overrides.h"
#include "model/qwen3.h"
#include "train/adamw.h"
#include "train/clip.h"

static long g_allocs; /* calls while counting */
static int g_counting;

void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);
int __real_posix_memalign(void **p, size_t a, size_t n);

void *__wrap_malloc(size_t n) {
    __atomic_add_fetch(&g_allocs, g_counting, __ATOMIC_RELAXED);
    return __real_malloc(n);
}
void *__wrap_calloc(size_t k, size_t n) {
    __atomic_add_fetch(&g_allocs, g_counting, __ATOMIC_RELAXED);
    return __real_calloc(k, n);
}
void *__wrap_realloc(void *p, size_t n) {
    __atomic_add_fetch(&g_allocs, g_counting, __ATOMIC_RELAXED);
    return __real_realloc(p, n);
}
void *__wrap_aligned_alloc(size_t a, size_t n) {
    __atomic_add_fetch(&g_allocs, g_counting, __ATOMIC_RELAXED);
    return __real_aligned_alloc(a, n);
}
int __wrap_posix_memalign(void **p, size_t a, size_t n) {
    __atomic_add_fetch(&g_allocs, g_counting, __ATOMIC_RELAXED);
    return __real_posix_memalign(p, a, n);
}

#define B_ 2
#define T_ 32
#define V_ 256
#define STEPS 4

static ModelSpec tiny(int moe) {
    ModelSpec s;
    memset(&s, 0, sizeof s);
    snprintf(s.flavor, sizeof s.flavor, "test");
    s.dim = 64, s.n_layers = 2, s.n_heads = 4, s.n_kv_heads = 2, s.head_dim = 16;
    s.hidden_dim = 96, s.vocab_size = V_, s.max_seq_len = T_, s.norm_eps = 1e-6;
    s.rope_theta = 1e6;
    if (moe) {
        s.num_experts = 8, s.top_k = 2, s.moe_hidden_dim = 32, s.norm_topk_prob = 1;
        s.decoder_sparse_step = 1, s.load_balance_coeff = 1e-3;
    }
    return s;
}

/* Allocation calls in each of steps 2..STEPS of one small run. */
static void run(int moe, int bf16) {
    ModelSpec s = tiny(moe);
    Err err;
    Qwen3Modules mod;
    overrides_defaults(&s, "cpu", &mod);
    Qwen3 m;
    assert_int_equal(qwen3_create_with(&m, &s, B_, T_, AC_NONE, &mod, &err), 0);
    qwen3_init_params(&m, 5);
    if (bf16) assert_int_equal(qwen3_enable_bf16(&m, &err), 0);
    AdamWParam *ap = calloc((size_t)m.nparams, sizeof *ap);
    GradRef *gr = calloc((size_t)m.nparams, sizeof *gr);
    for (int i = 0; i < m.nparams; i++) {
        ap[i] = (AdamWParam){m.table[i].name, m.table[i].data, m.table[i].grad,
                             (size_t)m.table[i].numel, 1};
        gr[i] = (GradRef){m.table[i].grad, (size_t)m.table[i].numel, NULL};
    }
    AdamWConfig cfg = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    AdamW opt;
    assert_int_equal(adamw_init(&opt, &cfg, ap, m.nparams, &err), 0);
    int32_t tok[B_ * T_], tgt[B_ * T_];
    for (int i = 0; i < B_ * T_; i++)
        tok[i] = (int32_t)((i * 37 + 11) % V_), tgt[i] = (int32_t)(((i + 1) * 37 + 11) % V_);
    for (int step = 1; step <= STEPS; step++) {
        g_counting = step > 1;
        long before = g_allocs;
        qwen3_zero_grads(&m);
        qwen3_moe_reset_counts(&m);
        qwen3_forward(&m, tok, tgt, NULL, NULL, B_, T_);
        qwen3_backward(&m, 0);
        double norm = grad_global_norm(gr, m.nparams);
        adamw_step_scaled(&opt, 1e-3, grad_clip_coef(norm, 0.5));
        g_counting = 0;
        if (step > 1 && g_allocs != before)
            fail_msg("%s %s: step %d made %ld heap allocation(s)", moe ? "MoE" : "dense",
                     bf16 ? "bf16" : "fp32", step, g_allocs - before);
    }
    adamw_free(&opt);
    free(ap);
    free(gr);
    qwen3_free(&m);
}

static void test_dense_fp32(void **state) {
    (void)state;
    run(0, 0);
}
static void test_dense_bf16(void **state) {
    (void)state;
    run(0, 1);
}
static void test_moe_fp32(void **state) {
    (void)state;
    run(1, 0);
}
static void test_moe_bf16(void **state) {
    (void)state;
    run(1, 1);
}

/* Allocation calls in decode steps after a prefill, batches of two and one sequence. */
/* Every weight of m from its initializer (seed 5), through one buffer of the largest size. */
static void init_weights(Qwen3 *m) {
    long max_numel = 1;
    for (int i = 0; i < m->nparams; i++)
        if (m->table[i].numel > max_numel) max_numel = m->table[i].numel;
    float *v = malloc((size_t)max_numel * sizeof *v);
    for (int i = 0; i < m->nparams; i++) {
        qwen3_init_param(m, i, 5, v);
        qwen3_param_store(m, i, v);
    }
    free(v);
}

static void run_decode(int moe, int bf16) {
    ModelSpec s = tiny(moe);
    Err err;
    Qwen3Modules mod;
    overrides_defaults(&s, "cpu", &mod);
    Qwen3 m;
    if (bf16)
        assert_int_equal(qwen3_create_inference_bf16(&m, &s, 1, 1, &mod, &err), 0);
    else
        assert_int_equal(qwen3_create_forward(&m, &s, 1, 1, &mod, &err), 0);
    init_weights(&m);
    Decoder d;
    assert_int_equal(decoder_create(&d, &m, 2, T_, &err), 0);
    float *logits = malloc((size_t)2 * V_ * sizeof *logits);
    int32_t prompt[4] = {3, 17, 99, 4};
    decoder_prefill(&d, 0, prompt, 4, logits);
    decoder_prefill(&d, 1, prompt, 3, logits);
    int seq[2] = {0, 1};
    int32_t ids[2] = {7, 8};
    long before = g_allocs;
    g_counting = 1;
    for (int step = 0; step < STEPS; step++)
        decoder_step(&d, seq + step % 2, ids, 2 - step % 2, logits);
    g_counting = 0;
    if (g_allocs != before)
        fail_msg("%s %s: %d decode steps made %ld heap allocation(s)", moe ? "MoE" : "dense",
                 bf16 ? "bf16" : "fp32", STEPS, g_allocs - before);
    free(logits);
    decoder_free(&d);
    qwen3_free(&m);
}

static void test_decode(void **state) {
    (void)state;
    for (int moe = 0; moe < 2; moe++)
        for (int bf16 = 0; bf16 < 2; bf16++)
            run_decode(moe, bf16);
}

static void stream_none(void *ctx, int i, const char *text, size_t len) {
    (void)ctx, (void)i, (void)text, (void)len;
}

/* Allocation calls of generate with a tokenizer (the tiny byte-level one: ids below 256 are
 * its bytes), sampled, streamed, with stop strings, for completions of different lengths. */
static void test_generate_per_token(void **state) {
    (void)state;
    ModelSpec s = tiny(0);
    Err err;
    Qwen3Modules mod;
    overrides_defaults(&s, "cpu", &mod);
    Qwen3 m;
    assert_int_equal(qwen3_create_forward(&m, &s, 1, 1, &mod, &err), 0);
    init_weights(&m);
    const char *src = getenv("QT_SOURCE_DIR");
    char *tp = fs_join(src ? src : ".", "tests/fixtures/tokenizer/tiny_gpt2");
    Tokenizer *tok = tokenizer_load(tp, &err);
    if (!tok) fail_msg("%s", err.msg);
    free(tp);
    Decoder d;
    assert_int_equal(decoder_create(&d, &m, 2, 64, &err), 0);
    int32_t a[4] = {3, 17, 99, 4}, b[3] = {40, 41, 42};
    const int32_t *prompts[2] = {a, b};
    int lens[2] = {4, 3};
    const char *stop[2] = {"\xE6\x97\xA5 never", "nor this"};
    GenOptions o = {.sample = {.temperature = 1.5f, .top_k = 100, .top_p = 0.95f},
                    .seed = 3,
                    .stop = stop,
                    .n_stop = 2};
    long calls[2];
    int new_tokens[2] = {4, 40};
    for (int r = 0; r < 2; r++) {
        o.max_new_tokens = new_tokens[r];
        GenOutput out[2];
        long before = g_allocs;
        g_counting = 1;
        assert_int_equal(
            generate(&d, tok, prompts, lens, 2, &o, out, stream_none, NULL, NULL, &err), 0);
        g_counting = 0;
        calls[r] = g_allocs - before;
        for (int i = 0; i < 2; i++) {
            assert_int_equal(out[i].n, new_tokens[r]);
            gen_output_free(&out[i]);
        }
    }
    if (calls[1] != calls[0])
        fail_msg("generate made %ld heap allocations for %d tokens a sequence, %ld for %d",
                 calls[0], new_tokens[0], calls[1], new_tokens[1]);
    decoder_free(&d);
    tokenizer_free(tok);
    qwen3_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense_fp32), cmocka_unit_test(test_dense_bf16),
        cmocka_unit_test(test_moe_fp32),   cmocka_unit_test(test_moe_bf16),
        cmocka_unit_test(test_decode),     cmocka_unit_test(test_generate_per_token),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
