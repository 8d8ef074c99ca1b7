/* Trace recording and the Chrome trace-event writer (trace.h). */
#include "core/trace.h"

#include <inttypes.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fs.h"
#include "core/timer.h"

/* A step of a large model makes some 10^4 events per thread; this bounds a runaway one. */
#define TRACE_MAX_EVENTS (1 << 20)
/* Threads that can record: the driver and OpenMP's workers (an event of a further thread is
 * counted as dropped). */
#define TRACE_MAX_THREADS 512

typedef struct TraceEvent {
    const char *name, *detail, *cat;
    double t0, t1;
    char args[64];
} TraceEvent;

/* One thread's events: only that thread appends, so recording takes no lock; trace_write reads
 * them after the step, when every parallel region has joined. */
typedef struct TraceThread {
    TraceEvent *ev;
    int n, cap, dropped;
    long tid;   /* the kernel's thread id: one Perfetto track per thread */
    int worker; /* OpenMP thread number when this thread first recorded */
} TraceThread;

static int g_on;
static double g_start;
static long g_driver; /* tid of the thread that called trace_start */
static TraceThread g_threads[TRACE_MAX_THREADS];
static _Atomic int g_nthreads, g_overflow;
static _Thread_local int t_slot = -1;

int trace_recording(void) {
    return g_on;
}

void trace_start(void) {
    for (int i = 0; i < g_nthreads; i++)
        g_threads[i].n = g_threads[i].dropped = 0;
    g_overflow = 0;
    g_driver = (long)gettid();
    g_start = now_seconds();
    g_on = 1;
}

double trace_now(void) {
    return g_on ? now_seconds() : 0;
}

static TraceThread *this_thread(void) {
    if (t_slot < 0) {
        int k = g_nthreads++;
        if (k >= TRACE_MAX_THREADS) {
            g_nthreads = TRACE_MAX_THREADS;
            return NULL;
        }
        g_threads[k].tid = (long)gettid();
        g_threads[k].worker = omp_get_thread_num();
        t_slot = k;
    }
    return &g_threads[t_slot];
}

void trace_span(const char *name, const char *detail, const char *cat, double t0,
                const char *args) {
    if (!g_on) return;
    double t1 = now_seconds();
    TraceThread *t = this_thread();
    if (!t) {
        g_overflow++;
        return;
    }
    if (t->n == TRACE_MAX_EVENTS) {
        t->dropped++;
        return;
    }
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 4096;
        t->ev = xrealloc(t->ev, (size_t)t->cap * sizeof *t->ev);
    }
    TraceEvent *e = &t->ev[t->n++];
    e->name = name;
    e->detail = detail && detail[0] ? detail : NULL;
    e->cat = cat;
    e->t0 = t0;
    e->t1 = t1;
    snprintf(e->args, sizeof e->args, "%s", args ? args : "");
}

/* Names are identifiers and kernel names; escape what JSON needs anyway. */
static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\u%04x", *s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

static void event(FILE *f, const char *name, const char *detail, const char *cat, double t0,
                  double t1, int rank, long tid, const char *args, int first) {
    fputs(first ? "\n" : ",\n", f);
    fputs("{\"name\": ", f);
    if (detail) {
        char both[160];
        snprintf(both, sizeof both, "%s [%s]", name, detail);
        json_str(f, both);
    } else {
        json_str(f, name);
    }
    fputs(", \"cat\": ", f);
    json_str(f, cat);
    /* Microseconds from the step's start, as the format wants. */
    fprintf(f, ", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": %d, \"tid\": %ld",
            1e6 * (t0 - g_start), 1e6 * (t1 - t0), rank, tid);
    if (args && args[0]) fprintf(f, ", \"args\": {%s}", args);
    fputc('}', f);
}

int trace_write(const char *dir, int64_t step, int rank, Err *err) {
    double end = now_seconds();
    g_on = 0;
    char sub[64];
    snprintf(sub, sizeof sub, "iteration_%" PRId64, step);
    char *folder = fs_join(dir, sub);
    int rc = fs_mkdirs(folder, err);
    char name[64];
    snprintf(name, sizeof name, "rank%d_trace.json", rank);
    char *path = fs_join(folder, name);
    FILE *f = rc == 0 ? fopen(path, "w") : NULL;
    if (rc == 0 && !f) rc = err_sys(err, "cannot create trace file %s", path);
    if (f) {
        fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [");
        fprintf(f,
                "\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, "
                "\"args\": {\"name\": \"rank %d\"}}",
                rank, rank);
        /* Each thread its own track, named, the driver first (sort_index orders the tracks). */
        int dropped = g_overflow, nthreads = g_nthreads;
        for (int i = 0; i < nthreads; i++)
            dropped += g_threads[i].dropped;
        for (int i = 0; i <= nthreads; i++) {
            const TraceThread *t = i < nthreads ? &g_threads[i] : NULL;
            if (t && (t->tid == g_driver || t->n == 0)) continue;
            char tname[64];
            if (t)
                snprintf(tname, sizeof tname, "OpenMP thread %d", t->worker);
            else
                snprintf(tname, sizeof tname, "step driver (OpenMP thread 0)");
            long tid = t ? t->tid : g_driver;
            fprintf(f,
                    ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %ld, "
                    "\"args\": {\"name\": \"%s\"}}",
                    rank, tid, tname);
            fprintf(f,
                    ",\n{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": %d, \"tid\": "
                    "%ld, \"args\": {\"sort_index\": %d}}",
                    rank, tid, t ? t->worker + 1 : 0);
        }
        char args[64];
        snprintf(args, sizeof args, "\"step\": %" PRId64 ", \"dropped_events\": %d", step, dropped);
        event(f, "step", NULL, "step", g_start, end, rank, g_driver, args, 0);
        for (int i = 0; i < nthreads; i++) {
            const TraceThread *t = &g_threads[i];
            for (int k = 0; k < t->n; k++)
                event(f, t->ev[k].name, t->ev[k].detail, t->ev[k].cat, t->ev[k].t0, t->ev[k].t1,
                      rank, t->tid, t->ev[k].args, 0);
        }
        fprintf(f, "\n]}\n");
        if (ferror(f)) rc = err_sys(err, "cannot write trace file %s", path);
        if (fclose(f) != 0 && rc == 0) rc = err_sys(err, "cannot write trace file %s", path);
    }
    free(path);
    free(folder);
    for (int i = 0; i < g_nthreads; i++)
        g_threads[i].n = 0;
    return rc;
}
