/* Random-start check (docs/training.md): the 4B flavor's shapes (vocab 151936, dim 2560, 32 / 8
 * heads, head_dim 128, ffn 9728, tied) with n_layers reduced to 2, initialised as the trainer
 * does (qwen3_init_params, seed 0), on the first packed rows of the C4 sample tokenized with the
 * Qwen3 tokenizer, has a loss of 12.4 +- 0.15 on its first step: ln(151936) = 11.93 plus
 * sigma^2 / 2 = 0.51, where sigma = 0.02 * sqrt(2560) is the spread of the logits (a unit-RMS
 * final hidden state against tied normal(0, 0.02) embeddings).
 *
 * Forward only (the step-1 loss is the loss before any update), 4 rows of 128 tokens so the
 * mean is over 512 tokens. Needs ../shared (exits 77 without it) and ~5 GB of memory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/fs.h"
#include "core/model_spec.h"
#include "model/qwen3.h"
#include "text/dataset.h"
#include "text/tokenizer.h"

enum { B = 4, T = 128 };

static const char *shared_dir;

static void test_random_start_loss(void **state) {
    (void)state;
    Err err;
    char *tok_path = fs_join(shared_dir, "tokenizers/qwen3");
    char *data_path = fs_join(shared_dir, "data/c4_sample/c4_sample.jsonl");
    Tokenizer *tok = tokenizer_load(tok_path, &err);
    if (!tok) fail_msg("%s", err.msg);
    DatasetEncoder enc;
    assert_int_equal(dataset_encoder_for_tokenizer(&enc, tok, &err), 0);
    char cache[] = "/tmp/qt_random_start_XXXXXX";
    assert_non_null(mkdtemp(cache));
    DatasetOptions o;
    dataset_options_default(&o);
    o.path = data_path;
    o.cache_dir = cache;
    o.seq_len = T;
    o.seed = 0;
    Dataset ds;
    if (dataset_open(&ds, &o, &enc, &err) != 0) fail_msg("%s", err.msg);
    Batch b;
    batch_alloc(&b, B, T);
    assert_int_equal(dataset_rows(&ds, 0, B, &b, &err), 0);
    int32_t *ids = malloc(sizeof(int32_t) * B * T);
    for (int i = 0; i < B * T; i++)
        ids[i] = (int32_t)b.tokens[i];

    ModelSpec s;
    assert_int_equal(model_spec_flavor(&s, "4B", &err), 0);
    assert_int_equal(model_spec_set_field(&s, "n_layers", "2", &err), 0);
    assert_int_equal(model_spec_validate(&s, &err), 0);
    assert_true(s.vocab_size == 151936 && s.dim == 2560 && s.tie_embeddings);
    Qwen3 m;
    if (qwen3_create(&m, &s, B, T, AC_NONE, &err) != 0) fail_msg("%s", err.msg);
    qwen3_init_params(&m, 0);
    float loss = qwen3_forward(&m, ids, b.targets, b.positions, b.doc_ids, B, T);
    printf("random-start loss (4B shapes, 2 layers, %d x %d C4 tokens): %.4f; ln(V) = %.4f\n", B, T,
           loss, log(151936.0));
    assert_true(fabsf(loss - 12.4f) <= 0.15f);

    qwen3_free(&m);
    free(ids);
    batch_free(&b);
    dataset_close(&ds);
    fs_remove_tree(cache, &err);
    tokenizer_free(tok);
    free(tok_path);
    free(data_path);
}

int main(void) {
    shared_dir = getenv("QT_SHARED_DIR");
    /* Skipped only without ../shared (a user's clone); CI has it, so a missing file fails. */
    if (!shared_dir || !fs_exists(shared_dir)) {
        fprintf(stderr, "skipped: no ../shared (QT_SHARED_DIR)\n");
        return 77;
    }
    char *probe = fs_join(shared_dir, "tokenizers/qwen3/tokenizer.json");
    int have = fs_exists(probe);
    free(probe);
    if (!have) {
        fprintf(stderr, "%s has no tokenizers/qwen3/tokenizer.json\n", shared_dir);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_start_loss),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
