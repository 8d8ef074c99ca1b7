/* The job config (docs/config.md): torchtitan-style TOML sections with their defaults, command-line
 * overrides (--section.key=value), and one-sentence errors that name file:line, key and what is
 * allowed (unknown keys suggest the nearest valid one).
 *
 * Checks here are local to one key (ranges, enum choices) or to the file's structure. Checks
 * that need the model spec or the world size (seq_len <= max_seq_len, batch divisibility,
 * tensor-parallel head splits, kernel names) belong to the trainer.
 *
 * Datasets: there is no [datasets] section. training.dataset names the data and
 * config_dataset_path() resolves it: training.dataset_path when set (a JSONL / text file or a
 * glob); otherwise the built-in name "c4_test", which is $QT_C4_TEST_PATH when that variable is
 * set and non-empty, else ../shared/data/c4_sample/c4_sample.jsonl relative to the current
 * directory. Any other name without a dataset_path is an error ("c4" says where C4 comes from).
 *
 * torchtitan's keys: those qtitan implements are rows of KEYS (debug.seed is training.seed);
 * the rest are rows of config_compat.c, accepted with a notice or refused by value. Sections
 * nest ([quantize.linear.float8], --quantize.linear.float8.filter_fqns=output). */
#ifndef QT_CONFIG_H
#define QT_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include "core/ac_mode.h"
#include "core/config_compat.h"
#include "core/dtype.h"
#include "core/err.h"
#include "core/model_spec.h"

typedef enum DecayType { DECAY_LINEAR = 0, DECAY_SQRT, DECAY_COSINE } DecayType;
typedef enum DeviceKind { DEVICE_CPU = 0, DEVICE_CUDA, DEVICE_AUTO } DeviceKind;
typedef enum OptimizerKind { OPTIMIZER_ADAMW = 0, OPTIMIZER_ADAM } OptimizerKind;
/* What a training JSONL line holds: text to pack, or a conversation (docs/finetune.md). */
typedef enum DataFormat {
    DATA_TEXT = 0,
    DATA_MESSAGES,
    DATA_PROMPT_COMPLETION,
    DATA_INSTRUCTION
} DataFormat;
/* Where a sharded run's samples come from (sample.gather; docs/generate.md): chosen by the
 * plan's memory figures, a whole copy on rank 0, or one FSDP unit at a time. */
typedef enum SampleGather {
    SAMPLE_GATHER_AUTO = 0,
    SAMPLE_GATHER_WHOLE,
    SAMPLE_GATHER_UNITS
} SampleGather;
/* A conversation longer than seq_len. */
typedef enum TooLong { TOO_LONG_TRUNCATE = 0, TOO_LONG_DROP } TooLong;

/* One replacement of a model field ([model] n_layers = 4, or --model.n_layers=4), applied in
 * order by the trainer with model_spec_set_field(spec, field, value). A field appears at most
 * once: a later setting (the command line) replaces the value in place. */
typedef struct ModelFieldSet {
    char *field; /* a name model_spec_field_name gives */
    char *value; /* value text: "4", "0.001", "true" */
    int line;    /* line in the config file; 0 = command line */
} ModelFieldSet;

/* One [[override]] entry (docs/kernels.md). */
typedef struct KernelOverride {
    char *target;      /* glob over module FQNs, e.g. "layers.*.attention.rope" */
    char *kernel;      /* implementation name */
    char *description; /* free text, "" when absent */
    int line;          /* line of the [[override]] header (or inline table) */
} KernelOverride;

/* checkpoint.async_mode: torchtitan's names. "async_with_pinned_mem" stages in pinned host
 * memory for a GPU's copy-out; qtitan stages every device's tensors in host memory alike. */
typedef enum { CKPT_ASYNC_DISABLED = 0, CKPT_ASYNC, CKPT_ASYNC_PINNED } CkptAsyncMode;

/* Every string is owned by the config (never NULL; "" when empty); config_free releases them. */
typedef struct JobConfig {
    char *path; /* the config file read, "" when none */
    struct {
        char *dump_folder; /* "./outputs" */
        char *description;
        int print_config; /* rank 0 prints the resolved config as TOML at start-up */
    } job;
    struct {
        char *name;           /* "qwen3" (the only model family) */
        char *flavor;         /* "debugmodel", ..., or "hf" (architecture from hf_assets_path) */
        char *hf_assets_path; /* HF model directory (config.json, tokenizer) or "" */
        char *tokenizer_path; /* "" = use hf_assets_path */
        /* torchtitan's model converters, comma-joined: "lora" (LoRA adapters as [lora] says,
         * with torchtitan's defaults where [lora] is silent; config_load) or "" */
        char *converters;
        ModelFieldSet *fields; /* n_fields replacements in order */
        int n_fields;
    } model;
    struct {
        OptimizerKind name; /* "AdamW" */
        double lr, eps, beta1, beta2, weight_decay;
        int exempt_norms_and_embeddings; /* no weight decay on norms and embeddings */
    } optimizer;
    struct {
        int warmup_steps;
        /* Fraction of the steps after warmup spent decaying, the rest held at lr
         * (warmup-stable-decay). < 0 = unset: decay over all steps after warmup, as torchtitan's
         * decay_ratio = None. */
        double decay_ratio;
        DecayType decay_type;
        double min_lr_factor; /* the lr decays to lr * min_lr_factor */
        /* The schedule's length in steps (torchtitan's total_steps); -1 = unset: training.steps.
         * Longer than the run: the run ends part-way along it (to be resumed with more steps). */
        int total_steps;
    } lr_scheduler;
    struct {
        int local_batch_size;  /* rows per rank per micro-step */
        int global_batch_size; /* -1 = local_batch_size * data-parallel degree */
        int seq_len;
        int steps;
        double max_norm; /* gradient clipping by total norm */
        char *dataset;   /* "c4_test" or any name when dataset_path is set */
        char *dataset_path;
        /* The JSON Lines field / Parquet column of a document's text, for training and
         * validation data (TRL's dataset_text_field); "text" by default. */
        char *dataset_text_field;
        /* The chat template conversations are rendered with (TRL's chat_template_path): a
         * .jinja file, a tokenizer_config.json or a folder; "" = the tokenizer folder's. */
        char *chat_template_path;
        int64_t seed;
        int deterministic;
        DType mixed_precision_param; /* DT_F32 or DT_BF16 */
        DeviceKind device;
        int document_mask;  /* attention does not cross packed documents */
        int skip_nonfinite; /* skip the update of a step whose loss or grad norm is not finite */
        DataFormat data_format;  /* "text" (pretraining) or a conversation shape */
        int packing;             /* conversations: several a row (1) or one a row, padded (0) */
        int train_on_all_tokens; /* conversations: every token a target, not only the assistant's */
        TooLong long_conversations; /* conversations longer than seq_len */
    } training;
    struct {
        int data_parallel_replicate_degree;
        int data_parallel_shard_degree; /* -1 = what the world size leaves */
        int tensor_parallel_degree;
        int enable_sequence_parallel;
        /* experts of each MoE layer split over this many ranks (docs/distributed.md) */
        int expert_parallel_degree;
    } parallelism;
    struct {
        int enable;
        char *folder;                     /* under job.dump_folder */
        int interval;                     /* steps between saves */
        int enable_first_step_checkpoint; /* also save after step 1 */
        int load_only;                    /* resume from the folder, never save into it */
        int keep_latest_k;                /* 0 = keep all */
        char *initial_load_path;
        int initial_load_in_hf;
        /* 0: a training checkpoint at initial_load_path gives every state, not the model only */
        int initial_load_model_only;
        int last_save_in_hf;
        int last_save_model_only;
        DType export_dtype;         /* DT_F32, DT_BF16 or DT_F16 */
        int load_step;              /* resume from this step; -1 = the newest */
        char *exclude_from_loading; /* comma-joined CKPT_EXCLUDE names a resume leaves alone */
        CkptAsyncMode async_mode;   /* torchtitan's; both async modes write in a thread */
    } checkpoint;
    struct {
        AcMode mode; /* as written: AC_NONE, AC_SELECTIVE or AC_FULL; config_ac resolves */
        /* torchtitan's: "op" (selective mode keeps the matmul and attention outputs) or a
         * decimal n (every n-th layer checkpointed whole); read under mode = "selective" */
        char *selective_ac_option;
    } activation_checkpoint;
    struct {
        int log_freq;
        double peak_tflops;     /* per device, for MFU; 0 = measure */
        int enable_tensorboard; /* event files under DUMP/save_tb_folder/<run>/ */
        char *save_tb_folder;   /* "tb" */
        int save_for_all_ranks; /* every rank writes its own TensorBoard run, not rank 0 alone */
    } metrics;
    struct {
        /* Seconds a collective may wait for the other ranks before every rank stops with a
         * sentence naming the rank that stopped answering: init_timeout_seconds until the
         * first training step has finished, train_timeout_seconds after it. */
        int init_timeout_seconds;
        int train_timeout_seconds;
    } comm;
    struct {
        int rank;           /* 0 = no LoRA: every weight trains */
        double alpha;       /* adapters scale by alpha / rank */
        int use_rslora;     /* ... by alpha / sqrt(rank) instead (peft's use_rslora) */
        double dropout;     /* on the adapters' input, in training (model/lora.h) */
        char *targets;      /* comma-joined globs over module names (layers.*.attention.wq) */
        char *adapter_path; /* a peft adapter folder to start from, "" = fresh adapters */
        /* What the frozen base's matmul weights and embedding are held in: DT_BF16 halves
         * them and multiplies them in bf16 (as a peft user's torch_dtype=torch.bfloat16). */
        DType base_dtype;
    } lora;
    struct {
        int enable_profiling;     /* Chrome trace-event JSON of every profile_freq-th step */
        char *save_traces_folder; /* under job.dump_folder: "profile_traces" */
        int profile_freq;         /* steps between traced steps */
    } profiling;
    struct {
        int enable;
        char *dataset; /* "c4_test" or any name when dataset_path is set */
        char *dataset_path;
        int freq;             /* steps between validations (and at the last step) */
        int steps;            /* batches of local_batch_size rows; -1 = the whole set */
        int local_batch_size; /* rows per forward */
        int seq_len;          /* -1 = training.seq_len */
    } validation;
    struct {
        int freq;          /* steps between samples; 0 = off */
        char *prompts;     /* one prompt a line ("\n" separated) */
        char *prompt_file; /* one prompt a line */
        int max_new_tokens;
        double temperature;        /* 0 = greedy */
        int top_k;                 /* 0 = off */
        double top_p;              /* 1 = off */
        double min_p;              /* 0 = off */
        double repetition_penalty; /* transformers' repetition_penalty; 1 = off */
        int no_repeat_ngram_size;  /* 0 = off */
        int64_t seed;
        SampleGather gather;
        int chat;            /* prompts as user turns in the tokenizer's chat format */
        char *system;        /* with chat: a system turn first ("" = none) */
        int enable_thinking; /* with chat: 0 opens the answer with an empty think block */
    } sample;
    struct {
        /* MoE routers assign experts round-robin, not by score (Qwen3.moe_round_robin) */
        int moe_force_load_balance;
    } debug;
    KernelOverride *overrides; /* n_overrides entries in file order */
    int n_overrides;
    /* One line each for torchtitan keys accepted without effect (config_compat.h), in the
     * order met; the commands print them with config_log_notices. */
    char **notices;
    int n_notices;
    /* Those keys as last set by the file or the command line, with the line each would print;
     * config_load turns them into notices or a refusal once every source is read. */
    CompatSet *compat;
    int n_compat;
    /* Per key of config.c's table, where it was last set (FILE:LINE or "command line"); NULL
     * until a key is set. Read through config_origin. */
    char **origins;
} JobConfig;

/* Where "section.key" was last set, for a sentence about its value: "FILE:LINE", "command
 * line", or (a default) the config file's name. */
const char *config_origin(const JobConfig *cfg, const char *dotted_key);
/* Fills cfg with the defaults; pair with config_free. */
void config_init(JobConfig *cfg);
void config_free(JobConfig *cfg);

/* config_init, then reads the TOML file at path (NULL = take it from --config; no file at all
 * = defaults only), then applies argv[0..argc): the arguments after the subcommand name, each
 * one of --config FILE, --config=FILE, --section.key=value or --section.key value (a boolean
 * key alone means true). Command-line values win over the file and are typed like TOML values,
 * except that a string key takes the text as is. On error cfg is freed and zeroed. */
int config_load(JobConfig *cfg, const char *path, int argc, char **argv, Err *err);
/* Parses TOML text (path labels errors) on top of what cfg holds. */
int config_apply_toml(JobConfig *cfg, const char *text, size_t len, const char *path, Err *err);
/* Applies one "section.key" = value text as from the command line (origin labels errors). */
int config_apply_override(JobConfig *cfg, const char *dotted_key, const char *value,
                          const char *origin, Err *err);

/* Logs cfg's notices (log_info: rank 0 only), one line each. */
void config_log_notices(const JobConfig *cfg);

/* Writes the resolved config as TOML that config_load reads back to the same values. */
void config_dump(const JobConfig *cfg, FILE *f);

/* The data file (or glob) for training.dataset; see the file comment. *out is malloc'd. */
int config_dataset_path(const JobConfig *cfg, char **out, Err *err);
/* The tokenizer directory or file: model.tokenizer_path, else model.hf_assets_path; error when
 * both are empty. *out points into cfg. */
/* validation.dataset_path, or the built-in file of validation.dataset ("c4_test"), as
 * config_dataset_path. */
int config_validation_dataset_path(const JobConfig *cfg, char **out, Err *err);
int config_tokenizer_path(const JobConfig *cfg, const char **out, Err *err);
/* A training.data_format name ("text", "messages", "prompt_completion", "instruction") to its
 * format, for commands that read data as training does; -1 for any other name. */
int config_data_format(const char *name, DataFormat *out);
/* Applies cfg's [model] field replacements to spec in order with model_spec_set_field; an
 * error names where the field was set (file:line or the command line). The caller validates
 * the result (config_validate_model). */
int config_apply_model_fields(ModelSpec *spec, const JobConfig *cfg, Err *err);
/* model_spec_validate for a spec that cfg's [model] fields replaced; an error names where a
 * field it mentions was set (file:line or the command line). */
int config_validate_model(const ModelSpec *spec, const JobConfig *cfg, Err *err);
/* Micro-steps per optimizer step for a data-parallel degree dp:
 * global_batch_size / (local_batch_size * dp), which must divide exactly. */
int config_grad_accum_steps(const JobConfig *cfg, int dp, int *out, Err *err);

/* Names for the enum values (as written in TOML). */
const char *config_decay_type_name(DecayType t);
const char *config_device_name(DeviceKind d);
const char *config_ac_mode_name(AcMode m);
/* The checkpointing the model runs: activation_checkpoint.mode, made layer-wise
 * (ac_every) by a selective_ac_option of n under mode = "selective". */
AcMode config_ac(const JobConfig *cfg);
/* m in words for the plan's lines, written to buf: "none", "selective", "full" or
 * "every 2nd layer". */
const char *config_ac_text(AcMode m, char *buf, size_t cap);
/* The inverse of config_ac: the activation_checkpoint.mode to write (returned) and the
 * selective_ac_option ("op" or the layer count) that ask for m. */
#define CONFIG_AC_OPTION_CAP 16
AcMode config_ac_parts(AcMode m, char option[CONFIG_AC_OPTION_CAP]);
/* The command-line options that ask for m, written to buf:
 * "--activation_checkpoint.mode=selective --activation_checkpoint.selective_ac_option=2". */
const char *config_ac_flags(AcMode m, char *buf, size_t cap);
/* "float32", "bfloat16", "float16" for DT_F32 / DT_BF16 / DT_F16. */
const char *config_dtype_name(DType t);

/* What checkpoint.exclude_from_loading may name (torchtitan's state names): a resume keeps
 * the fresh model, optimizer state, learning-rate schedule (restarted from its first step) or
 * data position (restarted from the first row) instead of the checkpoint's. */
enum {
    CKPT_EXCLUDE_MODEL = 1,
    CKPT_EXCLUDE_OPTIMIZER = 2,
    CKPT_EXCLUDE_LR_SCHEDULER = 4,
    CKPT_EXCLUDE_DATALOADER = 8
};
/* The CKPT_EXCLUDE bits of a comma-joined list; a name outside them fails with a sentence. */
int config_exclude_bits(const char *list, int *bits, Err *err);

#endif
