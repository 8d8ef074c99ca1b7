/* FSDP shard bookkeeping: the flat-parameter layout of fsdp.h and the unit gathers and
 * reduce-scatters over the dp_shard communicator. */
#include "dist/fsdp.h"

#include <stdlib.h>
#include <string.h>

#define ALIGN_FLOATS 16 /* 64 bytes: every parameter and every shard piece starts aligned */

static size_t round_up(size_t x, size_t m) {
    return (x + m - 1) / m * m;
}

int fsdp_plan(FsdpPlan *out, const size_t *numel, const int *unit, int n_params, int n_units,
              int dp_shard, int shard_rank, Err *err) {
    memset(out, 0, sizeof *out);
    if (dp_shard < 1)
        return err_set(err, "FSDP needs a dp_shard group of at least 1, got %d", dp_shard);
    if (shard_rank < 0 || shard_rank >= dp_shard)
        return err_set(err, "FSDP shard rank %d is outside a group of %d", shard_rank, dp_shard);
    if (n_params < 0 || n_units < 1)
        return err_set(err, "FSDP needs at least one unit, got %d parameters in %d units", n_params,
                       n_units);
    for (int i = 0; i < n_params; i++)
        if (unit[i] < 0 || unit[i] >= n_units)
            return err_set(err, "FSDP parameter %d names unit %d, outside 0..%d", i, unit[i],
                           n_units - 1);
    out->dp_shard = dp_shard;
    out->shard_rank = shard_rank;
    out->n_params = n_params;
    out->n_units = n_units;
    out->params = xcalloc((size_t)(n_params ? n_params : 1), sizeof *out->params);
    out->units = xcalloc((size_t)n_units, sizeof *out->units);
    for (int i = 0; i < n_params; i++) {
        FsdpUnit *u = &out->units[unit[i]];
        out->params[i].numel = numel[i];
        out->params[i].unit = unit[i];
        out->params[i].full_offset = u->full_numel;
        u->full_numel = round_up(u->full_numel + numel[i], ALIGN_FLOATS);
    }
    size_t offset = 0;
    for (int k = 0; k < n_units; k++) {
        FsdpUnit *u = &out->units[k];
        u->full_numel = round_up(u->full_numel, (size_t)ALIGN_FLOATS * dp_shard);
        u->shard_numel = u->full_numel / dp_shard;
        u->shard_offset = offset;
        offset += u->shard_numel;
        if (u->full_numel > out->max_full_numel) out->max_full_numel = u->full_numel;
        if (u->shard_numel > out->max_unit_shard) out->max_unit_shard = u->shard_numel;
    }
    out->shard_numel = offset;
    return 0;
}

void fsdp_plan_free(FsdpPlan *p) {
    free(p->params);
    free(p->units);
    memset(p, 0, sizeof *p);
}

void fsdp_param_shard(const FsdpPlan *p, int i, size_t *lo, size_t *hi, size_t *shard_at) {
    const FsdpParam *q = &p->params[i];
    const FsdpUnit *u = &p->units[q->unit];
    size_t mine_lo = (size_t)p->shard_rank * u->shard_numel, mine_hi = mine_lo + u->shard_numel;
    size_t a = q->full_offset > mine_lo ? q->full_offset : mine_lo;
    size_t b = q->full_offset + q->numel < mine_hi ? q->full_offset + q->numel : mine_hi;
    if (a >= b) {
        *lo = *hi = 0;
        *shard_at = u->shard_offset;
        return;
    }
    *lo = a - q->full_offset;
    *hi = b - q->full_offset;
    *shard_at = u->shard_offset + (a - mine_lo);
}

void fsdp_shard_from_full(const FsdpPlan *p, float *shard, const float *const *full_params) {
    memset(shard, 0, p->shard_numel * sizeof *shard);
    for (int i = 0; i < p->n_params; i++) {
        size_t lo, hi, at;
        fsdp_param_shard(p, i, &lo, &hi, &at);
        if (hi > lo) memcpy(shard + at, full_params[i] + lo, (hi - lo) * sizeof *shard);
    }
}

static int check_unit(const FsdpPlan *p, Comm *comm, int unit, Err *err) {
    if (unit < 0 || unit >= p->n_units)
        return err_set(err, "FSDP unit %d is outside 0..%d", unit, p->n_units - 1);
    if (comm->size != p->dp_shard || comm->rank != p->shard_rank)
        return err_set(err, "FSDP plan is for rank %d of %d but the communicator is rank %d of %d",
                       p->shard_rank, p->dp_shard, comm->rank, comm->size);
    return 0;
}

int fsdp_gather_unit_start(const FsdpPlan *p, Comm *comm, void *full, const void *shard, int unit,
                           CommDtype t, FsdpReq *req, Err *err) {
    memset(req, 0, sizeof *req);
    TRY(check_unit(p, comm, unit, err));
    const FsdpUnit *u = &p->units[unit];
    return comm_iall_gather(comm, full, (const char *)shard + u->shard_offset * comm_dtype_size(t),
                            u->shard_numel, t, &req->req, err);
}

int fsdp_gather_unit(const FsdpPlan *p, Comm *comm, void *full, const void *shard, int unit,
                     CommDtype t, Err *err) {
    FsdpReq req;
    TRY(fsdp_gather_unit_start(p, comm, full, shard, unit, t, &req, err));
    return fsdp_wait(comm, &req, err);
}

int fsdp_reduce_scatter_unit_start(const FsdpPlan *p, Comm *comm, float *grad_shard,
                                   const float *full_grad, int unit, float *scratch, FsdpReq *req,
                                   Err *err) {
    memset(req, 0, sizeof *req);
    TRY(check_unit(p, comm, unit, err));
    const FsdpUnit *u = &p->units[unit];
    /* The sum lands in the scratch and is added on completion, so gradients accumulate over
     * microbatches. */
    req->acc = grad_shard + u->shard_offset;
    req->n = u->shard_numel;
    req->tmp = scratch;
    if (comm_ireduce_scatter_sum(comm, scratch, full_grad, u->shard_numel, COMM_F32, &req->req,
                                 err)) {
        req->tmp = NULL;
        return -1;
    }
    return 0;
}

int fsdp_reduce_scatter_unit(const FsdpPlan *p, Comm *comm, float *grad_shard,
                             const float *full_grad, int unit, float *scratch, Err *err) {
    FsdpReq req;
    TRY(fsdp_reduce_scatter_unit_start(p, comm, grad_shard, full_grad, unit, scratch, &req, err));
    return fsdp_wait(comm, &req, err);
}

int fsdp_test(Comm *comm, FsdpReq *req, int *done, Err *err) {
    return comm_test(comm, req->req, done, err);
}

int fsdp_wait(Comm *comm, FsdpReq *req, Err *err) {
    int rc = comm_wait(comm, req->req, err);
    req->req = NULL;
    if (rc == 0 && req->tmp)
        for (size_t i = 0; i < req->n; i++)
            req->acc[i] += req->tmp[i];
    req->tmp = NULL;
    return rc;
}

int fsdp_all_reduce_replicas(const FsdpPlan *p, Comm *replicate, float *grad_shard, Err *err) {
    return comm_all_reduce_sum(replicate, grad_shard, p->shard_numel, COMM_F32, err);
}

void fsdp_shard_sq_sums(const FsdpPlan *p, const float *shard, const unsigned char *tp_replicated,
                        double *sq_tp_sharded, double *sq_tp_replicated) {
    double a = 0, b = 0;
    for (int i = 0; i < p->n_params; i++) {
        size_t lo, hi, at;
        fsdp_param_shard(p, i, &lo, &hi, &at);
        double s = 0;
        for (size_t j = 0; j < hi - lo; j++)
            s += (double)shard[at + j] * shard[at + j];
        if (tp_replicated && tp_replicated[i])
            b += s;
        else
            a += s;
    }
    *sq_tp_sharded = a;
    *sq_tp_replicated = b;
}
