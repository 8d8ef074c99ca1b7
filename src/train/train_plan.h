/* `qtitan plan`: what a `qtitan train` job will need per rank, computed without running it:
 * memory by part (parameters, gradients, optimizer state, activations with the chosen
 * activation checkpointing, workspace, tokenizer and dataset, process baseline) and FLOPs per
 * step. The arenas are sized by the same layout code the model and trainer run (counting
 * arenas, train_qwen3_sizes), so the plan cannot drift from what training allocates; the rest
 * is small and modeled by constants measured once (docs/plan.md). */
#ifndef QT_TRAIN_PLAN_H
#define QT_TRAIN_PLAN_H

#include <stdio.h>

#include "core/config.h"
#include "core/err.h"
#include "core/model_spec.h"
#include "text/tokenizer.h"
#include "train/samples.h"

typedef struct TrainPlan {
    ModelSpec spec;
    int B, T, micro;   /* micro-batch rows, seq_len, micro-batches per optimizer step */
    int dp_shard;      /* FSDP shard degree the per-rank numbers are divided by */
    int tp, sp;        /* tensor-parallel degree; sp 1 when it also splits the tokens */
    char ac[32];       /* activation checkpointing as training applies it (config_ac_text) */
    double numel;      /* parameter elements (a tied embedding counted once) */
    double lora_numel; /* LoRA adapter elements (lora.rank > 0), else 0 */
    /* LoRA: a rank's tensor-parallel blocks of the adapters (elements, lora_numel when tp = 1;
     * it keeps 1/dp_shard of them), in all and of each layer's adapters (0: none). */
    double lora_blocks, lora_layer[QT_MAX_LAYERS];
    /* Bytes per rank. */
    double params, grads, optim, acts;
    double workspace;      /* batch buffers, bf16 copies, GEMM scratch, FSDP gather workspaces */
    double fsdp_workspace; /* the part of workspace train_plan_fsdp_workspace gives */
    double lora_workspace; /* of workspace, LoRA's gathered adapters on many processes */
    double tokenizer, dataset, baseline;
    /* [sample] on rank 0: the whole copy or the unit buffers, the decoder's KV cache and work
     * rows and generation's logits, sized for every prompt at its length in tokens (in bytes,
     * a bound, when the tokenizer cannot be loaded) plus max_new_tokens. */
    double sample;
    SampleWay sample_way;
    /* LoRA with checkpoint.last_save_in_hf: the merged export's buffers on rank 0 after
     * training (train_qwen3_export_merged; never the whole model). */
    double merged_export;
    /* checkpoint.async_mode: the staged copy of a save (train/ckpt_async.h), this rank's
     * trainable parameters and their two Adam moments, fp32. */
    double ckpt_staging;
    double total;
    /* FLOPs: the MFU convention (metrics_flops_per_token) and, with full activation
     * checkpointing, what the machine really does (the forward of every layer once more). */
    double flops_per_token, tokens_per_step, flops_per_step, hw_flops_per_step;
    char notes[4][160]; /* what the plan does not model for this config; "" when unused */
} TrainPlan;

/* Elements of each FSDP unit as one rank gathers it (train/train_qwen3.c): unit 0 the embedding
 * (with the final norm when tied), 1 + l layer l, L + 1 the final norm and lm_head (nothing when
 * tied). Tensor-parallel parameters count the rank's 1/tp block (the split column of the
 * parameter table), and the stacked experts, counted apart in experts[], the rank's 1/ep of
 * them under expert parallelism (ep > 1). */
typedef struct PlanUnits {
    int n; /* n_layers + 2 */
    double dense[QT_MAX_LAYERS + 2], experts[QT_MAX_LAYERS + 2];
    /* Of dense[], the matmul weights and the embedding: what a bf16 base (lora.base_dtype)
     * holds and gathers in bf16 (model/qwen3.h qwen3_bf16_field). */
    double in_bf16[QT_MAX_LAYERS + 2];
} PlanUnits;
void train_plan_units(PlanUnits *u, const ModelSpec *spec, int tp, int ep);
/* Bytes per rank of the FSDP workspaces a sharded rank (world > 1) allocates: parameters and
 * gradient (none when frozen: a LoRA base) of two layers and of the larger edge unit, in fp32,
 * plus their bf16 twins under mixed precision (bf16 1). With layers gathered in bf16 (training
 * whose products all read bf16 copies: bf16 2) a layer's fp32 matmul weights are never
 * written, so only its other parameters count in fp32, and where the bf16 products widen a bf16
 * receive buffer joins the widened twin. A bf16 base (base16 1, frozen) gathers its in_bf16
 * part in bf16 (2 bytes, and a widened fp32 copy where the bf16 products widen) and only the
 * rest in fp32. */
double train_plan_fsdp_workspace(const PlanUnits *u, int bf16, int frozen, int base16);

/* Fills p for cfg (the job `qtitan train` would run with the same config and overrides).
 * Reads only file sizes (tokenizer, dataset sources), and with [sample] its prompts and the
 * tokenizer that counts them; allocates nothing big. */
int train_plan_compute(TrainPlan *p, const JobConfig *cfg, Err *err);
/* The same with [sample]'s prompts counted in tokens of tok, already loaded (a job's own; NULL:
 * the plan loads the job's tokenizer for them). */
int train_plan_compute_tok(TrainPlan *p, const JobConfig *cfg, const Tokenizer *tok, Err *err);
/* The name sample_way goes by in logs and the plan ("own model", "whole copy", "one unit at a
 * time"). */
const char *train_plan_sample_way_name(SampleWay w);
/* Before a job allocates (train_job.h TrainMemoryCheck), for a job of world processes whose
 * tokenizer is tok: sets *sample_way to how [sample] will generate (SAMPLE_NONE when the plan
 * cannot be computed) and returns -1 with a sentence giving the plan's figure when cfg's plan per
 * rank exceeds the memory this process may use: physical memory, the cgroup's memory.max, or the
 * address-space limit (RLIMIT_AS, against what is mapped already plus the plan's non-baseline
 * bytes and a margin for threads and oneDNN) (the job would swap, crash in a library's failed
 * allocation or be killed hours in, not stop now); 0 otherwise, and 0 when the plan itself
 * cannot be computed (the job reports why). */
int train_plan_check_memory(const JobConfig *cfg, int world, const Tokenizer *tok,
                            SampleWay *sample_way, Err *err);
/* The human-readable table, ending with the machine-readable line
 * "plan: total_gib=X flops_per_step=Y". */
void train_plan_print(const TrainPlan *p, FILE *f);

#endif
