/* The MPI communicator (Open MPI, CPU buffers). Sums are computed in rank order on the rank
 * that keeps them (see comm.h): reduce-scatter is an all-to-all of the chunks followed by a
 * local loop over ranks 0..P-1, and all-reduce is that reduce-scatter followed by an
 * all-gather. Every MPI call runs with MPI_ERRORS_RETURN and its failure becomes an Err.
 *
 * Collective timeout: every collective is started non-blocking and completed by wait_req,
 * which polls it (as MPI_Wait itself spins) against the deadline of comm_timeout_seconds. A
 * blocking MPI collective could not be interrupted: a stopped rank would hold the others in
 * it forever. On the deadline the rank says "alive" to every rank on a communicator of its
 * own and listens a short while; the ranks it does not hear from are the ones named. */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "dist/comm.h"

typedef enum { REQ_GATHER, REQ_REDUCE_SCATTER } ReqKind;

/* Requests live in a small per-communicator pool and keep their receive buffers between
 * uses, so after the first step a non-blocking collective allocates nothing. */
struct CommReq {
    MPI_Request request;
    ReqKind kind;
    int busy;
    char *recv;        /* (size, n): the chunks a reduce-scatter received, one per rank */
    size_t recv_bytes; /* capacity of recv */
    void *out;         /* (n): where the reduce-scatter's sum goes */
    size_t n;
    CommDtype t;
};

#define MAX_PENDING 8 /* outstanding non-blocking collectives per communicator */

typedef struct MpiImpl {
    MPI_Comm comm;
    int owns_mpi;  /* the world communicator finalises MPI when destroyed */
    char *scratch; /* blocking all-reduce's receive buffer, kept across calls */
    size_t scratch_bytes;
    int *counts; /* (4 * size) counts and displacements for the all-reduce */
    CommReq pool[MAX_PENDING];
} MpiImpl;

static int g_active = 0;
/* A duplicate of the world for the liveness round after a timeout, and whether one happened
 * (the world's destroy then aborts: MPI_Finalize would wait for the stopped rank). */
static MPI_Comm g_watch = MPI_COMM_NULL;
static int g_timed_out = 0;
#define WATCH_TAG 4242

int comm_mpi_active(void) {
    return g_active;
}

_Noreturn void comm_mpi_abort(int code) {
    MPI_Abort(MPI_COMM_WORLD, code);
    exit(code); /* MPI_Abort does not return; this keeps _Noreturn honest if it did */
}

static MPI_Comm mpi_of(Comm *c) {
    return ((MpiImpl *)c->impl)->comm;
}
static MPI_Datatype mpi_type(CommDtype t) {
    return t == COMM_F64 ? MPI_DOUBLE : t == COMM_BF16 ? MPI_UINT16_T : MPI_FLOAT;
}

static int mpi_fail(Comm *c, int rc, const char *what, Err *err) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "code %d", rc);
    return err_set(err, "%s failed on rank %d of %d: %s", what, c->rank, c->size, text);
}
#define MPI_TRY(c, call, what, err)                                                                \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != MPI_SUCCESS) return mpi_fail((c), rc_, (what), (err));                          \
    } while (0)

/* After a timeout: the world ranks that do not say "alive" within the grace period, as text
 * ("1, 3"). Every rank still running reaches its own deadline in the same collective at about
 * the same time and says so too. */
static void silent_ranks(char *out, size_t cap, double grace) {
    int P = 0, me = 0;
    MPI_Comm_size(g_watch, &P);
    MPI_Comm_rank(g_watch, &me);
    static const int alive = 1;
    int *heard = xcalloc((size_t)P, sizeof *heard), *got = xcalloc((size_t)P, sizeof *got);
    MPI_Request *recv = xcalloc((size_t)P, sizeof *recv), send;
    for (int r = 0; r < P; r++) {
        recv[r] = MPI_REQUEST_NULL;
        if (r == me) continue;
        /* Never waited for: a stopped rank may never take it, and the job ends anyway. */
        MPI_Isend(&alive, 1, MPI_INT, r, WATCH_TAG, g_watch, &send);
        MPI_Request_free(&send);
        MPI_Irecv(&got[r], 1, MPI_INT, r, WATCH_TAG, g_watch, &recv[r]);
    }
    heard[me] = 1;
    double until = MPI_Wtime() + grace;
    for (int pending = P - 1; pending > 0 && MPI_Wtime() < until;) {
        pending = 0;
        for (int r = 0; r < P; r++) {
            int flag = 0;
            if (!heard[r] && MPI_Test(&recv[r], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag)
                heard[r] = 1;
            pending += !heard[r];
        }
    }
    size_t n = 0;
    out[0] = 0;
    for (int r = 0; r < P; r++)
        if (!heard[r] && n < cap) n += (size_t)snprintf(out + n, cap - n, "%s%d", n ? ", " : "", r);
    free(heard), free(got), free(recv);
}

/* A gap longer than this between two checks of a request means this process did not run
 * (SIGSTOP, a suspended VM, a starved core): that time is not counted as waiting, since the
 * request could not be seen completing; a rank continued after a stop waits afresh instead of
 * timing out at once with a sentence about the others. */
#define NOT_RUNNING_GAP_S 1.0

/* Completes req, or fails once it has waited longer than the collective timeout. */
static int wait_req(Comm *c, MPI_Request *req, const char *what, Err *err) {
    const char *key;
    double limit = comm_timeout_seconds(&key);
    if (limit <= 0) {
        MPI_TRY(c, MPI_Wait(req, MPI_STATUS_IGNORE), what, err);
        return 0;
    }
    double start = MPI_Wtime(), last = start, away = 0;
    for (unsigned k = 1;; k++) {
        int flag = 0;
        MPI_TRY(c, MPI_Test(req, &flag, MPI_STATUS_IGNORE), what, err);
        if (flag) return 0;
        if (k % 64 != 0) continue;
        double now = MPI_Wtime();
        if (now - last > NOT_RUNNING_GAP_S) away += now - last;
        last = now;
        if (now - start - away > limit) break;
    }
    g_timed_out = 1;
    char silent[256];
    silent_ranks(silent, sizeof silent, limit < 2 ? limit : 2);
    if (!silent[0])
        return err_set(err,
                       "%s waited more than %g s (%s) on rank %d, yet every rank answered: the "
                       "ranks are waiting in different collectives",
                       what, limit, key, c->rank);
    return err_set(err,
                   "rank %s stopped answering: %s waited more than %g s (%s) for it on rank %d; "
                   "stopping every rank",
                   silent, what, limit, key, c->rank);
}

static int count_fits(Comm *c, size_t n, const char *what, Err *err) {
    if (n > INT_MAX)
        return err_set(err, "%s of %zu elements on rank %d exceeds MPI's int count (%d)", what, n,
                       c->rank, INT_MAX);
    return 0;
}

/* out[i] = in[0*n+i] + in[1*n+i] + ... in rank order, in the element type. The loop runs
 * rank by rank over whole chunks (same association as a per-element loop, but streaming and
 * vectorisable). */
static void sum_in_rank_order(void *out, const void *in, size_t n, int ranks, CommDtype t) {
    if (n == 0) return; /* a rank with no chunk may have no receive buffer at all */
    if (t == COMM_F64) {
        const double *x = in;
        double *y = out;
        memcpy(y, x, n * sizeof *y);
        for (int r = 1; r < ranks; r++)
            for (size_t i = 0; i < n; i++)
                y[i] += x[(size_t)r * n + i];
    } else {
        const float *x = in;
        float *y = out;
        memcpy(y, x, n * sizeof *y);
        for (int r = 1; r < ranks; r++)
            for (size_t i = 0; i < n; i++)
                y[i] += x[(size_t)r * n + i];
    }
}

static int mpi_barrier(Comm *c, Err *err) {
    MPI_Request req;
    MPI_TRY(c, MPI_Ibarrier(mpi_of(c), &req), "MPI_Ibarrier", err);
    return wait_req(c, &req, "a barrier", err);
}

/* All-reduce of n <= INT_MAX elements whose chunk offsets fit in int: rank r sums elements
 * [r*chunk, r*chunk+len_r) in rank order, then everyone gathers the sums in place. */
static int all_reduce_block(Comm *c, char *buf, size_t n, CommDtype t, Err *err) {
    MpiImpl *m = c->impl;
    int P = c->size, *counts = m->counts, *displs = m->counts + 2 * P;
    size_t es = comm_dtype_size(t), chunk = (n + P - 1) / P;
    for (int r = 0; r < P; r++) {
        size_t lo = (size_t)r * chunk, hi = lo + chunk < n ? lo + chunk : n;
        counts[r] = lo < n ? (int)(hi - lo) : 0;
        displs[r] = (int)(lo < n ? lo : n);
    }
    int mine = counts[c->rank];
    int *recv_counts = counts + P, *recv_displs = displs + P;
    for (int r = 0; r < P; r++)
        recv_counts[r] = mine, recv_displs[r] = r * mine;
    size_t need = (size_t)P * (size_t)mine * es;
    if (need > m->scratch_bytes) {
        m->scratch = xrealloc(m->scratch, need);
        m->scratch_bytes = need;
    }
    MPI_Request req;
    MPI_TRY(c,
            MPI_Ialltoallv(buf, counts, displs, mpi_type(t), m->scratch, recv_counts, recv_displs,
                           mpi_type(t), mpi_of(c), &req),
            "all-reduce (MPI_Ialltoallv)", err);
    TRY(wait_req(c, &req, "an all-reduce", err));
    sum_in_rank_order(buf + (size_t)displs[c->rank] * es, m->scratch, (size_t)mine, P, t);
    MPI_TRY(c,
            MPI_Iallgatherv(MPI_IN_PLACE, 0, mpi_type(t), buf, counts, displs, mpi_type(t),
                            mpi_of(c), &req),
            "all-reduce (MPI_Iallgatherv)", err);
    return wait_req(c, &req, "an all-reduce", err);
}

static int mpi_all_reduce_sum(Comm *c, void *buf, size_t n, CommDtype t, Err *err) {
    if (c->size == 1 || n == 0) return 0;
    /* Blocks keep every count and displacement below INT_MAX. */
    size_t block = ((size_t)INT_MAX / (size_t)c->size) * (size_t)c->size;
    for (size_t off = 0; off < n; off += block) {
        size_t len = n - off < block ? n - off : block;
        TRY(all_reduce_block(c, (char *)buf + off * comm_dtype_size(t), len, t, err));
    }
    return 0;
}

static int mpi_broadcast(Comm *c, void *buf, size_t bytes, int root, Err *err) {
    if (root < 0 || root >= c->size)
        return err_set(err, "broadcast root %d is not a rank of this %d-process communicator", root,
                       c->size);
    for (size_t off = 0; off < bytes; off += INT_MAX) {
        size_t len = bytes - off < INT_MAX ? bytes - off : INT_MAX;
        MPI_Request req;
        MPI_TRY(c, MPI_Ibcast((char *)buf + off, (int)len, MPI_BYTE, root, mpi_of(c), &req),
                "MPI_Ibcast", err);
        TRY(wait_req(c, &req, "a broadcast", err));
    }
    return 0;
}

static int mpi_all_to_all_v(Comm *c, void *out, const size_t *recv_counts, const void *in,
                            const size_t *send_counts, CommDtype t, Err *err) {
    MpiImpl *m = c->impl;
    int P = c->size, *sc = m->counts, *sd = m->counts + P, *rcnt = sd + P, *rd = rcnt + P;
    size_t so = 0, ro = 0;
    for (int p = 0; p < P; p++) {
        /* Offsets too must fit MPI's int counts. */
        TRY(count_fits(c, so + send_counts[p], "all-to-all (sent)", err));
        TRY(count_fits(c, ro + recv_counts[p], "all-to-all (received)", err));
        sc[p] = (int)send_counts[p], sd[p] = (int)so, so += send_counts[p];
        rcnt[p] = (int)recv_counts[p], rd[p] = (int)ro, ro += recv_counts[p];
    }
    MPI_Request req;
    MPI_TRY(c, MPI_Ialltoallv(in, sc, sd, mpi_type(t), out, rcnt, rd, mpi_type(t), mpi_of(c), &req),
            "MPI_Ialltoallv", err);
    return wait_req(c, &req, "an all-to-all", err);
}

static CommReq *take_request(Comm *c, ReqKind kind, size_t recv_bytes, Err *err) {
    MpiImpl *m = c->impl;
    for (int i = 0; i < MAX_PENDING; i++) {
        CommReq *q = &m->pool[i];
        if (q->busy) continue;
        if (recv_bytes > q->recv_bytes) {
            q->recv = xrealloc(q->recv, recv_bytes);
            q->recv_bytes = recv_bytes;
        }
        q->busy = 1;
        q->kind = kind;
        return q;
    }
    err_set(err,
            "more than %d non-blocking collectives are outstanding on rank %d's %d-rank "
            "communicator; wait for one first",
            MAX_PENDING, c->rank, c->size);
    return NULL;
}

static int mpi_iall_gather(Comm *c, void *out, const void *in, size_t n, CommDtype t, CommReq **req,
                           Err *err) {
    *req = NULL;
    TRY(count_fits(c, n, "all-gather", err));
    CommReq *q = take_request(c, REQ_GATHER, 0, err);
    if (!q) return -1;
    int rc =
        MPI_Iallgather(in, (int)n, mpi_type(t), out, (int)n, mpi_type(t), mpi_of(c), &q->request);
    if (rc != MPI_SUCCESS) {
        q->busy = 0;
        return mpi_fail(c, rc, "MPI_Iallgather", err);
    }
    *req = q;
    return 0;
}

static int mpi_ireduce_scatter_sum(Comm *c, void *out, const void *in, size_t n, CommDtype t,
                                   CommReq **req, Err *err) {
    *req = NULL;
    TRY(count_fits(c, n, "reduce-scatter", err));
    CommReq *q = take_request(c, REQ_REDUCE_SCATTER, (size_t)c->size * n * comm_dtype_size(t), err);
    if (!q) return -1;
    q->out = out;
    q->n = n;
    q->t = t;
    int rc = MPI_Ialltoall(in, (int)n, mpi_type(t), q->recv, (int)n, mpi_type(t), mpi_of(c),
                           &q->request);
    if (rc != MPI_SUCCESS) {
        q->busy = 0;
        return mpi_fail(c, rc, "MPI_Ialltoall (reduce-scatter)", err);
    }
    *req = q;
    return 0;
}

static int mpi_wait(Comm *c, CommReq *q, Err *err) {
    int rc = wait_req(c, &q->request,
                      q->kind == REQ_REDUCE_SCATTER ? "a reduce-scatter" : "an all-gather", err);
    if (rc == 0 && q->kind == REQ_REDUCE_SCATTER)
        sum_in_rank_order(q->out, q->recv, q->n, c->size, q->t);
    q->busy = 0;
    return rc;
}

static int mpi_test(Comm *c, CommReq *q, int *done, Err *err) {
    /* A request MPI_Test completes becomes MPI_REQUEST_NULL, which MPI_Wait returns at once. */
    int flag = 0;
    MPI_TRY(c, MPI_Test(&q->request, &flag, MPI_STATUS_IGNORE), "MPI_Test", err);
    *done = flag;
    return 0;
}

static const CommOps MPI_OPS;

static Comm *wrap(MPI_Comm comm, int owns_mpi) {
    Comm *c = xcalloc(1, sizeof *c);
    MpiImpl *m = xcalloc(1, sizeof *m);
    m->comm = comm;
    m->owns_mpi = owns_mpi;
    c->ops = &MPI_OPS;
    c->kind = "mpi";
    c->impl = m;
    MPI_Comm_rank(comm, &c->rank);
    MPI_Comm_size(comm, &c->size);
    m->counts = xmalloc(4 * (size_t)c->size * sizeof(int));
    return c;
}

static int mpi_split(Comm *c, int color, int key, Comm **out, Err *err) {
    *out = NULL;
    if (color < 0) return err_set(err, "communicator split color %d is negative", color);
    /* MPI_Comm_split has no non-blocking form: a barrier under the timeout first, so a rank
     * that stopped before it is named rather than waited for. */
    TRY(mpi_barrier(c, err));
    MPI_Comm sub;
    MPI_TRY(c, MPI_Comm_split(mpi_of(c), color, key, &sub), "MPI_Comm_split", err);
    *out = wrap(sub, 0);
    return 0;
}

static void mpi_destroy(Comm *c) {
    MpiImpl *m = c->impl;
    if (m->owns_mpi && g_timed_out) comm_mpi_abort(1); /* the sentence was printed already */
    MPI_Comm_free(&m->comm);
    if (m->owns_mpi) {
        if (g_watch != MPI_COMM_NULL) MPI_Comm_free(&g_watch);
        MPI_Finalize();
        g_active = 0;
    }
    free(m->scratch);
    free(m->counts);
    for (int i = 0; i < MAX_PENDING; i++)
        free(m->pool[i].recv);
    free(m);
    free(c);
}

static const CommOps MPI_OPS = {
    .barrier = mpi_barrier,
    .all_reduce_sum = mpi_all_reduce_sum,
    .broadcast = mpi_broadcast,
    .iall_gather = mpi_iall_gather,
    .ireduce_scatter_sum = mpi_ireduce_scatter_sum,
    .all_to_all_v = mpi_all_to_all_v,
    .wait = mpi_wait,
    .test = mpi_test,
    .split = mpi_split,
    .destroy = mpi_destroy,
};

int comm_mpi_init(Comm **out, int *argc, char ***argv, Err *err) {
    *out = NULL;
    int done = 0, provided = 0;
    MPI_Initialized(&done);
    if (done) return err_set(err, "MPI was already initialised; comm_init must run once");
    /* Only the main thread calls MPI; OpenMP threads compute between calls. */
    comm_watch_begin("MPI_Init");
    int init = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    comm_watch_end();
    if (init != MPI_SUCCESS)
        return err_set(err, "MPI_Init_thread failed; check the mpirun command line");
    g_active = 1;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    /* A duplicate keeps qtitan's messages apart from any library's on MPI_COMM_WORLD; it
     * inherits the error handler. */
    MPI_Comm world;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &world);
    if (rc != MPI_SUCCESS) {
        char text[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, text, &len);
        return err_set(err, "MPI_Comm_dup of the world communicator failed: %s", text);
    }
    rc = MPI_Comm_dup(MPI_COMM_WORLD, &g_watch);
    if (rc != MPI_SUCCESS) return err_set(err, "MPI_Comm_dup for the collective timeout failed");
    *out = wrap(world, 1);
    log_set_rank((*out)->rank, (*out)->size);
    return 0;
}
