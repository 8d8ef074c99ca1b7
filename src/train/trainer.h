/* The training loop, wired from its components (AdamW, LR schedule, clipping, metrics,
 * checkpoints) and two interfaces the caller fills: the model (parameters, gradients, one
 * forward + backward call) and the data (the micro-batches of a step). On many processes
 * the model is this rank's shard and TrainParallel completes gradients, norm and checkpoints
 * across ranks. */
#ifndef QT_TRAINER_H
#define QT_TRAINER_H

#include <jansson.h>
#include <stdint.h>

#include "core/config.h"
#include "core/err.h"
#include "core/rng.h"
#include "dist/comm.h"
#include "train/adamw.h"
#include "train/checkpoint.h"
#include "train/metrics.h"
#include "train/shard_slice.h"

typedef struct TrainModel {
    void *ctx;
    int nparams;
    const CkptTensor *params; /* (nparams) FQN, shape and fp32 data of every parameter */
    float *const *grads;      /* (nparams) gradient buffers shaped like params, on their devices */
    const int *decay;         /* (nparams) 1 = weight decay applies; NULL = all decay */
    /* (nparams) what params[i] holds of its whole tensor, recorded with sharded checkpoints so
     * that another mesh can resume from them; NULL = every params[i] is its whole tensor. */
    const ShardSlice *slices;
    /* Optional (NULL: none): (nparams) the low-precision copy of params[i] the forward reads
     * (adamw_set_copies), or NULL entries; the optimizer writes each with every update. */
    uint16_t *const *copies;
    /* Optional (NULL: none). Called with 1 once the run's starting parameters are settled
     * (after a resume), before the first step: the model makes its copies of the parameters
     * (and of frozen weights) and stops remaking them per forward, as the optimizer now keeps
     * them; with 0 when the run's steps end. */
    void (*keep_copies)(void *ctx, int on);
    /* Runs forward and backward on one micro-batch, adding scale * d(sum of token losses) into
     * grads (+=). Writes the sum of token losses (unscaled) to *loss_sum. */
    int (*forward_backward)(void *ctx, const void *batch, double scale, double *loss_sum, Err *err);
    /* Optional (NULL: none). Called once per step after every micro-batch's backward and before
     * the optimizer step; MoE models update their expert_bias here from the step's routing
     * counts (model/moe.h). It may append up to TRAIN_MAX_EXTRA numeric metrics (e.g. tokens
     * per expert) to the step's metrics.jsonl record through extra / *nextra. update is 0 on a
     * step whose update is skipped (training.skip_nonfinite): the per-step state (routing
     * counts) restarts, but the model is left as it is, like the parameters. */
    int (*before_optimizer_step)(void *ctx, int update, MetricsExtra *extra, int *nextra, Err *err);
} TrainModel;

#define TRAIN_MAX_EXTRA 8

typedef struct TrainData {
    void *ctx;
    /* Tokens of global step `step` (1-based) over all micro-batches: all input tokens (for
     * throughput) and the labels that count towards the loss (its denominator). */
    int (*count)(void *ctx, int64_t step, int64_t *tokens, int64_t *valid, Err *err);
    /* Micro-batch `micro` of step `step`, valid until the next call. */
    int (*next)(void *ctx, int64_t step, int micro, const void **batch, Err *err);
    /* Position for checkpoints (new reference, a JSON object), and its restore. */
    json_t *(*position)(void *ctx);
    int (*restore)(void *ctx, const json_t *position, Err *err);
    /* Forgets the position (checkpoint.exclude_from_loading = ["dataloader"]): the next step
     * asked for reads from the first row. */
    void (*restart)(void *ctx);
} TrainData;

/* The mesh's hooks (src/train/train_qwen3.c), for every mesh, a world of one included; NULL
 * (a model of its own, in tests) runs as a world of one without them. With more than one
 * process the model's params / grads are this rank's slices. */
typedef struct TrainParallel {
    void *ctx;
    Comm *world; /* every rank of the job: sharded checkpoints, agreement */
    /* [dp_replicate, dp_shard, tp, expert_parallel], recorded with sharded checkpoints (the
     * same degrees with another ep hold other pieces: a resume reshards) */
    int mesh[4];
    /* After a step's micro-batches: completes this rank's gradient slices and sums *loss_sum
     * over the data-parallel ranks (in place). */
    int (*finish_grads)(void *ctx, double *loss_sum, Err *err);
    /* The global gradient norm from this rank's sum of squares over its slices. */
    int (*grad_norm)(void *ctx, double local_sq, double *norm, Err *err);
    /* Seconds spent in collectives since the previous call (metrics' comm_s). */
    double (*comm_seconds)(void *ctx);
} TrainParallel;

typedef struct TrainerOptions {
    int64_t steps;     /* [training] steps */
    int micro_batches; /* gradient accumulation steps per optimizer step (>= 1) */
    double lr;         /* [optimizer] lr; the schedule multiplies it */
    int64_t warmup_steps;
    int64_t schedule_steps; /* the schedule's length; < 1: steps */
    double decay_ratio;     /* < 0: none */
    DecayType decay_type;   /* 0: linear */
    double min_lr_factor;
    AdamWConfig adamw;
    double max_norm;    /* <= 0: no clipping (the norm is still reported) */
    int skip_nonfinite; /* 1: a step with a non-finite loss or norm skips its update; 0: error */
    const char *dump_folder;
    int ckpt_enable;
    const char *ckpt_folder;  /* under dump_folder, or absolute; default "checkpoint" */
    int64_t ckpt_interval;    /* save every N steps and at the last step */
    int ckpt_first_step;      /* and after step 1 (checkpoint.enable_first_step_checkpoint) */
    int ckpt_load_only;       /* resume, but save nothing (checkpoint.load_only) */
    int last_save_model_only; /* the last step's checkpoint holds the weights only */
    int keep_latest_k;
    /* checkpoint.async_mode = "async": a save before the last copies the state and writes it
     * in a thread while the next steps run (train/ckpt_async.h) */
    int ckpt_async;
    int64_t load_step; /* resume from this step; <= 0: the newest */
    /* checkpoint.initial_load_model_only = false: when the job's own folder holds no step (or
     * checkpointing is off), resume every state from step initial_step (-1: the newest) of
     * the checkpoint folder initial_root instead, only reading it (ckpt_dist_initial_path). */
    const char *initial_root;
    int64_t initial_step;
    int exclude; /* CKPT_EXCLUDE bits (core/config.h): state a resume leaves fresh */
    int log_freq;
    /* TensorBoard events of the step scalars under this folder, NULL = none; written by rank
     * 0, or by every rank (each its own folder) with tb_all_ranks. */
    const char *tb_dir;
    int tb_all_ranks;
    /* Profiler traces (core/trace.h) of every trace_freq-th step under this folder, NULL =
     * none. */
    const char *trace_dir;
    int64_t trace_freq;
    double peak_tflops;     /* <= 0: measured at start-up */
    int bf16_matmuls;       /* mixed precision: the measured peak is the bf16 unit's */
    double flops_per_token; /* metrics_flops_per_token of the model */
    uint64_t seed;
    uint64_t config_hash;
    int gemm_bf16; /* CkptState.gemm_bf16 of this run, saved into every checkpoint */
    /* The job config key by key (ckpt_config_keys), saved into every checkpoint so that a
     * resume names the keys that changed; NULL = the hash alone. */
    json_t *config;
    const CkptFile *ckpt_files; /* (n_ckpt_files) saved into every checkpoint (config.json, ...) */
    int n_ckpt_files;
    /* Called once the run's starting point is settled (resumed from a checkpoint, or none to
     * resume), before the first step, when checkpoints are enabled; may be NULL. */
    int (*on_resumed)(void *ctx, Err *err);
    void *on_resumed_ctx;
    /* Called once the checkpoint of the last step is committed, with its directory (the HF
     * export of checkpoint.last_save_in_hf); may be NULL. */
    int (*on_last_save)(void *ctx, const char *step_dir, Err *err);
    void *on_last_save_ctx;
    /* Called after every step with its metrics (tests, progress hooks); may be NULL. */
    void (*on_step)(void *ctx, const StepMetrics *m);
    void *on_step_ctx;
    /* Called after every step (1-based), before its checkpoint, with the metrics writer (NULL
     * on ranks that do not write): validation and samples run here. last is 1 on the final
     * step. It must leave parameters, gradients and optimizer state as they are. May be NULL. */
    int (*after_step)(void *ctx, int64_t step, int last, MetricsWriter *mw, Err *err);
    void *after_step_ctx;
    const TrainParallel *par; /* NULL: a world of one without mesh hooks */
} TrainerOptions;

/* Trains from the newest complete checkpoint in {dump_folder}/{ckpt_folder} (or step
 * load_step) when one exists (else from the model's current parameters) up to opts->steps. A
 * checkpoint written on another mesh (or by one process, or for one process) is resharded on
 * load: every rank copies its slices out of the files' slices. A non-finite loss or gradient
 * norm stops with an error naming the step, or with skip_nonfinite leaves the parameters and
 * optimizer state untouched for that step (which still counts) and goes on. A checkpoint is
 * never written from parameters holding a non-finite value: that save is an error instead. */
int trainer_run(const TrainerOptions *opts, TrainModel *model, TrainData *data, Err *err);

#endif
