/* Profiler traces ([profiling] enable_profiling): while a step is recorded, every op forward
 * and backward (the rows of ops/op_profile.h), every GEMM, every collective and the checkpoint
 * I/O of that step become complete events of a Chrome trace-event JSON file, which Perfetto
 * (ui.perfetto.dev) and chrome://tracing open: one process per rank, one track per thread (the
 * thread that drives the step, and each OpenMP worker for the work a kernel records inside its
 * parallel region, e.g. flash attention's tiles). Each thread appends to its own buffer, so
 * recording takes no lock; off, a call costs one branch. */
#ifndef QT_TRACE_H
#define QT_TRACE_H

#include <stdint.h>

#include "core/err.h"

/* 1 while a step is being recorded. */
int trace_recording(void);
/* Starts recording (the events of one step). */
void trace_start(void);
/* Stops recording and writes the events as DIR/iteration_STEP/rankRANK_trace.json (torchtitan's
 * layout), with a span for the whole step. */
int trace_write(const char *dir, int64_t step, int rank, Err *err);

/* Seconds for trace_span's t0: the clock when recording, 0 otherwise (no clock read). */
double trace_now(void);
/* One event from t0 (trace_now) to now: name and detail are static strings ("sdpa", "cpu"),
 * cat its category ("forward", "backward", "gemm", "collective", "checkpoint"); args is
 * JSON object members ("\"M\": 4, \"N\": 8") or NULL. Nothing unless recording. */
void trace_span(const char *name, const char *detail, const char *cat, double t0, const char *args);

#endif
