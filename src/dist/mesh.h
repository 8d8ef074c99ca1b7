/* Device mesh [dp_replicate, dp_shard, tp] over the ranks of a job, as torchtitan lays it out:
 * tp varies fastest, so rank = (r * dp_shard + s) * tp + t and a tensor-parallel group is a
 * run of consecutive ranks (one host, on GPUs). The sizes come from [parallelism] and are
 * checked, together with the model shapes that tensor parallelism splits and the batch
 * sizes, before anything large is allocated: a failed check is one sentence that every rank
 * computes identically from the same inputs, so rank 0 can print it and all ranks exit. */
#ifndef QT_DIST_MESH_H
#define QT_DIST_MESH_H

#include <stddef.h>

#include "core/err.h"
#include "dist/comm.h"

/* Plain numbers taken from the job config and the model, so the mesh does not depend on the
 * config struct. A shape of 0 means "not known here" and skips its check. */
typedef struct MeshConfig {
    int world;               /* processes in the job */
    int dp_replicate;        /* parallelism.data_parallel_replicate_degree (>= 1) */
    int dp_shard;            /* parallelism.data_parallel_shard_degree (>= 1, or -1 = the rest) */
    int tp;                  /* parallelism.tensor_parallel_degree (>= 1) */
    int sequence_parallel;   /* parallelism.enable_sequence_parallel (0/1) */
    int ep;                  /* parallelism.expert_parallel_degree (>= 1) */
    int num_experts;         /* experts per MoE layer (0 for a dense model) */
    int n_heads, n_kv_heads; /* attention heads and key/value heads */
    long hidden_dim;         /* dense FFN hidden size (F) */
    long vocab_size;         /* lm_head rows (split across tp for the loss) */
    long seq_len;            /* training.seq_len */
    long local_batch;        /* training.local_batch_size (>= 1) */
    long global_batch;       /* training.global_batch_size (<= 0: dp * local_batch) */
} MeshConfig;

/* The resolved sizes and this rank's coordinates. */
typedef struct MeshDims {
    int world;
    int dp_replicate, dp_shard, tp; /* dp_shard resolved from -1 */
    int sequence_parallel;          /* 1: tp > 1 and the tp group also splits the tokens */
    /* Expert parallelism: the ep ranks of an EP group are ep / tp consecutive dp_shard
     * coordinates times the whole tp group (torchtitan's layout with
     * expert_tensor_parallel_degree = 1), so ep_in = ep / tp dp_shard ranks share one group. */
    int ep, ep_in;
    int q; /* this rank's index in its EP group: (s % ep_in) * tp + t */
    int rank;
    int r, s, t;          /* coordinates: replicate, shard, tensor-parallel index */
    int dp, dp_rank;      /* data-parallel ranks (dp_replicate * dp_shard) and this one's */
    long global_batch;    /* resolved */
    int grad_accum_steps; /* global_batch / (dp * local_batch) */
} MeshDims;

/* Resolves and checks cfg for `rank` (0 <= rank < cfg->world); pure, no communication. */
int mesh_resolve(MeshDims *out, const MeshConfig *cfg, int rank, Err *err);
/* One line for the start-up log, e.g. "mesh [dp_replicate 1, dp_shard 4, tp 1] on 4
 * processes, 2 microbatch(es) per step". */
void mesh_describe(char *out, size_t cap, const MeshDims *d);
/* The first row, within the step's global batch (global_batch rows, numbered as on one
 * process), of this rank's microbatch `micro` (0 <= micro < grad_accum_steps); the rows are
 * [first, first + local_batch). Microbatch k of all data-parallel ranks together covers rows
 * [k * dp * local_batch, (k + 1) * dp * local_batch), data-parallel rank order inside, so 1, 2
 * or 4 processes (or more accumulation steps) see the same rows every step. Tensor-parallel
 * peers get the same rows. */
long mesh_first_row(const MeshDims *d, long local_batch, int micro);
/* Rank of coordinates (r, s, t) in a resolved mesh. */
int mesh_rank_of(const MeshDims *d, int r, int s, int t);

typedef struct Mesh {
    MeshDims dims;
    Comm *world;        /* not owned */
    Comm *dp_replicate; /* same (s, t): ranks holding the same shard of the same TP slice */
    Comm *dp_shard;     /* same (r, t): the FSDP group that shares one replica */
    Comm *tp;           /* same (r, s): the tensor-parallel group */
    Comm *dp;           /* same t: every data-parallel rank (loss and token counts) */
    Comm *ep;           /* same r and s / ep_in: the ranks that split one layer's experts */
    /* same EP index q and replica r: the ranks of one replica holding the same experts, over
     * which the experts are FSDP-sharded (replicas hold copies, as under HSDP) */
    Comm *ep_shard;
} Mesh;

/* Resolves cfg against world's size and rank, then splits the four sub-communicators
 * (collective over world: every rank must call it). cfg->world is ignored. */
int mesh_create(Mesh *out, Comm *world, const MeshConfig *cfg, Err *err);
void mesh_destroy(Mesh *m);

/* Global L2 norm of gradients spread over the mesh, in double. sq_tp_sharded is this rank's
 * sum of squares over gradient elements that are split across tp (distinct on every rank);
 * sq_tp_replicated is over elements that every tp rank holds identically (norm weights),
 * counted once. Both are over this rank's FSDP shard; replicas along dp_replicate hold equal
 * shards and are not added again. Identical on every rank. */
int mesh_global_norm(double *out, const Mesh *m, double sq_tp_sharded, double sq_tp_replicated,
                     Err *err);

#endif
