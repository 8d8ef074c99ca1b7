/* The training loop wired end to end on a toy model (a bigram table trained with softmax
 * cross-entropy): the loss falls, and an interrupted run resumed from its checkpoint gives
 * bitwise the same losses and parameters as a run that never stopped (docs/training.md). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "core/rng.h"
#include "train/trainer.h"

enum { V = 16, ROWS = 4, T = 32, MICRO = 2, STEPS = 12 };

typedef struct Toy {
    float w[V * V], b[V]; /* (V, V) logits of the next token given this one, (V) bias */
    float gw[V * V], gb[V];
    CkptTensor params[2];
    float *grads[2];
    int tokens[ROWS][T + 1]; /* the current micro-batch uses ROWS / MICRO of these rows */
    int64_t fail_at;         /* data error at this step (0 = never) */
    double losses[STEPS + 1];
} Toy;

static void toy_init(Toy *m) {
    memset(m, 0, sizeof *m);
    Rng r;
    rng_seed(&r, 11, 0);
    rng_fill_normal(&r, m->w, V * V, 0.02f);
    m->params[0] = (CkptTensor){"bigram.weight", 2, {V, V}, m->w, NULL};
    m->params[1] = (CkptTensor){"bigram.bias", 1, {V}, m->b, NULL};
    m->grads[0] = m->gw;
    m->grads[1] = m->gb;
}

static int toy_fb(void *ctx, const void *batch, double divisor, double *loss_sum, Err *err) {
    (void)err;
    Toy *m = ctx;
    const int(*rows)[T + 1] = batch;
    double total = 0, scale = 1.0 / divisor;
    for (int r = 0; r < ROWS / MICRO; r++)
        for (int t = 0; t < T; t++) {
            int x = rows[r][t], y = rows[r][t + 1];
            float logits[V], mx = -INFINITY, sum = 0;
            for (int v = 0; v < V; v++) {
                logits[v] = m->w[x * V + v] + m->b[v];
                mx = fmaxf(mx, logits[v]);
            }
            for (int v = 0; v < V; v++)
                sum += expf(logits[v] - mx);
            total += -(logits[y] - mx - logf(sum));
            for (int v = 0; v < V; v++) {
                float d = expf(logits[v] - mx) / sum - (v == y);
                m->gw[x * V + v] += (float)scale * d;
                m->gb[v] += (float)scale * d;
            }
        }
    *loss_sum = total;
    return 0;
}

static int toy_count(void *ctx, int64_t step, int64_t *tokens, int64_t *valid, Err *err) {
    (void)ctx;
    (void)step;
    (void)err;
    *tokens = *valid = ROWS * T;
    return 0;
}

/* Rows of step s depend only on (seed, step): a noisy walk t -> 3t + 1 (mod V). */
static int toy_next(void *ctx, int64_t step, int micro, const void **batch, Err *err) {
    Toy *m = ctx;
    if (step == m->fail_at)
        return err_set(err, "toy data: simulated failure at step %lld", (long long)step);
    Rng r;
    rng_seed(&r, 99, (uint64_t)(step * MICRO + micro));
    for (int row = 0; row < ROWS / MICRO; row++) {
        int x = (int)rng_below(&r, V);
        for (int t = 0; t <= T; t++) {
            m->tokens[row][t] = x;
            x = rng_below(&r, 5) == 0 ? (int)rng_below(&r, V) : (3 * x + 1) % V;
        }
    }
    *batch = m->tokens;
    return 0;
}

static json_t *toy_position(void *ctx) {
    (void)ctx;
    return json_pack("{s:s}", "kind", "step-indexed");
}

static int toy_restore(void *ctx, const json_t *pos, Err *err) {
    (void)ctx;
    if (!json_is_object(pos)) return err_set(err, "toy data: bad position");
    return 0;
}

static void record(void *ctx, const StepMetrics *s) {
    Toy *m = ctx;
    m->losses[s->step] = s->loss;
}

static TrainerOptions options(Toy *m, const char *dump) {
    TrainerOptions o = {.steps = STEPS,
                        .micro_batches = MICRO,
                        .lr = 0.5,
                        .warmup_steps = 2,
                        .decay_ratio = -1,
                        .decay_type = DECAY_COSINE,
                        .min_lr_factor = 0.1,
                        .adamw = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1},
                        .max_norm = 1.0,
                        .dump_folder = dump,
                        .ckpt_enable = 1,
                        .ckpt_interval = 4,
                        .keep_latest_k = 2,
                        .log_freq = 1,
                        .peak_tflops = 1.0,
                        .flops_per_token = 6.0 * V * V,
                        .seed = 5,
                        .config_hash = 0x1234,
                        .on_step = record,
                        .on_step_ctx = m};
    return o;
}

static TrainModel model_of(Toy *m) {
    return (TrainModel){
        .ctx = m, .nparams = 2, .params = m->params, .grads = m->grads, .forward_backward = toy_fb};
}

static TrainData data_of(Toy *m) {
    return (TrainData){.ctx = m,
                       .count = toy_count,
                       .next = toy_next,
                       .position = toy_position,
                       .restore = toy_restore};
}

static void test_resume_is_bitwise(void **state) {
    (void)state;
    char tmpl[] = "/tmp/qt_trainer_XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    char *dump_a = fs_join(tmpl, "a"), *dump_b = fs_join(tmpl, "b");
    Toy *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    toy_init(a);
    toy_init(b);
    Err err;
    TrainerOptions oa = options(a, dump_a);
    TrainModel ma = model_of(a);
    TrainData da = data_of(a);
    assert_int_equal(trainer_run(&oa, &ma, &da, &err), 0);
    printf("loss: step 1 %.5f, step %d %.5f\n", a->losses[1], STEPS, a->losses[STEPS]);
    assert_true(a->losses[STEPS] < a->losses[1] - 0.3);
    /* Run b dies at step 7 (its last checkpoint is step 4), then starts again and resumes. */
    TrainerOptions ob = options(b, dump_b);
    TrainModel mb = model_of(b);
    TrainData db = data_of(b);
    b->fail_at = 7;
    assert_int_equal(trainer_run(&ob, &mb, &db, &err), -1);
    assert_non_null(strstr(err.msg, "step 7"));
    b->fail_at = 0;
    toy_init(b); /* a new process: parameters from scratch, then the checkpoint */
    assert_int_equal(trainer_run(&ob, &mb, &db, &err), 0);
    for (int s = 1; s <= STEPS; s++) {
        if (s <= 4)
            assert_true(b->losses[s] == 0.0); /* not rerun */
        else
            assert_true(b->losses[s] == a->losses[s]);
    }
    assert_memory_equal(a->w, b->w, sizeof a->w);
    assert_memory_equal(a->b, b->b, sizeof a->b);
    /* Both dumps end with step 12 as the newest checkpoint and keep two steps. */
    char path[4096];
    snprintf(path, sizeof path, "%s/checkpoint/step-12", dump_b);
    assert_true(fs_exists(path));
    snprintf(path, sizeof path, "%s/checkpoint/step-4", dump_b);
    assert_false(fs_exists(path));
    /* metrics.jsonl of b: 6 lines before the failure; the resume from step 4 drops steps 5-6
     * and writes steps 5-12, so each step is there once, in order. */
    char *jl = fs_join(dump_b, "metrics.jsonl"), *text;
    size_t len;
    assert_int_equal(fs_read_all(jl, &text, &len, &err), 0);
    int lines = 0;
    for (char *line = text; line < text + len; lines++) {
        char *nl = strchr(line, '\n');
        assert_non_null(nl);
        char want[32];
        snprintf(want, sizeof want, "{\"step\":%d,", lines + 1);
        assert_true(strncmp(line, want, strlen(want)) == 0);
        line = nl + 1;
    }
    assert_int_equal(lines, 12);
    free(text);
    free(jl);
    fs_remove_tree(tmpl, &err);
    free(dump_a);
    free(dump_b);
    free(a);
    free(b);
}

static void test_divergence_is_an_error(void **state) {
    (void)state;
    char tmpl[] = "/tmp/qt_trainer_XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    Toy *m = malloc(sizeof *m);
    toy_init(m);
    m->w[3] = NAN;
    TrainerOptions o = options(m, tmpl);
    o.ckpt_enable = 0;
    TrainModel md = model_of(m);
    TrainData d = data_of(m);
    Err err;
    assert_int_equal(trainer_run(&o, &md, &d, &err), -1);
    assert_non_null(strstr(err.msg, "diverged"));
    /* The toy's NaN loss has its sign bit set; the message says nan, as torch prints it. */
    assert_non_null(strstr(err.msg, "step 1: loss nan, grad_norm nan: training diverged"));
    /* With skip_nonfinite the run goes on and the parameters are left as they were. */
    float w4 = m->w[4], b0 = m->b[0];
    o.skip_nonfinite = 1;
    assert_int_equal(trainer_run(&o, &md, &d, &err), 0);
    assert_true(m->w[4] == w4 && m->b[0] == b0);
    assert_true(isnan(m->losses[STEPS]));
    fs_remove_tree(tmpl, &err);
    free(m);
}

/* Parameters that hold a NaN are never checkpointed: with skip_nonfinite the run reaches its
 * first save and fails there, naming the step and the parameter, and writes no step folder. */
static void test_no_checkpoint_holds_nan(void **state) {
    (void)state;
    char tmpl[] = "/tmp/qt_trainer_XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    Toy *m = malloc(sizeof *m);
    toy_init(m);
    m->w[3] = NAN;
    TrainerOptions o = options(m, tmpl);
    o.skip_nonfinite = 1;
    TrainModel md = model_of(m);
    TrainData d = data_of(m);
    Err err;
    assert_int_equal(trainer_run(&o, &md, &d, &err), -1);
    printf("%s\n", err.msg);
    assert_non_null(strstr(err.msg, "step 4: parameter bigram.weight holds a non-finite value"));
    char path[4096];
    snprintf(path, sizeof path, "%s/checkpoint/step-4", tmpl);
    assert_false(fs_exists(path));
    fs_remove_tree(tmpl, &err);
    free(m);
}

static int last_save_calls;
static char last_save_dir[4096];
static int on_last_save(void *ctx, const char *dir, Err *err) {
    (void)ctx;
    (void)err;
    last_save_calls++;
    snprintf(last_save_dir, sizeof last_save_dir, "%s", dir);
    return 0;
}

/* The last-save hook (HF export) runs once, after the last step's checkpoint is committed. */
static void test_last_save_hook(void **state) {
    (void)state;
    char tmpl[] = "/tmp/qt_trainer_XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    Toy *m = malloc(sizeof *m);
    toy_init(m);
    TrainerOptions o = options(m, tmpl);
    o.on_last_save = on_last_save;
    TrainModel md = model_of(m);
    TrainData d = data_of(m);
    Err err;
    last_save_calls = 0;
    assert_int_equal(trainer_run(&o, &md, &d, &err), 0);
    assert_int_equal(last_save_calls, 1);
    char want[4096];
    snprintf(want, sizeof want, "%s/checkpoint/step-%d", tmpl, STEPS);
    assert_string_equal(last_save_dir, want);
    snprintf(want, sizeof want, "%s/train_state.json", last_save_dir);
    assert_true(fs_exists(want));
    fs_remove_tree(tmpl, &err);
    free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_checkpoint_holds_nan),
        cmocka_unit_test(test_last_save_hook),
        cmocka_unit_test(test_resume_is_bitwise),
        cmocka_unit_test(test_divergence_is_an_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
