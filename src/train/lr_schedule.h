/* Learning-rate schedule: linear warmup, then a stable phase, then a linear / sqrt / cosine
 * decay towards min_lr_factor, with the same step arithmetic as torchtitan's
 * linear_warmup_stable_decay (a LambdaLR factor, so the lr of training step s (1-based) is
 * base_lr * factor(s - 1)). */
#ifndef QT_LR_SCHEDULE_H
#define QT_LR_SCHEDULE_H

#include <stdint.h>

#include "core/config.h"
#include "core/err.h"

typedef struct LrSchedule {
    double base_lr;
    int64_t warmup_steps, stable_steps, decay_steps;
    DecayType decay_type;
    double min_lr_factor;
} LrSchedule;

/* training_steps: [training] steps; total_steps: the schedule's length when >= 1
 * (lr_scheduler.total_steps), else training_steps. decay_ratio < 0 means "not set" (None): decay
 * starts right after warmup. */
int lr_schedule_init(LrSchedule *s, double base_lr, int64_t training_steps, int64_t total_steps,
                     int64_t warmup_steps, double decay_ratio, DecayType decay_type,
                     double min_lr_factor, Err *err);
/* The LambdaLR multiplier after `current_step` scheduler steps (0 for the first step). */
double lr_schedule_factor(const LrSchedule *s, int64_t current_step);
/* Learning rate used by training step `step` (1-based). */
double lr_schedule_lr(const LrSchedule *s, int64_t step);

#endif
