/* qtitan plan: reads a job config like `qtitan train` and prints, without training, the memory
 * per rank by part and the FLOPs per step (train/train_plan.h); with --cluster, the step-time
 * model of that job on a cluster and the mesh it recommends (train/steptime.h). */
#include "cli/commands.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "core/log.h"
#include "train/metrics.h"
#include "train/steptime.h"
#include "train/train_plan.h"

/* The CPU defaults of the step-time model, measured on this machine (2 cores of a Sapphire
 * Rapids Xeon, Open MPI 4.1.4, 2026-12-03, load average 10-20 from other jobs, so they are
 * low; docs/distributed.md, "Step-time model", says how, and bench/dist/steptime_check.sh
 * measures them again):
 *  - EFF: the mfu of a one-process debugmodel run with one OpenMP thread (0.138-0.164);
 *  - INTRA_GBS, LATENCY_US: all-gather bandwidth and per-message latency between two ranks
 *    of one host (shared memory), from `mpirun -np 2 build/mpi_comm bench` (0.02-0.118 GB/s,
 *    1.1-1.7 us);
 *  - INTER_GBS: the same over TCP between two network namespaces joined by veth links
 *    (tests/multihost_lib.sh; 0.072-0.109 GB/s);
 *  - OVERLAP: the share of FSDP waiting that prefetching hid in bench/dist/run.sh (24%). */
#define CPU_EFF 0.15
#define CPU_INTRA_GBS 0.1
#define CPU_INTER_GBS 0.09
#define CPU_LATENCY_US 2.0
#define CPU_OVERLAP 0.25
/* With --flops (an accelerator cluster) the inputs not given are assumptions, not
 * measurements: half the dense peak for eager kernels, transfers on their own streams,
 * NCCL-like latency, an 80 GiB device. */
#define GPU_EFF 0.5
#define GPU_OVERLAP 1.0
#define GPU_LATENCY_US 10.0
#define GPU_MEM_GIB 80.0

static const char *const OPTS[] = {"--cluster",  "--flops",    "--eff",
                                   "--intra-bw", "--inter-bw", "--latency-us",
                                   "--overlap",  "--mem",      "--gather-dtype"};
enum { N_OPTS = sizeof OPTS / sizeof OPTS[0] };

/* Takes the step-time options out of argv (into val, by OPTS index), leaving the job's
 * arguments in rest (rest[0] = argv[0]). */
static int split_args(int argc, char **argv, const char **val, char **rest, int *nrest, Err *err) {
    *nrest = 0;
    rest[(*nrest)++] = argv[0];
    for (int i = 1; i < argc; i++) {
        int k = -1;
        size_t len = 0;
        for (int o = 0; o < N_OPTS; o++) {
            len = strlen(OPTS[o]);
            if (strncmp(argv[i], OPTS[o], len) == 0 && (argv[i][len] == 0 || argv[i][len] == '=')) {
                k = o;
                break;
            }
        }
        if (k < 0) {
            rest[(*nrest)++] = argv[i];
            continue;
        }
        if (argv[i][len] == '=')
            val[k] = argv[i] + len + 1;
        else if (i + 1 < argc)
            val[k] = argv[++i];
        else
            return err_set(err, "option %s needs a value (see qtitan plan --help)", OPTS[k]);
    }
    return 0;
}

static int cluster_from_args(Cluster *c, const char **val, const JobConfig *cfg, Err *err) {
    memset(c, 0, sizeof *c);
    TRY(steptime_parse_cluster(val[0], &c->hosts, &c->per_host, err));
    int gpu = val[1] != NULL;
    if (gpu) {
        TRY(cli_number(OPTS[1], val[1], &c->peak_tflops, err));
    } else {
        c->peak_tflops = cfg->metrics.peak_tflops > 0 ? cfg->metrics.peak_tflops
                                                      : metrics_measure_peak_tflops(0.3);
    }
    c->compute_eff = gpu ? GPU_EFF : CPU_EFF;
    c->intra_gbs = CPU_INTRA_GBS;
    c->inter_gbs = CPU_INTER_GBS;
    c->latency_us = gpu ? GPU_LATENCY_US : CPU_LATENCY_US;
    c->overlap = gpu ? GPU_OVERLAP : CPU_OVERLAP;
    c->mem_gib = gpu ? GPU_MEM_GIB : metrics_total_ram_gib() / c->per_host;
    c->gather_bytes = 0;
    if (gpu && (!val[3] || !val[4]))
        return err_set(err, "--flops describes an accelerator cluster: give its --intra-bw and "
                            "--inter-bw too (GB/s; the CPU defaults were measured here)");
    double *dst[] = {NULL,          NULL,           &c->compute_eff, &c->intra_gbs,
                     &c->inter_gbs, &c->latency_us, &c->overlap,     &c->mem_gib};
    for (int k = 2; k < 8; k++)
        if (val[k]) TRY(cli_number(OPTS[k], val[k], dst[k], err));
    if (val[8]) {
        if (strcmp(val[8], "fp32") == 0)
            c->gather_bytes = 4;
        else if (strcmp(val[8], "bf16") == 0)
            c->gather_bytes = 2;
        else
            return err_set(err, "--gather-dtype %s: expected fp32 or bf16", val[8]);
    }
    return steptime_check_cluster(c, err);
}

static int run_cluster(const JobConfig *cfg, const Cluster *cl, const StepMesh *m, Err *err) {
    Cluster c = *cl;
    StepTime *best = xcalloc(8, sizeof *best), *job = xcalloc(1, sizeof *job);
    int rc = steptime_estimate(job, cfg, m, &c, err);
    if (rc == 0) {
        printf("the job's mesh:\n");
        steptime_print(job, &c, stdout);
        int valid, n = steptime_enumerate(best, 8, &valid, cfg, &c);
        printf("\n%d meshes can run this job on %dx%d; the best %d (tokens/s of those that fit "
               "%.4g GiB per rank first):\n",
               valid, c.hosts, c.per_host, n, c.mem_gib);
        printf("  %4s %5s %3s %2s %3s %-15s %9s %9s %12s %7s\n", "rep", "shard", "tp", "sp", "ep",
               "ac", "mem GiB", "step s", "tokens/s", "MFU %");
        for (int i = 0; i < n; i++) {
            const StepTime *s = &best[i];
            char ac[32];
            printf("  %4d %5d %3d %2d %3d %-15s %9.2f %9.4f %12.1f %7.2f%s\n", s->mesh.rep,
                   s->mesh.shard, s->mesh.tp, s->mesh.sp, s->mesh.ep,
                   config_ac_text(s->mesh.ac, ac, sizeof ac), s->mem_bytes / 1073741824.0,
                   s->step_s, s->tokens_per_s, s->mfu,
                   s->mem_bytes <= c.mem_gib * 1073741824.0 ? "" : "  does not fit");
        }
        if (n > 0 && best[0].mem_bytes <= c.mem_gib * 1073741824.0) {
            const StepMesh *b = &best[0].mesh;
            char ep[64] = "", ac[128];
            if (b->ep > 1)
                snprintf(ep, sizeof ep, " --parallelism.expert_parallel_degree=%d", b->ep);
            printf("recommend: --parallelism.data_parallel_replicate_degree=%d "
                   "--parallelism.data_parallel_shard_degree=%d "
                   "--parallelism.tensor_parallel_degree=%d%s%s "
                   "%s (%.1f tokens/s, %.2fx the job's mesh)\n",
                   b->rep, b->shard, b->tp, b->sp ? " --parallelism.enable_sequence_parallel" : "",
                   ep, config_ac_flags(b->ac, ac, sizeof ac), best[0].tokens_per_s,
                   best[0].tokens_per_s / job->tokens_per_s);
        } else {
            printf("recommend: no mesh fits %.4g GiB per rank; lower training.local_batch_size "
                   "or training.seq_len, or add ranks\n",
                   c.mem_gib);
        }
    }
    free(best), free(job);
    return rc;
}

int cmd_plan(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        printf(
            "usage: qtitan plan --config FILE.toml [--section.key=value ...]\n"
            "                   [--cluster HOSTSxGPUS [--flops TFLOPS --intra-bw GB/s "
            "--inter-bw GB/s]\n"
            "                    [--eff F] [--latency-us US] [--overlap F] [--mem GIB] "
            "[--gather-dtype fp32|bf16]]\n\n"
            "Prints what `qtitan train` with the same arguments will need per rank, without\n"
            "running it: parameters, gradients, optimizer state, activations (with the\n"
            "configured activation checkpointing), workspace, tokenizer, dataset and the\n"
            "process baseline, their total (the expected peak RSS), and FLOPs per step.\n"
            "The last line is machine-readable: plan: total_gib=X flops_per_step=Y\n\n"
            "With --cluster HOSTSxGPUS it also estimates one step of the job on that cluster:\n"
            "compute time, every collective's bytes and time, overlap, memory per rank,\n"
            "tokens/s and MFU, and recommends the fastest mesh that fits (docs/distributed.md).\n"
            "  --flops TFLOPS     peak per rank (default: measured on this CPU)\n"
            "  --intra-bw GB/s    rank to rank inside a host (default: measured here)\n"
            "  --inter-bw GB/s    in and out of one host (default: measured here over TCP)\n"
            "  --eff F            fraction of the peak the kernels sustain\n"
            "  --latency-us US    per message of a collective\n"
            "  --overlap F        fraction of compute FSDP transfers may hide under\n"
            "  --mem GIB          memory per rank a mesh must fit in\n"
            "  --gather-dtype T   FSDP all-gather element type (default: qtitan's, fp32 but\n"
            "                     bf16 matmul weights under bf16)\n");
        return 0;
    }
    const char *val[N_OPTS] = {0};
    char **rest = xcalloc((size_t)argc + 1, sizeof *rest);
    int nrest;
    Err err;
    if (split_args(argc, argv, val, rest, &nrest, &err) != 0) {
        log_error("%s", err.msg);
        free(rest);
        return 2;
    }
    int cluster = 0;
    for (int k = 0; k < N_OPTS; k++)
        cluster |= val[k] != NULL;
    if (cluster && !val[0]) {
        log_error("the step-time options need --cluster HOSTSxGPUS (see qtitan plan --help)");
        free(rest);
        return 2;
    }
    JobConfig cfg;
    if (config_load(&cfg, NULL, nrest - 1, rest + 1, &err) != 0) {
        log_error("%s", err.msg);
        free(rest);
        return 2;
    }
    free(rest);
    /* The step-time options and the job's mesh on the cluster are checked before anything
     * is printed, so a mistake in them is the only line. */
    Cluster c;
    StepMesh m;
    if (cluster && cluster_from_args(&c, val, &cfg, &err) != 0) {
        log_error("%s", err.msg);
        config_free(&cfg);
        return 2;
    }
    int rc = cluster ? steptime_job_mesh(&m, &cfg, &c, &err) : 0;
    /* On a cluster the memory plan is the job's mesh there: data_parallel_shard_degree = -1
     * takes what the cluster's ranks leave (an expert-parallel degree may need them). */
    if (rc == 0 && cluster) cfg.parallelism.data_parallel_shard_degree = m.shard;
    TrainPlan p;
    if (rc == 0) {
        config_log_notices(&cfg);
        rc = train_plan_compute(&p, &cfg, &err);
    }
    if (rc == 0) {
        train_plan_print(&p, stdout);
        if (cluster) {
            printf("\n");
            rc = run_cluster(&cfg, &c, &m, &err);
        }
    }
    if (rc != 0) log_error("%s", err.msg);
    config_free(&cfg);
    return rc == 0 ? 0 : 1;
}
