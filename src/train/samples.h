/* Samples during training (the [sample] section): every sample.freq steps and at the last
 * step, the model completes a few prompts through the generation code of `qtitan generate`
 * (infer/generate.h); the completions are logged and appended to DUMP/samples.jsonl as
 * {"step", "prompt", "text", "ids"}. The KV cache is sized once; the bf16 weight copies are
 * refreshed first (training casts them at its next forward anyway).
 *
 * On a mesh rank 0 generates alone, from a whole copy of the model it keeps for the run (one
 * process's shapes, kernels and precision): every rank takes part in gathering the current
 * weights into it (train_qwen3_gather_whole), then all wait for rank 0's outcome, so the ranks
 * stay in step and the samples are those one process would print from the same weights. The
 * copy costs rank 0 the model's weights once more. When the plan (train/train_plan.h) finds
 * that the job would not fit with it (sample.gather = "auto"), or sample.gather = "units", rank
 * 0 runs the whole model one FSDP unit at a time instead: before each unit of every prefill
 * and decode step it names the unit to all ranks, which gather it as training does
 * (train_qwen3_gather_unit) into rank 0's two unit buffers; the KV cache stays on rank 0. The
 * same weights reach the same kernels either way, so samples.jsonl is the same bytes; the
 * cost is the gathers, every step. The way taken is logged. A LoRA run (one process) samples from
 * such a copy too, its adapters merged as the run's merged export merges them (the decoder runs
 * plain weights). */
#ifndef QT_SAMPLES_H
#define QT_SAMPLES_H

#include <stdint.h>

#include "core/config.h"
#include "core/err.h"
#include "infer/decode.h"
#include "infer/generate.h"
#include "text/prompt_lines.h"
#include "train/train_qwen3.h"

/* How a job's [sample] section generates (train/samples.h). */
typedef enum SampleWay {
    SAMPLE_NONE,    /* no [sample] */
    SAMPLE_OWN,     /* one process: the training model itself */
    SAMPLE_WHOLE,   /* a whole copy gathered on rank 0 (or, with LoRA, merged) */
    SAMPLE_UNITWISE /* rank 0 gathers one FSDP unit at a time from the shards */
} SampleWay;

typedef struct Samples {
    TrainQwen3 *q; /* the training driver; not owned */
    Qwen3 *m;      /* the model generating: q's own on one process, whole on rank 0 of a mesh
                    * (or with LoRA), NULL on the other ranks */
    Qwen3 whole;   /* rank 0 of a mesh: the gathered copy, or the one-unit-at-a-time model */
    SampleWay way;
    const Tokenizer *tok;
    Decoder d;
    int freq;
    PromptLines pr;
    IdVec *ids; /* (pr.n) */
    GenOptions o;
    int32_t eos[2];
    char *path; /* DUMP/samples.jsonl */
} Samples;

/* Reads the prompts (sample.prompts, one a line, or sample.prompt_file), checks them on every
 * rank and, where m generates, sizes the cache. */
/* planned: the way the job's plan chose (train_plan_check_memory), rank 0's taken by all;
 * SAMPLE_NONE without a plan: a whole copy unless sample.gather = "units". */
int samples_open(Samples *s, const JobConfig *cfg, TrainQwen3 *q, const Tokenizer *tok,
                 SampleWay planned, Err *err);
void samples_close(Samples *s);
/* The sampling [sample] asks for (temperature, top-k, top-p, min-p, the penalties). */
SampleParams samples_params(const JobConfig *cfg);
/* sample.gather against a job of world processes: "units" needs more than one. */
int samples_check_gather(const JobConfig *cfg, int world, Err *err);
/* Collective over q's mesh. */
int samples_after_step(Samples *s, int64_t step, int last, Err *err);

#endif
