/* The machine's best measured peak, kept between runs (core/peak_record.h). */
#include "core/peak_record.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fs.h"
#include "core/log.h"

#define MAGIC "qtitan peak record 1"

/* Copies the text of [s, s + n) into dst (PEAK_RECORD_TEXT bytes), cut to fit. */
static void copy_text(char *dst, const char *s, size_t n) {
    if (n >= PEAK_RECORD_TEXT) n = PEAK_RECORD_TEXT - 1;
    memcpy(dst, s, n);
    dst[n] = 0;
}

/* The "model name" of the first processor in /proc/cpuinfo, or "unknown". */
static void cpu_model(char *dst) {
    copy_text(dst, "unknown", 7);
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        const char *v = strchr(line, ':');
        if (!v) break;
        v += strspn(v + 1, " \t") + 1;
        size_t n = strcspn(v, "\r\n");
        while (n > 0 && isspace((unsigned char)v[n - 1]))
            n--;
        if (n > 0) copy_text(dst, v, n);
        break;
    }
    fclose(f);
}

void peak_record_this_machine(PeakRecord *r, const char *unit, int threads) {
    memset(r, 0, sizeof *r);
    cpu_model(r->cpu);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    r->processors = n > 0 && n < 1 << 20 ? (int)n : 1;
    copy_text(r->unit, unit, strlen(unit));
    r->threads = threads;
}

int peak_record_format(char *buf, size_t cap, const PeakRecord *r) {
    return snprintf(buf, cap,
                    MAGIC "\ncpu %s\nprocessors %d\nunit %s\nthreads %d\ntflops %.6g\nruns %ld\n",
                    r->cpu, r->processors, r->unit, r->threads, r->tflops, r->runs);
}

/* A whole-line integer in [lo, hi] from [v, v + n); 0 or -1. */
static int parse_long(const char *v, size_t n, long lo, long hi, long *out) {
    char tmp[32];
    if (n == 0 || n >= sizeof tmp || !isdigit((unsigned char)v[0])) return -1;
    memcpy(tmp, v, n);
    tmp[n] = 0;
    char *end;
    errno = 0;
    long x = strtol(tmp, &end, 10);
    if (*end || errno || x < lo || x > hi) return -1;
    *out = x;
    return 0;
}

int peak_record_parse(const char *text, size_t len, const char *name, PeakRecord *out, Err *err) {
    enum { CPU, PROCESSORS, UNIT, THREADS, TFLOPS, RUNS, KEYS };
    static const char *const keys[KEYS] = {"cpu",     "processors", "unit",
                                           "threads", "tflops",     "runs"};
    static const char *const want[KEYS] = {"the CPU's model name",     "a processor count from 1",
                                           "the unit's name",          "a thread count from 1",
                                           "a finite TFLOP/s above 0", "a run count from 1"};
    PeakRecord r;
    memset(&r, 0, sizeof r);
    int seen[KEYS] = {0};
    size_t at = 0;
    int line = 0;
    while (at < len) {
        const char *s = text + at;
        const char *nl = memchr(s, '\n', len - at);
        size_t n = nl ? (size_t)(nl - s) : len - at;
        at += n + (nl != NULL);
        line++;
        if (memchr(s, 0, n))
            return err_set(err, "%s: line %d: expected text, found a NUL byte", name, line);
        if (line == 1) {
            if (n != strlen(MAGIC) || memcmp(s, MAGIC, n) != 0)
                return err_set(err, "%s: line 1: expected \"%s\"", name, MAGIC);
            continue;
        }
        int k = 0;
        for (; k < KEYS; k++) {
            size_t kl = strlen(keys[k]);
            if (n > kl && memcmp(s, keys[k], kl) == 0 && s[kl] == ' ') break;
        }
        if (k == KEYS)
            return err_set(err,
                           "%s: line %d: expected one of cpu, processors, unit, threads, tflops, "
                           "runs followed by a space and its value",
                           name, line);
        if (seen[k]) return err_set(err, "%s: line %d: %s given twice", name, line, keys[k]);
        seen[k] = 1;
        const char *v = s + strlen(keys[k]) + 1;
        size_t vn = n - strlen(keys[k]) - 1;
        long x = 0;
        int bad = 0;
        switch (k) {
        case CPU:
        case UNIT:
            bad = vn == 0 || vn >= PEAK_RECORD_TEXT;
            if (!bad) copy_text(k == CPU ? r.cpu : r.unit, v, vn);
            break;
        case PROCESSORS:
        case THREADS:
            bad = parse_long(v, vn, 1, 1 << 20, &x) != 0;
            if (k == PROCESSORS)
                r.processors = (int)x;
            else
                r.threads = (int)x;
            break;
        case RUNS:
            bad = parse_long(v, vn, 1, 1L << 40, &r.runs) != 0;
            break;
        default: { /* TFLOPS */
            char tmp[48];
            bad = vn == 0 || vn >= sizeof tmp || !isdigit((unsigned char)v[0]);
            if (!bad) {
                memcpy(tmp, v, vn);
                tmp[vn] = 0;
                char *end;
                r.tflops = strtod(tmp, &end);
                bad = *end || !isfinite(r.tflops) || !(r.tflops > 0);
            }
        }
        }
        if (bad) return err_set(err, "%s: line %d: %s: expected %s", name, line, keys[k], want[k]);
    }
    if (line == 0)
        return err_set(err, "%s: line 1: expected \"%s\", found an empty file", name, MAGIC);
    for (int k = 0; k < KEYS; k++)
        if (!seen[k])
            return err_set(err, "%s: line %d: expected a line \"%s\" (%s)", name, line + 1, keys[k],
                           want[k]);
    *out = r;
    return 0;
}

char *peak_record_path(const char *dir, const PeakRecord *r) {
    char name[3 * PEAK_RECORD_TEXT];
    snprintf(name, sizeof name, "peak-%s-%dt-%s-%dp", r->unit, r->threads, r->cpu, r->processors);
    for (char *c = name + 5; *c; c++)
        if (!isalnum((unsigned char)*c) && *c != '-') *c = '_';
    size_t n = strlen(name);
    snprintf(name + n, sizeof name - n, ".txt");
    return fs_join(dir, name);
}

static int same_machine(const PeakRecord *a, const PeakRecord *b) {
    return strcmp(a->cpu, b->cpu) == 0 && a->processors == b->processors &&
           strcmp(a->unit, b->unit) == 0 && a->threads == b->threads;
}

double peak_record_update(const char *path, const PeakRecord *self, double measured, long *runs) {
    PeakRecord r = *self;
    r.tflops = measured;
    r.runs = 1;
    char *text = NULL;
    size_t len = 0;
    Err err;
    if (fs_exists(path)) {
        PeakRecord old;
        if (fs_read_all(path, &text, &len, &err) != 0 ||
            peak_record_parse(text, len, path, &old, &err) != 0) {
            log_warn("%s; replacing it with this run's measurement", err.msg);
        } else if (!same_machine(&old, self)) {
            log_warn("%s: the record names another machine (%s, %d processors, %s, %d threads); "
                     "replacing it with this run's measurement",
                     path, old.cpu, old.processors, old.unit, old.threads);
        } else {
            r.tflops = old.tflops > measured ? old.tflops : measured;
            r.runs = old.runs + 1;
        }
    }
    free(text);
    *runs = r.runs;
    char buf[4 * PEAK_RECORD_TEXT];
    int n = peak_record_format(buf, sizeof buf, &r);
    char *dir = xstrdup(path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    if ((slash && slash != dir && fs_mkdirs(dir, &err) != 0) ||
        fs_write_atomic(path, buf, (size_t)n, &err) != 0)
        log_warn("the machine's peak record was not kept: %s", err.msg);
    free(dir);
    return r.tflops;
}
