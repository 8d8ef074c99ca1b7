/* Console logging with rank prefixes for multi-process runs. */
#include "core/log.h"

#include <stdarg.h>
#include <stdio.h>

static int g_rank = 0, g_world = 1;

void log_set_rank(int rank, int world) {
    g_rank = rank;
    g_world = world;
}

int log_rank(void) { return g_rank; }

static void vlog(FILE *f, const char *tag, const char *fmt, va_list ap) {
    if (g_world > 1) fprintf(f, "[rank %d] ", g_rank);
    if (tag) fputs(tag, f);
    vfprintf(f, fmt, ap);
    fputc('\n', f);
    fflush(f);
}

void log_info(const char *fmt, ...) {
    if (g_rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    vlog(stdout, NULL, fmt, ap);
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
