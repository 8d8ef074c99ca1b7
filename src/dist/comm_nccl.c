/* The NCCL communicator (GPU buffers). It is bootstrapped through any parent communicator:
 * rank 0 makes the ncclUniqueId and the parent broadcasts it, so under mpirun MPI carries the
 * handshake and NCCL carries the data. Each communicator owns one CUDA stream; collectives are
 * enqueued there, blocking ones then synchronise it and non-blocking ones record an event that
 * comm_wait synchronises.
 *
 * Determinism: NCCL picks ring or tree algorithms and protocols from the topology and the
 * message size; for a fixed machine, rank count and size the choice and the summation order
 * are fixed, and exporting NCCL_ALGO=Ring NCCL_PROTO=Simple pins them further. Results are not
 * in rank order like the MPI communicator's, so they match it to rounding, not bitwise. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "dist/comm.h"

typedef struct NcclImpl {
    ncclComm_t comm;
    cudaStream_t stream;
    int device;
    float *scratch; /* (1) device word for the barrier */
} NcclImpl;

struct CommReq {
    cudaEvent_t done;
};

static NcclImpl *impl_of(Comm *c) {
    return c->impl;
}
static ncclDataType_t nccl_type(CommDtype t) {
    /* bf16 is only moved, never summed (comm.h): any 2-byte type moves its bits */
    return t == COMM_F64 ? ncclFloat64 : t == COMM_BF16 ? ncclFloat16 : ncclFloat32;
}

static int cuda_fail(Comm *c, cudaError_t rc, const char *what, Err *err) {
    return err_set(err, "%s failed on rank %d of %d: %s", what, c ? c->rank : 0, c ? c->size : 1,
                   cudaGetErrorString(rc));
}
static int nccl_fail(Comm *c, ncclResult_t rc, const char *what, Err *err) {
    const char *detail = c ? ncclGetLastError(impl_of(c)->comm) : NULL;
    return err_set(err, "%s failed on rank %d of %d: %s%s%s", what, c ? c->rank : 0,
                   c ? c->size : 1, ncclGetErrorString(rc), detail && *detail ? " - " : "",
                   detail ? detail : "");
}
#define CUDA_TRY(c, call, what, err)                                                               \
    do {                                                                                           \
        cudaError_t rc_ = (call);                                                                  \
        if (rc_ != cudaSuccess) return cuda_fail((c), rc_, (what), (err));                         \
    } while (0)
#define NCCL_TRY(c, call, what, err)                                                               \
    do {                                                                                           \
        ncclResult_t rc_ = (call);                                                                 \
        if (rc_ != ncclSuccess) return nccl_fail((c), rc_, (what), (err));                         \
    } while (0)

static int sync_stream(Comm *c, Err *err) {
    CUDA_TRY(c, cudaStreamSynchronize(impl_of(c)->stream), "cudaStreamSynchronize", err);
    return 0;
}

static int nccl_barrier(Comm *c, Err *err) {
    NcclImpl *m = impl_of(c);
    NCCL_TRY(c, ncclAllReduce(m->scratch, m->scratch, 1, ncclFloat32, ncclSum, m->comm, m->stream),
             "ncclAllReduce (barrier)", err);
    return sync_stream(c, err);
}

static int nccl_all_reduce_sum(Comm *c, void *buf, size_t n, CommDtype t, Err *err) {
    NcclImpl *m = impl_of(c);
    NCCL_TRY(c, ncclAllReduce(buf, buf, n, nccl_type(t), ncclSum, m->comm, m->stream),
             "ncclAllReduce", err);
    return sync_stream(c, err);
}

static int nccl_broadcast(Comm *c, void *buf, size_t bytes, int root, Err *err) {
    if (root < 0 || root >= c->size)
        return err_set(err, "broadcast root %d is not a rank of this %d-process communicator", root,
                       c->size);
    NcclImpl *m = impl_of(c);
    NCCL_TRY(c, ncclBroadcast(buf, buf, bytes, ncclUint8, root, m->comm, m->stream),
             "ncclBroadcast", err);
    return sync_stream(c, err);
}

static int record(Comm *c, CommReq **req, Err *err) {
    CommReq *q = xcalloc(1, sizeof *q);
    cudaError_t rc = cudaEventCreateWithFlags(&q->done, cudaEventDisableTiming);
    if (rc == cudaSuccess) rc = cudaEventRecord(q->done, impl_of(c)->stream);
    if (rc != cudaSuccess) {
        free(q);
        return cuda_fail(c, rc, "cudaEventRecord", err);
    }
    *req = q;
    return 0;
}

static int nccl_iall_gather(Comm *c, void *out, const void *in, size_t n, CommDtype t,
                            CommReq **req, Err *err) {
    *req = NULL;
    NcclImpl *m = impl_of(c);
    NCCL_TRY(c, ncclAllGather(in, out, n, nccl_type(t), m->comm, m->stream), "ncclAllGather", err);
    return record(c, req, err);
}

static int nccl_ireduce_scatter_sum(Comm *c, void *out, const void *in, size_t n, CommDtype t,
                                    CommReq **req, Err *err) {
    *req = NULL;
    NcclImpl *m = impl_of(c);
    NCCL_TRY(c, ncclReduceScatter(in, out, n, nccl_type(t), ncclSum, m->comm, m->stream),
             "ncclReduceScatter", err);
    return record(c, req, err);
}

/* Point-to-point pairs in one group: NCCL runs them together (a send to this rank itself
 * included), so no pair waits on another's order. Blocking, like the MPI form. */
static int nccl_all_to_all_v(Comm *c, void *out, const size_t *recv_counts, const void *in,
                             const size_t *send_counts, CommDtype t, Err *err) {
    NcclImpl *m = impl_of(c);
    size_t es = comm_dtype_size(t), so = 0, ro = 0;
    NCCL_TRY(c, ncclGroupStart(), "ncclGroupStart", err);
    ncclResult_t rc = ncclSuccess;
    for (int p = 0; p < c->size && rc == ncclSuccess; p++) {
        if (send_counts[p])
            rc = ncclSend((const char *)in + so * es, send_counts[p], nccl_type(t), p, m->comm,
                          m->stream);
        if (rc == ncclSuccess && recv_counts[p])
            rc = ncclRecv((char *)out + ro * es, recv_counts[p], nccl_type(t), p, m->comm,
                          m->stream);
        so += send_counts[p];
        ro += recv_counts[p];
    }
    /* The group is closed whatever happened inside it. */
    ncclResult_t end = ncclGroupEnd();
    NCCL_TRY(c, rc != ncclSuccess ? rc : end, "ncclSend/ncclRecv (all-to-all)", err);
    return sync_stream(c, err);
}

static int nccl_wait(Comm *c, CommReq *q, Err *err) {
    cudaError_t rc = cudaEventSynchronize(q->done);
    cudaEventDestroy(q->done);
    free(q);
    if (rc != cudaSuccess) return cuda_fail(c, rc, "cudaEventSynchronize", err);
    return 0;
}

static int nccl_test(Comm *c, CommReq *q, int *done, Err *err) {
    cudaError_t rc = cudaEventQuery(q->done);
    if (rc != cudaSuccess && rc != cudaErrorNotReady)
        return cuda_fail(c, rc, "cudaEventQuery", err);
    *done = rc == cudaSuccess;
    return 0;
}

static const CommOps NCCL_OPS;

/* Wraps an initialised ncclComm_t with a new stream and scratch word on `device`. */
static int wrap(Comm **out, ncclComm_t comm, int device, Err *err) {
    NcclImpl *m = xcalloc(1, sizeof *m);
    m->comm = comm;
    m->device = device;
    cudaError_t rc = cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking);
    if (rc == cudaSuccess) rc = cudaMalloc((void **)&m->scratch, sizeof(float));
    if (rc != cudaSuccess) {
        ncclCommDestroy(comm);
        free(m);
        return cuda_fail(NULL, rc, "creating the NCCL communicator's stream", err);
    }
    Comm *c = xcalloc(1, sizeof *c);
    c->ops = &NCCL_OPS;
    c->kind = "nccl";
    c->impl = m;
    ncclCommUserRank(comm, &c->rank);
    ncclCommCount(comm, &c->size);
    *out = c;
    return 0;
}

static int nccl_split(Comm *c, int color, int key, Comm **out, Err *err) {
    *out = NULL;
    if (color < 0) return err_set(err, "communicator split color %d is negative", color);
    ncclComm_t sub;
    NCCL_TRY(c, ncclCommSplit(impl_of(c)->comm, color, key, &sub, NULL), "ncclCommSplit", err);
    return wrap(out, sub, impl_of(c)->device, err);
}

static void nccl_destroy(Comm *c) {
    NcclImpl *m = impl_of(c);
    ncclCommDestroy(m->comm);
    cudaStreamDestroy(m->stream);
    cudaFree(m->scratch);
    free(m);
    free(c);
}

static const CommOps NCCL_OPS = {
    .barrier = nccl_barrier,
    .all_reduce_sum = nccl_all_reduce_sum,
    .broadcast = nccl_broadcast,
    .iall_gather = nccl_iall_gather,
    .ireduce_scatter_sum = nccl_ireduce_scatter_sum,
    .all_to_all_v = nccl_all_to_all_v,
    .wait = nccl_wait,
    .test = nccl_test,
    .split = nccl_split,
    .destroy = nccl_destroy,
};

int comm_nccl_create(Comm **out, Comm *parent, int device, Err *err) {
    *out = NULL;
    CUDA_TRY(NULL, cudaSetDevice(device), "cudaSetDevice", err);
    /* Rank 0's result travels with the id, so a failure there stops every rank alike. */
    struct {
        int ok;
        ncclUniqueId id;
    } hello;
    memset(&hello, 0, sizeof hello);
    if (parent->rank == 0) hello.ok = ncclGetUniqueId(&hello.id) == ncclSuccess;
    TRY(comm_broadcast(parent, &hello, sizeof hello, 0, err));
    if (!hello.ok)
        return err_set(err, "ncclGetUniqueId failed on rank 0; no NCCL communicator was made");
    ncclComm_t comm;
    /* ncclCommInitRank blocks until every rank has joined, with no timeout of its own. */
    comm_watch_begin("ncclCommInitRank");
    ncclResult_t init = ncclCommInitRank(&comm, parent->size, hello.id, parent->rank);
    comm_watch_end();
    NCCL_TRY(NULL, init, "ncclCommInitRank", err);
    return wrap(out, comm, device, err);
}
