/* Samples during training (the [sample] section): every sample.freq steps and at the last
 * step, the model completes a few prompts through the generation code of `qtitan generate`
 * (infer/generate.h); the completions are logged and appended to DUMP/samples.jsonl as
 * {"step", "prompt", "text", "ids"}. The KV cache is sized once; the bf16 weight copies are
 * refreshed first (training casts them at its next forward anyway). One process only. */
#ifndef QT_SAMPLES_H
#define QT_SAMPLES_H

#include <stdint.h>

#include "core/config.h"
#include "core/err.h"
#include "infer/decode.h"
#include "infer/generate.h"

typedef struct Samples {
    Qwen3 *m; /* the training model; not owned */
    const Tokenizer *tok;
    Decoder d;
    int freq, n;
    char *data;     /* the prompts' text, NUL-separated */
    char **prompts; /* (n) */
    IdVec *ids;     /* (n) */
    GenOptions o;
    int32_t eos[2];
    char *path; /* DUMP/samples.jsonl */
} Samples;

/* Reads the prompts (sample.prompts, one a line, or sample.prompt_file) and sizes the cache. */
int samples_open(Samples *s, const JobConfig *cfg, Qwen3 *m, const Tokenizer *tok, Err *err);
void samples_close(Samples *s);
int samples_after_step(Samples *s, int64_t step, int last, Err *err);

#endif
