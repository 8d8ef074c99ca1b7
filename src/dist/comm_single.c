/* The single-process communicator: rank 0 of 1, where every collective is a copy or nothing.
 * It is what `qtitan train` uses when not started by mpirun. */
#include <stdlib.h>
#include <string.h>

#include "dist/comm.h"

static int single_barrier(Comm *c, Err *err) {
    (void)c, (void)err;
    return 0;
}

static int single_all_reduce_sum(Comm *c, void *buf, size_t n, CommDtype t, Err *err) {
    (void)c, (void)buf, (void)n, (void)t, (void)err;
    return 0;
}

static int single_broadcast(Comm *c, void *buf, size_t bytes, int root, Err *err) {
    (void)c, (void)buf, (void)bytes;
    if (root != 0) return err_set(err, "broadcast root %d is not a rank of a 1-process job", root);
    return 0;
}

static int single_copy(Comm *c, void *out, const void *in, size_t n, CommDtype t, CommReq **req,
                       Err *err) {
    (void)c, (void)err;
    if (out != in) memmove(out, in, n * comm_dtype_size(t));
    *req = NULL;
    return 0;
}

static int single_all_to_all_v(Comm *c, void *out, const size_t *recv_counts, const void *in,
                               const size_t *send_counts, CommDtype t, Err *err) {
    (void)c;
    if (recv_counts[0] != send_counts[0])
        return err_set(err, "all-to-all on one process sends %zu elements but receives %zu",
                       send_counts[0], recv_counts[0]);
    if (out != in) memmove(out, in, send_counts[0] * comm_dtype_size(t));
    return 0;
}

static int single_wait(Comm *c, CommReq *req, Err *err) {
    (void)c, (void)req, (void)err;
    return 0;
}

static int single_test(Comm *c, CommReq *req, int *done, Err *err) {
    (void)c, (void)req, (void)err;
    *done = 1;
    return 0;
}

static int single_split(Comm *c, int color, int key, Comm **out, Err *err) {
    (void)c, (void)color, (void)key, (void)err;
    *out = comm_single_create();
    return 0;
}

static void single_destroy(Comm *c) {
    free(c);
}

static const CommOps SINGLE_OPS = {
    .barrier = single_barrier,
    .all_reduce_sum = single_all_reduce_sum,
    .broadcast = single_broadcast,
    .iall_gather = single_copy,
    .ireduce_scatter_sum = single_copy,
    .all_to_all_v = single_all_to_all_v,
    .wait = single_wait,
    .test = single_test,
    .split = single_split,
    .destroy = single_destroy,
};

Comm *comm_single_create(void) {
    Comm *c = xcalloc(1, sizeof *c);
    c->ops = &SINGLE_OPS;
    c->kind = "single";
    c->rank = 0;
    c->size = 1;
    return c;
}
