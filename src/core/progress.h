/* Progress of long start-up work (tokenizing a corpus into the cache, loading a model,
 * exporting one): on a terminal one line redrawn in place with percent, amount, rate and time
 * left; otherwise a plain line every QT_PROGRESS_SECONDS seconds (default 10), so logs of long
 * jobs show the work is moving without one line per update. Rank 0 only, on stderr. */
#ifndef QT_PROGRESS_H
#define QT_PROGRESS_H

typedef struct Progress {
    char what[160]; /* "tokenizing c4-train.00000-of-01024.json.gz" */
    double total;   /* in units; <= 0: unknown, no percent or eta */
    const char *unit;
    double scale; /* units shown = amount / scale ("MB": 1e6 bytes) */
    double t0, last_print, interval;
    int on;  /* this process prints */
    int tty; /* stderr is a terminal: redraw in place */
    int drawn;
    double done; /* what progress_add has counted */
} Progress;

/* total and amounts are in the caller's units (bytes, tensors); unit names the shown unit. */
void progress_start(Progress *p, const char *what, double total, const char *unit, double scale);
void progress_update(Progress *p, double done);
/* progress_update(p, p->done + amount): for work counted piece by piece. */
void progress_add(Progress *p, double amount);
/* Ends the redrawn line on a terminal; prints nothing else (callers log their summary). */
void progress_finish(Progress *p);

/* A duration as qtitan shows it (step lines, progress): "12m04s", "1h02m03s". */
void format_duration(char *buf, int cap, double seconds);

/* " 27%  12.3/45.6 MB  3.1 MB/s  eta 0m11s" for done of p at time now (tests compare it). */
void progress_format(char *buf, int cap, const Progress *p, double done, double now);

#endif
