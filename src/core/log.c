/* Console logging with rank prefixes for multi-process runs. */
#include "core/log.h"

#include <stdarg.h>
#include <stdio.h>

static int g_rank = 0, g_world = 1;

void log_set_rank(int rank, int world) {
    g_rank = rank;
    g_world = world;
}

int log_rank(void) {
    return g_rank;
}

/* The line is formatted first and written with one call, so the lines of ranks sharing a
 * console (mpirun forwards them) do not interleave mid-line on unbuffered stderr. */
static void vlog(FILE *f, const char *tag, const char *fmt, va_list ap) {
    char line[4096];
    int n = 0;
    if (g_world > 1) n = snprintf(line, sizeof line, "[rank %d] ", g_rank);
    n += snprintf(line + n, sizeof line - (size_t)n, "%s", tag ? tag : "");
    int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    n = m < 0 ? n : (n + m < (int)sizeof line - 1 ? n + m : (int)sizeof line - 2);
    line[n++] = '\n';
    fwrite(line, 1, (size_t)n, f);
    fflush(f);
}

static int g_info = 1;

int log_set_info(int on) {
    int was = g_info;
    g_info = on;
    return was;
}

int log_info_on(void) {
    return g_info;
}

static int g_info_stderr;

void log_info_to_stderr(void) {
    g_info_stderr = 1;
}

void log_info(const char *fmt, ...) {
    if (g_rank != 0 || !g_info) return;
    va_list ap;
    va_start(ap, fmt);
    vlog(g_info_stderr ? stderr : stdout, NULL, fmt, ap);
    va_end(ap);
}

void log_warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlog(stderr, "warning: ", fmt, ap);
    va_end(ap);
}

void log_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vlog(stderr, "error: ", fmt, ap);
    va_end(ap);
}
