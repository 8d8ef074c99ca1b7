/* `qtitan plan --cluster`: a step-time model. For a job config and a cluster (hosts x ranks per
 * host, peak FLOP/s per rank, bandwidth inside and between hosts) it estimates one optimizer
 * step: the compute time from the MFU convention's FLOPs (metrics_flops_per_token, through
 * train_plan_compute), every collective the driver (train/train_qwen3.c) issues with its bytes
 * and time, which of them hide under compute, the memory per rank (the plan's), and tokens/s
 * and MFU; and it enumerates the meshes the job could run on to recommend the fastest that
 * fits. docs/distributed.md ("Step-time model") gives the formulas and how they were checked. */
#ifndef QT_TRAIN_STEPTIME_H
#define QT_TRAIN_STEPTIME_H

#include <stdio.h>

#include "core/config.h"
#include "core/err.h"
#include "train/train_plan.h"

typedef struct Cluster {
    int hosts, per_host; /* hosts, and ranks (GPUs, or CPU processes) per host */
    double peak_tflops;  /* per rank: what MFU is measured against (--flops) */
    double compute_eff;  /* fraction of the peak the step's kernels sustain (--eff) */
    double intra_gbs;    /* GB/s one rank moves to another rank of its host (--intra-bw) */
    double inter_gbs;    /* GB/s in and out of one host, shared by its ranks (--inter-bw) */
    double latency_us;   /* per message of a collective (--latency-us) */
    double overlap;      /* fraction of compute FSDP transfers can hide under (--overlap) */
    /* bytes per element all-gathered (4: fp32; 2: bf16; 0: what qtitan moves for the job,
     * fp32 but for the bf16 matmul weights of mixed precision or a LoRA bf16 base) */
    double gather_bytes;
    double mem_gib; /* memory per rank a mesh must fit in (--mem) */
} Cluster;

/* The mesh: [dp_replicate, dp_shard, tp] as [parallelism] has it, plus expert parallelism
 * (torchtitan's meaning with expert_tensor_parallel_degree = 1: an EP group is ep / tp
 * dp_shard ranks times the tp group, and the experts are FSDP-sharded over the ranks of a
 * replica that hold the same ones, as train/train_qwen3.c runs them), sequence parallelism and
 * activation checkpointing. */
typedef struct StepMesh {
    int rep, shard, tp, ep, sp;
    AcMode ac;
} StepMesh;

enum { STEP_MAX_COLL = 16 };

typedef struct StepCollective {
    const char *what;  /* e.g. "FSDP all-gather" */
    const char *group; /* "dp_shard", "tp", ... */
    int ranks;         /* group size */
    int cross_host;    /* 1 when the group spans hosts */
    double count;      /* calls per step */
    double bytes;      /* per call: the full (gathered / reduced / sent) buffer per rank */
    double seconds;    /* all calls of the step */
    int overlapped;    /* 1: may hide under compute (FSDP prefetch / reduce-scatter in flight) */
} StepCollective;

typedef struct StepTime {
    StepMesh mesh;
    TrainPlan plan;      /* the plan for this mesh (memory per rank, FLOPs) */
    double mem_bytes;    /* plan.total, with expert parallelism's smaller gather workspaces */
    double rank_flops;   /* FLOPs one rank computes per step (its tp share, recompute included) */
    double compute_s;    /* rank_flops / (peak x eff) */
    double overlap_s;    /* FSDP transfer time hidden under compute */
    double exposed_s;    /* collective time on the critical path */
    double step_s;       /* compute_s + exposed_s */
    double tokens_per_s; /* whole job */
    double tokens_per_s_per_rank; /* tokens_per_s / world */
    double mfu;                   /* percent: model FLOPs per second per rank / peak */
    int ncoll;
    StepCollective coll[STEP_MAX_COLL];
} StepTime;

/* The most ranks (hosts x per_host) --cluster may name: 2^22, past any cluster built. */
#define STEPTIME_MAX_RANKS (1 << 22)

/* "HOSTSxGPUS" (e.g. "2x8") into hosts and per_host, both 1..65536, at most
 * STEPTIME_MAX_RANKS in all; otherwise -1 with a sentence naming the text and what was
 * expected. */
int steptime_parse_cluster(const char *text, int *hosts, int *per_host, Err *err);
/* Checks c's numbers (positive, fractions within 0..1); -1 with a sentence naming the option. */
int steptime_check_cluster(const Cluster *c, Err *err);
/* The job's own mesh: its [parallelism] degrees, with data_parallel_shard_degree = -1 taking
 * what the cluster's ranks leave. */
int steptime_job_mesh(StepMesh *m, const JobConfig *cfg, const Cluster *c, Err *err);
/* Estimates one step of cfg on mesh m over c. -1 with training's sentence when the mesh cannot
 * run the job (degrees that do not multiply to the cluster's ranks, shapes it cannot split). */
int steptime_estimate(StepTime *out, const JobConfig *cfg, const StepMesh *m, const Cluster *c,
                      Err *err);
/* Every mesh the job can run on over c (tp a divisor of the ranks per host, sequence
 * parallelism on or off with tp > 1, ep 1 or tp x a divisor of dp_shard, each activation
 * checkpointing mode; the estimate drops what the model cannot split), best first: those that
 * fit c->mem_gib by tokens/s, then those that do not by memory. Returns how many were written
 * to out (at most cap), *valid the number that exist. */
int steptime_enumerate(StepTime *out, int cap, int *valid, const JobConfig *cfg, const Cluster *c);
/* The estimate as a table, ending "steptime: step_s=... tokens_per_s=... mfu=...". */
void steptime_print(const StepTime *s, const Cluster *c, FILE *f);

#endif
