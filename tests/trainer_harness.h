/* trainer_run (train/trainer.h) over a Qwen3 fed fixed batches, for the tests that compare a
 * whole run against PyTorch (test_train_parity.c, test_lora.c): the batches, the callbacks
 * that feed them and record each step's loss, gradient norm and lr, the options both runs share
 * and the comparison with the fixture's per-step numbers. The including file defines the enum
 * constants STEPS, B and T first, and includes this after cmocka.h. */
#ifndef QT_TEST_TRAINER_HARNESS_H
#define QT_TEST_TRAINER_HARNESS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/fs.h"
#include "core/json.h"
#include "model/qwen3.h"
#include "train/trainer.h"

typedef struct Harness {
    Qwen3 m;
    int32_t tok[STEPS][B * T], tgt[STEPS][B * T]; /* step s's batch at [s - 1] */
    const int32_t *cur[2];
    double loss[STEPS + 1], norm[STEPS + 1], lr[STEPS + 1]; /* by step, from 1 */
} Harness;

/* A target of -100 is not counted (the masked positions of the LoRA fixture). */
static int harness_count(void *ctx, int64_t step, int64_t *tokens, int64_t *valid, Err *err) {
    Harness *h = ctx;
    if (step < 1 || step > STEPS) return err_set(err, "no batch for step %lld", (long long)step);
    *tokens = B * T;
    *valid = 0;
    for (int k = 0; k < B * T; k++)
        *valid += h->tgt[step - 1][k] != -100;
    return 0;
}

static int harness_next(void *ctx, int64_t step, int micro, const void **batch, Err *err) {
    (void)micro;
    Harness *h = ctx;
    if (step < 1 || step > STEPS) return err_set(err, "no batch for step %lld", (long long)step);
    h->cur[0] = h->tok[step - 1];
    h->cur[1] = h->tgt[step - 1];
    *batch = h->cur;
    return 0;
}

static int harness_fwd_bwd(void *ctx, const void *batch, double divisor, double *loss_sum,
                           Err *err) {
    (void)err;
    Harness *h = ctx;
    const int32_t *const *bt = batch;
    qwen3_forward(&h->m, bt[0], bt[1], NULL, NULL, B, T);
    qwen3_backward(&h->m, divisor);
    *loss_sum = h->m.loss_sum;
    return 0;
}

static void harness_on_step(void *ctx, const StepMetrics *s) {
    Harness *h = ctx;
    h->loss[s->step] = s->loss;
    h->norm[s->step] = s->grad_norm;
    h->lr[s->step] = s->lr;
}

/* STEPS steps of AdamW (lr 1e-2, betas 0.9 / 0.95, eps 1e-8, weight decay 0.1) on the n
 * params, warmup 2 then linear decay to 0, clipped to max_norm: the runs both fixtures
 * recorded. */
static void harness_run(Harness *h, int n, CkptTensor *params, float **grads, double max_norm) {
    TrainModel model = {.ctx = h,
                        .nparams = n,
                        .params = params,
                        .grads = grads,
                        .forward_backward = harness_fwd_bwd};
    TrainData data = {.ctx = h, .count = harness_count, .next = harness_next};
    char tmpl[] = "/tmp/qt_harness_XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    TrainerOptions o = {.steps = STEPS,
                        .micro_batches = 1,
                        .lr = 1e-2,
                        .warmup_steps = 2,
                        .decay_ratio = -1,
                        .decay_type = DECAY_LINEAR,
                        .min_lr_factor = 0.0,
                        .adamw = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1},
                        .max_norm = max_norm,
                        .dump_folder = tmpl,
                        .log_freq = 1,
                        .peak_tflops = 1.0,
                        .flops_per_token = 1.0,
                        .on_step = harness_on_step,
                        .on_step_ctx = h};
    Err err;
    if (trainer_run(&o, &model, &data, &err) != 0) fail_msg("%s", err.msg);
    fs_remove_tree(tmpl, &err);
}

/* Each step's loss and gradient norm against the fixture's "steps" array (what: who made it):
 * the largest relative differences, a NaN counting as the largest; the lr must match. */
static void harness_compare(const Harness *h, const json_t *steps, const char *what,
                            double *worst_loss, double *worst_norm) {
    *worst_loss = *worst_norm = 0;
    for (int s = 1; s <= STEPS; s++) {
        const json_t *e = json_array_get(steps, (size_t)s - 1);
        double loss = json_number_value(json_object_get(e, "loss"));
        double norm = json_number_value(json_object_get(e, "grad_norm"));
        double lr = json_number_value(json_object_get(e, "lr"));
        printf("step %d: loss %.7f (%s %.7f)  grad_norm %.7f (%s %.7f)\n", s, h->loss[s], what,
               loss, h->norm[s], what, norm);
        /* Not fmax, which drops a NaN: a NaN loss or norm must fail the caller's checks. */
        double dl = fabs(h->loss[s] - loss) / loss, dn = fabs(h->norm[s] - norm) / norm;
        if (isnan(dl) || dl > *worst_loss) *worst_loss = dl;
        if (isnan(dn) || dn > *worst_norm) *worst_norm = dn;
        assert_true(fabs(h->lr[s] - lr) <= 1e-17);
    }
}

#endif
