/* Communicator: the collectives that data and tensor parallelism need, behind one interface
 * with three implementations: single process (copies), MPI (CPU buffers) and NCCL (GPU
 * buffers, bootstrapped through a parent communicator).
 *
 * Determinism. Sums are the only reduction, and the MPI communicator computes every sum on
 * the receiving rank in rank order 0, 1, ..., P-1 (an all-to-all moves the contributions, then
 * a local loop adds them), instead of trusting MPI_Allreduce / MPI_Reduce_scatter whose
 * association order depends on the collective component and algorithm Open MPI picks. So a
 * result depends only on the inputs and the world size, never on timing or on MPI tuning, is
 * bitwise the same on every rank that holds it, and equals a serial loop
 * `acc = x[0]; acc += x[1]; ...` in the element type. The NCCL communicator uses NCCL's own
 * collectives; those are repeatable for a fixed NCCL_ALGO/NCCL_PROTO and rank count (see
 * docs/distributed.md) but are not rank-ordered.
 *
 * Buffers: counts are elements of `dtype`; `in` and `out` must not overlap unless a function
 * says so. all_gather and reduce_scatter use equal chunks: all_gather takes n elements from
 * each rank and writes n*size, rank r's at out[r*n]; reduce_scatter takes n*size elements and
 * writes the n-element sum of chunk `rank`. */
#ifndef QT_DIST_COMM_H
#define QT_DIST_COMM_H

#include <stddef.h>

#include "core/err.h"
#include "core/trace.h"

/* COMM_BF16 (bf16 bit patterns, 2 bytes) is only moved (gathers, broadcasts, all-to-all): a sum
 * of it is refused with an error. */
typedef enum CommDtype { COMM_F32, COMM_F64, COMM_BF16 } CommDtype;

typedef struct Comm Comm;
/* An outstanding non-blocking collective; comm_wait completes and frees it. */
typedef struct CommReq CommReq;

typedef struct CommOps {
    int (*barrier)(Comm *c, Err *err);
    int (*all_reduce_sum)(Comm *c, void *buf, size_t n, CommDtype t, Err *err);
    int (*broadcast)(Comm *c, void *buf, size_t bytes, int root, Err *err);
    int (*iall_gather)(Comm *c, void *out, const void *in, size_t n, CommDtype t, CommReq **req,
                       Err *err);
    int (*ireduce_scatter_sum)(Comm *c, void *out, const void *in, size_t n, CommDtype t,
                               CommReq **req, Err *err);
    /* NULL where the implementation has none: comm_all_to_all_v says so. */
    int (*all_to_all_v)(Comm *c, void *out, const size_t *recv_counts, const void *in,
                        const size_t *send_counts, CommDtype t, Err *err);
    int (*wait)(Comm *c, CommReq *req, Err *err);
    int (*test)(Comm *c, CommReq *req, int *done, Err *err);
    int (*split)(Comm *c, int color, int key, Comm **out, Err *err);
    void (*destroy)(Comm *c);
} CommOps;

struct Comm {
    const CommOps *ops;
    const char *kind; /* "single", "mpi" or "nccl" */
    int rank, size;
    void *impl; /* the implementation's own state */
};

/* Starts the process's world communicator. Initialises MPI only when this process was started
 * by mpirun (Open MPI's OMPI_COMM_WORLD_SIZE or PMIx's PMIX_RANK in the environment), so a
 * plain `qtitan train` needs no MPI at all. Sets MPI_ERRORS_RETURN, so a failed MPI call
 * becomes an Err instead of killing the job silently, and tells the logger the rank. */
int comm_init(Comm **out, int *argc, char ***argv, Err *err);
/* How many processes a launcher started in this job: OMPI_COMM_WORLD_SIZE when mpirun set it,
 * else 1. Needs no MPI (commands other than train check it before doing anything). */
int comm_launcher_size(void);
/* Frees a communicator from comm_init or comm_split; for the world one it also finalises MPI. */
void comm_destroy(Comm *c);
/* A single-process communicator (rank 0 of 1); never fails. */
Comm *comm_single_create(void);

/* Collective timeouts (comm.init_timeout_seconds, comm.train_timeout_seconds): a collective
 * that waits longer than the current one for the other ranks fails with a sentence naming the
 * ranks that stopped answering, and ending the job then ends every rank (MPI_Abort, not a
 * finalize that would wait for the stopped rank too). init applies from this call until
 * comm_first_step_done, train after it; both process-wide, for every communicator. Without
 * this call collectives wait forever (a single process never waits). */
void comm_set_timeouts(int init_seconds, int train_seconds);
/* A watchdog for a blocking start-up call that has no timeout of its own (MPI_Init, NCCL's
 * ncclCommInitRank): when it has not returned within the init timeout (comm_set_timeouts; 0 =
 * unwatched), the watchdog thread prints "error: WHAT did not finish within N s
 * (comm.init_timeout_seconds) ..." and ends the process with status 1. It cannot return an
 * error instead: the call it watches never returns, and before MPI is up there is no
 * MPI_Abort to end the other ranks (each rank's own watchdog ends it). One at a time. */
void comm_watch_begin(const char *what);
void comm_watch_end(void);
/* The first training step has finished: collectives switch to the train timeout. */
void comm_first_step_done(void);
/* The timeout in force in seconds (0 = none) and the config key it comes from. */
double comm_timeout_seconds(const char **key);

/* Prints "[rank R] error: MSG" to stderr and ends every rank of the job with `code`
 * (MPI_Abort under mpirun, exit otherwise). For failures after which the ranks cannot agree
 * to stop together, e.g. one rank's file read failed while the others wait in a collective. */
_Noreturn void comm_abort(int code, const char *msg);

/* Makes a rank-local outcome collective, so ranks that fail apart do not leave the others
 * waiting in the next collective. Every rank passes its own status (0, or -1 with *err
 * filled); all get 0 when every rank succeeded, else -1 with the same sentence: the lowest
 * failing rank's message, prefixed "rank K: " when the job has more than one rank. Host
 * communicators only (single, MPI). */
int comm_agree(Comm *c, int local_rc, Err *err);
/* comm_agree for checks that every rank normally fails alike (the config, the mesh): a rank
 * that failed keeps its own sentence, unprefixed, and the others get the lowest failing
 * rank's. */
int comm_agree_own(Comm *c, int local_rc, Err *err);

/* The collectives below add an event to a recording profiler trace (core/trace.h). */
static inline int comm_barrier(Comm *c, Err *err) {
    double t0 = trace_now();
    int rc = c->ops->barrier(c, err);
    trace_span("barrier", NULL, "collective", t0, NULL);
    return rc;
}
/* buf[0..n) = sum over ranks of buf[0..n) (in place). */
static inline int comm_all_reduce_sum(Comm *c, void *buf, size_t n, CommDtype t, Err *err) {
    if (t == COMM_BF16) return err_set(err, "an all-reduce sums fp32 or fp64, not bf16");
    double t0 = trace_now();
    int rc = c->ops->all_reduce_sum(c, buf, n, t, err);
    trace_span("all_reduce_sum", NULL, "collective", t0, NULL);
    return rc;
}
/* Copies `bytes` bytes of root's buf into every rank's buf. */
static inline int comm_broadcast(Comm *c, void *buf, size_t bytes, int root, Err *err) {
    double t0 = trace_now();
    int rc = c->ops->broadcast(c, buf, bytes, root, err);
    trace_span("broadcast", NULL, "collective", t0, NULL);
    return rc;
}
/* Starts an all-gather: out (n*size) = concat over ranks of in (n). */
static inline int comm_iall_gather(Comm *c, void *out, const void *in, size_t n, CommDtype t,
                                   CommReq **req, Err *err) {
    double t0 = trace_now();
    int rc = c->ops->iall_gather(c, out, in, n, t, req, err);
    trace_span("all_gather (start)", NULL, "collective", t0, NULL);
    return rc;
}
/* Starts a reduce-scatter: out (n) = sum over ranks of in[rank*n .. rank*n+n). */
static inline int comm_ireduce_scatter_sum(Comm *c, void *out, const void *in, size_t n,
                                           CommDtype t, CommReq **req, Err *err) {
    if (t == COMM_BF16) return err_set(err, "a reduce-scatter sums fp32 or fp64, not bf16");
    double t0 = trace_now();
    int rc = c->ops->ireduce_scatter_sum(c, out, in, n, t, req, err);
    trace_span("reduce_scatter (start)", NULL, "collective", t0, NULL);
    return rc;
}
/* Completes a request started on c (NULL is already complete) and releases it. Until then
 * the buffers it was given must stay untouched. The MPI communicator allows 8 requests in
 * flight and refuses a ninth with an error. */
static inline int comm_wait(Comm *c, CommReq *req, Err *err) {
    if (!req) return 0;
    double t0 = trace_now();
    int rc = c->ops->wait(c, req, err);
    trace_span("wait", NULL, "collective", t0, NULL);
    return rc;
}
/* Lets a request progress without blocking; *done = 1 once it has finished moving data
 * (comm_wait is still needed to complete and release it). Open MPI moves a non-blocking
 * collective only inside MPI calls, so a trainer that wants a prefetch to overlap compute
 * calls this between kernels. */
static inline int comm_test(Comm *c, CommReq *req, int *done, Err *err) {
    if (!req) {
        *done = 1;
        return 0;
    }
    return c->ops->test(c, req, done, err);
}
/* All-to-all with per-peer counts (MPI_Alltoallv): in holds send_counts[p] elements for rank
 * p, one run after another in rank order; out receives recv_counts[p] elements from rank p the
 * same way. Each pair's counts must agree (what p sends to q is what q expects from p). Moves
 * bytes unchanged; blocking. Expert parallelism dispatches tokens with it. */
int comm_all_to_all_v(Comm *c, void *out, const size_t *recv_counts, const void *in,
                      const size_t *send_counts, CommDtype t, Err *err);
/* Blocking forms of the two above. */
int comm_all_gather(Comm *c, void *out, const void *in, size_t n, CommDtype t, Err *err);
int comm_reduce_scatter_sum(Comm *c, void *out, const void *in, size_t n, CommDtype t, Err *err);
/* Collective over c: ranks passing the same color form one new communicator, ordered by key
 * (ties by rank in c). */
static inline int comm_split(Comm *c, int color, int key, Comm **out, Err *err) {
    return c->ops->split(c, color, key, out, err);
}

size_t comm_dtype_size(CommDtype t);

#ifdef QTITAN_HAVE_MPI
/* The MPI world communicator (called by comm_init under mpirun). */
int comm_mpi_init(Comm **out, int *argc, char ***argv, Err *err);
/* 1 between comm_mpi_init and the world communicator's destroy. */
int comm_mpi_active(void);
/* MPI_Abort on the world communicator. */
_Noreturn void comm_mpi_abort(int code);
#endif

#ifdef QTITAN_HAVE_NCCL
/* A NCCL communicator over the same ranks as `parent` (any kind), on CUDA device `device`.
 * Rank 0 makes the ncclUniqueId and `parent` broadcasts it. Buffers passed to it are device
 * pointers; every call is enqueued on the communicator's own stream, blocking calls return
 * after that stream has finished them. */
int comm_nccl_create(Comm **out, Comm *parent, int device, Err *err);
#endif

#endif
