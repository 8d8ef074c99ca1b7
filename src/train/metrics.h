/* Training metrics: FLOPs per token and MFU, peak memory, the console line, the JSONL record
 * in {dump_folder}/metrics.jsonl, and the steady-state average printed at the end of a run. */
#ifndef QT_METRICS_H
#define QT_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <stdio.h>

#include "core/err.h"
#include "core/model_spec.h"

/* Parameters that take part in a matmul for one token: the attention projections
 * (wq, wk, wv, wo), the dense FFN (w1, w2, w3) or, in MoE layers, the router plus top_k experts
 * only, and lm_head. The embedding lookup is no matmul; when tied, its table is lm_head and is
 * counted once as lm_head. Norm weights are left out. */
double metrics_matmul_params(const ModelSpec *spec);
/* The FLOPs of one token, forward and backward (PaLM's count, as torchtitan's MFU): 6 * matmul
 * params + 12 * n_layers * n_heads * head_dim * seq_len. */
double metrics_flops_per_token(const ModelSpec *spec, int seq_len);

/* Measures this machine's fp32 FMA throughput on all OpenMP threads for about `seconds` and
 * returns TFLOP/s (an upper bound real kernels approach, used as the MFU denominator on CPU). */
double metrics_measure_peak_tflops(double seconds);
/* The same for bf16 products with fp32 accumulation, on the fastest unit present (AMX tiles,
 * else AVX512_BF16 dot products, else the fp32 FMA): the MFU denominator of mixed-precision
 * runs. *unit (may be NULL) names the unit. */
double metrics_measure_peak_tflops_bf16(double seconds, const char **unit);

/* Peak resident memory of this process and total RAM, in GiB. */
double metrics_peak_rss_gib(void);
double metrics_total_ram_gib(void);

typedef struct StepMetrics {
    int64_t step;
    double loss, grad_norm, lr;
    double memory_gib, memory_pct; /* peak RSS and its share of total RAM */
    double tps;                    /* tokens per second per device */
    double tflops;                 /* achieved TFLOP/s per device */
    double mfu;                    /* percent of peak */
    double step_time_s;
    int64_t total_steps; /* training.steps, shown as step/total; 0 = not shown */
    double eta_s;        /* time left at the mean step time so far; 0 = not shown */
} StepMetrics;

/* Fills the throughput fields from the step's tokens (per device), its wall time, FLOPs per
 * token and the peak TFLOP/s, and the memory fields from the process. */
void metrics_fill(StepMetrics *m, double tokens, double step_time_s, double flops_per_token,
                  double peak_tflops);

/* The console line:
 * step:  1/100  loss: 12.04959  grad_norm:  1.7336  memory: 59.90GiB(21.65%)  tps: 441
 * tflops: 7.98  mfu: 0.32%  eta: 12m04s (one line; "/100" with total_steps, the eta with
 * eta_s > 0). Returns the length snprintf reports. */
int metrics_format_line(char *buf, size_t cap, const StepMetrics *m);

/* Extra numeric keys appended to a JSONL record (comm_s, MoE load statistics, ...). */
typedef struct MetricsExtra {
    const char *key;
    double value;
} MetricsExtra;

typedef struct TbWriter TbWriter;

typedef struct MetricsWriter {
    FILE *f; /* metrics.jsonl, or NULL (a rank that writes TensorBoard events only) */
    char *path;
    TbWriter *tb; /* TensorBoard events (metrics.enable_tensorboard), or NULL */
} MetricsWriter;

/* Opens {dump_folder}/metrics.jsonl (creating the folder). resume_step = 0 starts the file
 * afresh, never over an earlier run's records: a non-empty metrics.jsonl is first renamed to
 * the first free metrics.N.jsonl (N = 1, 2, ...), with a notice naming it. A run resumed from
 * the checkpoint of step S > 0 keeps the records of steps <= S and appends, so the steps
 * redone after S are not in the file twice. */
int metrics_writer_open(MetricsWriter *w, const char *dump_folder, int64_t resume_step, Err *err);
/* Adds TensorBoard events under dir (train/tensorboard.h) to w, opened or zeroed. */
int metrics_writer_open_tensorboard(MetricsWriter *w, const char *dir, Err *err);
/* One JSON object per line: step, loss, grad_norm, lr, memory_gib, tps, tflops, mfu,
 * step_time_s, then the extras; flushed so a crash loses at most the current line. With
 * TensorBoard on, the same numbers as scalars tagged with the same keys. */
int metrics_writer_write(MetricsWriter *w, const StepMetrics *m, const MetricsExtra *extra,
                         int nextra, Err *err);
/* Scalars that are not a training step's (validation: "validation/loss", ...) to TensorBoard
 * at step; nothing when w has no TensorBoard events. */
int metrics_log_scalars(MetricsWriter *w, int64_t step, const MetricsExtra *kv, int n, Err *err);
/* Any record (validation) as one line, flushed; o is not consumed. */
int metrics_writer_write_json(MetricsWriter *w, json_t *o, Err *err);
void metrics_writer_close(MetricsWriter *w);

/* Mean throughput over the steps after the first one this process ran (whose one-time costs,
 * page faults and allocation, would skew it). */
typedef struct MetricsSummary {
    int64_t seen, n;
    double tps, tflops, mfu;
} MetricsSummary;

void metrics_summary_add(MetricsSummary *s, const StepMetrics *m);
/* "steady state over N steps (first step excluded): tps: T  tflops: F  mfu: M%", or a sentence
 * saying there were too few steps. */
int metrics_summary_format(char *buf, size_t cap, const MetricsSummary *s);

#endif
