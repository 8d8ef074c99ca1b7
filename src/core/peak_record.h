/* The best peak arithmetic rate this machine has shown, kept between runs: the MFU
 * denominator of a run is the larger of its own start-up measurement and the record
 * (docs/training.md, "MFU"). On a shared machine (a VM whose cores' vector or tile units
 * another tenant also uses) one 0.3 s measurement can land in a busy moment and come out at
 * half the rate, which made the same run's MFU read 13% or 38%; the best over runs
 * converges on what the unit can do. The GEMM backend keeps its bf16 probe's two rates the
 * same way (ops/gemm.c), so that a busy moment does not flip the path it picks. One file per
 * unit, thread count and CPU model, under the cache folder (fs_cache_dir), e.g.
 *
 *   qtitan peak record 1
 *   cpu Intel(R) Xeon(R) Processor
 *   processors 2
 *   unit amx bf16
 *   threads 2
 *   tflops 4.585
 *   runs 7
 *
 * metrics.peak_tflops still replaces both. */
#ifndef QT_PEAK_RECORD_H
#define QT_PEAK_RECORD_H

#include <stddef.h>

#include "core/err.h"

#define PEAK_RECORD_TEXT 128 /* longest cpu / unit text kept */

typedef struct PeakRecord {
    char cpu[PEAK_RECORD_TEXT];  /* the model name in /proc/cpuinfo ("unknown" without one) */
    int processors;              /* processors online */
    char unit[PEAK_RECORD_TEXT]; /* the unit measured, as the trainer names it */
    int threads;                 /* OpenMP threads of the measurement */
    double tflops;               /* the best measured, > 0 */
    long runs;                   /* measurements it covers, >= 1 */
} PeakRecord;

/* The record's identity for this machine: cpu and processors read here, unit and threads as
 * given; tflops 0 and runs 0. */
void peak_record_this_machine(PeakRecord *r, const char *unit, int threads);
/* Parses a record's text (name: the file, for messages): every line of the format above, once,
 * in any order. 0, or -1 with one sentence naming the file, the line and what was expected. */
int peak_record_parse(const char *text, size_t len, const char *name, PeakRecord *out, Err *err);
/* The text of r, as peak_record_parse reads it; snprintf's return. */
int peak_record_format(char *buf, size_t cap, const PeakRecord *r);
/* The record file of r's identity in dir (malloc'd):
 * "peak-<unit>-<threads>t-<cpu>-<processors>p.txt" with every character other than a letter or
 * digit as '_'. */
char *peak_record_path(const char *dir, const PeakRecord *r);
/* Takes this run's measurement into the record at path (made when missing, with its folder):
 * returns the larger of `measured` and the recorded best and sets *runs to the measurements the
 * record now covers. A record that does not parse, or names another machine, is replaced after a
 * warning; one that cannot be written leaves a warning and the result as if it had been. */
double peak_record_update(const char *path, const PeakRecord *self, double measured, long *runs);

#endif
