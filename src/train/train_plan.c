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
#include "model/lora.h"
#include "ops/gemm.h"
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
 * gradients, and per adapter the (N, r) input projection kept for backward. */
static int plan_lora(TrainPlan *p, const JobConfig *cfg, const ModelSpec *spec, Err *err) {
    char *list = xstrdup(cfg->lora.targets), *save = NULL, *targets[256];
    int nt = 0;
    for (char *t = strtok_r(list, ",", &save); t && nt < 256; t = strtok_r(NULL, ",", &save))
        targets[nt++] = t;
    Lora lo;
    int rc = lora_create(&lo, spec, cfg->lora.rank, cfg->lora.alpha, targets, nt, 1,
                         cfg->path[0] ? cfg->path : "the job config", err);
    free(list);
    TRY(rc);
    double numel = (double)lora_numel(&lo), N = (double)p->B * p->T;
    p->lora_numel = numel;
    p->optim = 2.0 * 4.0 * numel;
    p->params += 4.0 * numel;
    p->grads += 4.0 * numel;
    p->acts += 4.0 * N * lo.rank * (lo.n + 1);
    if (cfg->lora.dropout > 0) p->acts += 4.0 * N * lora_max_in(&lo); /* lora_set_dropout */
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
    }
    free(pi);
}

double train_plan_fsdp_workspace(const PlanUnits *u, int bf16) {
    double layer = 0, edge = u->dense[0] + u->experts[0];
    for (int i = 1; i + 1 < u->n; i++)
        if (u->dense[i] + u->experts[i] > layer) layer = u->dense[i] + u->experts[i];
    double last = u->dense[u->n - 1] + u->experts[u->n - 1];
    if (last > edge) edge = last;
    /* fp32 parameters and gradient per slot; the bf16 twin holds the parameters only, widened
     * to 4 bytes where the bf16 products widen (ops/gemm.h) */
    double twin = bf16 ? (gemm_bf16_widens() ? 4.0 : 2.0) : 0.0;
    return (2.0 * layer + edge) * (2.0 * 4.0 + twin);
}

int train_plan_compute(TrainPlan *p, const JobConfig *cfg, Err *err) {
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
    TRY(train_job_check_world(cfg, world, err));
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
    AcMode ac = cfg->activation_checkpoint.mode;
    int full_ac = ac == AC_FULL;
    p->ac = ac == AC_FULL ? "full" : ac == AC_SELECTIVE ? "selective" : "none";
    TrainQwen3Sizes z, whole;
    int rc = train_qwen3_sizes(&z, &local, p->B, p->T, ac, p->sp ? p->tp : 1, &plan, err);
    /* whole gives the parameter count only, which no kernel choice changes: without the plan,
     * so its replacements are not logged twice */
    if (rc == 0) rc = train_qwen3_sizes(&whole, &p->spec, p->B, p->T, ac, 1, NULL, err);
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
    /* Expert parallelism: a rank keeps its X / ep experts of every MoE layer whole, outside
     * FSDP (train_qwen3_create), so they are not divided by dp_shard. */
    double experts = 0;
    if (dims.ep > 1) {
        for (int l = 0; l < p->spec.n_layers; l++)
            experts +=
                model_spec_layer_is_moe(&p->spec, l)
                    ? 3.0 * local.num_local_experts * p->spec.moe_hidden_dim * p->spec.dim * 4.0
                    : 0.0;
        char line[160];
        snprintf(line, sizeof line,
                 "expert parallel %d: %d of the %d experts of each MoE layer per rank, whole; "
                 "the rows it receives per micro-batch are not counted",
                 dims.ep, local.num_local_experts, p->spec.num_experts);
        note(p, line);
    }
    p->params = ((double)z.param_bytes - experts) / p->dp_shard + experts;
    p->grads = ((double)z.grad_bytes - experts) / p->dp_shard + experts;
    /* AdamW (train/adamw.c) places m and v per parameter with the same arena rules as the
     * gradient arena places gradients: exactly twice its size (tests/test_plan.c checks). */
    p->optim = 2.0 * p->grads;
    p->acts = (double)z.act_bytes;
    if (cfg->lora.rank > 0) {
        /* The frozen base has no gradients (train_qwen3_create with frozen); a bf16 base keeps
         * its matmul weights and embedding in the bf16 arena alone (counted below). */
        p->grads = 0;
        p->optim = 0;
        if (cfg->lora.base_dtype == DT_BF16) p->params = (double)z.base_bf16_param_bytes;
        TRY(plan_lora(p, cfg, &p->spec, err));
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
    if (cfg->lora.rank > 0 && cfg->lora.base_dtype == DT_BF16) {
        /* The base's weights and matmul scratch, and the fp32 staging of the largest weight
         * while it is loaded and rounded (train_qwen3_load_hf). */
        p->workspace += (double)z.base_bf16_bytes + 4.0 * big;
    } else if (cfg->training.mixed_precision_param == DT_BF16) {
        if (p->dp_shard > 1 || p->tp > 1)
            note(p, "bfloat16 on many processes: the matmul scratch is not counted");
        else
            p->workspace += (double)z.bf16_bytes;
    }
    /* The widened path's block scratch, taken by the first bf16 product (ops/gemm.h). */
    if (cfg->training.mixed_precision_param == DT_BF16 || cfg->lora.base_dtype == DT_BF16)
        p->workspace += (double)GEMM_BF16_SCRATCH_BYTES;
    p->workspace += PLAN_GEMM_SCRATCH_PER_BYTE * 4.0 * big;
    if (world > 1) {
        PlanUnits units;
        train_plan_units(&units, &p->spec, p->tp, 1);
        p->fsdp_workspace =
            train_plan_fsdp_workspace(&units, cfg->training.mixed_precision_param == DT_BF16);
        p->workspace += p->fsdp_workspace;
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

    p->flops_per_token = metrics_flops_per_token(&p->spec, p->T);
    p->tokens_per_step = N * p->micro;
    p->flops_per_step = p->flops_per_token * p->tokens_per_step;
    p->hw_flops_per_step = p->flops_per_step;
    if (full_ac) {
        /* Backward reruns the forward of every layer but the last: per token, a third of
         * the model FLOPs (2 per matmul parameter + attention) less the lm_head's share. */
        double fwd = p->flops_per_token / 3.0 - 2.0 * V * D;
        double L = p->spec.n_layers;
        p->hw_flops_per_step += fwd * (L - 1) / L * p->tokens_per_step;
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
        p->lora_numel > 0 ? "AdamW exp_avg + exp_avg_sq, fp32, of the LoRA adapters"
                          : "AdamW exp_avg + exp_avg_sq, fp32");
    row(f, "activations", p->acts, t, "activation arena: kept activations, logits, grad scratch");
    row(f, "workspace", p->workspace, t, "batch buffers, bf16 copies, GEMM scratch");
    row(f, "tokenizer", p->tokenizer, t, "loaded vocabulary and merges");
    row(f, "dataset", p->dataset, t, "tokenizing the sources into the cache (first run)");
    row(f, "baseline", p->baseline, t, "binary, libraries, OpenMP and oneDNN runtimes");
    row(f, "total", p->total, t, "expected peak RSS");
    fprintf(f,
            "flops: %.4g per token (6 x matmul params + attention), %.0f tokens per step, %.4g "
            "per step",
            p->flops_per_token, p->tokens_per_step, p->flops_per_step);
    if (p->hw_flops_per_step > p->flops_per_step)
        fprintf(f, " (%.4g with the recomputed forward)", p->hw_flops_per_step);
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

int train_plan_check_memory(const JobConfig *cfg, Err *err) {
    TrainPlan p;
    Err ignore;
    int was = log_set_info(0); /* the job logs its own override resolution */
    int rc = train_plan_compute(&p, cfg, &ignore);
    log_set_info(was);
    if (rc != 0) return 0;
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
