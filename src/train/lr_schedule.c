/* torchtitan's warmup-stable-decay schedule. Its step arithmetic, restated, for a schedule of
 * `steps` steps (lr_scheduler.total_steps, else training.steps):
 * - decay_steps = round-half-even(steps * decay_ratio) when a ratio is given (and shortened to
 *   steps - warmup_steps when warmup + decay would exceed the schedule), otherwise
 *   steps - warmup_steps; stable_steps is what remains.
 * - The factor for scheduler position c (c = 0 before the first step) clamps c to
 *   warmup + stable + decay, then: during warmup (c < warmup) it is (c + 1) / (warmup + 1),
 *   so the first step already trains with a non-zero lr and the last warmup step is just below
 *   the peak; in the stable phase, or with no decay, it is 1; in the decay phase the progress is
 *   (c + 1 - warmup - stable) / (decay + 1), mapped by 1 - p, 1 - sqrt(p) or
 *   (1 + cos(pi p)) / 2, then rescaled into [min_lr_factor, 1]. */
#include "train/lr_schedule.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/log.h"

int lr_schedule_init(LrSchedule *s, double base_lr, int64_t training_steps, int64_t total_steps,
                     int64_t warmup_steps, double decay_ratio, DecayType decay_type,
                     double min_lr_factor, Err *err) {
    memset(s, 0, sizeof *s);
    s->decay_type = decay_type;
    if (training_steps < 1)
        return err_set(err, "training.steps must be >= 1, got %lld", (long long)training_steps);
    if (warmup_steps < 0)
        return err_set(err, "lr_scheduler.warmup_steps must be >= 0, got %lld",
                       (long long)warmup_steps);
    if (!(min_lr_factor >= 0.0 && min_lr_factor <= 1.0))
        return err_set(err, "lr_scheduler.min_lr_factor must be in [0, 1], got %g", min_lr_factor);
    if (decay_ratio > 1.0)
        return err_set(err, "lr_scheduler.decay_ratio must be in [0, 1], got %g", decay_ratio);
    /* The schedule's length and the key that gave it, for the warnings. */
    char what[96];
    int64_t steps = total_steps >= 1 ? total_steps : training_steps;
    snprintf(what, sizeof what, "%s = %lld",
             total_steps >= 1 ? "lr_scheduler.total_steps" : "training.steps", (long long)steps);
    if (total_steps >= 1 && total_steps < training_steps)
        log_warn("lr_scheduler: total_steps = %lld is shorter than the run (training.steps = "
                 "%lld); its last %lld steps train at the schedule's final lr "
                 "(optimizer.lr x min_lr_factor)",
                 (long long)total_steps, (long long)training_steps,
                 (long long)(training_steps - total_steps));
    int64_t decay;
    if (warmup_steps > steps) {
        /* torchtitan runs such a job (a short smoke run of a recipe, say) on the warmup ramp
         * alone; so do we, and say so */
        log_warn("lr_scheduler: warmup_steps = %lld is longer than the schedule (%s); the lr "
                 "stays on the warmup ramp and never reaches optimizer.lr",
                 (long long)warmup_steps, what);
        decay = 0;
    } else if (decay_ratio >= 0.0) {
        decay = (int64_t)nearbyint((double)steps * decay_ratio); /* Python round() */
        if (warmup_steps + decay > steps) {
            log_warn("lr_scheduler: warmup (%lld) + decay (%lld) steps exceed the schedule (%s); "
                     "decaying over the last %lld steps instead",
                     (long long)warmup_steps, (long long)decay, what,
                     (long long)(steps - warmup_steps));
            decay = steps - warmup_steps;
        }
    } else {
        decay = steps - warmup_steps;
    }
    s->base_lr = base_lr;
    s->warmup_steps = warmup_steps;
    s->decay_steps = decay;
    /* none when the warmup outlasts the run */
    s->stable_steps = steps > warmup_steps ? steps - warmup_steps - decay : 0;
    s->min_lr_factor = min_lr_factor;
    return 0;
}

double lr_schedule_factor(const LrSchedule *s, int64_t c) {
    int64_t warmup_stable = s->warmup_steps + s->stable_steps;
    if (c >= warmup_stable + s->decay_steps) c = warmup_stable + s->decay_steps;
    if (c < s->warmup_steps) return (double)(c + 1) / (double)(s->warmup_steps + 1);
    if (c < warmup_stable || s->decay_steps == 0) return 1.0;
    double progress = (double)((c + 1) - warmup_stable) / (double)(s->decay_steps + 1);
    double adj;
    switch (s->decay_type) {
    case DECAY_SQRT:
        adj = 1.0 - sqrt(progress);
        break;
    case DECAY_COSINE:
        adj = 0.5 * (1.0 + cos(M_PI * progress));
        break;
    default:
        adj = 1.0 - progress;
        break;
    }
    return s->min_lr_factor + (1.0 - s->min_lr_factor) * adj;
}

double lr_schedule_lr(const LrSchedule *s, int64_t step) {
    return s->base_lr * lr_schedule_factor(s, step - 1);
}
