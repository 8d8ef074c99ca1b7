/* From a job config to a running trainer (CPU): the spec, the checks every rank agrees on, the
 * mesh (one process is a world of one), the data feed, the driver (src/train/train_qwen3.c)
 * and the trainer, read top to bottom the same on every mesh. */
#include "train/train_job.h"

#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "core/arena.h"
#include "core/fs.h"
#include "core/json.h"
#include "core/log.h"
#include "io/hf_config.h"
#include "io/hf_export.h"
#include "model/lora.h"
#include "model/qwen3_hf.h"
#include "ops/gemm.h"
#include "text/chat_data.h"
#include "text/dataset.h"
#include "text/tokenizer.h"
#include "train/between_steps.h"
#include "train/ckpt_config.h"
#include "train/ckpt_dist.h"
#include "train/data_feed.h"
#include "train/lock.h"
#include "train/train_hf.h"
#include "train/train_qwen3.h"
#include "train/trainer.h"

int train_job_lora(const JobConfig *cfg, const ModelSpec *spec, Lora *lo, long max_tokens, int warn,
                   Err *err) {
    /* As many targets as the list holds (at most one per comma, plus one). */
    char *list = xstrdup(cfg->lora.targets), *save = NULL;
    size_t cap = 1;
    for (const char *c = list; *c; c++)
        cap += *c == ',';
    char **targets = xcalloc(cap, sizeof *targets);
    int nt = 0;
    for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save))
        targets[nt++] = t;
    LoraWhere at = {config_origin(cfg, "lora.rank"), config_origin(cfg, "lora.alpha"),
                    config_origin(cfg, "lora.targets")};
    int rc = lora_create(lo, spec, cfg->lora.rank, cfg->lora.alpha, cfg->lora.use_rslora, targets,
                         nt, max_tokens, &at, warn, err);
    free(targets);
    free(list);
    return rc;
}

/* The job's adapters: [lora] checked, created on the model's linears, started from
 * lora.adapter_path or fresh (seeded by training.seed, as are the dropout masks). */
static int lora_setup(const JobConfig *cfg, const ModelSpec *spec, Lora *lo, long max_tokens,
                      Err *err) {
    TRY(train_job_lora(cfg, spec, lo, max_tokens, 1, err));
    if (cfg->lora.adapter_path[0]) {
        TRY(lora_load_peft(lo, spec, cfg->lora.adapter_path, err));
        log_info("lora: adapters from %s", cfg->lora.adapter_path);
    } else {
        lora_init(lo, (uint64_t)cfg->training.seed);
    }
    lora_set_dropout(lo, cfg->lora.dropout, (uint64_t)cfg->training.seed);
    double base = 0;
    for (int i = 0; i < lo->n; i++)
        base += (double)lo->ad[i].in * lo->ad[i].out;
    log_info("lora: %d adapter(s) of rank %d (alpha %g, scale %g%s) on %s; %ld trainable "
             "parameters, the %.4g frozen weights of those linears and all others stay as "
             "loaded%s",
             lo->n, lo->rank, lo->alpha, lo->scale,
             lo->rslora ? " = alpha / sqrt(rank): rsLoRA" : "", cfg->lora.targets, lora_numel(lo),
             base,
             cfg->lora.base_dtype == DT_BF16
                 ? " (the matmul weights and embedding in bf16: lora.base_dtype)"
                 : "");
    return 0;
}

/* Where a LoRA run's merged export goes (checkpoint.last_save_in_hf): DUMP/merged. */
static char *lora_merged_dir(const JobConfig *cfg) {
    return fs_join(cfg->job.dump_folder, "merged");
}

/* After a LoRA run: the adapters in peft's format in DUMP/adapter, with the tokenizer files
 * beside them as TRL saves them (the chat template the run rendered with), and with
 * checkpoint.last_save_in_hf the merged model as an HF directory in DUMP/merged. Rank 0 writes
 * the adapters gathered whole; the merge gathers the base with them (both collective). */
static int lora_finish(const JobConfig *cfg, TrainQwen3 *q, const Lora *lo, const ModelSpec *spec,
                       const TrainHf *hf, Comm *world, Err *err) {
    char *dir = fs_join(cfg->job.dump_folder, "adapter");
    const char *base = cfg->checkpoint.initial_load_path[0] ? cfg->checkpoint.initial_load_path
                                                            : cfg->model.hf_assets_path;
    float *whole = world->rank == 0 ? xmalloc((size_t)lora_numel(lo) * sizeof *whole) : NULL;
    int rc = train_qwen3_lora_params(q, whole, err);
    if (rc == 0 && whole) rc = lora_save_peft(lo, spec, dir, base, whole, err);
    if (rc == 0 && whole) rc = train_hf_write_tokenizer(hf, dir, err);
    free(whole);
    rc = comm_agree(world, rc, err);
    if (rc == 0) log_info("lora: adapters written to %s (peft format)", dir);
    free(dir);
    if (rc == 0 && cfg->checkpoint.last_save_in_hf) {
        dir = lora_merged_dir(cfg);
        HfExportOptions o = {.dtype = cfg->checkpoint.export_dtype,
                             .extra = &hf->extra,
                             .tokenizer = hf->tokenizer,
                             .chat_template = hf->chat_template,
                             .chat_template_len = hf->chat_template_len};
        rc = train_qwen3_export_merged(q, dir, &o, err);
        if (rc == 0)
            log_info("lora: merged model written to %s (%s)", dir,
                     config_dtype_name(cfg->checkpoint.export_dtype));
        free(dir);
    }
    return rc;
}

int train_job_spec(const JobConfig *cfg, ModelSpec *spec, HfConfigExtra *extra, Err *err) {
    memset(extra, 0, sizeof *extra);
    if (strcmp(cfg->model.flavor, "hf") == 0) {
        if (!cfg->model.hf_assets_path[0])
            return err_set(err, "model.flavor = \"hf\" needs model.hf_assets_path (a Hugging Face "
                                "model directory with config.json)");
        char *path = fs_join(cfg->model.hf_assets_path, "config.json");
        int rc = model_spec_from_hf_config_ex(spec, extra, path, err);
        free(path);
        TRY(rc);
        /* As transformers trains it: the auxiliary loss only with output_router_logits (a
         * [model] router_aux_loss_coef below still turns it on). */
        if (!extra->output_router_logits) spec->router_aux_loss_coef = 0.0;
        /* Training without the dropout config.json asks for would be a different model. */
        if (extra->attention_dropout > 0)
            return err_set(err,
                           "%s/config.json: attention_dropout %g is not supported in training "
                           "(qtitan has no dropout; set it to 0.0 to train this model without "
                           "it)",
                           cfg->model.hf_assets_path, extra->attention_dropout);
    } else {
        TRY(model_spec_flavor(spec, cfg->model.flavor, err));
    }
    TRY(config_apply_model_fields(spec, cfg, err));
    return config_validate_model(spec, cfg, err);
}

/* A hash of the resolved config, so a resume under another config can be told apart. */
static uint64_t config_hash(const JobConfig *cfg) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return 0;
    config_dump(cfg, f);
    fclose(f);
    uint64_t h = ckpt_checksum(text, len);
    free(text);
    return h;
}

/* Every rank must run the same config: one that differs (a stale copy of the file on another
 * host, an MPMD launch) passes the mesh check and then, with another training.steps or model,
 * leaves ranks waiting forever in collectives the others never reach. */
static int check_same_config(Comm *world, uint64_t hash, uint64_t model, Err *err) {
    uint64_t first[2] = {hash, model};
    TRY(comm_broadcast(world, first, sizeof first, 0, err));
    int rc = 0;
    if (first[0] != hash)
        rc = err_set(err,
                     "the resolved config (hash %016" PRIx64 ") differs from rank 0's (%016" PRIx64
                     "); every process must run the same config file with the same command-line "
                     "overrides",
                     hash, first[0]);
    /* The same config text can name different models: model.hf_assets_path relative to
     * another working directory, or another copy of config.json on this host. */
    else if (first[1] != model)
        rc = err_set(err,
                     "the model this rank built (its HF config.json text hashes to %016" PRIx64
                     ") differs from rank 0's (%016" PRIx64 "); every rank must read the same "
                     "model.hf_assets_path/config.json (a relative path from another working "
                     "directory, or another copy on this host?)",
                     model, first[1]);
    return comm_agree(world, rc, err);
}

/* A hash of the model spec as its HF config.json text (every field that shapes the model). */
static uint64_t spec_hash(const ModelSpec *spec, const HfConfigExtra *extra) {
    size_t len = 0;
    char *text = model_spec_hf_config_text(spec, extra, "float32", &len, NULL);
    uint64_t h = text ? ckpt_checksum(text, len) : 0;
    free(text);
    return h;
}

/* What every rank opened, by content, against rank 0's: the tokenizer (the hash of its
 * tokenizer.json bytes) and data (the hash of every token id and document boundary of the
 * tokenized dataset, or of every rendered conversation's ids, targets and boundaries:
 * chat_content_hash), which `what` names ("the training data this rank tokenized"). Ranks started
 * in different directories with one relative path, or on hosts holding different copies, would
 * otherwise train on different data; the same files under different mount points agree. comm_agree
 * prefixes the failing rank. */
static int check_same_data(Comm *world, uint64_t tokenizer, uint64_t data, const char *what,
                           Err *err) {
    uint64_t mine[2] = {tokenizer, data}, first[2] = {tokenizer, data};
    TRY(comm_broadcast(world, first, sizeof first, 0, err));
    int rc = 0;
    if (first[0] != mine[0])
        rc = err_set(err,
                     "the tokenizer this rank opened (hash %016" PRIx64 ") differs from rank 0's "
                     "(%016" PRIx64 "); every rank must read the same tokenizer.json (a relative "
                     "path from another working directory, or another copy on this host?)",
                     mine[0], first[0]);
    else if (first[1] != mine[1])
        rc = err_set(err,
                     "the %s (content hash %016" PRIx64 ") differs from rank 0's (%016" PRIx64
                     "); every rank must read the same dataset files (a relative path from "
                     "another working directory, or another copy on this host?)",
                     what, mine[1], first[1]);
    return comm_agree(world, rc, err);
}

/* Bytes of each end of a tensor's data that the initial weights' fingerprint reads. */
#define WEIGHTS_SAMPLE 4096

static int cmp_tensor_ptr(const void *a, const void *b) {
    return strcmp((*(const StTensor *const *)a)->name, (*(const StTensor *const *)b)->name);
}

/* A fingerprint of HF weights as a rank opened them, for comparing ranks at start-up: for
 * every tensor in name order (whatever the shards), its name, dtype and shape and the
 * checksums of the first and last WEIGHTS_SAMPLE bytes of its data (all of it when smaller).
 * Every rank reads the same bytes whatever slice it keeps, and a few pages per tensor cost
 * milliseconds where hashing the files would read them whole. Two different checkpoints of
 * one model differ in nearly every element, so the samples tell them apart; a change confined
 * to the middle of one tensor would pass. The same weights split into other shards, or under
 * other paths, agree. */
static uint64_t weights_fingerprint(const StSet *set) {
    int n = 0;
    for (int f = 0; f < set->nfiles; f++)
        n += set->files[f].n;
    const StTensor **t = xcalloc((size_t)n + 1, sizeof *t);
    int k = 0;
    for (int f = 0; f < set->nfiles; f++) {
        /* Only the sampled pages, not the kernel's read-around of each (8 MiB on the
         * project's VM): 0.6B's 310 tensors from a cold page cache took 0.6 s with it, 0.05 s
         * without (docs/training.md). */
        madvise(set->files[f].map, set->files[f].map_len, MADV_RANDOM);
        for (int i = 0; i < set->files[f].n; i++)
            t[k++] = &set->files[f].tensors[i];
    }
    qsort(t, (size_t)n, sizeof *t, cmp_tensor_ptr);
    uint64_t acc[2 + ST_MAX_DIMS + 4], h = ckpt_checksum(&n, sizeof n);
    for (int i = 0; i < n; i++) {
        const unsigned char *d = t[i]->data;
        size_t b = t[i]->nbytes, head = b < WEIGHTS_SAMPLE ? b : WEIGHTS_SAMPLE;
        memset(acc, 0, sizeof acc);
        acc[0] = ckpt_checksum(t[i]->name, strlen(t[i]->name));
        acc[1] = (uint64_t)t[i]->dtype << 32 | (uint64_t)t[i]->ndim;
        for (int j = 0; j < t[i]->ndim; j++)
            acc[2 + j] = (uint64_t)t[i]->shape[j];
        acc[2 + ST_MAX_DIMS] = b;
        acc[3 + ST_MAX_DIMS] = b ? ckpt_checksum(d, head) : 0;
        acc[4 + ST_MAX_DIMS] = b ? ckpt_checksum(d + b - head, head) : 0;
        acc[5 + ST_MAX_DIMS] = h;
        h = ckpt_checksum(acc, sizeof acc);
    }
    free(t);
    return h;
}

/* The initial weights at path (checkpoint.initial_load_path), only mapped: checked against the
 * model (every name and shape, before its memory is sized) and fingerprinted. A training
 * checkpoint (initial_load_in_hf false) is checked by its layouts and fingerprinted by its
 * train_state.json, which holds the checksums of its files. */
static int open_initial_weights(const ModelSpec *spec, const char *path, int in_hf,
                                uint64_t *fingerprint, Err *err) {
    if (!in_hf) {
        char *root;
        int64_t step;
        TRY(ckpt_dist_initial_path(path, &root, &step, err));
        int n = param_list(spec, NULL);
        ParamInfo *params = xcalloc((size_t)n, sizeof *params);
        param_list(spec, params);
        int rc = ckpt_dist_check_shapes(root, step, params, n, 1, err);
        free(params);
        char *dir = ckpt_dist_candidate_dir(root, step), *state = NULL, *text = NULL;
        size_t len = 0;
        if (rc == 0 && dir) {
            state = fs_join(dir, "train_state.json");
            rc = fs_read_all(state, &text, &len, err);
        }
        if (rc == 0) *fingerprint = ckpt_checksum(text, len);
        free(text), free(state), free(dir), free(root);
        return rc;
    }
    StSet set;
    TRY(qwen3_hf_open(&set, path, err));
    int rc = qwen3_hf_check(spec, &set, path, err);
    if (rc == 0) *fingerprint = weights_fingerprint(&set);
    st_set_close(&set);
    return rc;
}

/* A training checkpoint's model as the initial weights (open_initial_weights checked it):
 * every rank copies its pieces out of the step's files, on any mesh, as a resume that leaves
 * the optimizer, schedule and data fresh does. */
static int load_initial_checkpoint(TrainQwen3 *q, const char *path, Comm *world, Err *err) {
    char *root;
    int64_t step;
    TRY(ckpt_dist_initial_path(path, &root, &step, err));
    CkptDistReader r;
    int rc = ckpt_dist_open_initial(&r, world, root, step, err);
    free(root);
    TRY(rc);
    TrainModel md;
    train_qwen3_model(q, &md, 0);
    rc = ckpt_dist_reader_check_names(&r, world, md.params, md.nparams, err);
    if (rc == 0) rc = ckpt_dist_read_into(&r, md.params, md.nparams, md.slices, 1, 0, NULL, err);
    if (rc == 0 && (!world || world->rank == 0))
        log_info("initial weights: step %" PRId64 " of the training checkpoint %s (model only)",
                 r.step, path);
    ckpt_dist_reader_close(&r);
    return rc;
}

/* The weights every rank started from against rank 0's, by fingerprint: `what` (the initial
 * weights, the LoRA adapters) read from config key `key` = path. One relative path from
 * another working directory, or another copy on this host, would otherwise start the ranks
 * from different weights. comm_agree prefixes the failing rank. */
static int check_same_weights(Comm *world, const char *what, const char *key, const char *path,
                              uint64_t mine, Err *err) {
    uint64_t first = mine;
    TRY(comm_broadcast(world, &first, sizeof first, 0, err));
    int rc = 0;
    if (first != mine) {
        char here[PATH_MAX];
        if (!realpath(path, here)) snprintf(here, sizeof here, "%s", path);
        rc = err_set(err,
                     "the %s this rank opened (%s %s, %s on this rank; fingerprint %016" PRIx64
                     ") differ from rank 0's (%016" PRIx64 "); every rank must start from the "
                     "same %s (a relative path from another working directory, or another copy "
                     "on this host?)",
                     what, key, path, here, mine, first, what);
    }
    return comm_agree(world, rc, err);
}

/* 1 when the job multiplies in bf16 (mixed precision or a LoRA bf16 base). */
static int bf16_job(const JobConfig *cfg) {
    return cfg->training.mixed_precision_param == DT_BF16 ||
           (cfg->lora.rank > 0 && cfg->lora.base_dtype == DT_BF16);
}

/* A resume multiplies its bf16 products as the checkpoint's steps did (train_state.json's
 * gemm_bf16), so the resumed steps are bitwise those of the uninterrupted run even where a
 * new timing would choose the other path; QT_GEMM_BF16 still wins, and the resume warns. */
static void prefer_checkpoint_bf16_path(const JobConfig *cfg) {
    if (!cfg->checkpoint.enable) return;
    char *root = fs_resolve(cfg->job.dump_folder, cfg->checkpoint.folder);
    char *dir = ckpt_dist_candidate_dir(
        root, cfg->checkpoint.load_step > 0 ? cfg->checkpoint.load_step : -1);
    CkptState st;
    Err ignore; /* an unreadable state is the resume's to report */
    if (dir && ckpt_read_state(dir, &st, &ignore) == 0) {
        if (st.gemm_bf16 != CKPT_GEMM_BF16_NONE) {
            char why[96];
            snprintf(why, sizeof why, "the path checkpoint step %" PRId64 " was trained with",
                     st.step);
            gemm_bf16_prefer(st.gemm_bf16, why);
        }
        ckpt_state_release(&st);
    }
    free(dir);
    free(root);
}

/* CkptState.gemm_bf16 of this job. */
static int job_gemm_bf16(const JobConfig *cfg) {
    if (!bf16_job(cfg)) return CKPT_GEMM_BF16_NONE;
    return gemm_bf16_path();
}

/* The bf16 path of the GEMMs (ops/gemm.h) is chosen per process by timing the two; on a
 * loaded machine ranks could choose differently and multiply in different orders, so a mesh
 * runs rank 0's choice everywhere (a run pinned with QT_GEMM_BF16 chooses the same anyway), and
 * a resume the checkpoint's (prefer_checkpoint_bf16_path). */
static int agree_bf16_path(Comm *world, const JobConfig *cfg, Err *err) {
    if (!bf16_job(cfg)) return 0;
    if (world->rank == 0) prefer_checkpoint_bf16_path(cfg);
    if (world->size == 1) return 0;
    int path = world->rank == 0 ? gemm_bf16_path() : 0;
    TRY(comm_broadcast(world, &path, sizeof path, 0, err));
    int rc = 0;
    if (world->rank != 0 && gemm_bf16_adopt(path) != 0)
        rc = err_set(err, "this rank cannot multiply its bf16 products as rank 0 does (it chose "
                          "its path first, or lacks AMX); set QT_GEMM_BF16=widen or onednn "
                          "for every rank");
    return comm_agree(world, rc, err);
}

/* The content hash of chat data as training sees it: every conversation's token ids, targets
 * and boundaries, after rendering, truncation and dropping (not the raw files: the same
 * conversations under another path or mount point agree). */
static uint64_t chat_content_hash(const ChatData *cd) {
    uint64_t parts[4] = {ckpt_checksum(cd->ids, (size_t)cd->n_tokens * sizeof *cd->ids),
                         ckpt_checksum(cd->targets, (size_t)cd->n_tokens * sizeof *cd->targets),
                         ckpt_checksum(cd->off, (size_t)(cd->n_conv + 1) * sizeof *cd->off),
                         (uint64_t)cd->n_conv};
    return ckpt_checksum(parts, sizeof parts);
}

/* The user's batch against the sizes computed from it: tokens per micro-batch are counted in
 * int32 (positions, document ids), and the widest activation row over every layer, in bytes,
 * must fit in int64 for the arena arithmetic (and the plan) to be exact. */
static int check_batch_size(const JobConfig *cfg, const ModelSpec *spec, Err *err) {
    int64_t tokens = (int64_t)cfg->training.local_batch_size * cfg->training.seq_len, bytes;
    if (tokens > INT32_MAX)
        return err_set(err,
                       "training.local_batch_size x training.seq_len = %d x %d = %" PRId64
                       " tokens per micro-batch, more than the %d a micro-batch may hold",
                       cfg->training.local_batch_size, cfg->training.seq_len, tokens, INT32_MAX);
    if (!spec) return 0;
    int64_t row = spec->vocab_size;
    const int64_t widths[] = {spec->dim, spec->hidden_dim,
                              (int64_t)spec->moe_hidden_dim * (spec->top_k > 0 ? spec->top_k : 1),
                              (int64_t)spec->n_heads * spec->head_dim};
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++)
        if (widths[i] > row) row = widths[i];
    if (__builtin_mul_overflow(tokens, row, &bytes) ||
        __builtin_mul_overflow(bytes, (int64_t)4 * (spec->n_layers + 8), &bytes))
        return err_set(err,
                       "training.local_batch_size x training.seq_len = %" PRId64
                       " tokens per micro-batch with rows of %" PRId64
                       " values over %d layers needs more bytes than a 64-bit size can count",
                       tokens, row, spec->n_layers);
    return 0;
}

/* torchtitan's layout: DUMP/save_tb_folder/<start time>/, plus rank_N/ per rank with
 * save_for_all_ranks. Rank 0's clock names the run, so all ranks write into one run. */
static int tb_run_dir(const JobConfig *cfg, Comm *world, char **out, Err *err) {
    int64_t t = (int64_t)time(NULL);
    TRY(comm_broadcast(world, &t, sizeof t, 0, err));
    time_t tt = (time_t)t;
    struct tm tm;
    localtime_r(&tt, &tm);
    char run[64];
    strftime(run, sizeof run, "%Y%m%d-%H%M%S", &tm);
    char *tb = fs_resolve(cfg->job.dump_folder, cfg->metrics.save_tb_folder);
    char *dir = fs_join(tb, run);
    free(tb);
    if (cfg->metrics.save_for_all_ranks) {
        char rank[32];
        snprintf(rank, sizeof rank, "rank_%d", world->rank);
        char *r = fs_join(dir, rank);
        free(dir);
        dir = r;
    }
    *out = dir;
    return 0;
}

int train_job_check(const JobConfig *cfg, const ModelSpec *spec, Err *err) {
    if (spec && cfg->training.seq_len > spec->max_seq_len)
        return err_set(err, "training.seq_len = %d exceeds the model's max_seq_len %d",
                       cfg->training.seq_len, spec->max_seq_len);
    TRY(check_batch_size(cfg, spec, err));
    int micro;
    TRY(config_grad_accum_steps(cfg, 1, &micro, err));
    if (cfg->checkpoint.load_only && cfg->checkpoint.last_save_in_hf)
        return err_set(err, "checkpoint.load_only = true saves nothing, so last_save_in_hf = true "
                            "has no last checkpoint to export; set one of them false");
    if (cfg->checkpoint.last_save_in_hf && !cfg->checkpoint.enable)
        return err_set(err, "checkpoint.last_save_in_hf = true needs checkpoint.enable = true (the "
                            "HF export is written into the last checkpoint's folder)");
    if (cfg->checkpoint.initial_load_path[0] && !cfg->checkpoint.initial_load_in_hf &&
        cfg->lora.rank > 0)
        return err_set(err,
                       "a LoRA run's base is Hugging Face weights: checkpoint.initial_load_path "
                       "needs initial_load_in_hf = true (a training checkpoint becomes one "
                       "with qtitan export)");
    /* Without a path the run would start from random weights, not the ones asked for. */
    if (!cfg->checkpoint.initial_load_model_only &&
        (cfg->checkpoint.initial_load_in_hf || !cfg->checkpoint.initial_load_path[0]))
        return err_set(err,
                       "checkpoint.initial_load_model_only = false needs a training checkpoint "
                       "at checkpoint.initial_load_path with initial_load_in_hf = false (HF "
                       "weights hold no optimizer, schedule or data state)");
    if (cfg->checkpoint.initial_load_in_hf && !cfg->checkpoint.initial_load_path[0])
        return err_set(err,
                       "checkpoint.initial_load_in_hf = true needs "
                       "checkpoint.initial_load_path (the Hugging Face weights to start from)");
    return 0;
}

/* The paths a run reads and writes, checked before anything large is allocated. */
static int check_paths(const JobConfig *cfg, Err *err) {
    if (cfg->checkpoint.initial_load_path[0] && !fs_exists(cfg->checkpoint.initial_load_path))
        return err_set(err, "checkpoint.initial_load_path %s does not exist",
                       cfg->checkpoint.initial_load_path);
    if (fs_mkdirs(cfg->job.dump_folder, err) != 0)
        return err_wrap(err, "job.dump_folder %s cannot be created", cfg->job.dump_folder);
    if (access(cfg->job.dump_folder, W_OK | X_OK) != 0)
        return err_sys(err, "job.dump_folder %s is not writable", cfg->job.dump_folder);
    return 0;
}

void train_job_mesh_config(MeshConfig *out, const JobConfig *cfg, const ModelSpec *spec,
                           int world) {
    *out = (MeshConfig){.world = world,
                        .dp_replicate = cfg->parallelism.data_parallel_replicate_degree,
                        .dp_shard = cfg->parallelism.data_parallel_shard_degree,
                        .tp = cfg->parallelism.tensor_parallel_degree,
                        .sequence_parallel = cfg->parallelism.enable_sequence_parallel,
                        .n_heads = spec->n_heads,
                        .n_kv_heads = spec->n_kv_heads,
                        .hidden_dim = spec->hidden_dim,
                        .ep = cfg->parallelism.expert_parallel_degree,
                        .num_experts = spec->num_experts,
                        .vocab_size = spec->vocab_size,
                        .seq_len = cfg->training.seq_len,
                        .local_batch = cfg->training.local_batch_size,
                        .global_batch = cfg->training.global_batch_size};
}

static int mesh_from_config(Mesh *mesh, Comm *world, const JobConfig *cfg, const ModelSpec *spec,
                            Err *err) {
    MeshConfig mc;
    train_job_mesh_config(&mc, cfg, spec, world->size);
    return mesh_create(mesh, world, &mc, err);
}

static int run_job(const JobConfig *cfg, Comm *world, TrainMemoryCheck check_memory, Err *err);

int train_job_run(const JobConfig *cfg, Comm *world, TrainMemoryCheck check_memory, Err *err) {
    Comm *single = world ? NULL : comm_single_create();
    TrainLock lock;
    int rc = train_lock_take(&lock, world ? world : single, cfg, err);
    if (rc == 0) rc = run_job(cfg, world ? world : single, check_memory, err);
    train_lock_release(&lock);
    comm_destroy(single);
    return rc;
}

/* A failure inside the loop may be this rank's alone (its data, a file) while the others wait
 * in a collective: with other ranks, end the whole job, with the cause. */
static int end_job_on_failure(Comm *world, int rc, const Err *err) {
    if (rc != 0 && world->size > 1) comm_abort(1, err->msg);
    return rc;
}

/* A LoRA run's checkpoint tensors, as train_qwen3_model_lora names them: per adapter
 * "<module>.lora_A" (r, I) and "<module>.lora_B" (O, r). */
static int lora_params(const JobConfig *cfg, const ModelSpec *spec, ParamInfo **out, int *n,
                       Err *err) {
    Lora lo;
    TRY(train_job_lora(cfg, spec, &lo, 1, 0, err));
    *n = 2 * lo.n;
    ParamInfo *p = *out = xcalloc((size_t)*n + 1, sizeof *p);
    for (int i = 0; i < lo.n; i++) {
        const LoraAdapter *ad = &lo.ad[i];
        char mod[64];
        lora_module_name(mod, sizeof mod, ad->layer, ad->site);
        for (int ab = 0; ab < 2; ab++) {
            ParamInfo *q = &p[2 * i + ab];
            snprintf(q->name, sizeof q->name, "%s.lora_%c", mod, ab ? 'B' : 'A');
            q->ndim = 2;
            q->shape[0] = ab ? ad->out : lo.rank;
            q->shape[1] = ab ? lo.rank : ad->in;
            q->numel = q->shape[0] * q->shape[1];
        }
    }
    lora_free(&lo);
    return 0;
}

/* The last checks before the model's memory is sized, once every cheaper one has passed:
 * initial weights and the checkpoint to resume against the model (a wrong vocab or shape costs
 * a sentence, not gigabytes first), then the plan against physical memory (a job that cannot fit
 * would swap or be killed hours in). */
static int check_before_sizing(const JobConfig *cfg, const ModelSpec *spec,
                               TrainMemoryCheck check_memory, Comm *world, const Tokenizer *tok,
                               SampleWay *sample_way, Err *err) {
    int rc = 0;
    uint64_t weights = 0;
    if (cfg->checkpoint.initial_load_path[0])
        rc = open_initial_weights(spec, cfg->checkpoint.initial_load_path,
                                  cfg->checkpoint.initial_load_in_hf, &weights, err);
    /* The checkpoint a resume would take, against what it must hold: the model's parameters,
     * or a LoRA run's adapters (made here at their size; they are small). One process's and
     * sharded checkpoints alike, read by rank 0 (the others wait in the agreement below). */
    if (rc == 0 && cfg->checkpoint.enable && world->rank == 0) {
        ParamInfo *params = NULL;
        int n = 0;
        if (cfg->lora.rank > 0)
            rc = lora_params(cfg, spec, &params, &n, err);
        else {
            n = param_list(spec, NULL);
            params = xcalloc((size_t)n, sizeof *params);
            param_list(spec, params);
        }
        char *root = fs_resolve(cfg->job.dump_folder, cfg->checkpoint.folder);
        if (rc == 0)
            rc = ckpt_dist_check_shapes(root, cfg->checkpoint.load_step, params, n, 0, err);
        free(params);
        free(root);
    }
    /* The merged export's directory, which it would refuse only after training (a file there,
     * or files an export does not write). */
    if (rc == 0 && cfg->lora.rank > 0 && cfg->checkpoint.last_save_in_hf && world->rank == 0) {
        char *merged = lora_merged_dir(cfg);
        char *root = fs_resolve(cfg->job.dump_folder, cfg->checkpoint.folder);
        if (cfg->checkpoint.enable && fs_path_under(root, merged))
            rc = err_set(err,
                         "checkpoint.folder = \"%s\" lies in %s, which the merged export replaces "
                         "whole; choose another checkpoint.folder",
                         cfg->checkpoint.folder, merged);
        else
            rc = hf_export_check_out_dir(merged, err);
        if (rc != 0)
            err_wrap(err, "checkpoint.last_save_in_hf (the merged LoRA model, written to "
                          "job.dump_folder/merged after training)");
        free(root);
        free(merged);
    }
    if (rc == 0 && check_memory) rc = check_memory(cfg, world->size, tok, sample_way, err);
    rc = comm_agree(world, rc, err);
    if (rc == 0 && cfg->checkpoint.initial_load_path[0])
        rc = check_same_weights(world, "initial weights", "checkpoint.initial_load_path",
                                cfg->checkpoint.initial_load_path, weights, err);
    return rc;
}

int train_job_device(const JobConfig *cfg, const Device **out, Err *err) {
    DeviceKind k = cfg->training.device == DEVICE_AUTO ? DEVICE_CPU : cfg->training.device;
    *out = device_find(config_device_name(k));
    if (!*out)
        return err_set(err, "training.device = \"%s\": this build trains on the CPU only",
                       config_device_name(k));
    return 0;
}

static int run_job(const JobConfig *cfg, Comm *world, TrainMemoryCheck check_memory, Err *err) {
    ModelSpec spec;
    HfConfigExtra extra;
    OverridePlan plan = {0};
    OpRun run = {&spec, cfg->training.local_batch_size, cfg->training.seq_len,
                 cfg->training.document_mask, cfg->training.mixed_precision_param == DT_BF16};
    const Device *dev = NULL;
    int rc = train_job_device(cfg, &dev, err);
    if (rc == 0) rc = train_job_spec(cfg, &spec, &extra, err);
    if (rc == 0) rc = train_job_check(cfg, &spec, err);
    if (rc == 0) rc = check_paths(cfg, err);
    if (rc == 0)
        rc = ckpt_dist_check_keep(world->size, cfg->checkpoint.enable,
                                  cfg->checkpoint.keep_latest_k, err);
    /* [[override]] entries against the module tree and the registry, before anything is
     * sized; the plan is applied when the model is created. */
    if (rc == 0)
        rc = overrides_resolve(&plan, &spec, cfg->overrides, cfg->n_overrides, cfg->path, dev->name,
                               &run, err);
    /* The mesh is checked here, before anything large exists, although mesh_from_config
     * checks it again: every check so far must agree before the mesh's first collective, so
     * that a rank that fails alone (a path missing on its host, a config of its own) does not
     * leave the others waiting there. */
    if (rc == 0) {
        MeshConfig mc;
        MeshDims dims;
        train_job_mesh_config(&mc, cfg, &spec, world->size);
        rc = mesh_resolve(&dims, &mc, world->rank, err);
    }
    Mesh mesh;
    if (comm_agree_own(world, rc, err) != 0 || mesh_from_config(&mesh, world, cfg, &spec, err)) {
        overrides_plan_free(&plan);
        return -1;
    }
    int micro = mesh.dims.grad_accum_steps;
    int B = cfg->training.local_batch_size, T = cfg->training.seq_len;
    int use_lora = cfg->lora.rank > 0;
    Lora lora;
    memset(&lora, 0, sizeof lora);
    TrainQwen3 *q = NULL;
    char *initial_root = NULL; /* initial_load_model_only = false: the trainer resumes from it */
    int64_t initial_step = -1;
    TrainHf hf;
    memset(&hf, 0, sizeof hf);
    Dataset ds;
    memset(&ds, 0, sizeof ds);
    ChatData chat; /* instead of ds when training.data_format names a conversation shape */
    memset(&chat, 0, sizeof chat);
    DataFeed feed;
    memset(&feed, 0, sizeof feed);
    DatasetEncoder enc;
    DatasetOptions dopt;
    dataset_options_default(&dopt);
    char *dpath = NULL;
    const char *tok_path;
    rc = config_tokenizer_path(cfg, &tok_path, err);
    Tokenizer *tok = rc == 0 ? tokenizer_load(tok_path, err) : NULL;
    if (rc == 0 && !tok) rc = -1;
    if (rc == 0 && tokenizer_vocab_size(tok) > (uint32_t)spec.vocab_size)
        rc = err_set(err,
                     "the tokenizer at %s has %u tokens but the model's vocab_size is %d (set "
                     "model.vocab_size or use a smaller tokenizer)",
                     tok_path, tokenizer_vocab_size(tok), spec.vocab_size);
    if (rc == 0) rc = config_dataset_path(cfg, &dpath, err);
    if (rc == 0) rc = dataset_encoder_for_tokenizer(&enc, tok, err);
    int is_chat = cfg->training.data_format != DATA_TEXT;
    if (rc == 0 && is_chat) {
        ChatFormat *cf = chat_format_load_at(tok, cfg->training.chat_template_path, err);
        ChatDataOptions copt = {.path = dpath,
                                .format = cfg->training.data_format,
                                .seq_len = T,
                                .seed = (uint64_t)cfg->training.seed,
                                .shuffle = 1,
                                .packing = cfg->training.packing,
                                .train_on_all_tokens = cfg->training.train_on_all_tokens,
                                .too_long = cfg->training.long_conversations};
        rc = cf ? chat_data_open(&chat, &copt, cf, enc.eos_id, err) : -1;
        chat_format_free(cf);
    } else if (rc == 0 && cfg->training.chat_template_path[0]) {
        /* Text data renders no conversation, but checkpoints and exports keep the template:
         * it must be one that generation can render. */
        ChatFormat *cf = chat_format_load_at(tok, cfg->training.chat_template_path, err);
        if (!cf) rc = -1;
        chat_format_free(cf);
    }
    if (rc == 0 && !is_chat) {
        dopt.path = dpath;
        dopt.seq_len = T;
        dopt.seed = (uint64_t)cfg->training.seed;
        dopt.document_mask = cfg->training.document_mask;
        dopt.text_field = cfg->training.dataset_text_field;
        rc = dataset_open(&ds, &dopt, &enc, err);
    }
    free(dpath);
    /* A rank that cannot read its tokenizer or dataset stops every rank, with its sentence. */
    int agreed = comm_agree(world, rc, err);
    if (agreed == 0)
        agreed = check_same_config(world, config_hash(cfg), spec_hash(&spec, &extra), err);
    if (agreed == 0)
        agreed = check_same_data(world, tokenizer_hash(tok),
                                 is_chat ? chat_content_hash(&chat) : ds.content_hash,
                                 is_chat ? "chat data this rank rendered and tokenized"
                                         : "training data this rank tokenized",
                                 err);
    if (agreed == 0) agreed = agree_bf16_path(world, cfg, err);
    if (agreed != 0) {
        if (rc == 0) dataset_close(&ds);
        chat_data_close(&chat);
        tokenizer_free(tok);
        mesh_destroy(&mesh);
        overrides_plan_free(&plan);
        return -1;
    }
    if (is_chat)
        data_feed_init_chat(&feed, &chat, &mesh.dims);
    else
        data_feed_init(&feed, &ds, &mesh.dims);

    SampleWay sample_way = SAMPLE_NONE;
    if (check_before_sizing(cfg, &spec, check_memory, world, tok, &sample_way, err) != 0) {
        rc = -1;
        goto out;
    }
    rc = train_hf_init(&hf, cfg, &spec, &extra, tok_path, world, err);
    if (rc == 0) {
        q = train_qwen3_create(&spec, B, T, config_ac(cfg), &mesh, &plan, use_lora,
                               use_lora && cfg->lora.base_dtype == DT_BF16, err);
        if (!q) rc = -1;
    }
    if (rc == 0 && cfg->debug.moe_force_load_balance) {
        if (spec.num_experts > 0)
            log_info("debug.moe_force_load_balance: the routers assign experts round-robin, not "
                     "by score (validation too; samples route by score)");
        else
            log_warn("debug.moe_force_load_balance has no effect: the model has no experts");
        train_qwen3_qwen3(q)->moe_round_robin = 1;
    }
    /* initial_load_model_only = false: the trainer resumes every state from it (below). */
    int initial_whole =
        cfg->checkpoint.initial_load_path[0] && !cfg->checkpoint.initial_load_model_only;
    if (rc == 0 && initial_whole)
        rc = ckpt_dist_initial_path(cfg->checkpoint.initial_load_path, &initial_root, &initial_step,
                                    err);
    if (rc == 0 && cfg->checkpoint.initial_load_path[0] && !initial_whole) {
        rc = cfg->checkpoint.initial_load_in_hf
                 ? train_qwen3_load_hf(q, cfg->checkpoint.initial_load_path, err)
                 : load_initial_checkpoint(q, cfg->checkpoint.initial_load_path, world, err);
        if (rc == 0) log_info("loaded initial weights from %s", cfg->checkpoint.initial_load_path);
    } else if (rc == 0) {
        train_qwen3_init(q, (uint64_t)cfg->training.seed);
    }
    if (comm_agree(world, rc, err) != 0) {
        rc = -1;
        goto out;
    }
    int bf16_matmuls = 0;
    if (cfg->training.mixed_precision_param == DT_BF16) {
        rc = train_qwen3_enable_bf16(q, err);
        if (comm_agree(world, rc, err) != 0) { /* an allocation may fail on one rank alone */
            rc = -1;
            goto out;
        }
        bf16_matmuls = 1;
        log_info("mixed precision: bf16 matmuls, fp32 master weights, optimizer and loss");
    }
    if (comm_agree(world,
                   arena_check_headroom("the model, its gradients and its optimizer state", err),
                   err) != 0) {
        rc = -1;
        goto out;
    }
    if (use_lora) {
        /* Every rank makes the whole adapters before taking its share, so they are compared
         * whole. */
        rc = comm_agree(world, lora_setup(cfg, &spec, &lora, (long)B * T, err), err);
        if (rc == 0 && cfg->lora.adapter_path[0])
            rc = check_same_weights(
                world, "LoRA adapters", "lora.adapter_path", cfg->lora.adapter_path,
                ckpt_checksum(lora.param, (size_t)lora_numel(&lora) * sizeof *lora.param), err);
        if (rc != 0) goto out;
    }
    TrainModel model;
    TrainParallel par;
    train_qwen3_set_micro_batches(q, micro);
    if (use_lora) {
        if (comm_agree(world, train_qwen3_model_lora(q, &lora, &model, err), err) != 0) {
            rc = -1;
            goto out;
        }
    } else {
        train_qwen3_model(q, &model, cfg->optimizer.exempt_norms_and_embeddings);
    }
    train_qwen3_parallel(q, &par);
    TrainData data;
    data_feed_bind(&feed, &data);
    int exclude = 0; /* checked when the config was read */
    if ((rc = config_exclude_bits(cfg->checkpoint.exclude_from_loading, &exclude, err)) != 0)
        goto out;
    json_t *config_keys = ckpt_config_keys(cfg);
    TrainerOptions o = {
        .steps = cfg->training.steps,
        .micro_batches = micro,
        .lr = cfg->optimizer.lr,
        .warmup_steps = cfg->lr_scheduler.warmup_steps,
        .schedule_steps = cfg->lr_scheduler.total_steps,
        .decay_ratio = cfg->lr_scheduler.decay_ratio,
        .decay_type = cfg->lr_scheduler.decay_type,
        .min_lr_factor = cfg->lr_scheduler.min_lr_factor,
        .adamw = {.beta1 = cfg->optimizer.beta1,
                  .beta2 = cfg->optimizer.beta2,
                  .eps = cfg->optimizer.eps,
                  .weight_decay = cfg->optimizer.weight_decay,
                  .l2 = cfg->optimizer.name == OPTIMIZER_ADAM},
        .max_norm = cfg->training.max_norm,
        .skip_nonfinite = cfg->training.skip_nonfinite,
        .dump_folder = cfg->job.dump_folder,
        .ckpt_enable = cfg->checkpoint.enable,
        .ckpt_folder = cfg->checkpoint.folder,
        .ckpt_interval = cfg->checkpoint.interval,
        .ckpt_first_step = cfg->checkpoint.enable_first_step_checkpoint,
        .ckpt_load_only = cfg->checkpoint.load_only,
        .last_save_model_only = cfg->checkpoint.last_save_model_only,
        .keep_latest_k = cfg->checkpoint.keep_latest_k,
        .ckpt_async = cfg->checkpoint.async_mode != CKPT_ASYNC_DISABLED,
        .load_step = cfg->checkpoint.load_step,
        .initial_root = initial_root,
        .initial_step = initial_step,
        .exclude = exclude,
        .log_freq = cfg->metrics.log_freq,
        .peak_tflops = cfg->metrics.peak_tflops,
        .bf16_matmuls = bf16_matmuls,
        .flops_per_token = metrics_flops_per_token(&spec, T),
        .seed = (uint64_t)cfg->training.seed,
        .config_hash = config_hash(cfg),
        .gemm_bf16 = job_gemm_bf16(cfg),
        .config = config_keys,
        .par = &par,
        .ckpt_files = hf.files,
        .n_ckpt_files = world->size > 1 ? 0 : hf.nfiles, /* many: once, at the folder's root */
        .on_resumed = train_hf_on_resumed,
        .on_resumed_ctx = &hf,
        /* A LoRA run's trained tensors are the adapters: lora_finish exports them instead. */
        .on_last_save = cfg->checkpoint.last_save_in_hf && !use_lora ? train_hf_on_last_save : NULL,
        .on_last_save_ctx = &hf,
    };
    hf.model = &model;
    log_info("model: %s, %d layers, dim %d, vocab %d; %.3g matmul parameters; %d x %d tokens "
             "per micro-batch, %d micro-batch(es) per step",
             spec.flavor, spec.n_layers, spec.dim, spec.vocab_size, metrics_matmul_params(&spec), B,
             T, micro);
    char *tb_dir = NULL;
    if (cfg->metrics.enable_tensorboard) rc = tb_run_dir(cfg, world, &tb_dir, err);
    o.tb_dir = tb_dir;
    o.tb_all_ranks = cfg->metrics.save_for_all_ranks;
    char *trace_dir = cfg->profiling.enable_profiling
                          ? fs_resolve(cfg->job.dump_folder, cfg->profiling.save_traces_folder)
                          : NULL;
    o.trace_dir = trace_dir;
    o.trace_freq = cfg->profiling.profile_freq;
    BetweenSteps between = {0};
    if (rc == 0) {
        /* Mostly config checks that fail alike; the whole model for samples is rank 0 alone. */
        rc = comm_agree_own(world, between_steps_open(&between, cfg, q, tok, sample_way, err), err);
        /* Validation shares its rows across the ranks: they must hold the same ones. */
        if (rc == 0 && between.validate)
            rc = check_same_data(world, tokenizer_hash(tok), between.v.ds.content_hash,
                                 "validation data this rank tokenized", err);
    }
    if (rc == 0 && (between.validate || between.sample)) {
        o.after_step = between_steps_run;
        o.after_step_ctx = &between;
    }
    if (rc == 0) rc = trainer_run(&o, &model, &data, err);
    rc = end_job_on_failure(world, rc, err);
    if (rc == 0 && use_lora) rc = lora_finish(cfg, q, &lora, &spec, &hf, world, err);
    between_steps_close(&between);
    free(tb_dir);
    free(trace_dir);
    json_decref(config_keys);
out:
    free(initial_root);
    overrides_plan_free(&plan);
    train_hf_free(&hf);
    train_qwen3_free(q);
    lora_free(&lora);
    mesh_destroy(&mesh);
    data_feed_free(&feed);
    dataset_close(&ds);
    chat_data_close(&chat);
    tokenizer_free(tok);
    return rc;
}
