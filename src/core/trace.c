/* Trace recording and the Chrome trace-event writer (trace.h). */
#include "core/trace.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fs.h"
#include "core/timer.h"

/* A step of a large model makes some 10^4 events; this bounds a runaway one. */
#define TRACE_MAX_EVENTS (1 << 20)

typedef struct TraceEvent {
    const char *name, *detail, *cat;
    double t0, t1;
    char args[64];
} TraceEvent;

static int g_on;
static double g_start;
static TraceEvent *g_ev;
static int g_n, g_cap, g_dropped;

int trace_recording(void) {
    return g_on;
}

void trace_start(void) {
    g_on = 1;
    g_n = g_dropped = 0;
    g_start = now_seconds();
}

double trace_now(void) {
    return g_on ? now_seconds() : 0;
}

void trace_span(const char *name, const char *detail, const char *cat, double t0,
                const char *args) {
    if (!g_on) return;
    if (g_n == TRACE_MAX_EVENTS) {
        g_dropped++;
        return;
    }
    if (g_n == g_cap) {
        g_cap = g_cap ? 2 * g_cap : 4096;
        g_ev = xrealloc(g_ev, (size_t)g_cap * sizeof *g_ev);
    }
    TraceEvent *e = &g_ev[g_n++];
    e->name = name;
    e->detail = detail && detail[0] ? detail : NULL;
    e->cat = cat;
    e->t0 = t0;
    e->t1 = now_seconds();
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
                  double t1, int rank, const char *args, int first) {
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
    fprintf(f, ", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": %d, \"tid\": 0",
            1e6 * (t0 - g_start), 1e6 * (t1 - t0), rank);
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
        fprintf(f,
                ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, "
                "\"args\": {\"name\": \"step driver\"}}",
                rank);
        char args[64];
        snprintf(args, sizeof args, "\"step\": %" PRId64 ", \"dropped_events\": %d", step,
                 g_dropped);
        event(f, "step", NULL, "step", g_start, end, rank, args, 0);
        for (int i = 0; i < g_n; i++)
            event(f, g_ev[i].name, g_ev[i].detail, g_ev[i].cat, g_ev[i].t0, g_ev[i].t1, rank,
                  g_ev[i].args, 0);
        fprintf(f, "\n]}\n");
        if (ferror(f)) rc = err_sys(err, "cannot write trace file %s", path);
        if (fclose(f) != 0 && rc == 0) rc = err_sys(err, "cannot write trace file %s", path);
    }
    free(path);
    free(folder);
    g_n = 0;
    return rc;
}
