/* qtitan plan: per-rank memory and FLOPs of a training job, without running it. */
#include "train/train_plan.h"

#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "core/arena.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/param_table.h"
#include "infer/decode.h"
#include "infer/generate.h"
#include "io/safetensors.h"
#include "model/lora.h"
#include "model/qwen3.h"
#include "ops/gemm.h"
#include "text/idvec.h"
#include "text/prompt_lines.h"
#include "text/tokenizer.h"
#include "train/metrics.h"
#include "train/train_job.h"
#include "train/train_qwen3.h"

/* Constants measured once on x86-64 Linux (Debian, glibc, libgomp, oneDNN 2.6.3, -O2 build);
 * docs/plan.md says how. They are small next to the arenas of any real job.
 *  - BASELINE: peak RSS of a 1-step run of a ~100k-parameter model with a 2048-token
 *    tokenizer (binary, libraries, OpenMP and oneDNN runtimes, jansson, logging), less its
 *    arenas.
 *  - TOKENIZER_PER_BYTE: resident bytes of a loaded tokenizer per byte of tokenizer.json
 *    (vocab and merge tables, the pre-tokenizer; the parsed JSON is freed after loading, but
 *    its pages stay counted in the peak).
 *  - DATASET_PER_BYTE: peak resident bytes per byte of JSONL source while the dataset is
 *    tokenized into its cache (text + ids per document); the mapped cache afterwards is less.
 *  - GEMM_SCRATCH_PER_BYTE: oneDNN matmul scratchpad (packed B blocks), allocated per call
 *    and freed, as a fraction of the largest weight matrix. */
#define PLAN_BASELINE_BYTES (13.2 * 1048576.0)
#define PLAN_TOKENIZER_PER_BYTE 1.3
#define PLAN_DATASET_PER_BYTE 2.5
#define PLAN_GEMM_SCRATCH_PER_BYTE 0.0 /* within the measured agreement: see docs/plan.md */

static double source_bytes(const char *paths) {
    double total = 0;
    char *copy = strdup(paths);
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        glob_t g;
        if (glob(tok, 0, NULL, &g) != 0) continue;
        for (size_t i = 0; i < g.gl_pathc; i++) {
            struct stat st;
            if (stat(g.gl_pathv[i], &st) == 0 && S_ISREG(st.st_mode)) total += (double)st.st_size;
        }
        globfree(&g);
    }
    free(copy);
    return total;
}

static double tokenizer_json_bytes(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return 0;
    if (S_ISREG(st.st_mode)) return (double)st.st_size;
    char *f = fs_join(path, "tokenizer.json");
    double n = stat(f, &st) == 0 ? (double)st.st_size : 0;
    free(f);
    return n;
}

static void note(TrainPlan *p, const char *text) {
    for (int i = 0; i < 4; i++)
        if (!p->notes[i][0]) {
            snprintf(p->notes[i], sizeof p->notes[i], "%s", text);
            return;
        }
}

/* LoRA: the adapters as training creates them; AdamW state for them alone, their values and
 * gradients, and per adapter the (N, r) input projection kept for backward. On many processes
 * a rank keeps 1/dp_shard of its tensor-parallel blocks of them (train_qwen3_model_lora) and
 * gathers them a layer at a time into two layers' slots, with their gradients and the
 * reduce-scatter's scratch. With
 * checkpoint.last_save_in_hf the merged export's buffers on rank 0 after training
 * (train_qwen3_export_merged): the writer's, a bf16 base's merged rows of a chunk on one
 * process, on many the staging of one unit's parameters and of the tp / ep gathers. */
static int plan_lora(TrainPlan *p, const JobConfig *cfg, const ModelSpec *spec, int world, int ep,
                     Err *err) {
    Lora lo;
    /* Quiet as the job's memory check runs it (log_set_info(0)): the job warns itself. */
    TRY(train_job_lora(cfg, spec, &lo, 1, log_info_on(), err));
    double numel = (double)lora_numel(&lo), N = (double)p->B * p->T, held = numel;
    p->lora_numel = numel;
    lora_set_tp(&lo, world > 1 ? p->tp : 1, 0);
    double most = 0;
    for (int i = 0; i < lo.n; i++) {
        double e = (double)lo.rank * (lo.ad[i].in_l + lo.ad[i].out_l);
        double *layer = &p->lora_layer[lo.ad[i].layer];
        *layer += e;
        p->lora_blocks += e;
        if (*layer > most) most = *layer;
    }
    if (world > 1) {
        held = p->lora_blocks / p->dp_shard;
        p->lora_workspace = 2.0 * 4.0 * (2.0 * most + most / p->dp_shard);
    }
    p->optim = 2.0 * 4.0 * held;
    p->params += 4.0 * held;
    p->grads += 4.0 * held;
    p->acts += 4.0 * N * lo.rank * (lo.n + 1);
    if (cfg->lora.dropout > 0) p->acts += 4.0 * N * lora_max_in(&lo); /* lora_set_dropout */
    if (cfg->checkpoint.last_save_in_hf) {
        size_t stage = 0, parts = 0;
        if (world > 1)
            train_qwen3_export_sizes(spec, p->tp, ep, &lo, cfg->lora.base_dtype == DT_BF16, &stage,
                                     &parts);
        else if (cfg->lora.base_dtype == DT_BF16)
            stage = ST_WRITE_CHUNK + 2 * (size_t)lora_max_in(&lo);
        p->merged_export =
            4.0 * ((double)stage + (double)parts + ST_WRITE_CHUNK) + (double)ST_WRITE_BUFFER_BYTES;
    }
    lora_free(&lo);
    note(p, "LoRA: gradients and optimizer state for the adapters alone; the frozen base has "
            "none");
    return 0;
}

void train_plan_units(PlanUnits *u, const ModelSpec *spec, int tp, int ep) {
    memset(u, 0, sizeof *u);
    u->n = spec->n_layers + 2;
    int np = param_list(spec, NULL);
    ParamInfo *pi = xcalloc((size_t)np, sizeof *pi);
    param_list(spec, pi);
    for (int i = 0; i < np; i++) {
        const ParamKind *k = pi[i].kind;
        int unit = pi[i].layer >= 0                             ? 1 + pi[i].layer
                   : k->id == PK_TOK_EMBEDDINGS                 ? 0
                   : (k->id == PK_NORM && spec->tie_embeddings) ? 0
                                                                : spec->n_layers + 1;
        double n = (double)pi[i].numel / (k->tp == TP_REPLICATED ? 1 : tp);
        if (k->role == ROLE_EXPERTS)
            u->experts[unit] += n / ep;
        else
            u->dense[unit] += n;
        /* the kinds qwen3_bf16_field places */
        if (k->role == ROLE_LINEAR || k->role == ROLE_EMBEDDING) u->in_bf16[unit] += n;
    }
    free(pi);
}

/* What slot_elements counts of a unit. */
enum { ALL, BASE_F32, BASE_B16, TOUCHED_F32 };

/* Elements of the two layer slots and the edge slot (train_qwen3.c sizes each slot for the
 * largest unit it takes): all of a unit's; of a bf16 base the fp32 part (all but in_bf16) or
 * in_bf16; or, where layers are gathered in bf16 (a unit with matmul weights and neither the
 * embedding nor experts), the fp32 elements such a unit writes (its norms and router: the
 * pages of its fp32 matmul weights are never touched), all of any other unit. */
static double slot_elements(const PlanUnits *u, int what) {
    double layer = 0, edge = 0;
    for (int i = 0; i < u->n; i++) {
        double all = u->dense[i] + u->experts[i], n = all;
        if (what == BASE_F32) n = all - u->in_bf16[i];
        if (what == BASE_B16) n = u->in_bf16[i];
        if (what == TOUCHED_F32 && i > 0 && u->in_bf16[i] > 0 && u->experts[i] == 0)
            n = all - u->in_bf16[i];
        if (i == 0 || i == u->n - 1)
            edge = n > edge ? n : edge;
        else
            layer = n > layer ? n : layer;
    }
    return 2.0 * layer + edge;
}

double train_plan_fsdp_workspace(const PlanUnits *u, int bf16, int frozen, int base16) {
    /* The bf16 copies hold the parameters only, widened to 4 bytes more where the bf16
     * products widen (ops/gemm.h; asked only of a job with bf16, as the question times the
     * two paths). */
    double widened = (bf16 || base16) && gemm_bf16_widens() ? 4.0 : 0.0;
    if (base16) /* frozen: no gradient */
        return slot_elements(u, BASE_F32) * 4.0 + slot_elements(u, BASE_B16) * (2.0 + widened);
    /* fp32 parameters and gradient per slot (no gradient for a frozen base), and the twin */
    double twin = bf16 ? (widened ? 4.0 : 2.0) : 0.0;
    if (bf16 == 2) /* gathered in bf16: the fp32 parameters touched, and a widened twin's bf16
                    * receive buffer */
        return slot_elements(u, TOUCHED_F32) * 4.0 +
               slot_elements(u, ALL) * (4.0 + twin + (widened ? 2.0 : 0.0));
    return slot_elements(u, ALL) * ((frozen ? 1.0 : 2.0) * 4.0 + twin);
}

/* The memory this process may use: physical memory, or the cgroup's memory.max when lower
 * (bytes; 0 when neither is known). */
static double memory_limit_bytes(void) {
    double limit = metrics_total_ram_gib() * 1073741824.0;
    FILE *f = fopen("/sys/fs/cgroup/memory.max", "r");
    unsigned long long max = 0;
    if (f && fscanf(f, "%llu", &max) == 1 && (limit <= 0 || (double)max < limit))
        limit = (double)max;
    if (f) fclose(f);
    return limit;
}

/* [sample]'s prompts as the job reads them (train/samples.c): their count and the longest in
 * tokens of tok, or when tok is NULL of the tokenizer the job loads, or when that cannot be
 * loaded in bytes (a bound: every token of a byte-level BPE covers a byte or more). 0 prompts
 * when they cannot be read: the job reports why. */
static void sample_prompts(const JobConfig *cfg, const Tokenizer *tok, int *n, long *longest) {
    *n = 0, *longest = 0;
    PromptLines pr;
    Err ignored;
    char *data = NULL;
    size_t len = 0;
    int rc;
    if (cfg->sample.prompt_file[0]) {
        if (fs_read_all(cfg->sample.prompt_file, &data, &len, &ignored)) return;
        rc = prompt_lines_split(&pr, data, len, cfg->sample.prompt_file, &ignored);
        free(data);
    } else {
        rc = prompt_lines_split(&pr, cfg->sample.prompts, strlen(cfg->sample.prompts),
                                "sample.prompts", &ignored);
    }
    if (rc) return;
    Tokenizer *own = NULL;
    const char *tok_path;
    if (!tok && config_tokenizer_path(cfg, &tok_path, &ignored) == 0)
        tok = own = tokenizer_load(tok_path, &ignored);
    *n = pr.n;
    for (int i = 0; i < pr.n; i++) {
        long l = (long)strlen(pr.text[i]);
        IdVec ids = {0};
        if (tok && tokenizer_encode(tok, pr.text[i], strlen(pr.text[i]), &ids, &ignored) == 0) {
            l = (long)ids.n;
            idvec_free(&ids);
        }
        if (l > *longest) *longest = l;
    }
    if (own) tokenizer_free(own);
    prompt_lines_free(&pr);
}

const char *train_plan_sample_way_name(SampleWay w) {
    switch (w) {
    case SAMPLE_OWN:
        return "own model";
    case SAMPLE_WHOLE:
        return "whole copy";
    case SAMPLE_UNITWISE:
        return "one unit at a time";
    default:
        return "none";
    }
}

/* [sample]: how rank 0 generates (sample.gather; on auto the whole copy when the plan's total
 * with it fits the memory this process may use) and what that costs it (TrainPlan.sample). */
static int plan_sample(TrainPlan *p, const JobConfig *cfg, const Tokenizer *tok,
                       const Qwen3Modules *mod, int world, int ep, Err *err) {
    if (cfg->sample.freq <= 0) return 0;
    int n;
    long longest;
    sample_prompts(cfg, tok, &n, &longest);
    if (n == 0) return 0;
    TRY(samples_check_gather(cfg, world, err));
    SampleGather g = cfg->sample.gather;
    const ModelSpec *s = &p->spec;
    int bf16 = cfg->training.mixed_precision_param == DT_BF16;
    long C = longest + cfg->sample.max_new_tokens;
    if (C > s->max_seq_len) C = s->max_seq_len; /* longer prompts stop the job */
    SampleParams sp = samples_params(cfg);
    double run = (double)decoder_bytes(s, mod, bf16, n, (int)C) +
                 generate_buffer_bytes(n, s->vocab_size, sample_penalizes(&sp), C);
    int lora = cfg->lora.rank > 0;
    if (world == 1 && !lora) {
        p->sample_way = SAMPLE_OWN;
        p->sample = run;
        return 0;
    }
    /* The whole copy: a forward-only model of one token, its bf16 copies under mixed
     * precision. */
    Qwen3Sizes z;
    TRY(qwen3_sizes(&z, s, 1, 1, AC_NONE, 1, mod, err));
    double whole = (double)z.param_bytes + (double)z.act_bytes +
                   (bf16 ? (double)z.bf16_bytes[gemm_bf16_widens()] : 0);
    /* One unit at a time: the edge and layer buffers (whole shapes) with their bf16 twins, the
     * skeleton's activations, and the staging of tensor- and expert-parallel gathers. */
    PlanUnits u;
    train_plan_units(&u, s, 1, 1);
    double edge = u.dense[0] + u.experts[0], layer = 0, largest = 0;
    if (u.dense[u.n - 1] + u.experts[u.n - 1] > edge) edge = u.dense[u.n - 1] + u.experts[u.n - 1];
    for (int i = 1; i + 1 < u.n; i++)
        if (u.dense[i] + u.experts[i] > layer) layer = u.dense[i] + u.experts[i];
    int np = param_list(s, NULL);
    ParamInfo *pi = xcalloc((size_t)np, sizeof *pi);
    param_list(s, pi);
    for (int i = 0; i < np; i++)
        if ((double)pi[i].numel > largest) largest = (double)pi[i].numel;
    free(pi);
    double unitwise = (edge + layer) * (4.0 + (bf16 ? 2.0 : 0.0)) + (double)z.act_bytes;
    if (p->tp > 1 || ep > 1) unitwise += 4.0 * largest;
    if (g == SAMPLE_GATHER_AUTO) {
        double limit = memory_limit_bytes();
        g = world == 1 || limit <= 0 || p->total + whole + run <= limit ? SAMPLE_GATHER_WHOLE
                                                                        : SAMPLE_GATHER_UNITS;
    }
    p->sample_way = g == SAMPLE_GATHER_WHOLE ? SAMPLE_WHOLE : SAMPLE_UNITWISE;
    p->sample = run + (g == SAMPLE_GATHER_WHOLE ? whole : unitwise);
    return 0;
}

int train_plan_compute(TrainPlan *p, const JobConfig *cfg, Err *err) {
    return train_plan_compute_tok(p, cfg, NULL, err);
}

int train_plan_compute_tok(TrainPlan *p, const JobConfig *cfg, const Tokenizer *tok, Err *err) {
    memset(p, 0, sizeof *p);
    HfConfigExtra extra;
    TRY(train_job_spec(cfg, &p->spec, &extra, err));
    TRY(train_job_check(cfg, &p->spec, err));
    p->B = cfg->training.local_batch_size;
    p->T = cfg->training.seq_len;
    /* The mesh as training resolves it, on the processes the degrees ask for (one FSDP shard
     * when data_parallel_shard_degree = -1 leaves it to the job's size): the micro-batches a
     * rank runs per step (train/data_feed.h), and with tensor parallelism a rank's model, which
     * has n_heads / tp heads, n_kv_heads / tp key/value heads and hidden_dim / tp FFN columns
     * (train_qwen3_create), so its arenas are sized from that shape; with sequence parallelism
     * its residual stream keeps 1/tp of the tokens. */
    int shard = cfg->parallelism.data_parallel_shard_degree > 1
                    ? cfg->parallelism.data_parallel_shard_degree
                    : 1;
    int world = cfg->parallelism.data_parallel_replicate_degree * shard *
                cfg->parallelism.tensor_parallel_degree;
    MeshConfig mc;
    train_job_mesh_config(&mc, cfg, &p->spec, world);
    MeshDims dims;
    TRY(mesh_resolve(&dims, &mc, 0, err));
    p->micro = dims.grad_accum_steps;
    p->tp = dims.tp;
    p->sp = dims.sequence_parallel;
    ModelSpec local = p->spec;
    local.n_heads /= p->tp;
    local.n_kv_heads /= p->tp;
    local.hidden_dim /= p->tp;
    if (dims.ep > 1) local.num_local_experts = p->spec.num_experts / dims.ep;
    /* The kernels training would run ([[override]] entries resolved as train_job_run does):
     * they decide the activation workspace (e.g. loss_chunked keeps no (N, V) logits). */
    OverridePlan plan;
    OpRun run = {&p->spec, p->B, p->T, cfg->training.document_mask,
                 cfg->training.mixed_precision_param == DT_BF16};
    const Device *dev;
    TRY(train_job_device(cfg, &dev, err));
    TRY(overrides_resolve(&plan, &p->spec, cfg->overrides, cfg->n_overrides, cfg->path, dev->name,
                          &run, err));
    AcMode ac = config_ac(cfg);
    config_ac_text(ac, p->ac, sizeof p->ac);
    TrainQwen3Sizes z, whole;
    int rc = train_qwen3_sizes(&z, &local, p->B, p->T, ac, p->sp ? p->tp : 1, &plan, err);
    /* whole gives the parameter count only, which no kernel choice changes: without the plan,
     * so its replacements are not logged twice */
    if (rc == 0) rc = train_qwen3_sizes(&whole, &p->spec, p->B, p->T, ac, 1, NULL, err);
    /* The modules a whole copy runs, for samples (train_qwen3_whole_create); their
     * replacements were logged above. */
    Qwen3Modules *whole_mod = NULL;
    if (rc == 0 && cfg->sample.freq > 0) {
        int was = log_set_info(0);
        whole_mod = train_qwen3_modules(&p->spec, &plan, 0);
        log_set_info(was);
    }
    overrides_plan_free(&plan);
    TRY(rc);
    p->numel = (double)whole.param_bytes / 4.0; /* upper bound by alignment padding only */
    if (p->tp > 1)
        note(p, "tensor parallel: parameters and activations are one tp rank's (its heads and "
                "FFN columns; norms, embedding and lm_head whole)");

    /* FSDP: every rank holds 1/dp_shard of the parameters, gradients and optimizer state. */
    p->dp_shard = cfg->parallelism.data_parallel_shard_degree > 1
                      ? cfg->parallelism.data_parallel_shard_degree
                      : 1;
    if (p->dp_shard > 1)
        note(p, "FSDP modeled as an even split of parameters, gradients and optimizer state, "
                "plus the gather workspaces (two layers and the larger edge unit)");
    /* Expert parallelism: a rank computes X / ep experts of every MoE layer and keeps 1 / ep_rep
     * of them, FSDP over the dp_shard x tp / ep ranks of its replica that hold the same experts
     * (train_qwen3_create), instead of 1 / dp_shard. */
    double experts = 0;
    int ep_rep = dims.ep > 1 ? dims.dp_shard * dims.tp / dims.ep : 1;
    if (dims.ep > 1) {
        for (int l = 0; l < p->spec.n_layers; l++)
            experts +=
                model_spec_layer_is_moe(&p->spec, l)
                    ? 3.0 * local.num_local_experts * p->spec.moe_hidden_dim * p->spec.dim * 4.0
                    : 0.0;
        char line[160];
        snprintf(line, sizeof line,
                 "expert parallel %d: %d of the %d experts of each MoE layer per rank, 1/%d of "
                 "them kept; the rows it receives per micro-batch are not counted",
                 dims.ep, local.num_local_experts, p->spec.num_experts, ep_rep);
        note(p, line);
    }
    p->params = ((double)z.param_bytes - experts) / p->dp_shard + experts / ep_rep;
    p->grads = ((double)z.grad_bytes - experts) / p->dp_shard + experts / ep_rep;
    /* AdamW (train/adamw.c) places m and v per parameter with the same arena rules as the
     * gradient arena places gradients: exactly twice its size (tests/test_plan.c checks). */
    p->optim = 2.0 * p->grads;
    p->acts = (double)z.act_bytes;
    if (cfg->lora.rank > 0) {
        /* The frozen base has no gradients (train_qwen3_create with frozen); a bf16 base keeps
         * its matmul weights and embedding in the bf16 arena alone (counted below). */
        p->grads = 0;
        p->optim = 0;
        /* Sharded, a bf16 base's shards are its fp32 arena's part and its bf16 weights (2
         * bytes a parameter), divided as above; the experts stay fp32. */
        double b16 = (double)z.base_bf16_bytes - (double)z.bf16_scratch_bytes;
        if (cfg->lora.base_dtype == DT_BF16 && world == 1)
            p->params = (double)z.base_bf16_param_bytes;
        else if (cfg->lora.base_dtype == DT_BF16)
            p->params =
                ((double)z.base_bf16_param_bytes - experts + b16) / p->dp_shard + experts / ep_rep;
        if (world > 1)
            note(p, "LoRA on many processes: the frozen base sharded without gradients, the "
                    "adapters sharded with their layers, with their gradients and AdamW state");
        TRY(plan_lora(p, cfg, &p->spec, world, dims.ep, err));
    }

    /* Workspace: the job's batch buffers (dataset Batch of 4 arrays + the int32 tokens), the
     * bf16 copies of mixed precision, GEMM scratch. */
    double N = (double)p->B * p->T;
    p->workspace = 5.0 * 4.0 * N;
    /* bf16 mixed precision: the bf16 weight copies and matmul scratch arena, as
     * train_job_run enables it on one process; with FSDP the copies are of the gathered-layer
     * workspaces, which are not counted either. */
    double D = p->spec.dim, V = p->spec.vocab_size, F = p->spec.hidden_dim;
    double big = V * D > F * D ? V * D : F * D;
    int base_bf16 = cfg->lora.rank > 0 && cfg->lora.base_dtype == DT_BF16;
    if (base_bf16 && world == 1) {
        /* The base's weights and matmul scratch, and the fp32 piece its weights are made or
         * loaded through, then rounded (train_qwen3_init, train_qwen3_load_hf). */
        p->workspace += (double)z.base_bf16_bytes + 4.0 * QWEN3_CHUNK;
    } else if (base_bf16) {
        /* Sharded: the matmul scratch; the weights are the shards (params) and the gather
         * workspaces (below). */
        p->workspace += (double)z.bf16_scratch_bytes;
    } else if (cfg->training.mixed_precision_param == DT_BF16) {
        if (p->dp_shard > 1 || p->tp > 1)
            note(p, "bfloat16 on many processes: the matmul scratch is not counted");
        else
            p->workspace += (double)z.bf16_bytes[gemm_bf16_widens()] +
                            (gemm_bf16_prepacks() ? (double)z.bf16_pack_bytes : 0);
    }
    /* Training in bf16 on many processes whose products all read bf16 copies gathers them in
     * bf16 from a bf16 copy of each rank's shard (train_qwen3.c): 2 bytes per element of it. */
    int gathers16 = world > 1 && cfg->lora.rank == 0 &&
                    cfg->training.mixed_precision_param == DT_BF16 && z.products_bf16;
    if (gathers16) p->workspace += 2.0 * ((double)z.param_bytes - experts) / 4.0 / p->dp_shard;
    /* The widened path's block scratch, taken by the first bf16 product (ops/gemm.h). */
    if (cfg->training.mixed_precision_param == DT_BF16 || cfg->lora.base_dtype == DT_BF16)
        p->workspace += (double)GEMM_BF16_SCRATCH_BYTES;
    p->workspace += PLAN_GEMM_SCRATCH_PER_BYTE * 4.0 * big;
    if (world > 1) {
        PlanUnits units;
        train_plan_units(&units, &p->spec, p->tp, dims.ep);
        int mp = cfg->training.mixed_precision_param == DT_BF16;
        p->fsdp_workspace = train_plan_fsdp_workspace(&units, mp ? 1 + gathers16 : 0,
                                                      cfg->lora.rank > 0, base_bf16);
        p->workspace += p->fsdp_workspace + p->lora_workspace;
    }

    const char *tok_path = NULL;
    Err ignored;
    if (config_tokenizer_path(cfg, &tok_path, &ignored) == 0)
        p->tokenizer = PLAN_TOKENIZER_PER_BYTE * tokenizer_json_bytes(tok_path);
    char *dpath = NULL;
    if (config_dataset_path(cfg, &dpath, &ignored) == 0) {
        p->dataset = PLAN_DATASET_PER_BYTE * source_bytes(dpath);
        free(dpath);
    }
    p->baseline = PLAN_BASELINE_BYTES;
    p->total = p->params + p->grads + p->optim + p->acts + p->workspace + p->tokenizer +
               p->dataset + p->baseline;
    rc = plan_sample(p, cfg, tok, whole_mod, world, dims.ep, err);
    free(whole_mod);
    TRY(rc);
    /* The optimizer holds 2 fp32 moments per trainable parameter; a staged save adds them and
     * the parameters once more. */
    p->ckpt_staging = cfg->checkpoint.enable && cfg->checkpoint.async_mode != CKPT_ASYNC_DISABLED
                          ? 1.5 * p->optim
                          : 0;
    p->total += p->sample + p->merged_export + p->ckpt_staging;

    p->flops_per_token = metrics_flops_per_token(&p->spec, p->T);
    p->tokens_per_step = N * p->micro;
    p->flops_per_step = p->flops_per_token * p->tokens_per_step;
    p->hw_flops_per_step = p->flops_per_step;
    /* LoRA: the frozen base runs no weight-gradient products (2 of each matmul parameter's
     * 6 FLOPs per token); the adapters (forward, dX and dW) run 6 per adapter element. */
    double adapters = 6.0 * p->lora_numel;
    if (cfg->lora.rank > 0)
        p->hw_flops_per_step +=
            (adapters - 2.0 * metrics_matmul_params(&p->spec)) * p->tokens_per_step;
    double again = ac_recomputed_layers(ac, p->spec.n_layers);
    if (again > 0) {
        /* Backward reruns the forward of those layers: per token and layer, a third of the
         * model FLOPs (2 per matmul parameter + attention, and the adapters') less the
         * lm_head's share, over the layers. */
        double fwd = (p->flops_per_token + adapters) / 3.0 - 2.0 * V * D;
        p->hw_flops_per_step += fwd * again / p->spec.n_layers * p->tokens_per_step;
    }
    return 0;
}

static void row(FILE *f, const char *name, double bytes, double total, const char *what) {
    fprintf(f, "  %-12s %9.3f GiB %10.1f MiB %5.1f%%  %s\n", name, bytes / 1073741824.0,
            bytes / 1048576.0, total > 0 ? 100.0 * bytes / total : 0.0, what);
}

void train_plan_print(const TrainPlan *p, FILE *f) {
    const ModelSpec *s = &p->spec;
    fprintf(f,
            "model: %s, %d layers, dim %d, heads %d/%d, head_dim %d, ffn %d, vocab %d%s; %.4g "
            "parameters\n",
            s->flavor, s->n_layers, s->dim, s->n_heads, s->n_kv_heads, s->head_dim, s->hidden_dim,
            s->vocab_size, s->tie_embeddings ? " (tied)" : "", p->numel);
    char rope[160];
    rope_describe(rope, sizeof rope, s);
    if (rope[0]) fprintf(f, "rope: theta %g, %s\n", s->rope_theta, rope);
    if (p->lora_numel > 0)
        fprintf(f, "lora: %.4g trainable adapter parameters, the %.4g base parameters frozen\n",
                p->lora_numel, p->numel);
    fprintf(f,
            "batch: %d x %d tokens per micro-batch, %d micro-batch(es) per step; activation "
            "checkpointing: %s; FSDP shard degree %d; tensor parallel degree %d%s\n",
            p->B, p->T, p->micro, p->ac, p->dp_shard, p->tp,
            p->sp ? " with sequence parallelism" : "");
    fprintf(f, "memory per rank:\n");
    double t = p->total;
    row(f, "parameters", p->params, t, "fp32 parameter arena");
    row(f, "gradients", p->grads, t, "fp32 gradient arena");
    row(f, "optimizer", p->optim, t,
        p->lora_numel > 0 ? "Adam moments exp_avg + exp_avg_sq, fp32, of the LoRA adapters"
                          : "Adam moments exp_avg + exp_avg_sq, fp32");
    row(f, "activations", p->acts, t, "activation arena: kept activations, logits, grad scratch");
    row(f, "workspace", p->workspace, t, "batch buffers, bf16 copies, GEMM scratch");
    row(f, "tokenizer", p->tokenizer, t, "loaded vocabulary and merges");
    row(f, "dataset", p->dataset, t, "tokenizing the sources into the cache (first run)");
    row(f, "baseline", p->baseline, t, "binary, libraries, OpenMP and oneDNN runtimes");
    if (p->sample_way != SAMPLE_NONE) {
        char what[96];
        snprintf(what, sizeof what, "[sample] on rank 0 (%s): KV cache, work rows, logits",
                 train_plan_sample_way_name(p->sample_way));
        row(f, "samples", p->sample, t, what);
    }
    if (p->merged_export > 0)
        row(f, "export", p->merged_export, t,
            "merged HF export on rank 0 after training: one unit staged, writer buffers");
    if (p->ckpt_staging > 0)
        row(f, "ckpt staging", p->ckpt_staging, t,
            "checkpoint.async_mode: a save's copy of the parameters and Adam moments");
    row(f, "total", p->total, t, "expected peak RSS");
    fprintf(f,
            "flops: %.4g per token (6 x matmul params + attention), %.0f tokens per step, %.4g "
            "per step",
            p->flops_per_token, p->tokens_per_step, p->flops_per_step);
    if (p->hw_flops_per_step != p->flops_per_step)
        fprintf(f, " (%.4g executed: %s)", p->hw_flops_per_step,
                p->lora_numel > 0 ? "no weight gradients for the frozen base, the adapters' "
                                    "products, any recomputed forward"
                                  : "with the recomputed forward");
    fprintf(f, "\n");
    for (int i = 0; i < 4; i++)
        if (p->notes[i][0]) fprintf(f, "note: %s\n", p->notes[i]);
    fprintf(f, "plan: total_gib=%.4f flops_per_step=%.6g\n", p->total / 1073741824.0,
            p->flops_per_step);
}

/* This process's mapped address space now (VmSize), in GiB; 0 when unknown. */
static double mapped_gib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %llu kB", &kb) == 1) break;
    fclose(f);
    return (double)kb / (1 << 20);
}

int train_plan_check_memory(const JobConfig *cfg, int world, const Tokenizer *tok,
                            SampleWay *sample_way, Err *err) {
    TrainPlan p;
    Err ignore;
    /* The shard degree as the job resolves it (-1: what the other degrees leave of its size). */
    JobConfig c = *cfg;
    int rest =
        cfg->parallelism.data_parallel_replicate_degree * cfg->parallelism.tensor_parallel_degree;
    if (cfg->parallelism.data_parallel_shard_degree < 1 && rest > 0 && world % rest == 0)
        c.parallelism.data_parallel_shard_degree = world / rest;
    int was = log_set_info(0); /* the job logs its own override resolution */
    int rc = train_plan_compute_tok(&p, &c, tok, &ignore);
    log_set_info(was);
    *sample_way = SAMPLE_NONE;
    if (rc != 0) return 0;
    *sample_way = p.sample_way;
    double gib = (double)(1 << 30), need = p.total / gib;
    double ram = metrics_total_ram_gib();
    if (ram > 0 && need > ram)
        return err_set(err,
                       "the job needs about %.2f GiB per process (qtitan plan shows the parts) but "
                       "this machine has %.2f GiB of memory; reduce training.local_batch_size or "
                       "training.seq_len, or enable activation checkpointing",
                       need, ram);
    /* A container's limit counts resident memory, as the plan does. */
    FILE *f = fopen("/sys/fs/cgroup/memory.max", "r");
    unsigned long long max = 0;
    int limited = f && fscanf(f, "%llu", &max) == 1;
    if (f) fclose(f);
    if (limited && need > (double)max / gib)
        return err_set(err,
                       "the job needs about %.2f GiB per process (qtitan plan shows the parts) but "
                       "the cgroup's memory.max allows %.2f GiB; reduce training.local_batch_size "
                       "or training.seq_len, or enable activation checkpointing",
                       need, (double)max / gib);
    /* An address-space limit (ulimit -v, prlimit --as) counts what is mapped, resident or not:
     * what this process maps already stands for the plan's baseline row, and threads and
     * oneDNN need their headroom (core/arena.h). */
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        double as = (double)rl.rlim_cur / gib,
               need_as =
                   mapped_gib() + (p.total - p.baseline) / gib + (double)ARENA_HEADROOM_BYTES / gib;
        if (need_as > as)
            return err_set(
                err,
                "the job needs about %.2f GiB per process (qtitan plan shows the parts), "
                "%.2f GiB of address space with the libraries and threads, but the "
                "address-space limit (ulimit -v) allows %.2f GiB; raise the limit, or "
                "reduce training.local_batch_size or training.seq_len",
                need, need_as, as);
    }
    return 0;
}
