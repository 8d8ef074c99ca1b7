/* Metrics: FLOP counting, a measured CPU peak, memory, and the console / JSONL outputs. */
#include "train/metrics.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fs.h"
#include "core/json.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/timer.h"
#include "kernels/cpu_peak.h"
#include "train/tensorboard.h"

/* The rule model_spec.h states for model_spec_layer_is_moe, restated here so FLOP counting
 * does not depend on the flavor table's translation unit. */
static int layer_is_moe(const ModelSpec *s, int l) {
    if (s->num_experts <= 0 || s->mlp_only_layers[l]) return 0;
    int step = s->decoder_sparse_step > 0 ? s->decoder_sparse_step : 1;
    return (l + 1) % step == 0;
}

double metrics_matmul_params(const ModelSpec *s) {
    double D = s->dim, H = s->n_heads, K = s->n_kv_heads, E = s->head_dim;
    double attention = D * H * E + 2.0 * D * K * E + H * E * D; /* wq, wk + wv, wo */
    double total = 0;
    for (int l = 0; l < s->n_layers; l++) {
        total += attention;
        if (layer_is_moe(s, l))
            total += D * s->num_experts + (double)s->top_k * 3.0 * D * s->moe_hidden_dim;
        else
            total += 3.0 * D * s->hidden_dim;
    }
    return total + (double)s->vocab_size * D; /* lm_head */
}

double metrics_flops_per_token(const ModelSpec *s, int seq_len) {
    return 6.0 * metrics_matmul_params(s) +
           12.0 * s->n_layers * (double)s->n_heads * s->head_dim * (double)seq_len;
}

static double thread_cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Every thread runs `iters` iterations at once and times itself in its own CPU time, so other
 * processes on a shared machine lower the wall-clock rate but not the measured one. The loop is
 * cpu_peak_fma_loop: 12 register-resident FMA chains, whose checksum tests/test_cpu_peak.c
 * verifies. (An earlier loop here kept its accumulators in a stack array: every FMA went
 * through a store and a reload and it read ~4x below the real peak, e.g. 0.097 instead of
 * ~0.42 TFLOP/s on 2 Sapphire Rapids cores.) Returns the sum of the threads' FLOP/s; *cpu gets
 * the shortest thread CPU time (for sizing the run). */
typedef enum PeakUnit { PEAK_FMA, PEAK_DPBF16, PEAK_AMX } PeakUnit;

/* FLOPs one iteration of a unit's loop does on one thread (kernels/cpu_peak.h). */
static double peak_flop_per_iter(PeakUnit u) {
    switch (u) {
    case PEAK_AMX:
        return 4.0 * 16 * 16 * 32 * 2; /* 4 tiles of 16x16, 32 products each */
    case PEAK_DPBF16:
        return 12.0 * 32 * 2; /* 12 chains of 32 products */
    default:
        return 2.0 * 12.0 * cpu_peak_fma_lanes();
    }
}

static double peak_loop(PeakUnit u, long iters) {
    return u == PEAK_AMX      ? cpu_peak_amx_loop(iters)
           : u == PEAK_DPBF16 ? cpu_peak_dpbf16_loop(iters)
                              : cpu_peak_fma_loop(iters, 1.0f, 1.0f);
}

static double peak_run(PeakUnit u, long iters, double *cpu, volatile float *sink) {
    double rate = 0, shortest = 1e300;
    const double flop_per_iter = peak_flop_per_iter(u);
#pragma omp parallel reduction(+ : rate) reduction(min : shortest)
    {
        double t0 = thread_cpu_seconds();
        double r = peak_loop(u, iters);
        double t = thread_cpu_seconds() - t0;
        if (r == 12345.678) *sink = (float)r; /* keeps the loop alive */
        if (t <= 0) t = 1e-9;
        rate += flop_per_iter * (double)iters / t;
        shortest = t;
    }
    *cpu = shortest;
    return rate;
}

static double measure_peak(PeakUnit u, double seconds) {
    volatile float sink = 0;
    long iters = 1 << 12;
    double cpu;
    peak_run(u, iters, &cpu, &sink);
    /* Grow the run until it is long enough to time, then size the measured runs; the best of
     * three is kept (a run can still lose its core's caches or frequency to a neighbour). */
    while (cpu < 0.01 && iters < (1L << 40)) {
        iters *= 4;
        peak_run(u, iters, &cpu, &sink);
    }
    long measured = (long)((double)iters * seconds / 3.0 / (cpu > 0 ? cpu : 1e-9));
    if (measured < iters) measured = iters;
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        double r = peak_run(u, measured, &cpu, &sink);
        if (r > best) best = r;
    }
    return best / 1e12;
}

double metrics_measure_peak_tflops(double seconds) {
    return measure_peak(PEAK_FMA, seconds);
}

double metrics_measure_peak_tflops_bf16(double seconds, const char **unit) {
    PeakUnit u = cpu_peak_amx_loop(1) >= 0      ? PEAK_AMX
                 : cpu_peak_dpbf16_loop(1) >= 0 ? PEAK_DPBF16
                                                : PEAK_FMA;
    if (unit) *unit = u == PEAK_AMX ? "amx bf16" : u == PEAK_DPBF16 ? "avx512_bf16" : "fp32 fma";
    return measure_peak(u, seconds);
}

double metrics_peak_rss_gib(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0.0;
    return (double)ru.ru_maxrss * 1024.0 / (1024.0 * 1024.0 * 1024.0); /* ru_maxrss is KiB */
}

double metrics_total_ram_gib(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) return 0.0;
    return (double)pages * (double)page / (1024.0 * 1024.0 * 1024.0);
}

void metrics_fill(StepMetrics *m, double tokens, double step_time_s, double flops_per_token,
                  double peak_tflops) {
    m->step_time_s = step_time_s;
    m->tps = step_time_s > 0 ? tokens / step_time_s : 0.0;
    m->tflops = flops_per_token * m->tps / 1e12;
    m->mfu = peak_tflops > 0 ? 100.0 * m->tflops / peak_tflops : 0.0;
    m->memory_gib = metrics_peak_rss_gib();
    double total = metrics_total_ram_gib();
    m->memory_pct = total > 0 ? 100.0 * m->memory_gib / total : 0.0;
}

int metrics_format_line(char *buf, size_t cap, const StepMetrics *m) {
    char total[32] = "", eta[48] = "";
    if (m->total_steps > 0) snprintf(total, sizeof total, "/%lld", (long long)m->total_steps);
    if (m->eta_s > 0) {
        char d[32];
        format_duration(d, sizeof d, m->eta_s);
        snprintf(eta, sizeof eta, "  eta: %s", d);
    }
    return snprintf(buf, cap,
                    "step: %2lld%s  loss: %8.5f  grad_norm: %7.4f  memory: %5.2fGiB(%.2f%%)  "
                    "tps: %.0f  tflops: %.2f  mfu: %.2f%%%s",
                    (long long)m->step, total, m->loss, m->grad_norm, m->memory_gib, m->memory_pct,
                    round(m->tps), m->tflops, m->mfu, eta);
}

/* Keeps the records of steps <= keep_step (and drops a torn last line): a run resumed from the
 * checkpoint of keep_step redoes the steps after it and writes their records again. The file is
 * rewritten atomically, so a crash here leaves the old one. */
static int drop_records_after(const char *path, int64_t keep_step, Err *err) {
    if (!fs_exists(path)) return 0;
    char *data;
    size_t len;
    TRY(fs_read_all(path, &data, &len, err));
    size_t out = 0;
    int dropped = 0;
    for (size_t i = 0; i < len;) {
        size_t end = i;
        while (end < len && data[end] != '\n')
            end++;
        int keep = 0;
        if (end < len) { /* a complete line */
            json_error_t je;
            json_t *o = json_parse(data + i, end - i, 0, &je);
            json_t *st = o ? json_object_get(o, "step") : NULL;
            keep = json_is_integer(st) && json_integer_value(st) <= keep_step;
            json_decref(o);
        }
        if (keep) {
            memmove(data + out, data + i, end + 1 - i);
            out += end + 1 - i;
        } else {
            dropped = 1;
        }
        i = end + 1;
    }
    int rc = dropped ? fs_write_atomic(path, data, out, err) : 0;
    free(data);
    return rc;
}

/* A fresh run's metrics.jsonl: an earlier run's non-empty file is moved to metrics.N.jsonl. */
static int keep_earlier_run(const char *dump_folder, const char *path, Err *err) {
    struct stat st;
    if (stat(path, &st) != 0 || st.st_size == 0) return 0;
    for (int n = 1;; n++) {
        char name[48];
        snprintf(name, sizeof name, "metrics.%d.jsonl", n);
        char *kept = fs_join(dump_folder, name);
        if (fs_exists(kept)) {
            free(kept);
            continue;
        }
        int rc = rename(path, kept) == 0 ? 0 : err_sys(err, "cannot move %s to %s", path, kept);
        if (rc == 0)
            log_info("metrics: %s holds an earlier run's records; kept them as %s, this run "
                     "writes a new %s",
                     path, kept, path);
        free(kept);
        return rc;
    }
}

int metrics_writer_open(MetricsWriter *w, const char *dump_folder, int64_t resume_step, Err *err) {
    memset(w, 0, sizeof *w);
    TRY(fs_mkdirs(dump_folder, err));
    w->path = fs_join(dump_folder, "metrics.jsonl");
    if ((resume_step > 0 ? drop_records_after(w->path, resume_step, err)
                         : keep_earlier_run(dump_folder, w->path, err)) != 0) {
        free(w->path);
        w->path = NULL;
        return -1;
    }
    w->f = fopen(w->path, "a");
    if (!w->f) {
        err_sys(err, "cannot open %s for writing", w->path);
        free(w->path);
        w->path = NULL;
        return -1;
    }
    return 0;
}

/* JSON has no NaN or inf: a diverged loss is written as null so the file stays parseable. */
static json_t *num(double x) {
    return isfinite(x) ? json_real(x) : json_null();
}

int metrics_writer_open_tensorboard(MetricsWriter *w, const char *dir, Err *err) {
    return tb_open(&w->tb, dir, err);
}

int metrics_log_scalars(MetricsWriter *w, int64_t step, const MetricsExtra *kv, int n, Err *err) {
    if (!w->tb) return 0;
    const char **tags = xcalloc((size_t)(n ? n : 1), sizeof *tags);
    double *vals = xcalloc((size_t)(n ? n : 1), sizeof *vals);
    for (int i = 0; i < n; i++) {
        tags[i] = kv[i].key;
        vals[i] = kv[i].value;
    }
    int rc = tb_write_scalars(w->tb, step, tags, vals, n, err);
    free(tags);
    free(vals);
    return rc;
}

int metrics_writer_write(MetricsWriter *w, const StepMetrics *m, const MetricsExtra *extra,
                         int nextra, Err *err) {
    /* One list of keys for the JSONL record and the TensorBoard tags. */
    MetricsExtra *kv = xcalloc((size_t)nextra + 8, sizeof *kv);
    int n = 0;
    kv[n++] = (MetricsExtra){"loss", m->loss};
    kv[n++] = (MetricsExtra){"grad_norm", m->grad_norm};
    kv[n++] = (MetricsExtra){"lr", m->lr};
    kv[n++] = (MetricsExtra){"memory_gib", m->memory_gib};
    kv[n++] = (MetricsExtra){"tps", m->tps};
    kv[n++] = (MetricsExtra){"tflops", m->tflops};
    kv[n++] = (MetricsExtra){"mfu", m->mfu};
    kv[n++] = (MetricsExtra){"step_time_s", m->step_time_s};
    for (int i = 0; i < nextra; i++)
        kv[n++] = extra[i];
    int rc = 0;
    if (w->f) {
        json_t *o = json_object();
        json_object_set_new(o, "step", json_integer(m->step));
        for (int i = 0; i < n; i++)
            json_object_set_new(o, kv[i].key, num(kv[i].value));
        char *line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
        json_decref(o);
        int ok = line && fprintf(w->f, "%s\n", line) >= 0 && fflush(w->f) == 0;
        free(line);
        if (!ok) rc = err_sys(err, "cannot write to %s", w->path);
    }
    if (rc == 0) rc = metrics_log_scalars(w, m->step, kv, n, err);
    free(kv);
    return rc;
}

int metrics_writer_write_json(MetricsWriter *w, json_t *o, Err *err) {
    char *line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    int ok = line && fprintf(w->f, "%s\n", line) >= 0 && fflush(w->f) == 0;
    free(line);
    if (!ok) return err_sys(err, "cannot write to %s", w->path);
    return 0;
}

void metrics_writer_close(MetricsWriter *w) {
    if (w->f) fclose(w->f);
    tb_close(w->tb);
    free(w->path);
    memset(w, 0, sizeof *w);
}

void metrics_summary_add(MetricsSummary *s, const StepMetrics *m) {
    if (s->seen++ == 0) return;
    s->n++;
    s->tps += m->tps;
    s->tflops += m->tflops;
    s->mfu += m->mfu;
}

int metrics_summary_format(char *buf, size_t cap, const MetricsSummary *s) {
    if (s->n == 0)
        return snprintf(buf, cap,
                        "steady state: not enough steps (the first step is excluded, %lld ran)",
                        (long long)s->seen);
    double n = (double)s->n;
    return snprintf(buf, cap,
                    "steady state over %lld steps (first step excluded): tps: %.0f  tflops: "
                    "%.2f  mfu: %.2f%%",
                    (long long)s->n, round(s->tps / n), s->tflops / n, s->mfu / n);
}
