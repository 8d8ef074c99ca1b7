/* From a job config to a running trainer (CPU, fp32 reference model), on one process or, under
 * mpirun, on a device mesh with FSDP (src/train/fsdp_model.c). */
#include "train/train_job.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fs.h"
#include "core/json.h"
#include "core/log.h"
#include "io/hf_config.h"
#include "model/lora.h"
#include "text/chat_data.h"
#include "text/dataset.h"
#include "text/tokenizer.h"
#include "train/ckpt_dist.h"
#include "train/fsdp_model.h"
#include "train/train_hf.h"
#include "train/train_qwen3.h"
#include "train/trainer.h"

/* Dataset-backed TrainData: step s reads global rows [(s-1)*R, s*R) in micro-batches of B;
 * data-parallel rank d of dp takes micro-batch k's rows (k * dp + d) * B onward, so every
 * mesh sees the same rows per step (mesh_first_row). */
typedef struct JobData {
    Dataset ds;
    ChatData chat; /* instead of ds when training.data_format names a conversation shape */
    int is_chat;
    Batch raw;
    int32_t *tokens; /* (B, T) the raw uint32 ids as the model's int32 */
    TrainQwen3Batch mb;
    int B, T, micro, global_rows;
    int dp, dp_rank;
    int64_t step_done; /* the last step whose rows were handed out */
} JobData;

static int data_count(void *ctx, int64_t step, int64_t *tokens, int64_t *valid, Err *err) {
    (void)err;
    JobData *d = ctx;
    /* Tokens are this rank's (throughput is per device), valid labels the whole step's (the
     * loss denominator): every position of packed text, the unmasked targets of chat rows. */
    *tokens = (int64_t)d->global_rows * d->T / d->dp;
    *valid = d->is_chat
                 ? chat_data_labels(&d->chat, (step - 1) * (int64_t)d->global_rows, d->global_rows)
                 : (int64_t)d->global_rows * d->T;
    return 0;
}

static int data_next(void *ctx, int64_t step, int micro, const void **batch, Err *err) {
    JobData *d = ctx;
    int64_t row =
        (step - 1) * (int64_t)d->global_rows + ((int64_t)micro * d->dp + d->dp_rank) * d->B;
    if (d->is_chat)
        TRY(chat_data_rows(&d->chat, row, d->B, &d->raw, NULL, err));
    else
        TRY(dataset_rows(&d->ds, row, d->B, &d->raw, err));
    for (long i = 0; i < (long)d->B * d->T; i++)
        d->tokens[i] = (int32_t)d->raw.tokens[i];
    d->mb = (TrainQwen3Batch){.B = d->B,
                              .T = d->T,
                              .tokens = d->tokens,
                              .targets = d->raw.targets,
                              .positions = d->raw.positions,
                              .doc = d->raw.doc_ids};
    d->step_done = step;
    *batch = &d->mb;
    return 0;
}

/* Chat rows are a pure function of the row index and the data: the position is the row, with
 * the data's size to tell a changed file. */
static json_t *chat_position(const JobData *d) {
    return json_pack("{sIsIsI}", "row", (json_int_t)(d->step_done * (int64_t)d->global_rows),
                     "conversations", (json_int_t)d->chat.n_conv, "tokens",
                     (json_int_t)d->chat.n_tokens);
}

static int chat_restore(JobData *d, const json_t *pos, Err *err) {
    int64_t row, conv, tokens;
    const char *what = "checkpoint data_position";
    TRY(json_req_int(pos, "row", &row, what, err));
    TRY(json_req_int(pos, "conversations", &conv, what, err));
    TRY(json_req_int(pos, "tokens", &tokens, what, err));
    if (conv != d->chat.n_conv || tokens != d->chat.n_tokens)
        return err_set(err,
                       "the chat data changed since the checkpoint (%lld conversations and %lld "
                       "tokens then, %lld and %lld now)",
                       (long long)conv, (long long)tokens, (long long)d->chat.n_conv,
                       (long long)d->chat.n_tokens);
    d->step_done = row / d->global_rows;
    return 0;
}

static json_t *data_position(void *ctx) {
    JobData *d = ctx;
    if (d->is_chat) return chat_position(d);
    d->ds.next_row = d->step_done * (int64_t)d->global_rows;
    DatasetState st;
    dataset_state_save(&d->ds, &st);
    return dataset_state_to_json(&st);
}

static int data_restore(void *ctx, const json_t *pos, Err *err) {
    JobData *d = ctx;
    if (d->is_chat) return chat_restore(d, pos, err);
    DatasetState st;
    TRY(dataset_state_from_json(pos, &st, "checkpoint data_position", err));
    TRY(dataset_state_restore(&d->ds, &st, err));
    d->step_done = st.row / d->global_rows;
    return 0;
}

/* The job's adapters: [lora] checked, created on the model's linears, started from
 * lora.adapter_path or fresh (seeded by training.seed). */
static int lora_setup(const JobConfig *cfg, const ModelSpec *spec, Lora *lo, long max_tokens,
                      Err *err) {
    const char *where = cfg->path[0] ? cfg->path : "the job config";
    if (cfg->lora.dropout != 0)
        return err_set(err, "%s: lora.dropout = %g: only 0 is implemented", where,
                       cfg->lora.dropout);
    char *list = xstrdup(cfg->lora.targets), *save = NULL;
    char *targets[256];
    int nt = 0;
    for (char *t = strtok_r(list, ",", &save); t && nt < 256; t = strtok_r(NULL, ",", &save))
        targets[nt++] = t;
    int rc =
        lora_create(lo, spec, cfg->lora.rank, cfg->lora.alpha, targets, nt, max_tokens, where, err);
    free(list);
    TRY(rc);
    if (cfg->lora.adapter_path[0]) {
        TRY(lora_load_peft(lo, spec, cfg->lora.adapter_path, err));
        log_info("lora: adapters from %s", cfg->lora.adapter_path);
    } else {
        lora_init(lo, (uint64_t)cfg->training.seed);
    }
    double base = 0;
    for (int i = 0; i < lo->n; i++)
        base += (double)lo->ad[i].in * lo->ad[i].out;
    log_info("lora: %d adapter(s) of rank %d (alpha %g, scale %g) on %s; %ld trainable "
             "parameters, the %.4g frozen weights of those linears and all others stay as "
             "loaded",
             lo->n, lo->rank, lo->alpha, lo->scale, cfg->lora.targets, lora_numel(lo), base);
    return 0;
}

/* After a LoRA run: the adapters in peft's format in DUMP/adapter, and with
 * checkpoint.last_save_in_hf the merged model as an HF directory in DUMP/merged. */
static int lora_finish(const JobConfig *cfg, TrainQwen3 *q, const Lora *lo, const ModelSpec *spec,
                       const TrainHf *hf, Err *err) {
    char *dir = fs_join(cfg->job.dump_folder, "adapter");
    const char *base = cfg->checkpoint.initial_load_path[0] ? cfg->checkpoint.initial_load_path
                                                            : cfg->model.hf_assets_path;
    int rc = lora_save_peft(lo, spec, dir, base, err);
    if (rc == 0) log_info("lora: adapters written to %s (peft format)", dir);
    free(dir);
    if (rc == 0 && cfg->checkpoint.last_save_in_hf) {
        dir = fs_join(cfg->job.dump_folder, "merged");
        HfExportOptions o = {
            .dtype = cfg->checkpoint.export_dtype, .extra = &hf->extra, .tokenizer = hf->tokenizer};
        rc = train_qwen3_export_merged(q, dir, &o, err);
        if (rc == 0) log_info("lora: merged model written to %s", dir);
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
    } else {
        TRY(model_spec_flavor(spec, cfg->model.flavor, err));
    }
    for (int i = 0; i < cfg->model.n_fields; i++)
        if (model_spec_set_field(spec, cfg->model.fields[i].field, cfg->model.fields[i].value,
                                 err) != 0)
            return err_wrap(err, "model.%s", cfg->model.fields[i].field);
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
static int check_same_config(Comm *world, uint64_t hash, Err *err) {
    uint64_t first = hash;
    TRY(comm_broadcast(world, &first, sizeof first, 0, err));
    int rc = first == hash ? 0
                           : err_set(err,
                                     "the resolved config (hash %016" PRIx64 ") differs from rank "
                                     "0's (%016" PRIx64 "); every process must run the same "
                                     "config file with the same command-line overrides",
                                     hash, first);
    return comm_agree(world, rc, err);
}

int train_job_check(const JobConfig *cfg, const ModelSpec *spec, Err *err) {
    if (spec && cfg->training.seq_len > spec->max_seq_len)
        return err_set(err, "training.seq_len = %d exceeds the model's max_seq_len %d",
                       cfg->training.seq_len, spec->max_seq_len);
    int micro;
    TRY(config_grad_accum_steps(cfg, 1, &micro, err));
    if (cfg->checkpoint.last_save_in_hf && !cfg->checkpoint.enable)
        return err_set(err, "checkpoint.last_save_in_hf = true needs checkpoint.enable = true (the "
                            "HF export is written into the last checkpoint's folder)");
    if (cfg->checkpoint.initial_load_path[0] && !cfg->checkpoint.initial_load_in_hf)
        return err_set(err, "checkpoint.initial_load_path needs initial_load_in_hf = true (only "
                            "Hugging Face weights can be loaded as a starting point)");
    /* Without a path the run would start from random weights, not the ones asked for. */
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
                        .moe_hidden_dim = spec->num_experts > 0 ? spec->moe_hidden_dim : 0,
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

static int run_job(const JobConfig *cfg, Comm *world, Err *err);

int train_job_run(const JobConfig *cfg, Comm *world, Err *err) {
    Comm *single = world ? NULL : comm_single_create();
    int rc = run_job(cfg, world ? world : single, err);
    comm_destroy(single);
    return rc;
}

/* The model of a sharded checkpoint folder ({folder}/config.json), so `qtitan export` can
 * read the folder alone. Written only once the trainer has resumed: a job that fails to resume
 * (another model, another number of processes) must not replace the description of the
 * checkpoint that is there. */
typedef struct FolderConfig {
    Comm *world;
    char *root;
    const ModelSpec *spec;
} FolderConfig;

static int write_folder_config(void *ctx, Err *err) {
    const FolderConfig *fc = ctx;
    return ckpt_dist_write_config(fc->world, fc->root, fc->spec, err);
}

static int run_job(const JobConfig *cfg, Comm *world, Err *err) {
    ModelSpec spec;
    HfConfigExtra extra;
    OverridePlan plan = {0};
    OpRun run = {&spec, cfg->training.local_batch_size, cfg->training.seq_len,
                 cfg->training.document_mask, cfg->training.mixed_precision_param == DT_BF16};
    int rc = cfg->training.device == DEVICE_CUDA
                 ? err_set(err, "training.device = \"cuda\": this build trains on the CPU only")
                 : train_job_spec(cfg, &spec, &extra, err);
    if (rc == 0) rc = train_job_check(cfg, &spec, err);
    if (rc == 0) rc = check_paths(cfg, err);
    if (rc == 0 && world->size > 1 && cfg->checkpoint.enable &&
        cfg->checkpoint.keep_latest_k > CKPT_DIST_MAX_KEPT)
        rc = err_set(err,
                     "checkpoint.keep_latest_k = %d: a sharded checkpoint keeps at most %d steps "
                     "(older ones would be removed); set it to %d or less",
                     cfg->checkpoint.keep_latest_k, CKPT_DIST_MAX_KEPT, CKPT_DIST_MAX_KEPT);
    /* [[override]] entries against the module tree and the registry, before anything is
     * sized; the plan is applied when the model is created. */
    if (rc == 0)
        rc = overrides_resolve(&plan, &spec, cfg->overrides, cfg->n_overrides, cfg->path, "cpu",
                               &run, err);
    /* The mesh is checked here, before anything large exists, although mesh_from_config
     * checks it again: every check so far must agree before the mesh's first collective, so
     * that a rank that fails alone (a path missing on its host, a config of its own) does not
     * leave the others waiting there. MoE with tensor parallelism first: its refusal makes the
     * mesh's divisibility of the experts' hidden size moot. */
    if (rc == 0 && world->size > 1)
        rc = fsdp_model_check(&spec, cfg->parallelism.tensor_parallel_degree, err);
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
    JobData d;
    memset(&d, 0, sizeof d);
    Lora lora;
    memset(&lora, 0, sizeof lora);
    int use_lora = cfg->lora.rank > 0;
    d.B = cfg->training.local_batch_size;
    d.T = cfg->training.seq_len;
    d.micro = micro;
    d.dp = mesh.dims.dp;
    d.dp_rank = mesh.dims.dp_rank;
    d.global_rows = d.B * micro * d.dp;
    TrainQwen3 *q = NULL;
    FsdpModel *fm = NULL;
    TrainHf hf;
    memset(&hf, 0, sizeof hf);
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
    d.is_chat = cfg->training.data_format != DATA_TEXT;
    if (rc == 0 && d.is_chat) {
        ChatFormat *cf = chat_format_load(tok, err);
        ChatDataOptions copt = {.path = dpath,
                                .format = cfg->training.data_format,
                                .seq_len = d.T,
                                .seed = (uint64_t)cfg->training.seed,
                                .shuffle = 1,
                                .packing = cfg->training.packing,
                                .train_on_all_tokens = cfg->training.train_on_all_tokens,
                                .too_long = cfg->training.long_conversations};
        rc = cf ? chat_data_open(&d.chat, &copt, cf, enc.eos_id, err) : -1;
        chat_format_free(cf);
    } else if (rc == 0) {
        dopt.path = dpath;
        dopt.seq_len = d.T;
        dopt.seed = (uint64_t)cfg->training.seed;
        dopt.document_mask = cfg->training.document_mask;
        rc = dataset_open(&d.ds, &dopt, &enc, err);
    }
    free(dpath);
    /* A rank that cannot read its tokenizer or dataset stops every rank, with its sentence. */
    int agreed = comm_agree(world, rc, err);
    if (agreed == 0) agreed = check_same_config(world, config_hash(cfg), err);
    if (agreed != 0) {
        if (rc == 0) dataset_close(&d.ds);
        chat_data_close(&d.chat);
        tokenizer_free(tok);
        mesh_destroy(&mesh);
        overrides_plan_free(&plan);
        return -1;
    }
    batch_alloc(&d.raw, d.B, d.T);
    d.tokens = xmalloc((size_t)d.B * d.T * sizeof *d.tokens);

    int sharded = world->size > 1;
    if (use_lora && sharded) {
        rc = err_set(err,
                     "lora.rank = %d: LoRA training runs on one process for now (FSDP and "
                     "tensor parallelism with adapters are not implemented)",
                     cfg->lora.rank);
        comm_agree(world, rc, err);
        goto out;
    }
    if (sharded) {
        fm = fsdp_model_create(&spec, d.B, d.T, cfg->activation_checkpoint.mode, &mesh, &plan, err);
        rc = fm ? 0 : -1;
    } else {
        rc = train_hf_init(&hf, cfg, &spec, &extra, tok_path, err);
        if (rc == 0)
            q = train_qwen3_create_with(&spec, d.B, d.T, cfg->activation_checkpoint.mode, &plan,
                                        use_lora, err);
        if (rc == 0 && !q) rc = -1;
    }
    if (rc == 0 && cfg->checkpoint.initial_load_path[0]) {
        if (sharded)
            rc = fsdp_model_load_hf(fm, cfg->checkpoint.initial_load_path, err);
        else
            rc = train_qwen3_load_hf(q, cfg->checkpoint.initial_load_path, err);
        if (rc == 0) log_info("loaded initial weights from %s", cfg->checkpoint.initial_load_path);
    } else if (rc == 0) {
        if (sharded)
            fsdp_model_init(fm, (uint64_t)cfg->training.seed);
        else
            train_qwen3_init(q, (uint64_t)cfg->training.seed);
    }
    if (comm_agree(world, rc, err) != 0) {
        rc = -1;
        goto out;
    }
    int bf16_matmuls = 0;
    if (cfg->training.mixed_precision_param == DT_BF16) {
        rc = sharded ? fsdp_model_enable_bf16(fm, err) : train_qwen3_enable_bf16(q, err);
        if (comm_agree(world, rc, err) != 0) { /* an allocation may fail on one rank alone */
            rc = -1;
            goto out;
        }
        bf16_matmuls = 1;
        log_info("mixed precision: bf16 matmuls, fp32 master weights, optimizer and loss");
    }
    if (use_lora && (rc = lora_setup(cfg, &spec, &lora, (long)d.B * d.T, err)) != 0) goto out;
    TrainModel model;
    TrainParallel par;
    if (sharded) {
        fsdp_model_set_micro_batches(fm, micro);
        fsdp_model_train_model(fm, &model, cfg->optimizer.exempt_norms_and_embeddings);
        fsdp_model_parallel(fm, &par);
    } else {
        train_qwen3_set_micro_batches(q, micro);
        if (use_lora)
            train_qwen3_model_lora(q, &lora, &model);
        else
            train_qwen3_model(q, &model, cfg->optimizer.exempt_norms_and_embeddings);
    }
    TrainData data = {.ctx = &d,
                      .count = data_count,
                      .next = data_next,
                      .position = data_position,
                      .restore = data_restore};
    TrainerOptions o = {
        .steps = cfg->training.steps,
        .micro_batches = micro,
        .lr = cfg->optimizer.lr,
        .warmup_steps = cfg->lr_scheduler.warmup_steps,
        .decay_ratio = cfg->lr_scheduler.decay_ratio,
        .decay_type = config_decay_type_name(cfg->lr_scheduler.decay_type),
        .min_lr_factor = cfg->lr_scheduler.min_lr_factor,
        .adamw = {.beta1 = cfg->optimizer.beta1,
                  .beta2 = cfg->optimizer.beta2,
                  .eps = cfg->optimizer.eps,
                  .weight_decay = cfg->optimizer.weight_decay},
        .max_norm = cfg->training.max_norm,
        .skip_nonfinite = cfg->training.skip_nonfinite,
        .dump_folder = cfg->job.dump_folder,
        .ckpt_enable = cfg->checkpoint.enable,
        .ckpt_folder = cfg->checkpoint.folder,
        .ckpt_interval = cfg->checkpoint.interval,
        .last_save_model_only = cfg->checkpoint.last_save_model_only,
        .keep_latest_k = cfg->checkpoint.keep_latest_k,
        .log_freq = cfg->metrics.log_freq,
        .peak_tflops = cfg->metrics.peak_tflops,
        .bf16_matmuls = bf16_matmuls,
        .flops_per_token = metrics_flops_per_token(&spec, d.T),
        .seed = (uint64_t)cfg->training.seed,
        .config_hash = config_hash(cfg),
        .par = sharded ? &par : NULL,
        .ckpt_files = hf.files,
        .n_ckpt_files = hf.nfiles,
        /* A LoRA run's trained tensors are the adapters: lora_finish exports them instead. */
        .on_last_save =
            cfg->checkpoint.last_save_in_hf && !sharded && !use_lora ? train_hf_on_last_save : NULL,
        .on_last_save_ctx = &hf,
    };
    hf.model = &model;
    log_info("model: %s, %d layers, dim %d, vocab %d; %.3g matmul parameters; %d x %d tokens "
             "per micro-batch, %d micro-batch(es) per step",
             spec.flavor, spec.n_layers, spec.dim, spec.vocab_size, metrics_matmul_params(&spec),
             d.B, d.T, micro);
    char mesh_line[160];
    mesh_describe(mesh_line, sizeof mesh_line, &mesh.dims);
    if (sharded)
        log_info("%s; FSDP: each rank keeps 1/%d of the parameters, gradients and "
                 "optimizer state",
                 mesh_line, mesh.dims.dp_shard);
    FolderConfig fc = {world, NULL, &spec};
    if (sharded && cfg->checkpoint.enable) {
        fc.root = fs_resolve(cfg->job.dump_folder, cfg->checkpoint.folder);
        o.on_resumed = write_folder_config;
        o.on_resumed_ctx = &fc;
    }
    rc = trainer_run(&o, &model, &data, err);
    if (rc == 0 && use_lora) rc = lora_finish(cfg, q, &lora, &spec, &hf, err);
    free(fc.root);
    if (rc == 0 && sharded && cfg->checkpoint.last_save_in_hf && cfg->checkpoint.enable) {
        /* The last step's sharded checkpoint is committed: rank 0 exports it, a run of
         * elements at a time from the ranks' files (FSDP and tensor-parallel pieces joined). */
        char *root = fs_resolve(cfg->job.dump_folder, cfg->checkpoint.folder);
        rc = ckpt_dist_last_save_hf(world, root, &spec, cfg->checkpoint.export_dtype, err);
        free(root);
    }
    /* A failure inside the loop may be this rank's alone (its data, a file) while the others
     * wait in a collective: end the whole job, with the cause. */
    if (rc != 0 && sharded) comm_abort(1, err->msg);
out:
    overrides_plan_free(&plan);
    train_hf_free(&hf);
    train_qwen3_free(q);
    lora_free(&lora);
    fsdp_model_free(fm);
    mesh_destroy(&mesh);
    free(d.tokens);
    batch_free(&d.raw);
    dataset_close(&d.ds);
    chat_data_close(&d.chat);
    tokenizer_free(tok);
    return rc;
}
