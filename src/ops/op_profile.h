/* Per-op wall-clock profile, on when the environment has QT_PROFILE=1: the model wraps every
 * op call (forward and backward separately), the trainer its own steps (zeroing gradients,
 * clipping, AdamW), and gemm_f32 / gemm_bf16 add their time to the row that is open (as does
 * the output layer's AMX kernel for its tile products, kernels/loss_amx.h), so the table shows
 * how much of each op is GEMM. The trainer prints the table at the end of a run.
 *
 * Rows are keyed by (op kind, implementation, direction). Calls come from the thread that
 * drives the step (never from inside an OpenMP region), so the counters need no locks; a GEMM
 * called from inside a parallel region is not counted. Off, a call costs one branch. */
#ifndef QT_OP_PROFILE_H
#define QT_OP_PROFILE_H

#include <stdio.h>

#include "ops/op.h"

/* 1 when QT_PROFILE=1 (read once). */
int prof_enabled(void);
/* 1 when op calls are timed: QT_PROFILE=1, or a profiler trace is recording this step
 * (core/trace.h), whose events are these same calls. */
int prof_timing(void);
/* Opens a row ("sdpa", "cpu", 1 = backward); returns a token for prof_end, -1 when off.
 * Rows may nest (a recomputed forward inside backward opens its own rows); a GEMM counts
 * towards the innermost open row. */
int prof_begin(const char *what, const char *impl, int bwd);
void prof_end(int token);
/* Time spent in one GEMM, added to the innermost open row (or to "gemm (other)"). */
void prof_gemm_add(double seconds);
/* A part of the GEMMs (`what`, e.g. the packing of operands) shown as its own row: its seconds
 * count as GEMM time there and are taken out of the innermost open row, like a nested row's. */
void prof_gemm_part(const char *what, double seconds);
/* Prints the table: seconds per step for each row, its GEMM part and share of the total of
 * all rows, for `steps` steps. Nothing when off. */
void prof_report(FILE *f, long steps);
/* Clears every row (tests). */
void prof_reset(void);
/* A row's seconds so far and their GEMM part; 0 when the row exists, -1 when not (tests). */
int prof_row(const char *what, const char *impl, int bwd, double *seconds, double *gemm_seconds);

/* Wraps one op call: PROF_OP(&op->h, 0, op->forward(...)). */
#define PROF_OP(hdr, bwd, call)                                                                    \
    do {                                                                                           \
        int prof_tok_ = prof_begin(op_kind_name((hdr)->kind), (hdr)->name, (bwd));                 \
        call;                                                                                      \
        prof_end(prof_tok_);                                                                       \
    } while (0)
/* Wraps a step of work that is not an op: PROF_STEP("adamw", adamw_step(...)). */
#define PROF_STEP(what, call)                                                                      \
    do {                                                                                           \
        int prof_tok_ = prof_begin((what), "", 0);                                                 \
        call;                                                                                      \
        prof_end(prof_tok_);                                                                       \
    } while (0)

#endif
