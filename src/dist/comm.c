/* Communicator entry points shared by every implementation: picking single or MPI at start-up,
 * the blocking wrappers, and ending the whole job on an unrecoverable error. */
#include "dist/comm.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"

size_t comm_dtype_size(CommDtype t) {
    return t == COMM_F64 ? sizeof(double) : t == COMM_BF16 ? sizeof(uint16_t) : sizeof(float);
}

/* Open MPI's launcher sets OMPI_COMM_WORLD_SIZE; PMIx-based launchers (prterun, srun with
 * PMIx) set PMIX_RANK. Either means "a launcher started this process as one of a job". */
static int launched_by_mpirun(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") != NULL || getenv("PMIX_RANK") != NULL;
}

int comm_launcher_size(void) {
    const char *s = getenv("OMPI_COMM_WORLD_SIZE");
    int n = s ? atoi(s) : 1;
    return n > 1 ? n : 1;
}

int comm_init(Comm **out, int *argc, char ***argv, Err *err) {
    *out = NULL;
    if (launched_by_mpirun()) {
#ifdef QTITAN_HAVE_MPI
        return comm_mpi_init(out, argc, argv, err);
#else
        (void)argc, (void)argv;
        const char *n = getenv("OMPI_COMM_WORLD_SIZE");
        if (!n || atoi(n) != 1)
            return err_set(err, "this process was started by mpirun but qtitan was built "
                                "without MPI; rebuild with Open MPI installed "
                                "(-DQTITAN_WITH_MPI=ON) or run one process without mpirun");
#endif
    }
    *out = comm_single_create();
    log_set_rank(0, 1);
    return 0;
}

void comm_destroy(Comm *c) {
    if (c) c->ops->destroy(c);
}

int comm_all_gather(Comm *c, void *out, const void *in, size_t n, CommDtype t, Err *err) {
    CommReq *req = NULL;
    TRY(comm_iall_gather(c, out, in, n, t, &req, err));
    return comm_wait(c, req, err);
}

int comm_reduce_scatter_sum(Comm *c, void *out, const void *in, size_t n, CommDtype t, Err *err) {
    CommReq *req = NULL;
    TRY(comm_ireduce_scatter_sum(c, out, in, n, t, &req, err));
    return comm_wait(c, req, err);
}

int comm_all_to_all_v(Comm *c, void *out, const size_t *recv_counts, const void *in,
                      const size_t *send_counts, CommDtype t, Err *err) {
    if (!c->ops->all_to_all_v)
        return err_set(err, "the %s communicator has no all-to-all (expert parallelism needs one)",
                       c->kind);
    double t0 = trace_now();
    int rc = c->ops->all_to_all_v(c, out, recv_counts, in, send_counts, t, err);
    trace_span("all_to_all_v", NULL, "collective", t0, NULL);
    return rc;
}

static int g_init_timeout, g_train_timeout, g_first_step_done;

void comm_set_timeouts(int init_seconds, int train_seconds) {
    g_init_timeout = init_seconds;
    g_train_timeout = train_seconds;
}

void comm_first_step_done(void) {
    g_first_step_done = 1;
}

double comm_timeout_seconds(const char **key) {
    if (key) *key = g_first_step_done ? "comm.train_timeout_seconds" : "comm.init_timeout_seconds";
    return g_first_step_done ? g_train_timeout : g_init_timeout;
}

int comm_agree(Comm *c, int local_rc, Err *err) {
    if (c->size == 1) return local_rc ? -1 : 0;
    double *failed = xcalloc((size_t)c->size, sizeof *failed);
    double mine = local_rc != 0;
    Err comm_err;
    int rc = comm_all_gather(c, failed, &mine, 1, COMM_F64, &comm_err);
    int first = -1;
    for (int r = 0; rc == 0 && r < c->size && first < 0; r++)
        if (failed[r] != 0) first = r;
    free(failed);
    if (rc) return err_set(err, "%s", comm_err.msg);
    if (first < 0) return 0;
    Err shared = {{0}};
    if (c->rank == first) shared = *err;
    if (comm_broadcast(c, shared.msg, sizeof shared.msg, first, &comm_err))
        return err_set(err, "%s", comm_err.msg);
    shared.msg[sizeof shared.msg - 1] = 0;
    return err_set(err, "rank %d: %s", first, shared.msg);
}

int comm_agree_own(Comm *c, int local_rc, Err *err) {
    if (local_rc == 0) return comm_agree(c, 0, err);
    Err shared = *err;
    comm_agree(c, local_rc, &shared);
    return -1;
}

_Noreturn void comm_abort(int code, const char *msg) {
    log_error("%s", msg);
    if (code == 0) code = 1;
#ifdef QTITAN_HAVE_MPI
    if (comm_mpi_active()) comm_mpi_abort(code);
#endif
    exit(code);
}

static pthread_mutex_t g_watch_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_watch_cv;
static pthread_t g_watch_thread;
static int g_watching, g_watch_done;
static const char *g_watch_what;

static void *watchdog(void *arg) {
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += (time_t)(intptr_t)arg;
    pthread_mutex_lock(&g_watch_mu);
    int rc = 0;
    while (!g_watch_done && rc == 0)
        rc = pthread_cond_timedwait(&g_watch_cv, &g_watch_mu, &deadline);
    if (!g_watch_done) {
        const char *r = getenv("OMPI_COMM_WORLD_RANK");
        fprintf(stderr,
                "[rank %s] error: %s did not finish within %d s (comm.init_timeout_seconds); "
                "another rank did not start or cannot be reached; stopping this rank\n",
                r ? r : "?", g_watch_what, (int)(intptr_t)arg);
        fflush(stderr);
        _exit(1);
    }
    pthread_mutex_unlock(&g_watch_mu);
    return NULL;
}

void comm_watch_begin(const char *what) {
    if (g_init_timeout <= 0) return;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g_watch_cv, &ca);
    pthread_condattr_destroy(&ca);
    g_watch_what = what;
    g_watch_done = 0;
    g_watching =
        pthread_create(&g_watch_thread, NULL, watchdog, (void *)(intptr_t)g_init_timeout) == 0;
    if (!g_watching) log_warn("cannot start the watchdog for %s; it runs unwatched", what);
}

void comm_watch_end(void) {
    if (!g_watching) return;
    pthread_mutex_lock(&g_watch_mu);
    g_watch_done = 1;
    pthread_cond_signal(&g_watch_cv);
    pthread_mutex_unlock(&g_watch_mu);
    pthread_join(g_watch_thread, NULL);
    pthread_cond_destroy(&g_watch_cv);
    g_watching = 0;
}
