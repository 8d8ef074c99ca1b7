/* What a training job runs between steps besides checkpoints: validation ([validation]) and
 * samples ([sample]), behind the trainer's one after_step hook. */
#ifndef QT_BETWEEN_STEPS_H
#define QT_BETWEEN_STEPS_H

#include "train/samples.h"
#include "train/train_qwen3.h"
#include "train/validate.h"

typedef struct BetweenSteps {
    int validate, sample; /* which are on */
    Validator v;
    Samples s;
} BetweenSteps;

/* Opens what cfg turns on, for q on any mesh. Every rank opens both; run them collectively. */
/* sample_way: the plan's (samples_open). */
int between_steps_open(BetweenSteps *b, const JobConfig *cfg, TrainQwen3 *q, const Tokenizer *tok,
                       SampleWay sample_way, Err *err);
void between_steps_close(BetweenSteps *b);
/* TrainerOptions.after_step. */
int between_steps_run(void *ctx, int64_t step, int last, MetricsWriter *mw, Err *err);

#endif
