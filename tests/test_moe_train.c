/* A small Qwen3-MoE model trained by the real trainer (AdamW, LR schedule, clipping, two
 * micro-batches per step) on the C4 sample through the data feed, with the MoE step hook
 * (expert_bias update, load metrics): the loss must fall, metrics.jsonl must carry the MoE
 * load figures and the biases must move while staying zero-mean. The C4 text goes through the
 * real Qwen3 tokenizer with ids folded into a 2048-token vocabulary (id mod 2048, like the
 * debug flavors' size), so the model stays CPU-small. Needs QT_SHARED_DIR (exits 77 without). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h> /* after the headers it relies on */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "model/qwen3.h"
#include "spec_util.h"
#include "text/dataset.h"
#include "text/tokenizer.h"
#include "train/data_feed.h"
#include "train/metrics.h"
#include "train/moe_step.h"
#include "train/trainer.h"

#define VOCAB 2048
#define STEPS 60

static Tokenizer *qwen;
static char *c4_path;
static char tmp_dir[64];

static int fold_encode(const void *ctx, const char *text, size_t len, IdVec *out, Err *err) {
    size_t n0 = out->n;
    TRY(tokenizer_encode(ctx, text, len, out, err));
    for (size_t i = n0; i < out->n; i++)
        out->ids[i] %= VOCAB;
    return 0;
}

typedef struct Ctx {
    Qwen3 m;
    float losses[STEPS];
    int nloss;
} Ctx;

static int fwd_bwd(void *p, const void *batch, double divisor, double *loss_sum, Err *err) {
    (void)err;
    Ctx *c = p;
    const TrainQwen3Batch *b = batch;
    qwen3_forward(&c->m, b->tokens, b->targets, b->positions, b->doc, b->B, b->T);
    qwen3_backward(&c->m, divisor);
    *loss_sum = c->m.loss_sum;
    return 0;
}

static int before_opt(void *p, int update, MetricsExtra *extra, int *nextra, Err *err) {
    Ctx *c = p;
    return moe_train_step(&c->m, NULL, update, extra, nextra, TRAIN_MAX_EXTRA, err);
}

static void on_step(void *p, const StepMetrics *m) {
    Ctx *c = p;
    c->losses[c->nloss++] = (float)m->loss;
}

static void test_moe_trains_on_c4(void **state) {
    (void)state;
    Err err;
    DatasetEncoder enc;
    assert_int_equal(dataset_encoder_for_tokenizer(&enc, qwen, &err), 0);
    enc.encode = fold_encode;
    enc.hash ^= 0x6d6f65; /* another id mapping than the plain tokenizer's cache */
    enc.eos_id %= VOCAB;
    enc.vocab_size = VOCAB;
    int T = 64, rows = 4, micro = 2;
    DatasetOptions o;
    dataset_options_default(&o);
    o.path = c4_path;
    o.cache_dir = tmp_dir;
    o.seq_len = T;
    o.seed = 5;
    Dataset ds;
    if (dataset_open(&ds, &o, &enc, &err)) fail_msg("%s", err.msg);
    DataFeed feed;
    MeshConfig mc = {.world = 1,
                     .dp_replicate = 1,
                     .dp_shard = 1,
                     .tp = 1,
                     .local_batch = rows / micro,
                     .global_batch = rows};
    MeshDims dims;
    assert_int_equal(mesh_resolve(&dims, &mc, 0, &err), 0);
    data_feed_init(&feed, &ds, &dims);
    TrainData td;
    data_feed_bind(&feed, &td);

    ModelSpec s = test_spec((TestShape){
        .D = 64, .L = 2, .H = 4, .K = 2, .E = 16, .V = VOCAB, .T = T, .rope_theta = 1e4});
    test_spec_moe(&s, 8, 2, 64);
    s.load_balance_coeff = 1e-3;
    static Ctx c;
    assert_int_equal(qwen3_create(&c.m, &s, rows / micro, T, AC_NONE, &err), 0);
    qwen3_init_params(&c.m, 99);

    int np = c.m.nparams;
    CkptTensor *params = calloc((size_t)np, sizeof *params);
    float **grads = calloc((size_t)np, sizeof *grads);
    int *decay = calloc((size_t)np, sizeof *decay);
    for (int i = 0; i < np; i++) {
        Qwen3Param *p = &c.m.table[i];
        params[i].name = p->name;
        params[i].ndim = p->ndim;
        for (int d = 0; d < p->ndim; d++)
            params[i].shape[d] = p->shape[d];
        params[i].data = p->data;
        grads[i] = p->grad;
        /* expert_bias is balancing state: its gradient is 0 and it must not decay. */
        decay[i] = p->kind->role != ROLE_NORM && p->kind->role != ROLE_BUFFER;
    }
    TrainModel tm = {.ctx = &c,
                     .nparams = np,
                     .params = params,
                     .grads = grads,
                     .decay = decay,
                     .forward_backward = fwd_bwd,
                     .before_optimizer_step = before_opt};
    char *dump = fs_join(tmp_dir, "run");
    TrainerOptions opt = {.steps = STEPS,
                          .micro_batches = micro,
                          .lr = 1e-2,
                          .warmup_steps = 3,
                          .decay_ratio = -1,
                          .decay_type = DECAY_LINEAR,
                          .adamw = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1},
                          .max_norm = 1.0,
                          .dump_folder = dump,
                          .log_freq = 20,
                          .peak_tflops = 1.0,
                          .flops_per_token = metrics_flops_per_token(&s, T),
                          .seed = 1,
                          .on_step = on_step,
                          .on_step_ctx = &c};
    if (trainer_run(&opt, &tm, &td, &err)) fail_msg("%s", err.msg);
    assert_int_equal(c.nloss, STEPS);
    double first = 0, last = 0;
    for (int i = 0; i < 5; i++)
        first += c.losses[i] / 5, last += c.losses[STEPS - 5 + i] / 5;
    printf("loss: step 1 %.4f, step 20 %.4f, step 40 %.4f, step 60 %.4f (mean of first 5 %.4f, "
           "last 5 %.4f)\n",
           c.losses[0], c.losses[19], c.losses[39], c.losses[59], first, last);
    assert_true(c.losses[0] > 7.0f && c.losses[0] < 8.5f); /* ~ ln 2048 = 7.62 at init */
    assert_true(last < first - 0.7);

    for (int l = 0; l < s.n_layers; l++) {
        const float *b = c.m.p.layers[l].expert_bias;
        double mean = 0, spread = 0;
        for (int e = 0; e < s.num_experts; e++)
            mean += b[e], spread += fabs(b[e]);
        assert_true(fabs(mean) < 1e-5 && spread > 1e-3);
    }
    char *jsonl = fs_join(dump, "metrics.jsonl");
    char *text;
    size_t len;
    assert_int_equal(fs_read_all(jsonl, &text, &len, &err), 0);
    assert_non_null(strstr(text, "\"moe_imbalance\""));
    assert_non_null(strstr(text, "\"moe_tokens_min\""));
    assert_non_null(strstr(text, "\"moe_tokens_max\""));
    free(text), free(jsonl), free(dump);
    free(params), free(grads), free(decay);
    qwen3_free(&c.m);
    data_feed_free(&feed);
    dataset_close(&ds);
}

int main(void) {
    const char *shared = getenv("QT_SHARED_DIR");
    /* Skipped only without ../shared (a user's clone); CI has it, so a missing file fails. */
    if (!shared || !fs_exists(shared)) {
        fprintf(stderr, "skipped: no ../shared (QT_SHARED_DIR)\n");
        return 77;
    }
    char *tok = fs_join(shared, "tokenizers/qwen3");
    c4_path = fs_join(shared, "data/c4_sample/c4_sample.jsonl");
    if (!fs_exists(tok) || !fs_exists(c4_path)) {
        fprintf(stderr, "%s lacks the Qwen3 tokenizer or the C4 sample\n", shared);
        return 1;
    }
    Err err;
    qwen = tokenizer_load(tok, &err);
    free(tok);
    if (!qwen) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/qt_moetrain_XXXXXX");
    if (!mkdtemp(tmp_dir)) return 1;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_moe_trains_on_c4)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fs_remove_tree(tmp_dir, &err);
    tokenizer_free(qwen);
    free(c4_path);
    return rc;
}
