/* Device mesh: resolving and checking [parallelism] against the world size and the model
 * shapes, rank coordinates, and the sub-communicators each parallelism needs. */
#include "dist/mesh.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define KEY_R "parallelism.data_parallel_replicate_degree"
#define KEY_S "parallelism.data_parallel_shard_degree"
#define KEY_T "parallelism.tensor_parallel_degree"
#define KEY_EP "parallelism.expert_parallel_degree"

static int check_tp_divides(const char *what, long value, int tp, Err *err) {
    if (value > 0 && value % tp != 0)
        return err_set(err, "%s = %ld is not divisible by " KEY_T " = %d", what, value, tp);
    return 0;
}

int mesh_resolve(MeshDims *out, const MeshConfig *cfg, int rank, Err *err) {
    memset(out, 0, sizeof *out);
    int W = cfg->world, R = cfg->dp_replicate, S = cfg->dp_shard, T = cfg->tp;
    if (W < 1) return err_set(err, "the job has %d processes; it needs at least 1", W);
    if (rank < 0 || rank >= W)
        return err_set(err, "rank %d is outside the %d processes of the job", rank, W);
    if (R < 1) return err_set(err, KEY_R " = %d must be at least 1", R);
    if (T < 1) return err_set(err, KEY_T " = %d must be at least 1", T);
    if (S == 0 || S < -1)
        return err_set(err, KEY_S " = %d must be at least 1, or -1 to take the processes left", S);
    if (S == -1) {
        long rt = (long)R * T;
        if (W % rt != 0)
            return err_set(err,
                           KEY_S " = -1 cannot fill %d processes: %d is not a multiple of "
                                 "data_parallel_replicate_degree x tensor_parallel_degree = "
                                 "%d x %d = %ld",
                           W, W, R, T, rt);
        S = (int)(W / rt);
    }
    long product = (long)R * S * T;
    if (product != W)
        return err_set(err,
                       "the device mesh data_parallel_replicate_degree x "
                       "data_parallel_shard_degree x tensor_parallel_degree = %d x %d x %d = "
                       "%ld does not match the %d processes of the job",
                       R, S, T, product, W);
    TRY(check_tp_divides("model n_heads", cfg->n_heads, T, err));
    TRY(check_tp_divides("model n_kv_heads", cfg->n_kv_heads, T, err));
    TRY(check_tp_divides("model hidden_dim", cfg->hidden_dim, T, err));
    TRY(check_tp_divides("model vocab_size", cfg->vocab_size, T, err));
    if (cfg->sequence_parallel && T > 1)
        TRY(check_tp_divides("training.seq_len (with parallelism.enable_sequence_parallel)",
                             cfg->seq_len, T, err));
    int EP = cfg->ep > 0 ? cfg->ep : 1;
    if (cfg->ep < 1 && cfg->ep != 0)
        return err_set(err, KEY_EP " = %d must be at least 1", cfg->ep);
    if (EP > 1 && cfg->num_experts == 0)
        return err_set(err, KEY_EP " = %d needs a mixture-of-experts model (this one is dense)",
                       EP);
    if (cfg->num_experts > 0 && (EP > 1 || T > 1)) {
        if (EP % T != 0)
            return err_set(err,
                           KEY_EP " = %d is not a multiple of " KEY_T
                                  " = %d: a mixture-of-experts model splits its experts over "
                                  "the tensor-parallel ranks (and over data_parallel_shard "
                                  "ranks beyond them)",
                           EP, T);
        if (S % (EP / T) != 0)
            return err_set(err,
                           KEY_EP " = %d spans %d data_parallel_shard rank(s) per tensor-parallel "
                                  "rank, which does not divide data_parallel_shard_degree = %d",
                           EP, EP / T, S);
        if (cfg->num_experts % EP != 0)
            return err_set(err, "model num_experts = %d is not divisible by " KEY_EP " = %d",
                           cfg->num_experts, EP);
        /* The tp ranks of an EP group split the micro-batch's tokens (model/moe_ep.h). */
        long tokens = cfg->local_batch * cfg->seq_len;
        if (T > 1 && tokens > 0 && tokens % T != 0)
            return err_set(err,
                           "training.local_batch_size x training.seq_len = %ld x %ld = %ld tokens "
                           "is not divisible by " KEY_T
                           " = %d: the tensor-parallel ranks split a micro-batch's tokens "
                           "between them for the experts",
                           cfg->local_batch, cfg->seq_len, tokens, T);
    }
    if (cfg->local_batch < 1)
        return err_set(err, "training.local_batch_size = %ld must be at least 1", cfg->local_batch);
    int dp = R * S;
    long per_step = (long)dp * cfg->local_batch;
    long global = cfg->global_batch > 0 ? cfg->global_batch : per_step;
    if (global % per_step != 0)
        return err_set(err,
                       "training.global_batch_size = %ld is not divisible by data-parallel "
                       "ranks x training.local_batch_size = %d x %ld = %ld (data-parallel ranks "
                       "= replicate %d x shard %d)",
                       global, dp, cfg->local_batch, per_step, R, S);
    out->world = W;
    out->dp_replicate = R;
    out->dp_shard = S;
    out->tp = T;
    out->sequence_parallel = cfg->sequence_parallel && T > 1;
    out->rank = rank;
    out->t = rank % T;
    out->s = (rank / T) % S;
    out->r = rank / (T * S);
    out->dp = dp;
    out->dp_rank = out->r * S + out->s;
    out->ep = cfg->num_experts > 0 ? EP : 1;
    out->ep_in = out->ep / T > 0 ? out->ep / T : 1;
    out->q = out->ep > 1 ? (out->s % out->ep_in) * T + out->t : 0;
    out->global_batch = global;
    out->grad_accum_steps = (int)(global / per_step);
    return 0;
}

void mesh_describe(char *out, size_t cap, const MeshDims *d) {
    char ep[32] = "";
    if (d->ep > 1) snprintf(ep, sizeof ep, ", ep %d", d->ep);
    snprintf(out, cap,
             "mesh [dp_replicate %d, dp_shard %d, tp %d%s%s] on %d processes, %d "
             "microbatch(es) per step",
             d->dp_replicate, d->dp_shard, d->tp,
             d->sequence_parallel ? " + sequence parallel" : "", ep, d->world, d->grad_accum_steps);
}

long mesh_first_row(const MeshDims *d, long local_batch, int micro) {
    return ((long)micro * d->dp + d->dp_rank) * local_batch;
}

int mesh_rank_of(const MeshDims *d, int r, int s, int t) {
    return (r * d->dp_shard + s) * d->tp + t;
}

int mesh_create(Mesh *out, Comm *world, const MeshConfig *cfg, Err *err) {
    memset(out, 0, sizeof *out);
    MeshConfig c = *cfg;
    c.world = world->size;
    TRY(mesh_resolve(&out->dims, &c, world->rank, err));
    const MeshDims *d = &out->dims;
    out->world = world;
    /* Color = the coordinates a group shares, key = the coordinate it runs along. Without
     * expert parallelism every rank is an EP group of its own. */
    int group = d->r * (d->dp_shard / d->ep_in) + d->s / d->ep_in;
    if (comm_split(world, d->s * d->tp + d->t, d->r, &out->dp_replicate, err) ||
        comm_split(world, d->r * d->tp + d->t, d->s, &out->dp_shard, err) ||
        comm_split(world, d->r * d->dp_shard + d->s, d->t, &out->tp, err) ||
        comm_split(world, d->t, d->dp_rank, &out->dp, err) ||
        comm_split(world, d->ep > 1 ? group : d->rank, d->q, &out->ep, err) ||
        comm_split(world, d->ep > 1 ? d->r * d->ep + d->q : d->rank, d->s / d->ep_in,
                   &out->ep_shard, err)) {
        mesh_destroy(out);
        return err_wrap(err, "device mesh");
    }
    return 0;
}

void mesh_destroy(Mesh *m) {
    comm_destroy(m->dp_replicate);
    comm_destroy(m->dp_shard);
    comm_destroy(m->tp);
    comm_destroy(m->dp);
    comm_destroy(m->ep);
    comm_destroy(m->ep_shard);
    m->dp_replicate = m->dp_shard = m->tp = m->dp = m->ep = m->ep_shard = NULL;
}

int mesh_global_norm(double *out, const Mesh *m, double sq_tp_sharded, double sq_tp_replicated,
                     Err *err) {
    double v[2] = {sq_tp_sharded, sq_tp_replicated};
    TRY(comm_all_reduce_sum(m->dp_shard, v, 2, COMM_F64, err));
    TRY(comm_all_reduce_sum(m->tp, v, 1, COMM_F64, err));
    *out = sqrt(v[0] + v[1]);
    return 0;
}
