/* Start-up progress lines (progress.h). */
#include "core/progress.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "core/timer.h"

/* A terminal is redrawn at most this often: more is flicker, not information. */
#define TTY_REDRAW_S 0.1

void progress_start(Progress *p, const char *what, double total, const char *unit, double scale) {
    memset(p, 0, sizeof *p);
    snprintf(p->what, sizeof p->what, "%s", what);
    p->total = total;
    p->unit = unit;
    p->scale = scale > 0 ? scale : 1;
    p->t0 = p->last_print = now_seconds();
    p->on = log_rank() == 0;
    p->tty = isatty(2);
    const char *env = getenv("QT_PROGRESS_SECONDS");
    p->interval = env && env[0] ? atof(env) : 10.0;
}

void format_duration(char *buf, int cap, double s) {
    long long t = s > 0 && s < 1e12 ? (long long)(s + 0.5) : 0;
    if (t >= 3600)
        snprintf(buf, (size_t)cap, "%lldh%02lldm%02llds", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, (size_t)cap, "%lldm%02llds", t / 60, t % 60);
}

void progress_format(char *buf, int cap, const Progress *p, double done, double now) {
    double el = now - p->t0, rate = el > 0 ? done / el : 0;
    int o = 0;
    if (p->total > 0)
        o = snprintf(buf, (size_t)cap, "%3.0f%%  %.1f/%.1f %s", 100.0 * done / p->total,
                     done / p->scale, p->total / p->scale, p->unit);
    else
        o = snprintf(buf, (size_t)cap, "%.1f %s", done / p->scale, p->unit);
    if (o < 0 || o >= cap) return;
    o += snprintf(buf + o, (size_t)(cap - o), "  %.1f %s/s", rate / p->scale, p->unit);
    if (o < cap && p->total > 0 && rate > 0) {
        char eta[32];
        format_duration(eta, sizeof eta, (p->total - done) / rate);
        snprintf(buf + o, (size_t)(cap - o), "  eta %s", eta);
    }
}

void progress_update(Progress *p, double done) {
    if (!p->on) return;
    double now = now_seconds();
    if (now - p->last_print < (p->tty ? TTY_REDRAW_S : p->interval)) return;
    p->last_print = now;
    char line[256];
    progress_format(line, sizeof line, p, done, now);
    if (p->tty) {
        fprintf(stderr, "\r%s: %s\033[K", p->what, line);
        p->drawn = 1;
    } else {
        fprintf(stderr, "%s: %s\n", p->what, line);
    }
    fflush(stderr);
}

void progress_add(Progress *p, double amount) {
    p->done += amount;
    progress_update(p, p->done);
}

void progress_finish(Progress *p) {
    if (p->on && p->tty && p->drawn) fputs("\r\033[K", stderr);
    p->drawn = 0;
}
