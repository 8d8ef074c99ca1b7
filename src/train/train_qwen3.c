/* The training driver for Qwen3 on any mesh: on a world of one the model's own arenas; when
 * sharded, the shard plan over the model's parameter table, the unit callback that gathers
 * parameters and reduce-scatters gradients around each unit and the tensor-parallel (and
 * sequence-parallel) collectives the model calls. Both give the trainer the parameter pieces
 * this rank holds, and initialise and load them the same way. */
#include "train/train_qwen3.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/param_table.h"
#include "core/timer.h"
#include "dist/fsdp.h"
#include "io/hf_keys.h"
#include "io/safetensors.h"
#include "kernels/cpu_simd.h"
#include "model/lora.h"
#include "model/moe_ep.h"
#include "model/overrides.h"
#include "model/qwen3.h"
#include "model/qwen3_hf.h"
#include "ops/gemm.h"
#include "train/adamw.h"
#include "train/moe_step.h"

/* A full-size workspace: the gathered parameters of the unit it holds and that unit's
 * gradient. Layers alternate between slots 0 and 1 (one computes while the other is
 * prefetched); the embedding and the final norm + lm_head share slot 2. */
enum { NSLOTS = 3, EDGE = 2 };

typedef struct Slot {
    float *p;       /* (capacity) gathered parameters */
    float *g;       /* (capacity) full gradient of the unit in backward */
    float *scratch; /* (max_unit_shard) the reduce-scatter's received sum */
    uint16_t *pb;   /* (capacity) bf16 copy of p under mixed precision, else NULL; the handle
                     * of a widened copy at wide when the bf16 products widen (ops/gemm.h) */
    float *wide;
    size_t cap; /* floats in p and g */
    int holds;  /* unit whose parameters are in p (or being gathered), -1 none */
    FsdpReq gather, rs;
    int gather_pending, rs_pending;
} Slot;

/* What this rank holds of a parameter (of its tensor-parallel part, flattened): elements
 * [lo, hi) at p, their gradient at g; the whole parameter on a world of one. A frozen bf16
 * base's weight (lora.base_dtype) is at pb instead, p NULL. */
typedef struct Held {
    size_t lo, hi;
    float *p, *g;
    uint16_t *pb;
} Held;

struct TrainQwen3 {
    Qwen3 m;    /* this rank's (tensor-parallel part of the) model */
    Qwen3 full; /* tp > 1 or ep > 1: the whole model's table (full shapes), no parameters */
    int has_full;
    const Mesh *mesh;
    const OverridePlan *kernels; /* the kernels chosen at create (NULL: defaults); not owned */
    Mesh own_mesh;   /* the world of one made when train_qwen3_create is given no mesh */
    Comm *own_world; /* its communicator, NULL otherwise */
    /* 0 on a world of one: the model owns its parameters and no unit is gathered. */
    int sharded;
    int tp, t;        /* tensor-parallel degree and this rank's index */
    int seq_parallel; /* 1: the tp group also splits the tokens */
    /* Expert parallelism (ep > 1): this rank holds experts [q * Xl, (q + 1) * Xl) of every MoE
     * layer whole, outside FSDP, in xp with their gradients in xg (summed over the ranks that
     * hold the same experts, mesh->ep_replica, after the micro-batches). */
    int ep, q;
    float *xp, *xg;
    size_t xnumel;
    unsigned char *is_expert; /* (nparams) 1 for the experts' weights under ep > 1 */
    MoeEp *moe_ep;
    unsigned char *tp_split; /* (nparams) TP_REPLICATED, TP_ROWS or TP_COLS */
    unsigned char *tp_repl;  /* (nparams) 1 where tp_split is TP_REPLICATED */
    FsdpPlan plan;
    int L, tied;
    float *shard; /* (plan.shard_numel) master parameters, when sharded */
    float *grad;  /* (plan.shard_numel) gradient slices, when sharded */
    Slot slot[NSLOTS];
    Held *held; /* (nparams) */
    /* The trainer's view: pieces of parameters this rank holds. */
    int npieces;
    CkptTensor *pieces;  /* (npieces) */
    float **piece_grads; /* (npieces) */
    int *piece_decay;    /* (npieces) */
    int *piece_param;    /* (npieces) table index of each piece */
    ShardSlice *slices;  /* (npieces) what each piece is of its whole tensor, when sharded */
    int *bias_param;     /* (L) table index of layer l's moe.expert_bias, -1 none */
    float *bias_full;    /* (L, X) full-size copies of the biases for the balancing update */
    double comm_s;       /* seconds in collectives since the last comm_seconds call */
    int prefetch;        /* 0: gather each unit only when it is needed (bench/dist) */
    /* With LoRA (train_qwen3_model_lora): the trainer's view of the adapters, A and B each. */
    CkptTensor *lparams;
    float **lgrads;
    char (*lnames)[80];
};

/* ---- parameters: units and pointer fields ---- */

/* The FSDP unit of a parameter. Units: 0 embedding (plus the final norm when tied: then all
 * three are used from the first forward to the last backward), 1 + i layer i, L + 1 final
 * norm + lm_head. A buffer (expert_bias: zero gradient, no decay) is sharded and checkpointed
 * like the rest of its layer, updated on the shards by before_optimizer_step. */
static int param_unit(const TrainQwen3 *f, const Qwen3Param *p) {
    if (p->layer >= 0) return 1 + p->layer;
    if (p->kind->id == PK_TOK_EMBEDDINGS) return 0;
    if (p->kind->id == PK_NORM && f->tied) return 0;
    return f->L + 1;
}

static int slot_of(const TrainQwen3 *f, int unit) {
    return unit == 0 || unit == f->L + 1 ? EDGE : (unit - 1) % 2;
}

/* ---- collectives, timed ---- */

static void fail(const char *what, const Err *err) {
    /* A collective failed in the middle of forward or backward: the other ranks are waiting
     * in the next one, so the job cannot stop in agreement. */
    char msg[sizeof err->msg + 64];
    snprintf(msg, sizeof msg, "FSDP %s: %s", what, err->msg);
    comm_abort(1, msg);
}

static void wait_gather(TrainQwen3 *f, Slot *s) {
    if (!s->gather_pending) return;
    Err err;
    double t0 = now_seconds();
    if (fsdp_wait(f->mesh->dp_shard, &s->gather, &err)) fail("gather", &err);
    f->comm_s += now_seconds() - t0;
    s->gather_pending = 0;
}

static void wait_rs(TrainQwen3 *f, Slot *s) {
    if (!s->rs_pending) return;
    Err err;
    double t0 = now_seconds();
    if (fsdp_wait(f->mesh->dp_shard, &s->rs, &err)) fail("reduce-scatter", &err);
    f->comm_s += now_seconds() - t0;
    s->rs_pending = 0;
}

static void start_gather(TrainQwen3 *f, int unit) {
    Slot *s = &f->slot[slot_of(f, unit)];
    wait_gather(f, s);
    Err err;
    double t0 = now_seconds();
    if (fsdp_gather_unit_start(&f->plan, f->mesh->dp_shard, s->p, f->shard, unit, &s->gather, &err))
        fail("gather", &err);
    f->comm_s += now_seconds() - t0;
    s->gather_pending = 1;
    s->holds = unit;
}

/* The unit's parameters are in its slot once this returns, and under mixed precision their
 * bf16 copy (made once per gather: a gather is only ever completed here, by start_gather for a
 * unit it then replaces, or by finish_grads, which forgets the unit). */
static void ensure(TrainQwen3 *f, int unit) {
    Slot *s = &f->slot[slot_of(f, unit)];
    if (s->holds != unit) start_gather(f, unit);
    int fresh = s->gather_pending;
    wait_gather(f, s);
    if (fresh && s->pb) simd_bf16_weight_copy(s->pb, s->p, (long)f->plan.units[unit].full_numel);
}

/* Starts gathering `unit` (-1: none) unless its slot already holds it. Only called when the
 * slot's current unit is finished for this pass. */
static void prefetch(TrainQwen3 *f, int unit) {
    if (!f->prefetch || unit < 0 || f->slot[slot_of(f, unit)].holds == unit) return;
    start_gather(f, unit);
}

static void grad_begin(TrainQwen3 *f, int unit) {
    Slot *s = &f->slot[slot_of(f, unit)];
    wait_rs(f, s); /* the previous unit's gradient is still being sent from s->g */
    memset(s->g, 0, f->plan.units[unit].full_numel * sizeof *s->g);
}

static void grad_end(TrainQwen3 *f, int unit) {
    Slot *s = &f->slot[slot_of(f, unit)];
    Err err;
    double t0 = now_seconds();
    if (fsdp_reduce_scatter_unit_start(&f->plan, f->mesh->dp_shard, f->grad, s->g, unit, s->scratch,
                                       &s->rs, &err))
        fail("reduce-scatter", &err);
    f->comm_s += now_seconds() - t0;
    s->rs_pending = 1;
}

static void on_tp_sum(void *ctx, float *buf, long n) {
    TrainQwen3 *f = ctx;
    Err err;
    double t0 = now_seconds();
    if (comm_all_reduce_sum(f->mesh->tp, buf, (size_t)n, COMM_F32, &err))
        fail("tensor-parallel all-reduce", &err);
    f->comm_s += now_seconds() - t0;
}

static void on_tp_gather(void *ctx, float *full, const float *part, long n) {
    TrainQwen3 *f = ctx;
    Err err;
    double t0 = now_seconds();
    if (comm_all_gather(f->mesh->tp, full, part, (size_t)n, COMM_F32, &err))
        fail("sequence-parallel all-gather", &err);
    f->comm_s += now_seconds() - t0;
}

static void on_tp_reduce_scatter(void *ctx, float *part, const float *full, long n) {
    TrainQwen3 *f = ctx;
    Err err;
    double t0 = now_seconds();
    if (comm_reduce_scatter_sum(f->mesh->tp, part, full, (size_t)n, COMM_F32, &err))
        fail("sequence-parallel reduce-scatter", &err);
    f->comm_s += now_seconds() - t0;
}

static void on_ep_all_to_all(void *ctx, float *out, const size_t *recv_counts, const float *in,
                             const size_t *send_counts) {
    TrainQwen3 *f = ctx;
    Err err;
    double t0 = now_seconds();
    if (comm_all_to_all_v(f->mesh->ep, out, recv_counts, in, send_counts, COMM_F32, &err))
        fail("expert-parallel all-to-all", &err);
    f->comm_s += now_seconds() - t0;
}

/* The model's hook. Units in the model's numbering (0 embedding, 1 + i layer i, L + 1 head);
 * when tied, the head's parameters are unit 0's, which stays gathered for the whole pass. */
static void on_unit(void *ctx, Qwen3 *m, int unit, Qwen3HookPhase phase) {
    TrainQwen3 *f = ctx;
    int L = f->L, head = unit == L + 1;
    switch (phase) {
    case QWEN3_PRE_FORWARD:
        if (head && f->tied) break;
        ensure(f, unit);
        if (unit < L)
            prefetch(f, unit + 1); /* the next layer */
        else if (unit == L && !f->tied)
            prefetch(f, L + 1); /* the slot's embedding is done */
        break;
    case QWEN3_POST_FORWARD:
        break;
    case QWEN3_PRE_BACKWARD:
        if (head && f->tied) {
            grad_begin(f, 0); /* lm_head's gradient is the embedding's */
            break;
        }
        if (unit == 0 && f->tied) break;
        ensure(f, unit);
        if (head)
            prefetch(f, L);
        else if (unit > 1)
            prefetch(f, unit - 1);
        else if (unit == 1 && !f->tied)
            prefetch(f, 0); /* the head is done with slot 2 */
        grad_begin(f, unit);
        break;
    case QWEN3_POST_BACKWARD:
        if (head && f->tied) break;
        if (f->tp > 1 && unit >= 1 && unit <= L) {
            /* q_norm and k_norm are shared by all heads, and each rank saw only its own:
             * their gradients are sums over the tensor-parallel group. */
            const Qwen3LayerParams *g = &m->g.layers[unit - 1];
            on_tp_sum(f, g->q_norm, m->spec.head_dim);
            on_tp_sum(f, g->k_norm, m->spec.head_dim);
            /* Under expert parallelism each tp rank ran the router backward on its block of
             * the tokens only (model/moe_ep.h). */
            if (g->router_gate)
                on_tp_sum(f, g->router_gate, (long)m->spec.num_experts * m->spec.dim);
            if (f->seq_parallel) { /* and the layer's two norms saw only the rank's tokens */
                on_tp_sum(f, g->attention_norm, m->spec.dim);
                on_tp_sum(f, g->ffn_norm, m->spec.dim);
            }
        } else if (f->seq_parallel) {
            /* The embedding, the final norm and lm_head ran on the rank's tokens: every
             * gradient of the unit is a share of the group's sum. */
            on_tp_sum(f, f->slot[EDGE].g, (long)f->plan.units[unit].full_numel);
        }
        grad_end(f, unit);
        break;
    }
}

/* ---- create / free ---- */

struct Qwen3Modules *train_qwen3_modules(const ModelSpec *spec, const OverridePlan *plan,
                                         int verbose) {
    Qwen3Modules *mod = xmalloc(sizeof *mod);
    if (plan) {
        /* The module tree depends only on the layers, so a tensor-parallel rank's spec (fewer
         * heads and FFN columns) has the plan's instances; the defaults are chosen for spec. */
        OverridePlan on_spec = *plan;
        on_spec.spec = *spec;
        overrides_apply(&on_spec, mod);
    } else if (!overrides_defaults(spec, "cpu", mod) && verbose) {
        log_info("kernels: references (QT_KERNELS=reference)");
    }
    return mod;
}

int train_qwen3_sizes(TrainQwen3Sizes *out, const ModelSpec *spec, int B, int T, AcMode ac, int sp,
                      const OverridePlan *plan, Err *err) {
    memset(out, 0, sizeof *out);
    Qwen3Modules *mod = train_qwen3_modules(spec, plan, 0);
    Qwen3Sizes z;
    int rc = qwen3_sizes(&z, spec, B, T, ac, sp, mod, err);
    free(mod);
    TRY(rc);
    out->param_bytes = z.param_bytes;
    out->grad_bytes = z.grad_bytes;
    out->act_bytes = z.act_bytes;
    out->bf16_bytes = z.bf16_bytes;
    out->base_bf16_param_bytes = z.base_bf16_param_bytes;
    out->base_bf16_bytes = z.base_bf16_bytes;
    out->nparams = z.nparams;
    return 0;
}

/* A one-process mesh for a driver created without one (tests, tools). */
static int own_world_of_one(TrainQwen3 *f, int B, Err *err) {
    f->own_world = comm_single_create();
    MeshConfig mc = {.world = 1, .dp_replicate = 1, .dp_shard = 1, .tp = 1, .local_batch = B};
    TRY(mesh_create(&f->own_mesh, f->own_world, &mc, err));
    f->mesh = &f->own_mesh;
    return 0;
}

/* The sharded layout of f->m's table: the FSDP plan, the workspaces the units are gathered
 * into (the model's pointers are set into them once), the unit callback and the
 * tensor-parallel collectives. unit[i] is parameter i's unit. */
static int shard(TrainQwen3 *f, const int *unit, Err *err) {
    int n = f->m.nparams, nunits = f->L + 2, rc = 0;
    size_t *numel = xcalloc((size_t)n, sizeof *numel);
    float ***pf = xcalloc((size_t)n, sizeof *pf), ***gf = xcalloc((size_t)n, sizeof *gf);
    for (int i = 0; i < n; i++) {
        const Qwen3Param *p = &f->m.table[i];
        numel[i] = f->is_expert[i] ? 0 : (size_t)p->numel; /* held outside FSDP */
        pf[i] = qwen3_param_field(&f->m.p, p->kind->id, p->layer);
        gf[i] = qwen3_param_field(&f->m.g, p->kind->id, p->layer);
    }
    if (rc == 0)
        rc = fsdp_plan(&f->plan, numel, unit, n, nunits, f->mesh->dims.dp_shard,
                       f->mesh->dp_shard->rank, err);
    free(numel);
    if (rc != 0) {
        free(pf), free(gf);
        return -1;
    }
    /* Workspaces: the largest layer for slots 0 and 1, the larger of embedding and head for
     * slot 2. A unit always lives in the same slot, so the model's pointers are set once. */
    size_t cap[NSLOTS] = {0, 0, 0};
    for (int u = 0; u < nunits; u++) {
        size_t fu = f->plan.units[u].full_numel;
        int s = slot_of(f, u);
        if (fu > cap[s]) cap[s] = fu;
    }
    if (cap[1] > cap[0]) cap[0] = cap[1]; /* layers differ when dense and MoE blocks mix */
    cap[1] = cap[0];
    for (int s = 0; s < NSLOTS; s++) {
        size_t c = cap[s] ? cap[s] : 16;
        f->slot[s].cap = c;
        f->slot[s].p = xcalloc(c, sizeof(float));
        f->slot[s].g = xcalloc(c, sizeof(float));
        f->slot[s].scratch = xcalloc(f->plan.max_unit_shard + 16, sizeof(float));
        f->slot[s].holds = -1;
    }
    size_t at = 0;
    for (int i = 0; i < n; i++)
        f->xnumel += f->is_expert[i] ? (size_t)f->m.table[i].numel : 0;
    f->xp = xcalloc(f->xnumel + 1, sizeof(float));
    f->xg = xcalloc(f->xnumel + 1, sizeof(float));
    for (int i = 0; i < n; i++) {
        Slot *s = &f->slot[slot_of(f, unit[i])];
        *pf[i] = s->p + f->plan.params[i].full_offset;
        *gf[i] = s->g + f->plan.params[i].full_offset;
        if (f->is_expert[i]) {
            *pf[i] = f->xp + at;
            *gf[i] = f->xg + at;
            at += (size_t)f->m.table[i].numel;
        }
    }
    free(pf), free(gf);
    if (f->tied) {
        f->m.p.output = f->m.p.tok_embeddings;
        f->m.g.output = f->m.g.tok_embeddings;
    }
    f->shard = xcalloc(f->plan.shard_numel + 16, sizeof(float));
    f->grad = xcalloc(f->plan.shard_numel + 16, sizeof(float));
    for (int i = 0; i < n; i++) {
        if (f->is_expert[i]) {
            f->held[i] = (Held){
                0, (size_t)f->m.table[i].numel,
                *qwen3_param_field(&f->m.p, f->m.table[i].kind->id, f->m.table[i].layer),
                *qwen3_param_field(&f->m.g, f->m.table[i].kind->id, f->m.table[i].layer), NULL};
            continue;
        }
        size_t at;
        fsdp_param_shard(&f->plan, i, &f->held[i].lo, &f->held[i].hi, &at);
        f->held[i].p = f->shard + at;
        f->held[i].g = f->grad + at;
    }
    f->m.dist.unit = on_unit;
    f->m.dist.ctx = f;
    if (f->tp > 1) f->m.dist.tp_sum = on_tp_sum;
    if (f->ep > 1) {
        /* The EP group spans tp ranks that see the same tokens: each takes its block. */
        f->moe_ep = moe_ep_create(f->ep, f->q, f->m.spec.num_experts, f->tp, f->t, f->L,
                                  on_ep_all_to_all, f);
        f->m.ep = f->moe_ep;
    }
    if (f->seq_parallel) {
        f->m.sp_rank = f->t;
        f->m.dist.tp_gather = on_tp_gather;
        f->m.dist.tp_reduce_scatter = on_tp_reduce_scatter;
    }
    return 0;
}

/* What a sharded rank's piece of p is of the whole tensor: tp rank t's block of rows (the
 * first dimension) or of columns (the last), or all of it, and elements [lo, hi) of that. */
static void piece_slice(const TrainQwen3 *f, const Qwen3Param *p, const Held *h, ShardSlice *s) {
    int64_t shape[3] = {p->shape[0], p->shape[1], p->shape[2]};
    int split = f->tp_split[p - f->m.table], dim = split == TP_ROWS   ? 0
                                                   : split == TP_COLS ? p->ndim - 1
                                                                      : -1;
    /* Expert parallelism: the rank's run of experts (dimension 0), held whole. */
    int expert = f->is_expert[p - f->m.table], parts = expert ? f->ep : f->tp;
    int at = expert ? f->q : f->t;
    if (expert) dim = 0;
    if (dim >= 0) shape[dim] *= parts;
    shard_slice_whole(s, p->ndim, shape);
    if (dim >= 0) {
        s->box_len[dim] = p->shape[dim];
        s->box_off[dim] = (int64_t)at * p->shape[dim];
    }
    s->start = (int64_t)h->lo;
    s->numel = (int64_t)(h->hi - h->lo);
}

TrainQwen3 *train_qwen3_create(const ModelSpec *spec, int B, int T, AcMode ac, const Mesh *mesh,
                               const OverridePlan *plan, int frozen, int base_bf16, Err *err) {
    TrainQwen3 *f = xcalloc(1, sizeof *f);
    f->mesh = mesh;
    f->kernels = plan;
    if (!mesh && own_world_of_one(f, B, err) != 0) {
        train_qwen3_free(f);
        return NULL;
    }
    if (frozen && f->mesh->dims.world > 1) {
        /* The adapters live in one process's model. */
        err_set(err, "a frozen base (LoRA) runs on one process: FSDP and tensor parallelism with "
                     "adapters are not implemented");
        train_qwen3_free(f);
        return NULL;
    }
    f->sharded = f->mesh->dims.world > 1;
    f->tp = f->mesh->dims.tp;
    f->t = f->mesh->dims.t;
    f->seq_parallel = f->mesh->dims.sequence_parallel;
    f->L = spec->n_layers;
    f->tied = spec->tie_embeddings;
    /* QTITAN_FSDP_PREFETCH=0 turns prefetching off, to measure what it buys (bench/dist). */
    const char *pf_env = getenv("QTITAN_FSDP_PREFETCH");
    f->prefetch = !(pf_env && strcmp(pf_env, "0") == 0);
    /* Tensor parallel: the rank's model has n_heads / tp heads, n_kv_heads / tp key/value
     * heads and hidden_dim / tp FFN columns (the mesh checked that they divide). */
    ModelSpec local = *spec;
    local.n_heads /= f->tp;
    local.n_kv_heads /= f->tp;
    local.hidden_dim /= f->tp;
    f->ep = f->mesh->dims.ep;
    f->q = f->mesh->dims.q;
    f->has_full = f->tp > 1 || f->ep > 1;
    if (f->ep > 1) local.num_local_experts = spec->num_experts / f->ep;
    Qwen3Modules *mod = train_qwen3_modules(&local, plan, !f->sharded);
    int rc = f->sharded ? qwen3_create_unowned_with(&f->m, &local, B, T, ac,
                                                    f->seq_parallel ? f->tp : 1, mod, err)
             : frozen   ? qwen3_create_frozen_with(&f->m, &local, B, T, ac, mod, base_bf16, err)
                        : qwen3_create_with(&f->m, &local, B, T, ac, mod, err);
    free(mod);
    if (rc == 0 && f->has_full) rc = qwen3_create_unowned(&f->full, spec, 1, 1, AC_NONE, 1, err);
    if (rc != 0) {
        train_qwen3_free(f); /* qwen3_free takes a model that was never created */
        return NULL;
    }
    int n = f->m.nparams;
    int *unit = xcalloc((size_t)n, sizeof *unit);
    f->held = xcalloc((size_t)n, sizeof *f->held);
    f->is_expert = xcalloc((size_t)n, 1);
    for (int i = 0; i < n; i++)
        f->is_expert[i] = f->ep > 1 && f->m.table[i].kind->role == ROLE_EXPERTS;
    for (int i = 0; i < n; i++) {
        unit[i] = param_unit(f, &f->m.table[i]);
        const Qwen3Param *p = &f->m.table[i];
        f->held[i] = (Held){0, (size_t)p->numel, p->data, p->grad, p->data_bf16};
    }
    if (rc == 0 && f->sharded) rc = shard(f, unit, err);
    if (rc != 0) {
        free(unit);
        train_qwen3_free(f);
        return NULL;
    }
    f->bias_param = xmalloc((size_t)f->L * sizeof *f->bias_param);
    for (int l = 0; l < f->L; l++)
        f->bias_param[l] = -1;
    for (int i = 0; i < n; i++)
        if (f->m.table[i].kind->id == PK_EXPERT_BIAS) f->bias_param[unit[i] - 1] = i;
    free(unit);
    f->bias_full = xcalloc((size_t)f->L * (spec->num_experts > 0 ? spec->num_experts : 1),
                           sizeof *f->bias_full);
    f->tp_split = xcalloc((size_t)n, 1);
    f->tp_repl = xcalloc((size_t)n, 1);
    for (int i = 0; i < n; i++) {
        f->tp_split[i] = (unsigned char)(f->tp > 1 ? f->m.table[i].kind->tp : TP_REPLICATED);
        f->tp_repl[i] = f->tp_split[i] == TP_REPLICATED;
    }

    /* The trainer's pieces: on a world of one every parameter whole, with its shape (the
     * one-process checkpoint's tensors); sharded, the 1-D slices this rank holds. */
    f->pieces = xcalloc((size_t)n, sizeof *f->pieces);
    f->piece_grads = xcalloc((size_t)n, sizeof *f->piece_grads);
    f->piece_decay = xcalloc((size_t)n, sizeof *f->piece_decay);
    f->piece_param = xcalloc((size_t)n, sizeof *f->piece_param);
    f->slices = xcalloc((size_t)n, sizeof *f->slices);
    for (int i = 0; i < n; i++) {
        const Qwen3Param *p = &f->m.table[i];
        const Held *h = &f->held[i];
        if (h->hi <= h->lo) continue;
        int k = f->npieces++;
        /* An FSDP shard is the driver's host memory; otherwise the piece is the model's. */
        const Device *dev = f->sharded ? &device_cpu : f->m.param_arena.device;
        f->pieces[k] =
            f->sharded ? (CkptTensor){p->name, 1, {(int64_t)(h->hi - h->lo)}, h->p, dev}
                       : (CkptTensor){
                             p->name, p->ndim, {p->shape[0], p->shape[1], p->shape[2]}, h->p, dev};
        f->piece_grads[k] = h->g;
        f->piece_param[k] = i;
        if (f->sharded) piece_slice(f, p, h, &f->slices[k]);
    }
    if (f->sharded) {
        char mesh_line[160];
        mesh_describe(mesh_line, sizeof mesh_line, &f->mesh->dims);
        log_info("%s; FSDP: each rank keeps 1/%d of the parameters, gradients and optimizer "
                 "state",
                 mesh_line, f->mesh->dims.dp_shard);
    }
    return f;
}

Qwen3 *train_qwen3_qwen3(TrainQwen3 *q) {
    return &q->m;
}

const Mesh *train_qwen3_mesh(const TrainQwen3 *q) {
    return q->mesh;
}

int train_qwen3_sharded(const TrainQwen3 *q) {
    return q->sharded;
}

void train_qwen3_free(TrainQwen3 *f) {
    if (!f) return;
    for (int s = 0; s < NSLOTS; s++) {
        free(f->slot[s].p);
        free(f->slot[s].g);
        free(f->slot[s].scratch);
        if (f->slot[s].wide) {
            gemm_widened_unregister(f->slot[s].wide);
            free(f->slot[s].wide); /* pb is its handle */
        } else {
            free(f->slot[s].pb);
        }
    }
    fsdp_plan_free(&f->plan);
    qwen3_free(&f->m);
    if (f->has_full) qwen3_free(&f->full);
    moe_ep_free(f->moe_ep);
    free(f->xp);
    free(f->xg);
    free(f->is_expert);
    free(f->tp_split);
    free(f->tp_repl);
    free(f->shard);
    free(f->grad);
    free(f->held);
    free(f->pieces);
    free(f->piece_grads);
    free(f->piece_decay);
    free(f->piece_param);
    free(f->slices);
    free(f->bias_param);
    free(f->bias_full);
    free(f->lparams);
    free(f->lgrads);
    free(f->lnames);
    if (f->own_world) {
        mesh_destroy(&f->own_mesh);
        comm_destroy(f->own_world);
    }
    free(f);
}

/* The bf16 twin, in slot s's copy, of a weight in slot s (NULL: no such weight). */
static uint16_t *twin(const Slot *s, const float *w) {
    return w ? s->pb + (w - s->p) : NULL;
}

int train_qwen3_enable_bf16(TrainQwen3 *f, Err *err) {
    if (!f->sharded) return qwen3_enable_bf16(&f->m, err);
    TRY(qwen3_enable_bf16_by_hook(&f->m, err));
    for (int s = 0; s < NSLOTS; s++) {
        Slot *sl = &f->slot[s];
        if (!gemm_bf16_widens()) {
            sl->pb = xcalloc(sl->cap, sizeof(uint16_t));
            continue;
        }
        sl->wide = xcalloc(sl->cap, sizeof(float));
        sl->pb = gemm_widened_register(sl->wide, sl->cap);
        if (!sl->pb) return err_set(err, "too many widened weight regions at once (ops/gemm.h)");
    }
    for (int l = 0; l < f->L; l++) {
        const Slot *s = &f->slot[slot_of(f, 1 + l)];
        const Qwen3LayerParams *p = &f->m.p.layers[l];
        Qwen3Bf16Layer *b = &f->m.pb.layers[l];
        b->wq = twin(s, p->wq), b->wk = twin(s, p->wk), b->wv = twin(s, p->wv);
        b->wo = twin(s, p->wo), b->w1 = twin(s, p->w1), b->w3 = twin(s, p->w3);
        b->w2 = twin(s, p->w2); /* w1 / w3 / w2 NULL in MoE layers: experts stay fp32 */
    }
    f->m.pb.output = twin(&f->slot[EDGE], f->m.p.output); /* tied: the embedding's */
    for (int s = 0; s < NSLOTS; s++)
        f->slot[s].holds = -1; /* the next ensure gathers, and so casts */
    return 0;
}

/* ---- initial values ---- */

/* Where parameter i's initial values are made: in place when this rank holds all of it in
 * fp32 (a world of one), so no staging copy of the largest tensor adds to the peak memory;
 * else in tmp, for keep_slice to cut. */
static float *stage(const TrainQwen3 *f, int i, float *tmp) {
    return !f->sharded && !f->has_full && f->held[i].p ? f->held[i].p : tmp;
}

/* Keeps this rank's part of parameter i, given whole: first its tensor-parallel block (rows
 * or columns, cut into tmp), then the elements it holds of that. */
static void keep_slice(TrainQwen3 *f, int i, const float *full, float *tmp) {
    if (full == f->held[i].p) return; /* made in place (stage) */
    if (f->is_expert[i])              /* expert parallel: the rank's run of experts, held whole */
        full += (size_t)f->q * (size_t)f->m.table[i].numel;
    else if (f->tp_split[i] != TP_REPLICATED) {
        const Qwen3Param *p = &f->m.table[i]; /* the local shape */
        long rows = (long)p->shape[0], cols = p->ndim == 2 ? (long)p->shape[1] : 1;
        if (f->tp_split[i] == TP_ROWS) {
            memcpy(tmp, full + (size_t)f->t * rows * cols, (size_t)(rows * cols) * sizeof *tmp);
        } else {
            long full_cols = cols * f->tp;
            for (long r = 0; r < rows; r++)
                memcpy(tmp + r * cols, full + r * full_cols + (long)f->t * cols,
                       (size_t)cols * sizeof *tmp);
        }
        full = tmp;
    }
    const Held *h = &f->held[i];
    if (h->pb)
        simd_f32_to_bf16(h->pb + h->lo, full + h->lo, (long)(h->hi - h->lo));
    else if (h->hi > h->lo)
        memcpy(h->p, full + h->lo, (h->hi - h->lo) * sizeof *full);
}

/* The whole model's table (the rank's own when tp = 1). */
static const Qwen3 *whole(const TrainQwen3 *f) {
    return f->has_full ? &f->full : &f->m;
}

static size_t max_numel(const TrainQwen3 *f) {
    size_t mx = 1;
    for (int i = 0; i < whole(f)->nparams; i++)
        if ((size_t)whole(f)->table[i].numel > mx) mx = (size_t)whole(f)->table[i].numel;
    return mx;
}

void train_qwen3_init(TrainQwen3 *f, uint64_t seed) {
    float *tmp = xmalloc(max_numel(f) * sizeof *tmp), *part = xmalloc(max_numel(f) * sizeof *tmp);
    for (int i = 0; i < f->m.nparams; i++) {
        float *dst = stage(f, i, tmp);
        qwen3_init_param(whole(f), i, seed, dst);
        keep_slice(f, i, dst, part);
    }
    free(tmp);
    free(part);
    for (int s = 0; s < NSLOTS; s++)
        f->slot[s].holds = -1;
}

int train_qwen3_load_hf(TrainQwen3 *f, const char *path, Err *err) {
    StSet set;
    TRY(st_set_open(&set, path, err));
    float *tmp = xmalloc(max_numel(f) * sizeof *tmp), *part = xmalloc(max_numel(f) * sizeof *tmp);
    int rc = 0;
    HfKeyTable keys;
    hf_keys_build(&keys, &whole(f)->spec);
    rc = qwen3_hf_check(&whole(f)->spec, &set, path, err);
    for (int i = 0; i < f->m.nparams && rc == 0; i++) {
        const Qwen3Param *p = &whole(f)->table[i];
        int k = p->kind->hf ? hf_keys_find_param(&keys, p->name) : -1;
        float *dst = stage(f, i, tmp);
        if (!p->kind->hf) /* training state (expert_bias), not in HF files */
            memset(dst, 0, (size_t)p->numel * sizeof *dst);
        else if (k < 0)
            rc = err_set(err, "model parameter %s is not in the Hugging Face name table", p->name);
        else if (hf_keys_load_param(dst, &keys, k, &set, err) != 0)
            rc = err_wrap(err, "%s", path);
        if (rc != 0) break;
        keep_slice(f, i, dst, part);
    }
    hf_keys_free(&keys);
    free(tmp);
    free(part);
    st_set_close(&set);
    for (int s = 0; s < NSLOTS; s++)
        f->slot[s].holds = -1;
    return rc;
}

/* ---- the trainer's interfaces ---- */

static int forward_backward(void *ctx, const void *batch, double divisor, double *loss_sum,
                            Err *err) {
    TrainQwen3 *f = ctx;
    const TrainQwen3Batch *b = batch;
    if (b->B > f->m.max_B || b->T > f->m.max_T)
        return err_set(err,
                       "model: a micro-batch of %d x %d tokens exceeds the %d x %d the "
                       "activations were sized for",
                       b->B, b->T, f->m.max_B, f->m.max_T);
    /* LoRA dropout acts in training's forward and backward only (validation does not drop). */
    if (f->m.lora) lora_dropout_rows(f->m.lora, b->row, b->T);
    qwen3_forward_backward(&f->m, b->tokens, b->targets, b->positions, b->doc, b->B, b->T, divisor);
    if (f->m.lora) lora_dropout_rows(f->m.lora, -1, 0);
    *loss_sum = f->m.loss_sum;
    return 0;
}

/* MoE, once per step after finish_grads: moe_train_step sums the routing counts over every
 * data-parallel rank (so the counts are those of the whole global batch, as on one process)
 * and updates the biases through m->p, which when sharded would be a gathered workspace. It
 * gets full-size copies holding the elements this rank holds instead; every element's update
 * depends only on the counts, so they come out as on one process and are written back. */
static int before_optimizer_step(void *ctx, int update, MetricsExtra *extra, int *nextra,
                                 Err *err) {
    TrainQwen3 *f = ctx;
    int X = f->m.spec.num_experts;
    float *in_slot[QT_MAX_LAYERS];
    for (int l = 0; l < f->L; l++) {
        int i = f->bias_param[l];
        if (i < 0) continue;
        const Held *h = &f->held[i];
        float *full = f->bias_full + (size_t)l * X;
        memset(full, 0, (size_t)X * sizeof *full);
        if (h->hi > h->lo) memcpy(full + h->lo, h->p, (h->hi - h->lo) * sizeof *full);
        in_slot[l] = f->m.p.layers[l].expert_bias;
        f->m.p.layers[l].expert_bias = full;
    }
    double t0 = now_seconds();
    int rc = moe_train_step(&f->m, f->mesh->dp, update, extra, nextra, TRAIN_MAX_EXTRA, err);
    f->comm_s += now_seconds() - t0;
    for (int l = 0; l < f->L; l++) {
        int i = f->bias_param[l];
        if (i < 0) continue;
        const Held *h = &f->held[i];
        if (h->hi > h->lo)
            memcpy(h->p, f->m.p.layers[l].expert_bias + h->lo, (h->hi - h->lo) * sizeof(float));
        f->m.p.layers[l].expert_bias = in_slot[l];
    }
    return rc;
}

void train_qwen3_set_micro_batches(TrainQwen3 *f, int micro_batches) {
    f->m.aux_weight = 1.0 / ((micro_batches > 0 ? micro_batches : 1) * f->mesh->dims.dp);
}

void train_qwen3_model(TrainQwen3 *f, TrainModel *out, int exempt) {
    for (int k = 0; k < f->npieces; k++)
        f->piece_decay[k] = param_decays(f->m.table[f->piece_param[k]].kind, exempt, exempt);
    *out = (TrainModel){.ctx = f,
                        .nparams = f->npieces,
                        .params = f->pieces,
                        .grads = f->piece_grads,
                        .decay = f->piece_decay,
                        .slices = f->sharded ? f->slices : NULL,
                        .forward_backward = forward_backward,
                        .before_optimizer_step = f->m.n_moe_layers ? before_optimizer_step : NULL};
}

static int finish_grads(void *ctx, double *loss_sum, Err *err) {
    TrainQwen3 *f = ctx;
    for (int s = 0; s < NSLOTS; s++) {
        wait_gather(f, &f->slot[s]);
        wait_rs(f, &f->slot[s]);
        f->slot[s].holds = -1; /* the optimizer is about to change the parameters */
    }
    double t0 = now_seconds();
    int rc = 0;
    if (f->mesh->dims.dp_replicate > 1)
        rc = fsdp_all_reduce_replicas(&f->plan, f->mesh->dp_replicate, f->grad, err);
    /* Experts: every rank holding the same ones saw other tokens. */
    if (rc == 0 && f->ep > 1 && f->mesh->ep_replica->size > 1)
        rc = comm_all_reduce_sum(f->mesh->ep_replica, f->xg, f->xnumel, COMM_F32, err);
    if (rc == 0) rc = comm_all_reduce_sum(f->mesh->dp, loss_sum, 1, COMM_F64, err);
    /* Sequence parallel: each tp rank's loss covers its tokens only. */
    if (rc == 0 && f->seq_parallel)
        rc = comm_all_reduce_sum(f->mesh->tp, loss_sum, 1, COMM_F64, err);
    f->comm_s += now_seconds() - t0;
    return rc;
}

static int grad_norm(void *ctx, double local_sq, double *norm, Err *err) {
    TrainQwen3 *f = ctx;
    double sharded = local_sq, replicated = 0;
    /* With tensor parallelism the replicated parameters' squares count once, not per rank;
     * with expert parallelism the experts are outside the FSDP slices and count once per EP
     * group (each of its ranks holds other experts; their replicas hold the same sums). */
    if (f->tp > 1 || f->ep > 1)
        fsdp_shard_sq_sums(&f->plan, f->grad, f->tp_repl, &sharded, &replicated);
    double experts = 0;
    for (size_t i = 0; i < f->xnumel; i++)
        experts += (double)f->xg[i] * f->xg[i];
    double t0 = now_seconds();
    int rc = mesh_global_norm(norm, f->mesh, sharded, replicated, err);
    if (rc == 0 && f->ep > 1) {
        rc = comm_all_reduce_sum(f->mesh->ep, &experts, 1, COMM_F64, err);
        *norm = sqrt(*norm * *norm + experts);
    }
    f->comm_s += now_seconds() - t0;
    return rc;
}

static double comm_seconds(void *ctx) {
    TrainQwen3 *f = ctx;
    double s = f->comm_s;
    f->comm_s = 0;
    return s;
}

void train_qwen3_parallel(TrainQwen3 *f, TrainParallel *out) {
    *out = (TrainParallel){.ctx = f,
                           .world = f->mesh->world,
                           .mesh = {f->mesh->dims.dp_replicate, f->mesh->dims.dp_shard, f->tp},
                           .finish_grads = finish_grads,
                           .grad_norm = grad_norm,
                           .comm_seconds = comm_seconds};
}

void train_qwen3_model_lora(TrainQwen3 *q, Lora *lo, TrainModel *out) {
    q->m.lora = lo;
    int n = 2 * lo->n;
    q->lparams = xcalloc((size_t)n, sizeof *q->lparams);
    q->lgrads = xcalloc((size_t)n, sizeof *q->lgrads);
    q->lnames = xcalloc((size_t)n, sizeof *q->lnames);
    for (int i = 0; i < lo->n; i++) {
        LoraAdapter *ad = &lo->ad[i];
        char mod[64];
        lora_module_name(mod, sizeof mod, ad->layer, ad->site);
        snprintf(q->lnames[2 * i], sizeof q->lnames[0], "%s.lora_A", mod);
        snprintf(q->lnames[2 * i + 1], sizeof q->lnames[0], "%s.lora_B", mod);
        /* The adapters are host memory of their own (model/lora.c). */
        q->lparams[2 * i] = (CkptTensor){q->lnames[2 * i], 2, {lo->rank, ad->in}, ad->a, NULL};
        q->lparams[2 * i + 1] =
            (CkptTensor){q->lnames[2 * i + 1], 2, {ad->out, lo->rank}, ad->b, NULL};
        q->lgrads[2 * i] = ad->da;
        q->lgrads[2 * i + 1] = ad->db;
    }
    *out = (TrainModel){.ctx = q,
                        .nparams = n,
                        .params = q->lparams,
                        .grads = q->lgrads,
                        .forward_backward = forward_backward};
}

int train_qwen3_export_merged(TrainQwen3 *q, const char *dir, const HfExportOptions *o, Err *err) {
    Lora *lo = q->m.lora;
    for (int i = 0; lo && i < lo->n; i++)
        lora_merge(lo, &lo->ad[i],
                   *qwen3_param_field(&q->m.p, lora_site_kind(lo->ad[i].site), lo->ad[i].layer));
    q->m.lora = NULL;
    HfExportTensor *t = xcalloc((size_t)q->m.nparams, sizeof *t);
    for (int i = 0; i < q->m.nparams; i++)
        t[i] = (HfExportTensor){q->m.table[i].name, q->m.table[i].numel, q->m.table[i].data,
                                q->m.param_arena.device};
    int rc = hf_export(dir, &q->m.spec, t, q->m.nparams, o, err);
    free(t);
    return rc;
}

/* ---- the whole model on one rank (samples on a mesh) ---- */

int train_qwen3_whole_create(TrainQwen3 *f, Qwen3 *out, Err *err) {
    const ModelSpec *spec = &whole(f)->spec;
    Qwen3Modules *mod = train_qwen3_modules(spec, f->kernels, 0);
    int rc = qwen3_create_forward(out, spec, 1, 1, mod, err); /* only a Decoder runs it */
    free(mod);
    TRY(rc);
    if (f->m.bf16 && qwen3_enable_bf16_for_gemv(out, err) != 0) {
        qwen3_free(out);
        return -1;
    }
    return 0;
}

/* Parameter i's tensor-parallel parts (numel each, t-ordered in parts) as the whole tensor. */
static void join_tp(const TrainQwen3 *f, int i, float *whole_t, const float *parts) {
    const Qwen3Param *p = &f->m.table[i]; /* the local shape */
    long numel = (long)p->numel;
    if (f->tp_split[i] == TP_ROWS) {
        memcpy(whole_t, parts, (size_t)(numel * f->tp) * sizeof *whole_t);
        return;
    }
    long rows = (long)p->shape[0], cols = p->ndim == 2 ? (long)p->shape[1] : 1;
    for (int t = 0; t < f->tp; t++)
        for (long r = 0; r < rows; r++)
            memcpy(whole_t + r * cols * f->tp + (long)t * cols, parts + t * numel + r * cols,
                   (size_t)cols * sizeof *whole_t);
}

int train_qwen3_gather_whole(TrainQwen3 *f, Qwen3 *dst, Err *err) {
    int rc = 0;
    if (!f->sharded) {
        for (int i = 0; i < f->m.nparams; i++)
            memcpy(dst->table[i].data, f->m.table[i].data,
                   (size_t)f->m.table[i].numel * sizeof(float));
    }
    float *parts = f->tp > 1 || f->ep > 1 ? xmalloc(max_numel(f) * sizeof *parts) : NULL;
    /* Expert parallelism: each rank holds a run of experts whole, outside the FSDP units; the EP
     * group (ordered by its index q) holds them all, in order along dimension 0. */
    for (int i = 0; f->ep > 1 && i < f->m.nparams && rc == 0; i++) {
        if (!f->is_expert[i]) continue;
        const Qwen3Param *p = &f->m.table[i];
        const float *local = *qwen3_param_field(&f->m.p, p->kind->id, p->layer);
        rc = comm_all_gather(f->mesh->ep, dst ? dst->table[i].data : parts, local, (size_t)p->numel,
                             COMM_F32, err);
    }
    for (int u = 0; f->sharded && u < f->L + 2 && rc == 0; u++) {
        if (f->plan.units[u].full_numel == 0) continue; /* the head when tied */
        ensure(f, u); /* the unit's (tensor-parallel part of the) parameters, as in a forward */
        for (int i = 0; i < f->m.nparams && rc == 0; i++) {
            const Qwen3Param *p = &f->m.table[i];
            if (param_unit(f, p) != u || f->is_expert[i]) continue;
            const float *local = *qwen3_param_field(&f->m.p, p->kind->id, p->layer);
            float *to = dst ? dst->table[i].data : NULL;
            if (f->tp_split[i] == TP_REPLICATED) {
                if (to) memcpy(to, local, (size_t)p->numel * sizeof *to);
                continue;
            }
            rc = comm_all_gather(f->mesh->tp, parts, local, (size_t)p->numel, COMM_F32, err);
            if (rc == 0 && to) join_tp(f, i, to, parts);
        }
    }
    free(parts);
    /* LoRA (one process only): the adapters merged as the merged export merges them. */
    const Lora *lo = f->m.lora;
    for (int i = 0; rc == 0 && dst && lo && i < lo->n; i++)
        lora_merge(lo, &lo->ad[i],
                   *qwen3_param_field(&dst->p, lora_site_kind(lo->ad[i].site), lo->ad[i].layer));
    if (rc == 0 && dst && dst->bf16) qwen3_refresh_bf16(dst);
    return rc;
}
