/* Validation and samples between training steps (see between_steps.h). */
#include "train/between_steps.h"

#include <string.h>

int between_steps_open(BetweenSteps *b, const JobConfig *cfg, TrainQwen3 *q, const Tokenizer *tok,
                       SampleWay sample_way, Err *err) {
    memset(b, 0, sizeof *b);
    int want_v = cfg->validation.enable, want_s = cfg->sample.freq > 0;
    if (want_v) {
        TRY(validator_open(&b->v, cfg, train_qwen3_qwen3(q), train_qwen3_mesh(q), tok, err));
        b->validate = 1;
    }
    if (want_s) {
        if (samples_open(&b->s, cfg, q, tok, sample_way, err)) {
            between_steps_close(b);
            return -1;
        }
        b->sample = 1;
    }
    return 0;
}

void between_steps_close(BetweenSteps *b) {
    if (b->validate) validator_close(&b->v);
    if (b->sample) samples_close(&b->s);
    memset(b, 0, sizeof *b);
}

int between_steps_run(void *ctx, int64_t step, int last, MetricsWriter *mw, Err *err) {
    BetweenSteps *b = ctx;
    if (b->validate) TRY(validator_after_step(&b->v, step, last, mw, err));
    if (b->sample) TRY(samples_after_step(&b->s, step, last, err));
    return 0;
}
