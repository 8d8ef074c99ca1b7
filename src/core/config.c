/* Job config: one table of key descriptors (KEYS) drives typing, range checks, "did you mean"
 * suggestions and the dump, so a new key is one line there plus its struct field and default. */
#include "core/config.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config_compat.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/model_spec.h"
#include "core/strutil.h"
#include "core/toml.h"

#define C4_TEST_DEFAULT "../shared/data/c4_sample/c4_sample.jsonl"

/* K_LIST: an array of strings, kept joined by commas (none may hold one); the command line
 * gives the joined form. */
typedef enum { K_INT, K_I64, K_FLOAT, K_BOOL, K_STR, K_ENUM, K_LIST } Kind;

typedef struct Choice {
    const char *name;
    int value;
} Choice;

typedef struct KeyDesc {
    const char *section, *key;
    Kind kind;
    size_t off;
    double lo, hi;    /* inclusive range for numbers */
    int lo_open;      /* lo itself is excluded */
    int hi_open;      /* hi itself is excluded */
    int minus_one_ok; /* -1 is also allowed ("derive it") */
    const Choice *choices;
    const char *expect;   /* what is allowed, in words */
    const char *alias_of; /* torchtitan's other name for the key given here (not dumped) */
} KeyDesc;

static const Choice OPTIMIZERS[] = {
    {"AdamW", OPTIMIZER_ADAMW}, {"Adam", OPTIMIZER_ADAM}, {NULL, 0}};
static const Choice DECAYS[] = {
    {"linear", DECAY_LINEAR}, {"sqrt", DECAY_SQRT}, {"cosine", DECAY_COSINE}, {NULL, 0}};
static const Choice DEVICES[] = {
    {"cpu", DEVICE_CPU}, {"cuda", DEVICE_CUDA}, {"auto", DEVICE_AUTO}, {NULL, 0}};
static const Choice PARAM_DTYPES[] = {{"float32", DT_F32}, {"bfloat16", DT_BF16}, {NULL, 0}};
static const Choice EXPORT_DTYPES[] = {
    {"float32", DT_F32}, {"bfloat16", DT_BF16}, {"float16", DT_F16}, {NULL, 0}};
static const Choice CKPT_ASYNC_MODES[] = {{"disabled", CKPT_ASYNC_DISABLED},
                                          {"async", CKPT_ASYNC},
                                          {"async_with_pinned_mem", CKPT_ASYNC_PINNED},
                                          {NULL, 0}};
static const Choice AC_MODES[] = {
    {"none", AC_NONE}, {"selective", AC_SELECTIVE}, {"full", AC_FULL}, {NULL, 0}};
static const Choice DATA_FORMATS[] = {{"text", DATA_TEXT},
                                      {"messages", DATA_MESSAGES},
                                      {"prompt_completion", DATA_PROMPT_COMPLETION},
                                      {"instruction", DATA_INSTRUCTION},
                                      {NULL, 0}};
static const Choice TOO_LONG[] = {
    {"truncate", TOO_LONG_TRUNCATE}, {"drop", TOO_LONG_DROP}, {NULL, 0}};
static const Choice SAMPLE_GATHERS[] = {{"auto", SAMPLE_GATHER_AUTO},
                                        {"whole", SAMPLE_GATHER_WHOLE},
                                        {"units", SAMPLE_GATHER_UNITS},
                                        {NULL, 0}};
static const Choice MODEL_NAMES[] = {{"qwen3", 0}, {NULL, 0}};

_Static_assert(sizeof(DType) == sizeof(int) && sizeof(DecayType) == sizeof(int) &&
                   sizeof(DeviceKind) == sizeof(int) && sizeof(AcMode) == sizeof(int) &&
                   sizeof(OptimizerKind) == sizeof(int) && sizeof(DataFormat) == sizeof(int) &&
                   sizeof(TooLong) == sizeof(int) && sizeof(SampleGather) == sizeof(int) &&
                   sizeof(CkptAsyncMode) == sizeof(int),
               "enum fields are written through int pointers");

#define OFF(f) offsetof(JobConfig, f)
#define BIG 2147483647.0
#define STR(s, k)                                                                                  \
    { #s, #k, K_STR, OFF(s.k), 0, 0, 0, 0, 0, NULL, "a string", NULL }
#define LIST(s, k)                                                                                 \
    { #s, #k, K_LIST, OFF(s.k), 0, 0, 0, 0, 0, NULL, "an array of strings", NULL }
#define BOOL(s, k)                                                                                 \
    { #s, #k, K_BOOL, OFF(s.k), 0, 0, 0, 0, 0, NULL, "true or false", NULL }
#define INT(s, k, lo, m1, ex)                                                                      \
    { #s, #k, K_INT, OFF(s.k), lo, BIG, 0, 0, m1, NULL, ex, NULL }
#define ENUM(s, k, ch)                                                                             \
    { #s, #k, K_ENUM, OFF(s.k), 0, 0, 0, 0, 0, ch, NULL, NULL }
#define FLT(s, k, lo, hi, lo_open, hi_open, ex)                                                    \
    { #s, #k, K_FLOAT, OFF(s.k), lo, hi, lo_open, hi_open, 0, NULL, ex, NULL }

/* Sections in dump order; "model" also takes every model_spec_field_name name. Sections that only
 * hold compat rows (config_compat.c) are known through that table. */
static const char *const SECTIONS[] = {
    "job",      "model",       "optimizer",  "lr_scheduler",
    "training", "parallelism", "checkpoint", "activation_checkpoint",
    "metrics",  "validation",  "sample",     "profiling",
    "comm",     "lora",        "debug",      "override",
};
#define NSECTIONS ((int)(sizeof SECTIONS / sizeof SECTIONS[0]))

static const KeyDesc KEYS[] = {
    STR(job, dump_folder),
    STR(job, description),
    BOOL(job, print_config),
    {"model", "name", K_ENUM, OFF(model.name), 0, 0, 0, 0, 0, MODEL_NAMES, NULL, NULL},
    STR(model, flavor),
    STR(model, hf_assets_path),
    STR(model, tokenizer_path),
    LIST(model, converters),
    ENUM(optimizer, name, OPTIMIZERS),
    FLT(optimizer, lr, 0, INFINITY, 0, 1, "a number >= 0"),
    FLT(optimizer, eps, 0, INFINITY, 1, 1, "a number > 0"),
    FLT(optimizer, beta1, 0, 1, 0, 1, "a number in [0, 1)"),
    FLT(optimizer, beta2, 0, 1, 0, 1, "a number in [0, 1)"),
    FLT(optimizer, weight_decay, 0, INFINITY, 0, 1, "a number >= 0"),
    BOOL(optimizer, exempt_norms_and_embeddings),
    INT(lr_scheduler, warmup_steps, 0, 0, "an integer >= 0"),
    FLT(lr_scheduler, decay_ratio, 0, 1, 0, 0, "a number in [0, 1]"),
    ENUM(lr_scheduler, decay_type, DECAYS),
    FLT(lr_scheduler, min_lr_factor, 0, 1, 0, 0, "a number in [0, 1]"),
    INT(lr_scheduler, total_steps, 1, 1, "an integer >= 1, or -1 for training.steps"),
    INT(training, local_batch_size, 1, 0, "an integer >= 1"),
    INT(training, global_batch_size, 1, 1, "an integer >= 1, or -1 for local_batch_size x dp"),
    INT(training, seq_len, 1, 0, "an integer >= 1"),
    INT(training, steps, 1, 0, "an integer >= 1"),
    /* inf turns clipping off, as torch.nn.utils.clip_grad_norm_(max_norm=inf) does; 0 would
     * zero every gradient there, so it is an error rather than a second spelling of "off". */
    FLT(training, max_norm, 0, INFINITY, 1, 0, "a number > 0, or inf for no clipping"),
    STR(training, dataset),
    STR(training, dataset_path),
    STR(training, dataset_text_field),
    STR(training, chat_template_path),
    {"training", "seed", K_I64, OFF(training.seed), 0, 9.2e18, 0, 0, 0, NULL, "an integer >= 0",
     NULL},
    BOOL(training, deterministic),
    ENUM(training, mixed_precision_param, PARAM_DTYPES),
    ENUM(training, device, DEVICES),
    BOOL(training, document_mask),
    BOOL(training, skip_nonfinite),
    ENUM(training, data_format, DATA_FORMATS),
    BOOL(training, packing),
    BOOL(training, train_on_all_tokens),
    ENUM(training, long_conversations, TOO_LONG),
    INT(parallelism, data_parallel_replicate_degree, 1, 0, "an integer >= 1"),
    INT(parallelism, data_parallel_shard_degree, 1, 1, "an integer >= 1, or -1 for the rest"),
    INT(parallelism, tensor_parallel_degree, 1, 0, "an integer >= 1"),
    BOOL(parallelism, enable_sequence_parallel),
    INT(parallelism, expert_parallel_degree, 1, 0, "an integer >= 1"),
    BOOL(checkpoint, enable),
    STR(checkpoint, folder),
    INT(checkpoint, interval, 1, 0, "an integer >= 1"),
    BOOL(checkpoint, enable_first_step_checkpoint),
    BOOL(checkpoint, load_only),
    INT(checkpoint, keep_latest_k, 0, 0, "an integer >= 0 (0 keeps all)"),
    STR(checkpoint, initial_load_path),
    BOOL(checkpoint, initial_load_in_hf),
    BOOL(checkpoint, initial_load_model_only),
    BOOL(checkpoint, last_save_in_hf),
    BOOL(checkpoint, last_save_model_only),
    ENUM(checkpoint, export_dtype, EXPORT_DTYPES),
    INT(checkpoint, load_step, 1, 1, "a step number >= 1, or -1 for the newest"),
    LIST(checkpoint, exclude_from_loading),
    ENUM(checkpoint, async_mode, CKPT_ASYNC_MODES),
    ENUM(activation_checkpoint, mode, AC_MODES),
    STR(activation_checkpoint, selective_ac_option),
    /* torchtitan's recipes also name the dataset as [training.data] name. */
    {"training.data", "name", K_STR, OFF(training.dataset), 0, 0, 0, 0, 0, NULL, "a string",
     "training.dataset"},
    /* torchtitan's names before its 2025 renames, for recipes written then. */
    {"training", "batch_size", K_INT, OFF(training.local_batch_size), 1, BIG, 0, 0, 0, NULL,
     "an integer >= 1", "training.local_batch_size"},
    {"checkpoint", "enable_checkpoint", K_BOOL, OFF(checkpoint.enable), 0, 0, 0, 0, 0, NULL,
     "true or false", "checkpoint.enable"},
    {"validation", "enabled", K_BOOL, OFF(validation.enable), 0, 0, 0, 0, 0, NULL, "true or false",
     "validation.enable"},
    {"job", "print_args", K_BOOL, OFF(job.print_config), 0, 0, 0, 0, 0, NULL, "true or false",
     "job.print_config"},
    {"lr_scheduler", "lr_min", K_FLOAT, OFF(lr_scheduler.min_lr_factor), 0, 1, 0, 0, 0, NULL,
     "a number in [0, 1]", "lr_scheduler.min_lr_factor"},
    {"checkpoint", "model_weights_only", K_BOOL, OFF(checkpoint.last_save_model_only), 0, 0, 0, 0,
     0, NULL, "true or false", "checkpoint.last_save_model_only"},
    {"training", "debug_moe_force_load_balance", K_BOOL, OFF(debug.moe_force_load_balance), 0, 0, 0,
     0, 0, NULL, "true or false", "debug.moe_force_load_balance"},
    /* torchtitan moved these two to [debug]; both names set the one field. */
    {"debug", "seed", K_I64, OFF(training.seed), 0, 9.2e18, 0, 0, 0, NULL, "an integer >= 0",
     "training.seed"},
    {"debug", "deterministic", K_BOOL, OFF(training.deterministic), 0, 0, 0, 0, 0, NULL,
     "true or false", "training.deterministic"},
    BOOL(debug, moe_force_load_balance),
    INT(metrics, log_freq, 1, 0, "an integer >= 1"),
    FLT(metrics, peak_tflops, 0, INFINITY, 0, 1, "a number >= 0 (0 = measure)"),
    INT(comm, init_timeout_seconds, 1, 0, "an integer >= 1"),
    INT(comm, train_timeout_seconds, 1, 0, "an integer >= 1"),
    BOOL(metrics, enable_tensorboard),
    STR(metrics, save_tb_folder),
    BOOL(metrics, save_for_all_ranks),
    BOOL(profiling, enable_profiling),
    STR(profiling, save_traces_folder),
    INT(profiling, profile_freq, 1, 0, "an integer >= 1"),
    BOOL(validation, enable),
    STR(validation, dataset),
    STR(validation, dataset_path),
    INT(validation, freq, 1, 0, "an integer >= 1"),
    INT(validation, steps, 1, 1, "an integer >= 1, or -1 for the whole set"),
    INT(validation, local_batch_size, 1, 0, "an integer >= 1"),
    INT(validation, seq_len, 1, 1, "an integer >= 1, or -1 for training.seq_len"),
    INT(sample, freq, 0, 0, "an integer >= 0 (0 = off)"),
    STR(sample, prompts),
    STR(sample, prompt_file),
    INT(sample, max_new_tokens, 1, 0, "an integer >= 1"),
    FLT(sample, temperature, 0, INFINITY, 0, 1, "a number >= 0 (0 = greedy)"),
    INT(sample, top_k, 0, 0, "an integer >= 0 (0 = off)"),
    FLT(sample, top_p, 0, 1, 1, 0, "a number in (0, 1] (1 = off)"),
    FLT(sample, min_p, 0, 1, 0, 0, "a number in [0, 1] (0 = off)"),
    FLT(sample, repetition_penalty, 0, INFINITY, 1, 1, "a number > 0 (1 = off)"),
    INT(sample, no_repeat_ngram_size, 0, 0, "an integer >= 0 (0 = off)"),
    {"sample", "seed", K_I64, OFF(sample.seed), 0, 9.2e18, 0, 0, 0, NULL, "an integer >= 0", NULL},
    ENUM(sample, gather, SAMPLE_GATHERS),
    BOOL(sample, chat),
    STR(sample, system),
    BOOL(sample, enable_thinking),
    INT(lora, rank, 0, 0, "an integer >= 0 (0 = no LoRA)"),
    FLT(lora, alpha, 0, INFINITY, 1, 1, "a number > 0"),
    BOOL(lora, use_rslora),
    FLT(lora, dropout, 0, 1, 0, 1, "a number in [0, 1)"),
    LIST(lora, targets),
    /* torchtitan's LoRA converter's switch: sets lora.targets (true: every linear of the
     * layers, false: the attention's four). */
    {"lora", "apply_to_all_linears", K_BOOL, OFF(lora.targets), 0, 0, 0, 0, 0, NULL,
     "true or false", "lora.targets"},
    STR(lora, adapter_path),
    ENUM(lora, base_dtype, PARAM_DTYPES),
};
#define NKEYS ((int)(sizeof KEYS / sizeof KEYS[0]))

static const char *const OVERRIDE_KEYS[] = {"target", "kernel", "description"};

/* ---- small helpers ---- */

static void set_str(char **dst, const char *s) {
    free(*dst);
    *dst = xstrdup(s);
}

/* Shortest text that reads back as the same double; always looks like a TOML float. */
static void fmt_double(char *out, size_t cap, double v) {
    if (isnan(v)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(v)) {
        snprintf(out, cap, v < 0 ? "-inf" : "inf");
        return;
    }
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(out, cap, "%.1f", v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, cap, "%.*g", prec, v);
        if (strtod(out, NULL) == v) break;
    }
    if (!strpbrk(out, ".eEn")) strncat(out, ".0", cap - strlen(out) - 1);
}

/* A value as the user wrote it, for messages. */
static void fmt_value(char *out, size_t cap, const TomlValue *v) {
    switch (v->type) {
    case TOML_STRING:
        snprintf(out, cap, "\"%.200s\"", v->s);
        return;
    case TOML_INT:
        snprintf(out, cap, "%lld", (long long)v->i);
        return;
    case TOML_FLOAT:
        fmt_double(out, cap, v->f);
        return;
    case TOML_BOOL:
        snprintf(out, cap, "%s", v->b ? "true" : "false");
        return;
    case TOML_ARRAY: {
        /* Written out (["model", "loss"]) so compat values compare as text; cut when long. */
        size_t o = (size_t)snprintf(out, cap, "[");
        for (int i = 0; i < v->n && o + 8 < cap; i++) {
            char item[256];
            fmt_value(item, sizeof item, v->items[i]);
            o += (size_t)snprintf(out + o, cap - o, "%s%s", i ? ", " : "", item);
        }
        if (o < cap) snprintf(out + o, cap - o, "]");
        return;
    }
    case TOML_TABLE:
        snprintf(out, cap, "a table");
        return;
    }
}

static const char *choice_name(const Choice *c, int value) {
    for (; c->name; c++)
        if (c->value == value) return c->name;
    return "?";
}

static void choice_list(char *out, size_t cap, const Choice *c) {
    size_t o = 0;
    out[0] = 0;
    for (int i = 0; c[i].name && o < cap; i++)
        o += (size_t)snprintf(out + o, cap - o, "%s\"%s\"", i ? ", " : "", c[i].name);
}

static int is_model_field(const char *key) {
    for (int i = 0; i < MODEL_SPEC_NFIELDS; i++)
        if (strcmp(model_spec_field_name(i), key) == 0) return 1;
    return 0;
}

static const KeyDesc *find_key(const char *section, const char *key) {
    for (int i = 0; i < NKEYS; i++)
        if (strcmp(KEYS[i].section, section) == 0 && strcmp(KEYS[i].key, key) == 0) return &KEYS[i];
    return NULL;
}

/* A section of KEYS or of the compat table, or a table above one ("quantize" above
 * "quantize.linear.float8"). */
static int is_section(const char *s) {
    for (int i = 0; i < NSECTIONS; i++)
        if (strcmp(SECTIONS[i], s) == 0) return 1;
    size_t n = strlen(s);
    for (int i = 0; i < NKEYS; i++)
        if (strcmp(KEYS[i].section, s) == 0) return 1;
    for (int i = 0; i < CONFIG_COMPAT_N; i++) {
        const char *c = CONFIG_COMPAT[i].section;
        if (strncmp(c, s, n) == 0 && (c[n] == 0 || c[n] == '.')) return 1;
    }
    return 0;
}

static int unknown_section(const char *where, const char *name, Err *err) {
    const char *near = str_nearest(name, SECTIONS, NSECTIONS);
    if (near)
        return err_set(err, "%s: unknown section [%s]; did you mean [%s]?", where, name, near);
    return err_set(err, "%s: unknown section [%s]", where, name);
}

static int unknown_key(const char *where, const char *section, const char *key, Err *err) {
    const char *cand[NKEYS + 160];
    size_t n = 0;
    if (strcmp(section, "override") == 0) {
        for (int i = 0; i < 3; i++)
            cand[n++] = OVERRIDE_KEYS[i];
    } else {
        for (int i = 0; i < NKEYS; i++)
            if (strcmp(KEYS[i].section, section) == 0) cand[n++] = KEYS[i].key;
        for (int i = 0; i < CONFIG_COMPAT_N && n < sizeof cand / sizeof cand[0]; i++)
            if (strcmp(CONFIG_COMPAT[i].section, section) == 0) cand[n++] = CONFIG_COMPAT[i].key;
        if (strcmp(section, "model") == 0)
            for (int i = 0; i < MODEL_SPEC_NFIELDS && n < sizeof cand / sizeof cand[0]; i++)
                cand[n++] = model_spec_field_name(i);
    }
    const char *near = str_nearest(key, cand, n);
    if (near)
        return err_set(err, "%s: unknown key \"%s\" in [%s]; did you mean \"%s\"?", where, key,
                       section, near);
    return err_set(err, "%s: unknown key \"%s\" in [%s]", where, key, section);
}

/* ---- setting values ---- */

/* A list key's value as TOML text: the command line's comma-separated form shown as the list it
 * stands for. */
static void fmt_list_value(char *shown, size_t cap, const TomlValue *v) {
    if (v->type != TOML_STRING) {
        fmt_value(shown, cap, v);
        return;
    }
    size_t o = (size_t)snprintf(shown, cap, "[");
    const char *p = v->s;
    while (*p && o + 8 < cap) {
        size_t n = strcspn(p, ",");
        o += (size_t)snprintf(shown + o, cap - o, "%s\"%.*s\"", o > 1 ? ", " : "",
                              (int)(n > 200 ? 200 : n), p);
        p += n + (p[n] == ',');
    }
    if (o < cap) snprintf(shown + o, cap - o, "]");
}

/* lora.targets as torchtitan's lora.apply_to_all_linears sets it. */
#define LORA_ALL_LINEARS "all-linear"
#define LORA_ATTENTION_LINEARS                                                                     \
    "layers.*.attention.wq,layers.*.attention.wk,layers.*.attention.wv,layers.*.attention.wo"
/* torchtitan's LoRA converter's rank where [lora] gives none. */
#define LORA_CONVERTER_RANK 8

static int set_key_value(JobConfig *cfg, const KeyDesc *d, const TomlValue *v, const char *where,
                         Err *err) {
    char *field = (char *)cfg + d->off;
    char shown[256];
    fmt_value(shown, sizeof shown, v);
    if (d->kind == K_BOOL && d->off == OFF(lora.targets)) { /* lora.apply_to_all_linears */
        if (v->type != TOML_BOOL) goto wrong_type;
        set_str((char **)field, v->b ? LORA_ALL_LINEARS : LORA_ATTENTION_LINEARS);
        return 0;
    }
    switch (d->kind) {
    case K_LIST: {
        if (v->type == TOML_STRING) { /* the command line's joined form */
            set_str((char **)field, v->s);
            return 0;
        }
        if (v->type != TOML_ARRAY) break;
        size_t len = 1;
        for (int i = 0; i < v->n; i++) {
            if (v->items[i]->type != TOML_STRING || !v->items[i]->s[0] ||
                strchr(v->items[i]->s, ','))
                return err_set(err, "%s: %s.%s item %d must be a non-empty string without commas",
                               where, d->section, d->key, i + 1);
            len += strlen(v->items[i]->s) + 1;
        }
        char *joined = xcalloc(len, 1);
        for (int i = 0; i < v->n; i++) {
            if (i) strcat(joined, ",");
            strcat(joined, v->items[i]->s);
        }
        free(*(char **)field);
        *(char **)field = joined;
        return 0;
    }
    case K_STR:
        if (v->type != TOML_STRING) break;
        if (d->off == OFF(model.flavor) && strcmp(v->s, "hf") != 0) {
            ModelSpec scratch;
            if (model_spec_flavor(&scratch, v->s, err) != 0) return err_wrap(err, "%s", where);
        }
        /* An empty dump folder fails later with a message that names no path. */
        if (d->off == OFF(job.dump_folder) && !v->s[0])
            return err_set(err, "%s: job.dump_folder = \"\" is empty; expected a directory path",
                           where);
        set_str((char **)field, v->s);
        return 0;
    case K_BOOL:
        if (v->type != TOML_BOOL) break;
        *(int *)field = v->b;
        return 0;
    case K_ENUM: {
        char list[256];
        choice_list(list, sizeof list, d->choices);
        if (v->type != TOML_STRING)
            return err_set(err, "%s: %s.%s = %s has the wrong type; expected one of %s", where,
                           d->section, d->key, shown, list);
        for (const Choice *c = d->choices; c->name; c++) {
            if (strcmp(c->name, v->s) != 0) continue;
            if (d->choices == MODEL_NAMES)
                set_str((char **)field, c->name);
            else
                *(int *)field = c->value;
            return 0;
        }
        return err_set(err, "%s: %s.%s = %s is not allowed; expected one of %s", where, d->section,
                       d->key, shown, list);
    }
    case K_INT:
    case K_I64: {
        if (v->type != TOML_INT) break;
        int ok =
            (d->minus_one_ok && v->i == -1) || ((double)v->i >= d->lo && (double)v->i <= d->hi);
        if (!ok)
            return err_set(err, "%s: %s.%s = %s is out of range; expected %s", where, d->section,
                           d->key, shown, d->expect);
        if (d->kind == K_INT)
            *(int *)field = (int)v->i;
        else
            *(int64_t *)field = v->i;
        return 0;
    }
    case K_FLOAT: {
        if (v->type != TOML_INT && v->type != TOML_FLOAT) break;
        double x = v->type == TOML_INT ? (double)v->i : v->f;
        /* Infinities pass only where the range includes them (max_norm). */
        int ok = !isnan(x) && (d->lo_open ? x > d->lo : x >= d->lo) &&
                 (d->hi_open ? x < d->hi : x <= d->hi);
        if (!ok)
            return err_set(err, "%s: %s.%s = %s is out of range; expected %s", where, d->section,
                           d->key, shown, d->expect);
        *(double *)field = x;
        return 0;
    }
    }
wrong_type:
    return err_set(err, "%s: %s.%s = %s has the wrong type (%s); expected %s", where, d->section,
                   d->key, shown, toml_type_name(v->type), d->expect);
}

/* Sets a key and remembers where (FILE:LINE or "command line"), for sentences about it that
 * only later checks can make (config_origin). */
static int set_key(JobConfig *cfg, const KeyDesc *d, const TomlValue *v, const char *where,
                   Err *err) {
    TRY(set_key_value(cfg, d, v, where, err));
    if (!cfg->origins) cfg->origins = xcalloc(NKEYS, sizeof *cfg->origins);
    set_str(&cfg->origins[d - KEYS], where);
    return 0;
}

const char *config_origin(const JobConfig *cfg, const char *dotted_key) {
    const char *dot = strrchr(dotted_key, '.');
    char section[128];
    snprintf(section, sizeof section, "%.*s", dot ? (int)(dot - dotted_key) : 0, dotted_key);
    const KeyDesc *d = dot ? find_key(section, dot + 1) : NULL;
    if (d && cfg->origins && cfg->origins[d - KEYS]) return cfg->origins[d - KEYS];
    return cfg->path && cfg->path[0] ? cfg->path : "the job config";
}

/* A model field replacement: typed like the field (checked on a scratch spec), kept as text. */
static int set_model_field(JobConfig *cfg, const char *field, const TomlValue *v, int line,
                           const char *where, Err *err) {
    char text[64];
    int string = model_spec_field_is_string(field);
    if (string && v->type == TOML_STRING)
        snprintf(text, sizeof text, "%s", v->s);
    else if (!string && v->type == TOML_INT)
        snprintf(text, sizeof text, "%lld", (long long)v->i);
    else if (!string && v->type == TOML_FLOAT)
        fmt_double(text, sizeof text, v->f);
    else if (!string && v->type == TOML_BOOL)
        snprintf(text, sizeof text, "%s", v->b ? "true" : "false");
    else {
        char shown[256];
        fmt_value(shown, sizeof shown, v);
        return err_set(err, "%s: model.%s = %s has the wrong type (%s); expected %s", where, field,
                       shown, toml_type_name(v->type),
                       string ? "a string" : "a number or a boolean");
    }
    ModelSpec scratch;
    memset(&scratch, 0, sizeof scratch);
    if (model_spec_set_field(&scratch, field, text, err) != 0) return err_wrap(err, "%s", where);
    for (int i = 0; i < cfg->model.n_fields; i++) {
        ModelFieldSet *m = &cfg->model.fields[i];
        if (strcmp(m->field, field) == 0) {
            set_str(&m->value, text);
            m->line = line;
            return 0;
        }
    }
    cfg->model.fields =
        xrealloc(cfg->model.fields, (size_t)(cfg->model.n_fields + 1) * sizeof *cfg->model.fields);
    ModelFieldSet *m = &cfg->model.fields[cfg->model.n_fields++];
    m->field = xstrdup(field);
    m->value = xstrdup(text);
    m->line = line;
    return 0;
}

static void add_notice(JobConfig *cfg, const char *line) {
    cfg->notices = xrealloc(cfg->notices, (size_t)(cfg->n_notices + 1) * sizeof *cfg->notices);
    cfg->notices[cfg->n_notices++] = xstrdup(line);
}

/* A torchtitan key without a field here (config_compat.h): checks the type, then accepts the
 * value silently when it is one qtitan already honours, else notes or refuses it. */
static int apply_compat(JobConfig *cfg, const CompatKey *c, const TomlValue *v, const char *where,
                        Err *err) {
    char shown[512];
    fmt_value(shown, sizeof shown, v);
    static const struct {
        char type;
        const char *words;
    } EXPECT[] = {{'b', "true or false"},
                  {'i', "an integer"},
                  {'n', "a number"},
                  {'s', "a string"},
                  {'l', "a list of strings"}};
    int ok = 0;
    switch (c->type) {
    case 'b':
        ok = v->type == TOML_BOOL;
        break;
    case 'i':
        ok = v->type == TOML_INT;
        break;
    case 'n':
        ok = v->type == TOML_INT || v->type == TOML_FLOAT;
        break;
    case 's':
        ok = v->type == TOML_STRING;
        break;
    case 'l':
        ok = v->type == TOML_ARRAY || v->type == TOML_STRING;
        fmt_list_value(shown, sizeof shown, v);
        break;
    }
    if (!ok) {
        const char *words = "?";
        for (size_t i = 0; i < sizeof EXPECT / sizeof EXPECT[0]; i++)
            if (EXPECT[i].type == c->type) words = EXPECT[i].words;
        return err_set(err, "%s: %s.%s = %s has the wrong type (%s); expected %s", where,
                       c->section, c->key, shown, toml_type_name(v->type), words);
    }
    int same = 0;
    if (c->same) {
        same = strcmp(c->same, "*") == 0;
        size_t n = strlen(shown);
        for (const char *p = c->same; *p && !same;) {
            size_t k = strcspn(p, "|");
            same = k == n && strncmp(p, shown, n) == 0;
            p += k + (p[k] == '|');
        }
    }
    /* Settled when every source has spoken (compat_settle): the command line may set the key
     * again, and its value is the one that counts, as torchtitan's CLI overrides its TOML. */
    CompatSet *e = NULL;
    for (int i = 0; i < cfg->n_compat && !e; i++)
        if (cfg->compat[i].key == c) e = &cfg->compat[i];
    if (!e) {
        cfg->compat = xrealloc(cfg->compat, (size_t)(cfg->n_compat + 1) * sizeof *cfg->compat);
        e = &cfg->compat[cfg->n_compat++];
        e->line = NULL;
    }
    free(e->line);
    e->key = c;
    e->action = same ? COMPAT_SAME : c->other;
    char line[1600];
    snprintf(line, sizeof line, "%s: %s.%s = %s %s: %s", where, c->section, c->key, shown,
             c->other == COMPAT_REFUSE ? "is not available" : "has no effect here", c->reason);
    e->line = xstrdup(line);
    return 0;
}

/* The torchtitan keys without a field here, as last set: a value qtitan cannot honour stops
 * the run with its sentence, one without effect becomes a notice (in the order first met). */
static int compat_settle(JobConfig *cfg, Err *err) {
    for (int i = 0; i < cfg->n_compat; i++)
        if (cfg->compat[i].action == COMPAT_REFUSE) return err_set(err, "%s", cfg->compat[i].line);
    for (int i = 0; i < cfg->n_compat; i++)
        if (cfg->compat[i].action == COMPAT_NOTICE) add_notice(cfg, cfg->compat[i].line);
    return 0;
}

static int apply_override_entry(JobConfig *cfg, const TomlValue *t, const char *path, Err *err) {
    char where[1100];
    snprintf(where, sizeof where, "%s:%d", path, t->line);
    if (t->type != TOML_TABLE)
        return err_set(err, "%s: override entries must be tables ([[override]]), not %s", where,
                       toml_type_name(t->type));
    const char *vals[3] = {NULL, NULL, ""};
    for (int i = 0; i < t->n; i++) {
        const TomlKeyVal *e = &t->kv[i];
        snprintf(where, sizeof where, "%s:%d", path, e->line);
        int k = -1;
        for (int j = 0; j < 3; j++)
            if (strcmp(e->key, OVERRIDE_KEYS[j]) == 0) k = j;
        if (k < 0) return unknown_key(where, "override", e->key, err);
        if (e->value->type != TOML_STRING) {
            char shown[256];
            fmt_value(shown, sizeof shown, e->value);
            return err_set(err, "%s: override.%s = %s has the wrong type (%s); expected a string",
                           where, e->key, shown, toml_type_name(e->value->type));
        }
        vals[k] = e->value->s;
    }
    snprintf(where, sizeof where, "%s:%d", path, t->line);
    for (int j = 0; j < 2; j++)
        if (!vals[j] || !vals[j][0])
            return err_set(err, "%s: [[override]] entry needs a non-empty %s", where,
                           OVERRIDE_KEYS[j]);
    cfg->overrides =
        xrealloc(cfg->overrides, (size_t)(cfg->n_overrides + 1) * sizeof *cfg->overrides);
    KernelOverride *o = &cfg->overrides[cfg->n_overrides++];
    o->target = xstrdup(vals[0]);
    o->kernel = xstrdup(vals[1]);
    o->description = xstrdup(vals[2]);
    o->line = t->line;
    return 0;
}

static int apply_section(JobConfig *cfg, const char *section, const TomlValue *t, const char *path,
                         Err *err) {
    char where[1100];
    for (int i = 0; i < t->n; i++) {
        const TomlKeyVal *e = &t->kv[i];
        snprintf(where, sizeof where, "%s:%d", path, e->line);
        if (strcmp(section, "model") == 0 && is_model_field(e->key)) {
            TRY(set_model_field(cfg, e->key, e->value, e->line, where, err));
            continue;
        }
        const KeyDesc *d = find_key(section, e->key);
        if (d) {
            TRY(set_key(cfg, d, e->value, where, err));
            continue;
        }
        const CompatKey *c = config_compat_find(section, e->key);
        if (c) {
            TRY(apply_compat(cfg, c, e->value, where, err));
            continue;
        }
        char sub[256];
        snprintf(sub, sizeof sub, "%s.%s", section, e->key);
        if (e->value->type == TOML_TABLE && is_section(sub)) {
            TRY(apply_section(cfg, sub, e->value, path, err));
            continue;
        }
        return unknown_key(where, section, e->key, err);
    }
    return 0;
}

static int apply_toml(JobConfig *cfg, const char *text, size_t len, const char *path, Err *err);

int config_apply_toml(JobConfig *cfg, const char *text, size_t len, const char *path, Err *err) {
    size_t scope = err_oom_push("reading %s", path);
    int rc = apply_toml(cfg, text, len, path, err);
    err_oom_pop(scope);
    return rc;
}

static int apply_toml(JobConfig *cfg, const char *text, size_t len, const char *path, Err *err) {
    TomlValue *root;
    TRY(toml_parse(&root, text, len, path, err));
    int rc = 0;
    char where[1100];
    for (int i = 0; i < root->n && rc == 0; i++) {
        const TomlKeyVal *e = &root->kv[i];
        const TomlValue *v = e->value;
        snprintf(where, sizeof where, "%s:%d", path, e->line);
        if (!is_section(e->key)) {
            rc = unknown_section(where, e->key, err);
        } else if (strcmp(e->key, "override") == 0) {
            if (v->type != TOML_ARRAY) {
                rc = err_set(err,
                             "%s: override must be written as [[override]] entries (an array "
                             "of tables), not %s",
                             where, toml_type_name(v->type));
                continue;
            }
            for (int j = 0; j < v->n && rc == 0; j++)
                rc = apply_override_entry(cfg, v->items[j], path, err);
        } else if (v->type != TOML_TABLE) {
            rc = err_set(err, "%s: %s must be a table ([%s]), not %s", where, e->key, e->key,
                         toml_type_name(v->type));
        } else {
            rc = apply_section(cfg, e->key, v, path, err);
        }
    }
    toml_free(root);
    return rc;
}

int config_apply_override(JobConfig *cfg, const char *dotted_key, const char *value,
                          const char *origin, Err *err) {
    /* The last dot: sections nest (--quantize.linear.float8.emulate=false). */
    const char *dot = strrchr(dotted_key, '.');
    if (!dot || dot == dotted_key || !dot[1])
        return err_set(err, "%s: option --%s is not of the form --section.key=value", origin,
                       dotted_key);
    char section[128];
    snprintf(section, sizeof section, "%.*s", (int)(dot - dotted_key), dotted_key);
    const char *key = dot + 1;
    if (!is_section(section)) return unknown_section(origin, section, err);
    if (strcmp(section, "override") == 0)
        return err_set(err, "%s: [[override]] entries can only be given in a config file", origin);
    const KeyDesc *d = find_key(section, key);
    int model_field = strcmp(section, "model") == 0 && is_model_field(key);
    const CompatKey *c = d || model_field ? NULL : config_compat_find(section, key);
    if (!d && !model_field && !c) return unknown_key(origin, section, key, err);
    TomlValue *v = NULL;
    int is_text = (d && (d->kind == K_STR || d->kind == K_ENUM || d->kind == K_LIST)) ||
                  (c && c->type == 's');
    if (is_text && value[0] != '"' && value[0] != '\'') {
        v = xcalloc(1, sizeof *v);
        v->type = TOML_STRING;
        v->s = xstrdup(value);
    } else if (toml_parse_value(&v, value, origin, NULL) != 0) {
        /* Not a TOML value: take it as a string so the type error names what was expected. */
        v = xcalloc(1, sizeof *v);
        v->type = TOML_STRING;
        v->s = xstrdup(value);
    }
    int rc = model_field ? set_model_field(cfg, key, v, 0, origin, err)
             : c         ? apply_compat(cfg, c, v, origin, err)
                         : set_key(cfg, d, v, origin, err);
    toml_free(v);
    return rc;
}

/* ---- lifecycle ---- */

void config_init(JobConfig *c) {
    memset(c, 0, sizeof *c);
    c->path = xstrdup("");
    c->job.dump_folder = xstrdup("./outputs");
    c->job.description = xstrdup("");
    c->model.name = xstrdup("qwen3");
    c->model.flavor = xstrdup("debugmodel");
    c->model.hf_assets_path = xstrdup("");
    c->model.tokenizer_path = xstrdup("");
    c->model.converters = xstrdup("");
    c->optimizer.name = OPTIMIZER_ADAMW;
    c->optimizer.lr = 8e-4;
    c->optimizer.eps = 1e-8;
    c->optimizer.beta1 = 0.9;
    c->optimizer.beta2 = 0.95;
    c->optimizer.weight_decay = 0.1;
    c->lr_scheduler.warmup_steps = 200;
    c->lr_scheduler.decay_ratio = -1;
    c->lr_scheduler.total_steps = -1;
    c->lr_scheduler.decay_type = DECAY_LINEAR;
    c->lr_scheduler.min_lr_factor = 0.0;
    c->training.local_batch_size = 8;
    c->training.global_batch_size = -1;
    c->training.seq_len = 2048;
    c->training.steps = 10000;
    c->training.max_norm = 1.0;
    c->training.dataset = xstrdup("c4_test");
    c->training.dataset_path = xstrdup("");
    c->training.dataset_text_field = xstrdup("text");
    c->training.chat_template_path = xstrdup("");
    c->training.seed = 0;
    c->training.mixed_precision_param = DT_F32;
    c->training.device = DEVICE_CPU;
    c->training.document_mask = 1;
    c->training.packing = 1;
    c->parallelism.data_parallel_replicate_degree = 1;
    c->parallelism.data_parallel_shard_degree = -1;
    c->parallelism.tensor_parallel_degree = 1;
    c->parallelism.expert_parallel_degree = 1;
    c->checkpoint.folder = xstrdup("checkpoint");
    c->checkpoint.interval = 500;
    c->checkpoint.keep_latest_k = 10;
    c->checkpoint.initial_load_path = xstrdup("");
    c->checkpoint.initial_load_model_only = 1;
    c->checkpoint.export_dtype = DT_F32;
    c->checkpoint.load_step = -1;
    c->checkpoint.exclude_from_loading = xstrdup("");
    c->activation_checkpoint.mode = AC_NONE;
    c->activation_checkpoint.selective_ac_option = xstrdup("op");
    c->metrics.log_freq = 1;
    c->comm.init_timeout_seconds = 300; /* torchtitan's defaults */
    c->comm.train_timeout_seconds = 100;
    c->metrics.save_tb_folder = xstrdup("tb");
    c->profiling.save_traces_folder = xstrdup("profile_traces");
    c->profiling.profile_freq = 10;
    c->validation.dataset = xstrdup("c4_test");
    c->validation.dataset_path = xstrdup("");
    c->validation.freq = 10;
    c->validation.steps = -1;
    c->validation.local_batch_size = 8;
    c->validation.seq_len = -1;
    c->sample.prompts = xstrdup("");
    c->sample.prompt_file = xstrdup("");
    c->sample.system = xstrdup("");
    c->sample.enable_thinking = 1;
    c->sample.max_new_tokens = 32;
    c->sample.temperature = 0.8;
    c->sample.top_p = 1.0;
    c->sample.repetition_penalty = 1.0;
    c->lora.alpha = 16;
    c->lora.targets = xstrdup("layers.*.attention.wq,layers.*.attention.wv");
    c->lora.adapter_path = xstrdup("");
    c->lora.base_dtype = DT_F32;
}

void config_free(JobConfig *c) {
    free(c->path);
    for (int i = 0; i < NKEYS; i++)
        if ((KEYS[i].kind == K_STR || KEYS[i].kind == K_LIST || KEYS[i].choices == MODEL_NAMES) &&
            !KEYS[i].alias_of)
            free(*(char **)((char *)c + KEYS[i].off));
    for (int i = 0; i < c->model.n_fields; i++) {
        free(c->model.fields[i].field);
        free(c->model.fields[i].value);
    }
    free(c->model.fields);
    for (int i = 0; i < c->n_overrides; i++) {
        free(c->overrides[i].target);
        free(c->overrides[i].kernel);
        free(c->overrides[i].description);
    }
    free(c->overrides);
    for (int i = 0; i < c->n_notices; i++)
        free(c->notices[i]);
    free(c->notices);
    for (int i = 0; i < c->n_compat; i++)
        free(c->compat[i].line);
    free(c->compat);
    for (int i = 0; c->origins && i < NKEYS; i++)
        free(c->origins[i]);
    free(c->origins);
    memset(c, 0, sizeof *c);
}

/* Local checks that involve more than one key. */
int config_exclude_bits(const char *list, int *bits, Err *err) {
    static const Choice NAMES[] = {{"model", CKPT_EXCLUDE_MODEL},
                                   {"optimizer", CKPT_EXCLUDE_OPTIMIZER},
                                   {"lr_scheduler", CKPT_EXCLUDE_LR_SCHEDULER},
                                   {"dataloader", CKPT_EXCLUDE_DATALOADER},
                                   {NULL, 0}};
    *bits = 0;
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        int found = 0;
        for (const Choice *c = NAMES; c->name && !found; c++)
            if (strlen(c->name) == n && strncmp(c->name, p, n) == 0) *bits |= c->value, found = 1;
        if (!found && n == 11 && strncmp(p, "train_state", n) == 0)
            return err_set(err, "checkpoint.exclude_from_loading: \"train_state\" would restart "
                                "the step count in a folder that holds later steps; start a new "
                                "checkpoint.folder from an HF export instead");
        if (!found)
            return err_set(err,
                           "checkpoint.exclude_from_loading: \"%.*s\" is not one of \"model\", "
                           "\"optimizer\", \"lr_scheduler\", \"dataloader\"",
                           (int)(n > 64 ? 64 : n), p);
        p += n + (p[n] == ',');
    }
    return 0;
}

/* n of a selective_ac_option that is a layer count; -1 for "op" or anything else. */
static long ac_option_layers(const char *o) {
    if (!*o || strspn(o, "0123456789") != strlen(o)) return -1;
    errno = 0;
    unsigned long long n = strtoull(o, NULL, 10);
    return errno || n > AC_EVERY_MAX ? AC_EVERY_MAX : (long)n;
}

static int check_local(const JobConfig *c, Err *err) {
    const char *o = c->activation_checkpoint.selective_ac_option;
    if (strcmp(o, "op") != 0 && ac_option_layers(o) < 0)
        return err_set(err,
                       "%s: activation_checkpoint.selective_ac_option = \"%s\" is not allowed; "
                       "expected \"op\" or a number of layers such as \"2\" (every 2nd layer "
                       "checkpointed whole)",
                       config_origin(c, "activation_checkpoint.selective_ac_option"), o);
    int bits;
    if (config_exclude_bits(c->checkpoint.exclude_from_loading, &bits, err) != 0)
        return err_wrap(err, "%s", config_origin(c, "checkpoint.exclude_from_loading"));
    if (strcmp(c->model.flavor, "hf") == 0 && !c->model.hf_assets_path[0])
        return err_set(err,
                       "%s: model.flavor = \"hf\" needs model.hf_assets_path (the HF model "
                       "directory with config.json)",
                       config_origin(c, "model.flavor"));
    return 0;
}

/* Whether dotted_key was set by the file or the command line (not left at its default). */
static int key_given(const JobConfig *c, const char *section, const char *key) {
    const KeyDesc *d = find_key(section, key);
    return d && c->origins && c->origins[d - KEYS];
}

/* model.converters, once every source has spoken (the command line may set it back to []):
 * "lora", the one converter qtitan has, turns LoRA on as torchtitan's converter does, with rank
 * 8 and every linear (lora.apply_to_all_linears = true) where [lora] says nothing. */
static int settle_converters(JobConfig *c, Err *err) {
    if (!c->model.converters[0]) return 0;
    for (const char *p = c->model.converters;; p++) {
        size_t len = strcspn(p, ",");
        if (len != 4 || strncmp(p, "lora", 4) != 0) {
            TomlValue joined = {.type = TOML_STRING, .s = c->model.converters};
            char shown[512];
            fmt_list_value(shown, sizeof shown, &joined);
            return err_set(err,
                           "%s: model.converters = %s is not available: " COMPAT_NO_FP8
                           "; the one converter here is \"lora\" (docs/finetune.md)",
                           config_origin(c, "model.converters"), shown);
        }
        p += len;
        if (!*p) break;
    }
    if (key_given(c, "lora", "rank") && c->lora.rank == 0)
        return err_set(err,
                       "%s: lora.rank = 0 turns LoRA off, but model.converters = [\"lora\"] (%s) "
                       "asks for it; give a rank >= 1, or none for torchtitan's %d",
                       config_origin(c, "lora.rank"), config_origin(c, "model.converters"),
                       LORA_CONVERTER_RANK);
    if (!key_given(c, "lora", "rank")) c->lora.rank = LORA_CONVERTER_RANK;
    if (!key_given(c, "lora", "targets") && !key_given(c, "lora", "apply_to_all_linears"))
        set_str(&c->lora.targets, LORA_ALL_LINEARS);
    if (strcmp(c->lora.targets, LORA_ALL_LINEARS) == 0) {
        char line[512];
        snprintf(line, sizeof line,
                 "%s: model.converters = [\"lora\"] puts adapters of rank %d on every linear of "
                 "the layers (lora.targets = [\"" LORA_ALL_LINEARS
                 "\"]); torchtitan's converter also puts them on the output projection and MoE "
                 "routers, which qtitan does not",
                 config_origin(c, "model.converters"), c->lora.rank);
        add_notice(c, line);
    }
    return 0;
}

/* torchtitan's --job.config_file is qtitan's --config. */
static int is_config_flag(const char *a) {
    return strcmp(a, "--config") == 0 || strcmp(a, "--job.config_file") == 0;
}
static const char *config_flag_value(const char *a) {
    if (strncmp(a, "--config=", 9) == 0) return a + 9;
    if (strncmp(a, "--job.config_file=", 18) == 0) return a + 18;
    return NULL;
}

void config_log_notices(const JobConfig *cfg) {
    for (int i = 0; i < cfg->n_notices; i++)
        log_info("notice: %s", cfg->notices[i]);
}

int config_load(JobConfig *cfg, const char *path, int argc, char **argv, Err *err) {
    config_init(cfg);
    /* The file first, wherever --config appears, so the command line always wins. A second
     * --config is an error: only one file is read, and the other would be silently ignored. */
    const char *from_argv = NULL;
    for (int i = 0; i < argc; i++) {
        const char *file = NULL;
        if (is_config_flag(argv[i])) {
            if (i + 1 >= argc) {
                err_set(err, "command line: %s needs a file name", argv[i]);
                goto fail;
            }
            file = argv[++i];
        } else if (config_flag_value(argv[i])) {
            file = config_flag_value(argv[i]);
        }
        if (!file) continue;
        if (from_argv) {
            err_set(
                err,
                "command line: --config is given twice (%s, then %s); a run reads one config file",
                from_argv, file);
            goto fail;
        }
        from_argv = file;
    }
    if (!path) path = from_argv;
    if (path) {
        char *text;
        size_t len;
        if (fs_read_all(path, &text, &len, err) != 0) goto fail;
        set_str(&cfg->path, path);
        int rc = config_apply_toml(cfg, text, len, path, err);
        free(text);
        if (rc != 0) goto fail;
    }
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (is_config_flag(a)) {
            i++;
            continue;
        }
        if (config_flag_value(a)) continue;
        if (strncmp(a, "--", 2) != 0 || !strchr(a, '.')) {
            err_set(err,
                    "command line: unexpected argument \"%s\"; expected --config FILE or "
                    "--section.key=value",
                    a);
            goto fail;
        }
        char name[256];
        const char *eq = strchr(a, '=');
        const char *value;
        if (eq) {
            snprintf(name, sizeof name, "%.*s", (int)(eq - a - 2), a + 2);
            value = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", a + 2);
            const char *dot = strrchr(name, '.');
            char section[128];
            snprintf(section, sizeof section, "%.*s", (int)(dot - name), name);
            const KeyDesc *d = find_key(section, dot + 1);
            const CompatKey *ck = config_compat_find(section, dot + 1);
            /* Boolean model fields (--model.tie_embeddings) stand alone like boolean keys. */
            int is_bool =
                (d && d->kind == K_BOOL) || (ck && ck->type == 'b') ||
                (!d && strcmp(section, "model") == 0 && model_spec_field_is_bool(dot + 1));
            int next_is_option = i + 1 < argc && strncmp(argv[i + 1], "--", 2) == 0 &&
                                 !(argv[i + 1][2] >= '0' && argv[i + 1][2] <= '9');
            if (is_bool && (i + 1 >= argc || next_is_option)) {
                value = "true";
            } else if (i + 1 >= argc) {
                err_set(err, "command line: %s needs a value", a);
                goto fail;
            } else {
                value = argv[++i];
            }
        }
        if (config_apply_override(cfg, name, value, "command line", err) != 0) goto fail;
    }
    if (compat_settle(cfg, err) != 0 || settle_converters(cfg, err) != 0 ||
        check_local(cfg, err) != 0)
        goto fail;
    return 0;
fail:
    config_free(cfg);
    return -1;
}

/* ---- derived values ---- */

/* The data file (or glob) for section.dataset / section.dataset_path (training, validation). */
static int resolve_dataset(const char *section, const char *name, const char *path, char **out,
                           Err *err) {
    if (path[0]) {
        *out = xstrdup(path);
        return 0;
    }
    if (strcmp(name, "c4_test") == 0) {
        const char *env = getenv("QT_C4_TEST_PATH");
        *out = xstrdup(env && env[0] ? env : C4_TEST_DEFAULT);
        return 0;
    }
    if (strcmp(name, "c4") == 0)
        return err_set(err,
                       "%s.dataset = \"c4\" reads C4 from files you give: set "
                       "%s.dataset_path to them (e.g. the en/c4-train.*-of-01024.json.gz "
                       "files of allenai/c4, read compressed); qtitan downloads nothing",
                       section, section);
    return err_set(err,
                   "%s.dataset = \"%s\" is not a built-in dataset (only \"c4_test\"); "
                   "set %s.dataset_path to its file",
                   section, name, section);
}

int config_dataset_path(const JobConfig *cfg, char **out, Err *err) {
    return resolve_dataset("training", cfg->training.dataset, cfg->training.dataset_path, out, err);
}

int config_data_format(const char *name, DataFormat *out) {
    for (const Choice *c = DATA_FORMATS; c->name; c++)
        if (!strcmp(c->name, name)) {
            *out = (DataFormat)c->value;
            return 0;
        }
    return -1;
}

int config_validation_dataset_path(const JobConfig *cfg, char **out, Err *err) {
    return resolve_dataset("validation", cfg->validation.dataset, cfg->validation.dataset_path, out,
                           err);
}

int config_tokenizer_path(const JobConfig *cfg, const char **out, Err *err) {
    if (cfg->model.tokenizer_path[0]) {
        *out = cfg->model.tokenizer_path;
        return 0;
    }
    if (cfg->model.hf_assets_path[0]) {
        *out = cfg->model.hf_assets_path;
        return 0;
    }
    return err_set(err, "no tokenizer: set model.tokenizer_path or model.hf_assets_path");
}

int config_apply_model_fields(ModelSpec *spec, const JobConfig *cfg, Err *err) {
    for (int i = 0; i < cfg->model.n_fields; i++) {
        const ModelFieldSet *m = &cfg->model.fields[i];
        if (model_spec_set_field(spec, m->field, m->value, err) == 0) continue;
        if (m->line > 0) return err_wrap(err, "%s:%d", cfg->path, m->line);
        return err_wrap(err, "command line");
    }
    return 0;
}

int config_validate_model(const ModelSpec *spec, const JobConfig *cfg, Err *err) {
    if (model_spec_validate(spec, err) == 0) return 0;
    /* Flavors and HF config.json files are valid on their own, so a [model] field caused this;
     * the message names it as " field = value" (a leading space: "dim" is not "head_dim"). */
    for (int i = cfg->model.n_fields - 1; i >= 0; i--) {
        const ModelFieldSet *m = &cfg->model.fields[i];
        char named[80];
        snprintf(named, sizeof named, " %s = ", m->field);
        if (!strstr(err->msg, named)) continue;
        if (m->line > 0) return err_wrap(err, "%s:%d", cfg->path, m->line);
        return err_wrap(err, "command line");
    }
    return -1;
}

int config_grad_accum_steps(const JobConfig *cfg, int dp, int *out, Err *err) {
    int64_t per_step = (int64_t)cfg->training.local_batch_size * dp;
    if (dp < 1) return err_set(err, "data-parallel degree %d must be >= 1", dp);
    if (cfg->training.global_batch_size == -1) {
        *out = 1;
        return 0;
    }
    if (cfg->training.global_batch_size % per_step != 0)
        return err_set(err,
                       "training.global_batch_size = %d is not a multiple of "
                       "local_batch_size x data-parallel degree = %d x %d = %lld",
                       cfg->training.global_batch_size, cfg->training.local_batch_size, dp,
                       (long long)per_step);
    *out = (int)(cfg->training.global_batch_size / per_step);
    return 0;
}

const char *config_decay_type_name(DecayType t) {
    return choice_name(DECAYS, t);
}
const char *config_device_name(DeviceKind d) {
    return choice_name(DEVICES, d);
}
const char *config_ac_mode_name(AcMode m) {
    return choice_name(AC_MODES, m);
}
AcMode config_ac(const JobConfig *cfg) {
    AcMode m = cfg->activation_checkpoint.mode;
    long n = ac_option_layers(cfg->activation_checkpoint.selective_ac_option);
    return m == AC_SELECTIVE && n >= 0 ? ac_every(n) : m;
}
AcMode config_ac_parts(AcMode m, char option[CONFIG_AC_OPTION_CAP]) {
    int n = ac_every_n(m);
    snprintf(option, CONFIG_AC_OPTION_CAP, n ? "%d" : "op", n);
    return n ? AC_SELECTIVE : m;
}
const char *config_ac_flags(AcMode m, char *buf, size_t cap) {
    char option[CONFIG_AC_OPTION_CAP];
    AcMode mode = config_ac_parts(m, option);
    /* Selective names its option too: the job's own may be another. */
    snprintf(buf, cap, "--activation_checkpoint.mode=%s%s%s", config_ac_mode_name(mode),
             mode == AC_SELECTIVE ? " --activation_checkpoint.selective_ac_option=" : "",
             mode == AC_SELECTIVE ? option : "");
    return buf;
}
const char *config_ac_text(AcMode m, char *buf, size_t cap) {
    int n = ac_every_n(m);
    if (!n) {
        snprintf(buf, cap, "%s", config_ac_mode_name(m));
        return buf;
    }
    int d = n % 10, teen = n % 100 / 10 == 1;
    const char *th = teen ? "th" : d == 1 ? "st" : d == 2 ? "nd" : d == 3 ? "rd" : "th";
    snprintf(buf, cap, "every %d%s layer", n, th);
    return buf;
}
const char *config_dtype_name(DType t) {
    return choice_name(EXPORT_DTYPES, t);
}

/* ---- dump ---- */

static void dump_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", f);
        else if (*p == '\t')
            fputs("\\t", f);
        else if (*p < 0x20 || *p == 0x7F)
            fprintf(f, "\\u%04X", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

void config_dump(const JobConfig *cfg, FILE *f) {
    for (int s = 0; s < NSECTIONS; s++) {
        const char *sec = SECTIONS[s];
        if (strcmp(sec, "override") == 0) continue;
        fprintf(f, "%s[%s]\n", s ? "\n" : "", sec);
        for (int i = 0; i < NKEYS; i++) {
            const KeyDesc *d = &KEYS[i];
            if (strcmp(d->section, sec) != 0 || d->alias_of) continue;
            const char *field = (const char *)cfg + d->off;
            char num[64];
            if (d->kind == K_FLOAT && d->off == OFF(lr_scheduler.decay_ratio) &&
                cfg->lr_scheduler.decay_ratio < 0) {
                fprintf(f, "# decay_ratio unset: decay over all steps after warmup\n");
                continue;
            }
            fprintf(f, "%s = ", d->key);
            switch (d->kind) {
            case K_STR:
                dump_string(f, *(char *const *)field);
                break;
            case K_LIST: {
                fputc('[', f);
                const char *p = *(char *const *)field;
                for (int first = 1; *p; first = 0) {
                    const char *c = strchr(p, ',');
                    size_t n = c ? (size_t)(c - p) : strlen(p);
                    char *item = strndup(p, n);
                    fputs(first ? "" : ", ", f);
                    dump_string(f, item);
                    free(item);
                    p += n + (c != NULL);
                }
                fputc(']', f);
                break;
            }
            case K_BOOL:
                fputs(*(const int *)field ? "true" : "false", f);
                break;
            case K_INT:
                fprintf(f, "%d", *(const int *)field);
                break;
            case K_I64:
                fprintf(f, "%lld", (long long)*(const int64_t *)field);
                break;
            case K_FLOAT:
                fmt_double(num, sizeof num, *(const double *)field);
                fputs(num, f);
                break;
            case K_ENUM:
                if (d->choices == MODEL_NAMES)
                    dump_string(f, *(char *const *)field);
                else
                    dump_string(f, choice_name(d->choices, *(const int *)field));
                break;
            }
            fputc('\n', f);
        }
        for (int i = 0; strcmp(sec, "model") == 0 && i < cfg->model.n_fields; i++) {
            const ModelFieldSet *m = &cfg->model.fields[i];
            fprintf(f, "%s = ", m->field);
            if (model_spec_field_is_string(m->field))
                dump_string(f, m->value);
            else
                fputs(m->value, f);
            fputc('\n', f);
        }
    }
    for (int i = 0; i < cfg->n_overrides; i++) {
        const KernelOverride *o = &cfg->overrides[i];
        fputs("\n[[override]]\ntarget = ", f);
        dump_string(f, o->target);
        fputs("\nkernel = ", f);
        dump_string(f, o->kernel);
        if (o->description[0]) {
            fputs("\ndescription = ", f);
            dump_string(f, o->description);
        }
        fputc('\n', f);
    }
}
