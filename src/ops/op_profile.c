/* The op profile's rows and table (see op_profile.h). */
#include "ops/op_profile.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"
#include "core/trace.h"

#define PROF_MAX_ROWS 48
#define PROF_MAX_DEPTH 8

typedef struct ProfRow {
    const char *what, *impl; /* static strings (op kind and implementation names) */
    int bwd;
    long calls;
    double seconds, gemm_seconds;
} ProfRow;

static int g_state = -1; /* -1 unread, 0 off, 1 on */
static ProfRow g_rows[PROF_MAX_ROWS];
static int g_nrows;
/* Open rows, innermost last, with their start times. */
static int g_stack[PROF_MAX_DEPTH];
static double g_t0[PROF_MAX_DEPTH];
static int g_depth;

int prof_enabled(void) {
    if (g_state < 0) {
        const char *e = getenv("QT_PROFILE");
        g_state = e && strcmp(e, "1") == 0;
    }
    return g_state;
}

static int find_row(const char *what, const char *impl, int bwd) {
    for (int i = 0; i < g_nrows; i++)
        if (g_rows[i].bwd == bwd && strcmp(g_rows[i].what, what) == 0 &&
            strcmp(g_rows[i].impl, impl) == 0)
            return i;
    return -1;
}

static int row_index(const char *what, const char *impl, int bwd) {
    int i = find_row(what, impl, bwd);
    if (i >= 0) return i;
    if (g_nrows == PROF_MAX_ROWS) return -1;
    g_rows[g_nrows] = (ProfRow){.what = what, .impl = impl, .bwd = bwd};
    return g_nrows++;
}

int prof_timing(void) {
    return prof_enabled() || trace_recording();
}

int prof_begin(const char *what, const char *impl, int bwd) {
    if (!prof_timing() || omp_in_parallel() || g_depth == PROF_MAX_DEPTH) return -1;
    int r = row_index(what, impl, bwd);
    if (r < 0) return -1;
    g_stack[g_depth] = r;
    g_t0[g_depth] = now_seconds();
    return g_depth++;
}

void prof_end(int token) {
    if (token < 0 || token != g_depth - 1) return;
    g_depth--;
    ProfRow *r = &g_rows[g_stack[g_depth]];
    double dt = now_seconds() - g_t0[g_depth];
    trace_span(r->what, r->impl, r->bwd ? "backward" : "forward", g_t0[g_depth], NULL);
    r->seconds += dt;
    r->calls++;
    /* A nested row's time is its own; take it out of the enclosing row. */
    if (g_depth > 0) g_rows[g_stack[g_depth - 1]].seconds -= dt;
}

void prof_gemm_add(double seconds) {
    if (!prof_timing() || omp_in_parallel()) return;
    if (g_depth > 0) {
        g_rows[g_stack[g_depth - 1]].gemm_seconds += seconds;
        return;
    }
    int r = row_index("gemm (other)", "", 0);
    if (r >= 0) {
        g_rows[r].seconds += seconds;
        g_rows[r].gemm_seconds += seconds;
        g_rows[r].calls++;
    }
}

void prof_gemm_part(const char *what, double seconds) {
    if (!prof_timing() || omp_in_parallel()) return;
    int r = row_index(what, "", 0);
    if (r < 0) return;
    g_rows[r].seconds += seconds;
    g_rows[r].gemm_seconds += seconds;
    g_rows[r].calls++;
    if (g_depth > 0) g_rows[g_stack[g_depth - 1]].seconds -= seconds;
}

static int by_time(const void *a, const void *b) {
    const ProfRow *x = a, *y = b;
    return (x->seconds < y->seconds) - (x->seconds > y->seconds);
}

void prof_report(FILE *f, long steps) {
    if (!prof_enabled() || g_nrows == 0) return;
    if (steps < 1) steps = 1;
    ProfRow rows[PROF_MAX_ROWS];
    memcpy(rows, g_rows, sizeof rows);
    qsort(rows, (size_t)g_nrows, sizeof rows[0], by_time);
    double total = 0, gemm = 0;
    for (int i = 0; i < g_nrows; i++) {
        total += rows[i].seconds;
        gemm += rows[i].gemm_seconds;
    }
    fprintf(f, "op profile (QT_PROFILE=1): ms per step over %ld step(s), %d thread(s)\n", steps,
            omp_get_max_threads());
    fprintf(f, "  %-28s %-4s %9s %9s %9s %7s %7s\n", "op [implementation]", "dir", "calls", "ms",
            "gemm ms", "share", "non-gemm");
    for (int i = 0; i < g_nrows; i++) {
        const ProfRow *r = &rows[i];
        char name[64];
        if (r->impl[0])
            snprintf(name, sizeof name, "%s [%s]", r->what, r->impl);
        else
            snprintf(name, sizeof name, "%s", r->what);
        fprintf(f, "  %-28s %-4s %9.1f %9.1f %9.1f %6.1f%% %6.1f%%\n", name, r->bwd ? "bwd" : "fwd",
                (double)r->calls / steps, 1e3 * r->seconds / steps, 1e3 * r->gemm_seconds / steps,
                total > 0 ? 100 * r->seconds / total : 0,
                total > 0 ? 100 * (r->seconds - r->gemm_seconds) / total : 0);
    }
    fprintf(f, "  %-28s %-4s %9s %9.1f %9.1f %6.1f%%\n", "total", "", "", 1e3 * total / steps,
            1e3 * gemm / steps, 100.0);
}

void prof_reset(void) {
    g_nrows = 0;
    g_depth = 0;
}

int prof_row(const char *what, const char *impl, int bwd, double *seconds, double *gemm_seconds) {
    int i = find_row(what, impl, bwd);
    if (i < 0) return -1;
    *seconds = g_rows[i].seconds;
    *gemm_seconds = g_rows[i].gemm_seconds;
    return 0;
}
