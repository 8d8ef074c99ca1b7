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

#include "core/dtype.h"
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
    /* A bf16 base (TrainQwen3.base16), or a unit gathered in bf16 under mixed precision
     * (TrainQwen3.mp16, b16 1): the unit's bf16 weights gathered into bp (bcap elements), which
     * is pb itself, or, when the bf16 products widen, widened into wide (pb its handle) once
     * the gather completes. Under mixed precision its fp32-read parameters come packed into
     * small_recv (from every rank's small_send) and are unpacked into p. */
    uint16_t *bp;
    size_t bcap;
    FsdpReq bgather, sgather;
    int bgather_pending, sgather_pending, b16;
    float *small_send, *small_recv;
    /* Expert parallelism: the unit's experts (this rank's run of them), gathered over
     * mesh->ep_shard into xp and their gradient reduce-scattered from xg, alongside the rest
     * of the unit over dp_shard. */
    float *xp, *xg, *xscratch;
    FsdpReq xgather, xrs;
    int xgather_pending, xrs_pending;
    /* LoRA: the unit's adapters (TrainQwen3.lplan), gathered over dp_shard into lp and their
     * gradient reduce-scattered from lg, alongside the frozen base. */
    float *lp, *lg, *lscratch;
    FsdpReq lgather, lrs;
    int lgather_pending, lrs_pending;
} Slot;

/* What this rank holds of a parameter (of its tensor-parallel part, flattened): elements
 * [lo, hi) at p, their gradient at g; the whole parameter on a world of one. A frozen bf16
 * base's weight (lora.base_dtype) is at pb instead (elements [lo, hi) from pb[0]), p NULL. */
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
    /* 1: the model's weights do not train (the base of LoRA): no gradients for them, no
     * reduce-scatter; only the adapters train (lplan). */
    int frozen;
    /* A frozen bf16 base when sharded (lora.base_dtype): the matmul weights and the embedding
     * (in_bf16) are sharded by bplan into bshard, held, gathered (COMM_BF16) and multiplied in
     * bf16, 2 bytes a parameter, as one process holds them; the rest (norms) stays in plan. */
    int base16;
    FsdpPlan bplan;
    uint16_t *bshard;
    unsigned char *in_bf16; /* (nparams) */
    /* Mixed precision when sharded (training, not a frozen base) and every product reads bf16
     * copies (qwen3_products_bf16): copy16 (plan layout, like shard) holds the bf16 copy of the
     * rank's shard, cast whole when the trainer starts keeping copies (keep_copies) and then
     * written by AdamW as it updates each piece. While kept, each mp16_unit (one with matmul
     * weights whose other parameters are small: not the embedding's, not a layer with its
     * experts) is gathered in bf16 from copy16 into its twin, half the bytes, and only its
     * fp32-read parameters (reads_f32: norms, router, expert_bias) in fp32, packed
     * (small_numel[u] floats per rank, the most any rank holds). The fp32 matmul weights of
     * such a unit are not gathered: nothing reads them. */
    int mp16, mp16_kept;
    uint16_t *copy16;
    unsigned char *mp16_unit, *reads_f32;
    size_t *small_numel;
    int tp, t;        /* tensor-parallel degree and this rank's index */
    int seq_parallel; /* 1: the tp group also splits the tokens */
    /* Expert parallelism (ep > 1): this rank computes experts [q * Xl, (q + 1) * Xl) of every
     * MoE layer; they are FSDP-sharded of their own, by xplan over the ranks of its replica that
     * hold the same experts (mesh->ep_shard), into xshard with their gradient slices in xgrad,
     * gathered and reduce-scattered with their layer's unit and all-reduced over the replicas
     * like the rest (torchtitan shards experts over the data-parallel ranks outside the EP
     * group the same way). Replica 0 thus holds every element, as readers of checkpoints
     * expect. */
    int ep, q;
    FsdpPlan xplan;
    float *xshard, *xgrad;
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
    /* (npieces) on a world of one under mixed precision, the model's bf16 copy of each piece
     * (qwen3_bf16_copy), which AdamW writes; else NULL entries. */
    uint16_t **piece_copies;
    /* 1: the trainer's view was made with every weight the optimizer updates given its copy
     * (or none updated: LoRA's frozen base), so keep_copies may stop the per-forward cast. */
    int keeps;
    ShardSlice *slices; /* (npieces) what each piece is of its whole tensor, when sharded */
    int *bias_param;    /* (L) table index of layer l's moe.expert_bias, -1 none */
    float *bias_full;   /* (L, X) full-size copies of the biases for the balancing update */
    double comm_s;      /* seconds in collectives since the last comm_seconds call */
    int prefetch;       /* 0: gather each unit only when it is needed (bench/dist) */
    /* LoRA when sharded (shard_lora): the adapters' own FSDP plan, A and B of adapter i its
     * parameters 2i and 2i + 1 (this rank's tensor-parallel blocks, lora_set_tp) in their
     * layer's unit, over dp_shard as the base; this rank's share in lshard, its gradient
     * slices in lgrad; lrepl (2n) marks the factors whole over the tp group (their squares
     * count once in the norm, as a norm's). Gathered and reduce-scattered with their unit. */
    FsdpPlan lplan;
    float *lshard, *lgrad;
    unsigned char *lrepl;
    /* With LoRA (train_qwen3_model_lora): the trainer's view of the adapters, nl pieces: A and
     * B of each whole on one process, else the parts of lshard this rank holds (lslices). */
    int nl;
    CkptTensor *lparams;
    float **lgrads;
    char (*lnames)[80];
    ShardSlice *lslices;
    /* Samples through the shards (train_qwen3_unitwise_create): rank 0's buffers for the edge
     * unit being run and for one layer, their bf16 twins, and each unit's element count; on
     * every rank the staging of tensor- and expert-parallel gathers. */
    float *uw[2];
    uint16_t *uwb[2];
    size_t *uw_numel; /* (L + 2) */
    float *uw_parts;
};

/* ---- parameters: units and pointer fields ---- */

/* The FSDP unit of a parameter. Units: 0 embedding (plus the final norm when tied: then all
 * three are used from the first forward to the last backward), 1 + i layer i, L + 1 final
 * norm + lm_head. A buffer (expert_bias: zero gradient, no decay) is sharded and checkpointed
 * like the rest of its layer, updated on the shards by before_optimizer_step. */
static int unit_of(ParamKindId kind, int layer, int L, int tied) {
    if (layer >= 0) return 1 + layer;
    if (kind == PK_TOK_EMBEDDINGS) return 0;
    if (kind == PK_NORM && tied) return 0;
    return L + 1;
}

static int param_unit(const TrainQwen3 *f, const Qwen3Param *p) {
    return unit_of(p->kind->id, p->layer, f->L, f->tied);
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
    if (!s->gather_pending && !s->xgather_pending && !s->bgather_pending && !s->lgather_pending)
        return;
    Err err;
    double t0 = now_seconds();
    if (s->gather_pending && fsdp_wait(f->mesh->dp_shard, &s->gather, &err)) fail("gather", &err);
    if (s->bgather_pending && fsdp_wait(f->mesh->dp_shard, &s->bgather, &err))
        fail("bf16 gather", &err);
    if (s->sgather_pending && fsdp_wait(f->mesh->dp_shard, &s->sgather, &err))
        fail("gather of the fp32 parameters", &err);
    if (s->xgather_pending && fsdp_wait(f->mesh->ep_shard, &s->xgather, &err))
        fail("experts' gather", &err);
    if (s->lgather_pending && fsdp_wait(f->mesh->dp_shard, &s->lgather, &err))
        fail("adapters' gather", &err);
    f->comm_s += now_seconds() - t0;
    s->gather_pending = s->xgather_pending = s->bgather_pending = s->sgather_pending = 0;
    s->lgather_pending = 0;
}

static void wait_rs(TrainQwen3 *f, Slot *s) {
    if (!s->rs_pending && !s->xrs_pending && !s->lrs_pending) return;
    Err err;
    double t0 = now_seconds();
    if (s->rs_pending && fsdp_wait(f->mesh->dp_shard, &s->rs, &err)) fail("reduce-scatter", &err);
    if (s->xrs_pending && fsdp_wait(f->mesh->ep_shard, &s->xrs, &err))
        fail("experts' reduce-scatter", &err);
    if (s->lrs_pending && fsdp_wait(f->mesh->dp_shard, &s->lrs, &err))
        fail("adapters' reduce-scatter", &err);
    f->comm_s += now_seconds() - t0;
    s->rs_pending = s->xrs_pending = s->lrs_pending = 0;
}

/* 1 when `unit` has experts of this rank's (their gather and reduce-scatter run over
 * ep_shard next to the unit's own). */
static int has_experts(const TrainQwen3 *f, int unit) {
    return f->ep > 1 && f->xplan.units[unit].full_numel > 0;
}

/* 1 when `unit` has LoRA adapters of a sharded run (gathered and reduce-scattered with it). */
static int has_adapters(const TrainQwen3 *f, int unit) {
    return f->lplan.units && f->lplan.units[unit].full_numel > 0;
}

/* Moves the runs of unit u's fp32-read parameters (reads_f32) that shard rank k holds, in
 * table order, between `packed` (consecutive) and their places: this rank's piece of the unit
 * in its shard (piece, to pack) or the unit's full workspace (full, to unpack). Returns the
 * floats moved; with both NULL it only counts them. */
static size_t small_runs(const TrainQwen3 *f, int u, int k, float *packed, const float *piece,
                         float *full) {
    const FsdpUnit *un = &f->plan.units[u];
    size_t lo = (size_t)k * un->shard_numel, hi = lo + un->shard_numel, n = 0;
    for (int i = 0; i < f->m.nparams; i++) {
        const FsdpParam *q = &f->plan.params[i];
        if (q->unit != u || !f->reads_f32[i]) continue;
        size_t a = q->full_offset > lo ? q->full_offset : lo;
        size_t b = q->full_offset + q->numel < hi ? q->full_offset + q->numel : hi;
        if (a >= b) continue;
        if (piece) memcpy(packed + n, piece + (a - lo), (b - a) * sizeof *packed);
        if (full) memcpy(full + a, packed + n, (b - a) * sizeof *packed);
        n += b - a;
    }
    return n;
}

static void start_gather(TrainQwen3 *f, int unit) {
    Slot *s = &f->slot[slot_of(f, unit)];
    wait_gather(f, s);
    Err err;
    double t0 = now_seconds();
    s->b16 = f->mp16_kept && f->mp16_unit[unit];
    if (s->b16) {
        /* the bf16 copy of the whole unit, and its fp32-read parameters packed */
        if (fsdp_gather_unit_start(&f->plan, f->mesh->dp_shard, s->bp, f->copy16, unit, COMM_BF16,
                                   &s->bgather, &err))
            fail("bf16 gather", &err);
        size_t n = f->small_numel[unit];
        small_runs(f, unit, f->plan.shard_rank, s->small_send,
                   f->shard + f->plan.units[unit].shard_offset, NULL);
        memset(&s->sgather, 0, sizeof s->sgather);
        if (comm_iall_gather(f->mesh->dp_shard, s->small_recv, s->small_send, n, COMM_F32,
                             &s->sgather.req, &err))
            fail("gather of the fp32 parameters", &err);
        s->bgather_pending = s->sgather_pending = 1;
    } else {
        if (fsdp_gather_unit_start(&f->plan, f->mesh->dp_shard, s->p, f->shard, unit, COMM_F32,
                                   &s->gather, &err))
            fail("gather", &err);
        s->gather_pending = 1;
    }
    if (f->base16) {
        if (fsdp_gather_unit_start(&f->bplan, f->mesh->dp_shard, s->bp, f->bshard, unit, COMM_BF16,
                                   &s->bgather, &err))
            fail("bf16 gather", &err);
        s->bgather_pending = 1;
    }
    if (has_experts(f, unit)) {
        if (fsdp_gather_unit_start(&f->xplan, f->mesh->ep_shard, s->xp, f->xshard, unit, COMM_F32,
                                   &s->xgather, &err))
            fail("experts' gather", &err);
        s->xgather_pending = 1;
    }
    if (has_adapters(f, unit)) {
        if (fsdp_gather_unit_start(&f->lplan, f->mesh->dp_shard, s->lp, f->lshard, unit, COMM_F32,
                                   &s->lgather, &err))
            fail("adapters' gather", &err);
        s->lgather_pending = 1;
    }
    f->comm_s += now_seconds() - t0;
    s->holds = unit;
}

/* The unit's parameters are in its slot once this returns, and under mixed precision their
 * bf16 copy (made once per gather: a gather is only ever completed here, by start_gather for a
 * unit it then replaces, or by finish_grads, which forgets the unit). A bf16 base's weights
 * arrive in bf16 and are only widened where the products widen. */
static void ensure(TrainQwen3 *f, int unit) {
    Slot *s = &f->slot[slot_of(f, unit)];
    if (s->holds != unit) start_gather(f, unit);
    int fresh = s->gather_pending || s->bgather_pending; /* the experts stay fp32 */
    wait_gather(f, s);
    if (!fresh) return;
    if (s->b16) /* the fp32-read parameters from every rank's packed runs */
        for (int k = 0, P = f->plan.dp_shard; k < P; k++)
            small_runs(f, unit, k, s->small_recv + (size_t)k * f->small_numel[unit], NULL, s->p);
    const FsdpPlan *b = f->base16 ? &f->bplan : &f->plan;
    if ((f->base16 || s->b16) && s->wide)
        simd_bf16_to_f32(s->wide, s->bp, (long)b->units[unit].full_numel);
    else if (!f->base16 && !s->b16 && s->pb)
        simd_bf16_weight_copy(s->pb, s->p, (long)f->plan.units[unit].full_numel);
}

/* Starts gathering `unit` (-1: none) unless its slot already holds it. Only called when the
 * slot's current unit is finished for this pass. */
static void prefetch(TrainQwen3 *f, int unit) {
    if (!f->prefetch || unit < 0 || f->slot[slot_of(f, unit)].holds == unit) return;
    start_gather(f, unit);
}

/* The unit's full gradients zeroed: the base's unless frozen, and its adapters'. */
static void grad_begin(TrainQwen3 *f, int unit) {
    Slot *s = &f->slot[slot_of(f, unit)];
    wait_rs(f, s); /* the previous unit's gradient is still being sent from s->g */
    if (!f->frozen) memset(s->g, 0, f->plan.units[unit].full_numel * sizeof *s->g);
    if (!f->frozen && has_experts(f, unit))
        memset(s->xg, 0, f->xplan.units[unit].full_numel * sizeof *s->xg);
    if (has_adapters(f, unit)) memset(s->lg, 0, f->lplan.units[unit].full_numel * sizeof *s->lg);
}

static void grad_end(TrainQwen3 *f, int unit) {
    Slot *s = &f->slot[slot_of(f, unit)];
    Err err;
    double t0 = now_seconds();
    if (fsdp_reduce_scatter_unit_start(&f->plan, f->mesh->dp_shard, f->grad, s->g, unit, s->scratch,
                                       &s->rs, &err))
        fail("reduce-scatter", &err);
    s->rs_pending = 1;
    /* The experts' gradients: every rank holding the same experts saw other tokens. */
    if (has_experts(f, unit)) {
        if (fsdp_reduce_scatter_unit_start(&f->xplan, f->mesh->ep_shard, f->xgrad, s->xg, unit,
                                           s->xscratch, &s->xrs, &err))
            fail("experts' reduce-scatter", &err);
        s->xrs_pending = 1;
    }
    f->comm_s += now_seconds() - t0;
}

static void on_tp_sum(void *ctx, float *buf, long n) {
    TrainQwen3 *f = ctx;
    Err err;
    double t0 = now_seconds();
    if (comm_all_reduce_sum(f->mesh->tp, buf, (size_t)n, COMM_F32, &err))
        fail("tensor-parallel all-reduce", &err);
    f->comm_s += now_seconds() - t0;
}

/* LoRA: the unit's adapter gradients, once its backward is done. A factor whole over the
 * tensor-parallel group has a partial sum on each rank (lora_tp_whole): summed over the group
 * first, as q_norm's are, so every tp rank holds the same; then the unit's are
 * reduce-scattered over dp_shard into lgrad, as the base's are in full training. */
static void adapters_grad_end(TrainQwen3 *f, int unit) {
    Slot *s = &f->slot[slot_of(f, unit)];
    const Lora *lo = f->m.lora;
    for (int i = 0; f->tp > 1 && i < lo->n; i++) {
        const LoraAdapter *ad = &lo->ad[i];
        if (ad->layer != unit - 1) continue;
        if (lora_tp_whole(ad, 'A'))
            on_tp_sum(f, ad->da, (long)lo->rank * ad->in);
        else
            on_tp_sum(f, ad->db, (long)ad->out * lo->rank);
    }
    Err err;
    double t0 = now_seconds();
    if (fsdp_reduce_scatter_unit_start(&f->lplan, f->mesh->dp_shard, f->lgrad, s->lg, unit,
                                       s->lscratch, &s->lrs, &err))
        fail("adapters' reduce-scatter", &err);
    s->lrs_pending = 1;
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
            if (!f->frozen) grad_begin(f, 0); /* lm_head's gradient is the embedding's */
            break;
        }
        /* A frozen embedding has no backward to run (model/qwen3.c). */
        if (unit == 0 && (f->tied || f->frozen)) break;
        ensure(f, unit);
        if (head)
            prefetch(f, L);
        else if (unit > 1)
            prefetch(f, unit - 1);
        else if (unit == 1 && !f->tied && !f->frozen)
            prefetch(f, 0); /* the head is done with slot 2 */
        if (!f->frozen || has_adapters(f, unit)) grad_begin(f, unit);
        break;
    case QWEN3_POST_BACKWARD:
        if (head && f->tied) break;
        if (has_adapters(f, unit)) adapters_grad_end(f, unit);
        if (f->frozen) break;
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
    memcpy(out->bf16_bytes, z.bf16_bytes, sizeof out->bf16_bytes);
    out->bf16_pack_bytes = z.bf16_pack_bytes;
    out->base_bf16_param_bytes = z.base_bf16_param_bytes;
    out->base_bf16_bytes = z.base_bf16_bytes;
    out->bf16_scratch_bytes = z.bf16_scratch_bytes;
    out->products_bf16 = z.products_bf16;
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
    size_t *numel = xcalloc((size_t)n, sizeof *numel), *xnumel = xcalloc((size_t)n, sizeof *xnumel);
    size_t *bnumel = xcalloc((size_t)n, sizeof *bnumel);
    float ***pf = xcalloc((size_t)n, sizeof *pf), ***gf = xcalloc((size_t)n, sizeof *gf);
    for (int i = 0; i < n; i++) {
        const Qwen3Param *p = &f->m.table[i];
        /* the experts in the experts' plan, a bf16 base's weights in the bf16 one, the rest in
         * the unit's */
        (f->is_expert[i] ? xnumel : f->in_bf16[i] ? bnumel : numel)[i] = (size_t)p->numel;
        pf[i] = qwen3_param_field(&f->m.p, p->kind->id, p->layer);
        gf[i] = f->frozen ? NULL : qwen3_param_field(&f->m.g, p->kind->id, p->layer);
    }
    rc = fsdp_plan(&f->plan, numel, unit, n, nunits, f->mesh->dims.dp_shard,
                   f->mesh->dp_shard->rank, err);
    if (rc == 0 && f->ep > 1)
        rc = fsdp_plan(&f->xplan, xnumel, unit, n, nunits, f->mesh->ep_shard->size,
                       f->mesh->ep_shard->rank, err);
    if (rc == 0 && f->base16)
        rc = fsdp_plan(&f->bplan, bnumel, unit, n, nunits, f->mesh->dims.dp_shard,
                       f->mesh->dp_shard->rank, err);
    free(numel), free(xnumel), free(bnumel);
    if (rc != 0) {
        free(pf), free(gf);
        return -1;
    }
    /* Workspaces: the largest layer for slots 0 and 1, the larger of embedding and head for
     * slot 2. A unit always lives in the same slot, so the model's pointers are set once. */
    size_t cap[NSLOTS] = {0, 0, 0}, xcap[NSLOTS] = {0, 0, 0}, bcap[NSLOTS] = {0, 0, 0};
    for (int u = 0; u < nunits; u++) {
        size_t fu = f->plan.units[u].full_numel, xu = f->ep > 1 ? f->xplan.units[u].full_numel : 0;
        size_t bu = f->base16 ? f->bplan.units[u].full_numel : 0;
        int s = slot_of(f, u);
        if (fu > cap[s]) cap[s] = fu;
        if (xu > xcap[s]) xcap[s] = xu;
        if (bu > bcap[s]) bcap[s] = bu;
    }
    /* layers differ when dense and MoE blocks mix */
    if (cap[1] > cap[0]) cap[0] = cap[1];
    if (xcap[1] > xcap[0]) xcap[0] = xcap[1];
    if (bcap[1] > bcap[0]) bcap[0] = bcap[1];
    cap[1] = cap[0];
    xcap[1] = xcap[0];
    bcap[1] = bcap[0];
    for (int s = 0; s < NSLOTS && f->base16; s++) {
        Slot *sl = &f->slot[s];
        sl->bcap = bcap[s] ? bcap[s] : 16;
        sl->bp = xcalloc(sl->bcap, sizeof(uint16_t));
        sl->pb = sl->bp;
        if (!gemm_bf16_widens()) continue;
        /* widened once per gather (ensure), as mixed precision's copies are */
        sl->wide = xcalloc(sl->bcap, sizeof(float));
        sl->pb = gemm_widened_register(sl->wide, sl->bcap);
        if (!sl->pb) rc = err_set(err, "too many widened weight regions at once (ops/gemm.h)");
    }
    for (int s = 0; s < NSLOTS; s++) {
        size_t c = cap[s] ? cap[s] : 16;
        f->slot[s].cap = c;
        f->slot[s].p = xcalloc(c, sizeof(float));
        if (!f->frozen) { /* a frozen base has no gradient to hold or reduce-scatter */
            f->slot[s].g = xcalloc(c, sizeof(float));
            f->slot[s].scratch = xcalloc(f->plan.max_unit_shard + 16, sizeof(float));
        }
        f->slot[s].holds = -1;
        if (xcap[s] == 0) continue;
        f->slot[s].xp = xcalloc(xcap[s], sizeof(float));
        if (!f->frozen) { /* nor for its experts */
            f->slot[s].xg = xcalloc(xcap[s], sizeof(float));
            f->slot[s].xscratch = xcalloc(f->xplan.max_unit_shard + 16, sizeof(float));
        }
    }
    for (int i = 0; i < n && rc == 0; i++) {
        Slot *s = &f->slot[slot_of(f, unit[i])];
        const Qwen3Param *p = &f->m.table[i];
        if (f->in_bf16[i]) { /* no fp32 place, as on one process */
            *pf[i] = NULL;
            /* the products take the (widened) copy; the embedding's lookup reads bf16 */
            uint16_t *b = p->kind->id == PK_TOK_EMBEDDINGS ? s->bp : s->pb;
            *qwen3_bf16_field(&f->m, p->kind->id, p->layer) = b + f->bplan.params[i].full_offset;
            continue;
        }
        *pf[i] = f->is_expert[i] ? s->xp + f->xplan.params[i].full_offset
                                 : s->p + f->plan.params[i].full_offset;
        if (gf[i])
            *gf[i] = f->is_expert[i] ? s->xg + f->xplan.params[i].full_offset
                                     : s->g + f->plan.params[i].full_offset;
    }
    free(pf), free(gf);
    if (rc != 0) return -1;
    if (f->tied) {
        f->m.p.output = f->m.p.tok_embeddings;
        f->m.g.output = f->m.g.tok_embeddings;
        if (f->base16) /* lm_head's products: the embedding's copy */
            f->m.pb.output = f->slot[EDGE].pb + (f->m.pb.tok_embeddings - f->slot[EDGE].bp);
    }
    f->shard = xcalloc(f->plan.shard_numel + 16, sizeof(float));
    if (f->base16) f->bshard = xcalloc(f->bplan.shard_numel + 16, sizeof(uint16_t));
    if (!f->frozen) f->grad = xcalloc(f->plan.shard_numel + 16, sizeof(float));
    if (f->ep > 1) {
        f->xshard = xcalloc(f->xplan.shard_numel + 16, sizeof(float));
        if (!f->frozen) f->xgrad = xcalloc(f->xplan.shard_numel + 16, sizeof(float));
    }
    for (int i = 0; i < n; i++) {
        /* an expert's slice is of this rank's run of experts (piece_slice) */
        const FsdpPlan *plan = f->is_expert[i] ? &f->xplan : f->in_bf16[i] ? &f->bplan : &f->plan;
        size_t at;
        fsdp_param_shard(plan, i, &f->held[i].lo, &f->held[i].hi, &at);
        if (f->in_bf16[i]) {
            f->held[i] = (Held){f->held[i].lo, f->held[i].hi, NULL, NULL, f->bshard + at};
            continue;
        }
        f->held[i].p = (f->is_expert[i] ? f->xshard : f->shard) + at;
        float *g = f->is_expert[i] ? f->xgrad : f->grad;
        f->held[i].g = g ? g + at : NULL;
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

/* What a piece is of its whole tensor: the rank's part (local, ndim dimensions) is block `at`
 * of `parts` along dimension dim (-1: all of the tensor), and the piece elements [lo, hi) of
 * that part, flattened. */
static void slice_of(ShardSlice *s, int ndim, const int64_t *local, int dim, int parts, int at,
                     size_t lo, size_t hi) {
    int64_t shape[3] = {0, 0, 0};
    memcpy(shape, local, (size_t)ndim * sizeof *shape);
    if (dim >= 0) shape[dim] *= parts;
    shard_slice_whole(s, ndim, shape);
    if (dim >= 0) {
        s->box_len[dim] = local[dim];
        s->box_off[dim] = (int64_t)at * local[dim];
    }
    s->start = (int64_t)lo;
    s->numel = (int64_t)(hi - lo);
}

/* What a sharded rank's piece of p is of the whole tensor: tp rank t's block of rows (the
 * first dimension) or of columns (the last), or all of it, and elements [lo, hi) of that. */
static void piece_slice(const TrainQwen3 *f, const Qwen3Param *p, const Held *h, ShardSlice *s) {
    int split = f->tp_split[p - f->m.table], dim = split == TP_ROWS   ? 0
                                                   : split == TP_COLS ? p->ndim - 1
                                                                      : -1;
    /* Expert parallelism: the rank's run of experts (dimension 0), and elements [lo, hi) of
     * that run. */
    int expert = f->is_expert[p - f->m.table];
    if (expert) dim = 0;
    slice_of(s, p->ndim, p->shape, dim, expert ? f->ep : f->tp, expert ? f->q : f->t, h->lo, h->hi);
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
    f->sharded = f->mesh->dims.world > 1;
    f->frozen = frozen;
    f->base16 = frozen && base_bf16 && f->sharded;
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
    f->in_bf16 = xcalloc((size_t)n, 1);
    for (int i = 0; i < n; i++) {
        const Qwen3Param *p = &f->m.table[i];
        f->is_expert[i] = f->ep > 1 && p->kind->role == ROLE_EXPERTS;
        f->in_bf16[i] = f->base16 && qwen3_bf16_field(&f->m, p->kind->id, p->layer) != NULL;
    }
    for (int i = 0; i < n; i++) {
        unit[i] = param_unit(f, &f->m.table[i]);
        const Qwen3Param *p = &f->m.table[i];
        f->held[i] = (Held){0, (size_t)p->numel, p->data, p->grad, p->data_bf16};
    }
    if (rc == 0 && f->sharded) rc = shard(f, unit, err);
    if (rc == 0 && f->base16) rc = qwen3_enable_bf16_base_by_hook(&f->m, err);
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
    f->piece_copies = xcalloc((size_t)n, sizeof *f->piece_copies);
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
        if (f->frozen)
            log_info("%s; FSDP: each rank keeps 1/%d of the frozen base (no gradients%s); the "
                     "LoRA adapters are sharded with their layers, with their gradients and "
                     "optimizer state",
                     mesh_line, f->mesh->dims.dp_shard,
                     f->base16 ? "; matmul weights and embedding in bf16, gathered in bf16" : "");
        else
            log_info("%s; FSDP: each rank keeps 1/%d of the parameters, gradients and optimizer "
                     "state",
                     mesh_line, f->mesh->dims.dp_shard);
        if (f->ep > 1)
            log_info("expert parallel %d: each rank computes %d of the %d experts of each MoE "
                     "layer and keeps 1/%d of them (FSDP over the replica's ranks with the same "
                     "experts)",
                     f->ep, f->m.spec.num_local_experts, f->m.spec.num_experts,
                     f->mesh->ep_shard->size);
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
        } else if (f->slot[s].pb != f->slot[s].bp) {
            free(f->slot[s].pb);
        }
        free(f->slot[s].bp);
        free(f->slot[s].small_send);
        free(f->slot[s].small_recv);
        free(f->slot[s].xp);
        free(f->slot[s].xg);
        free(f->slot[s].xscratch);
        free(f->slot[s].lp);
        free(f->slot[s].lg);
        free(f->slot[s].lscratch);
    }
    fsdp_plan_free(&f->plan);
    fsdp_plan_free(&f->lplan);
    free(f->lshard);
    free(f->lgrad);
    free(f->lrepl);
    fsdp_plan_free(&f->xplan);
    fsdp_plan_free(&f->bplan);
    free(f->bshard);
    free(f->in_bf16);
    free(f->copy16);
    free(f->reads_f32);
    free(f->mp16_unit);
    free(f->small_numel);
    qwen3_free(&f->m);
    if (f->has_full) qwen3_free(&f->full);
    moe_ep_free(f->moe_ep);
    free(f->xshard);
    free(f->xgrad);
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
    free(f->piece_copies);
    free(f->slices);
    free(f->bias_param);
    free(f->bias_full);
    free(f->lparams);
    free(f->lgrads);
    free(f->lnames);
    free(f->lslices);
    free(f->uw[0]), free(f->uw[1]), free(f->uwb[0]), free(f->uwb[1]);
    free(f->uw_numel), free(f->uw_parts);
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

/* Mixed precision on a training mesh (TrainQwen3.mp16): which parameters are read in fp32,
 * which units gather in bf16, their packed fp32 gathers, the bf16 receive buffers and the
 * bf16 copy of the shard. */
static void setup_mp16(TrainQwen3 *f) {
    int n = f->m.nparams, nu = f->L + 2, P = f->plan.dp_shard;
    f->reads_f32 = xcalloc((size_t)n, 1);
    f->mp16_unit = xcalloc((size_t)nu, 1);
    f->small_numel = xcalloc((size_t)nu, sizeof *f->small_numel);
    unsigned char *big_f32 = xcalloc((size_t)nu, 1);
    for (int i = 0; i < n; i++) {
        const Qwen3Param *p = &f->m.table[i];
        int u = f->plan.params[i].unit, twin = p->kind->id != PK_TOK_EMBEDDINGS &&
                                               qwen3_bf16_field(&f->m, p->kind->id, p->layer);
        f->reads_f32[i] = !twin;
        if (twin) f->mp16_unit[u] = 1;
        ParamRole role = p->kind->role;
        if ((role == ROLE_EMBEDDING || role == ROLE_EXPERTS) && f->plan.params[i].numel > 0)
            big_f32[u] = 1; /* the embedding's lookup and the experts read fp32 */
    }
    size_t most = 1;
    for (int u = 0; u < nu; u++) {
        if (big_f32[u]) f->mp16_unit[u] = 0;
        for (int k = 0; k < P && f->mp16_unit[u]; k++) {
            size_t c = small_runs(f, u, k, NULL, NULL, NULL);
            if (c > f->small_numel[u]) f->small_numel[u] = c;
        }
        if (f->small_numel[u] > most) most = f->small_numel[u];
    }
    free(big_f32);
    for (int s = 0; s < NSLOTS; s++) {
        Slot *sl = &f->slot[s];
        sl->small_send = xcalloc(most, sizeof(float));
        sl->small_recv = xcalloc(most * (size_t)P, sizeof(float));
        sl->bcap = sl->cap;
        sl->bp = sl->wide ? xcalloc(sl->cap, sizeof(uint16_t)) : sl->pb;
    }
    f->copy16 = xcalloc(f->plan.shard_numel + 16, sizeof(uint16_t));
    f->mp16 = 1;
    int k = 0;
    for (int u = 0; u < nu; u++)
        k += f->mp16_unit[u];
    log_info("FSDP under bf16: %d of the %d units are gathered in bf16 from each rank's bf16 copy "
             "of its shard (kept by AdamW), their norms and router in fp32; the others in fp32",
             k, nu);
}

int train_qwen3_enable_bf16(TrainQwen3 *f, Err *err) {
    if (f->m.bf16) return 0; /* a sharded bf16 base has it already */
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
    /* QTITAN_FSDP_GATHER_BF16=0 keeps the fp32 gathers, to measure what bf16 ones buy. */
    const char *env = getenv("QTITAN_FSDP_GATHER_BF16");
    if (!f->frozen && qwen3_products_bf16(&f->m) && !(env && strcmp(env, "0") == 0)) setup_mp16(f);
    return 0;
}

/* ---- initial values ---- */

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

/* 1 when parameter i's initial values are made or loaded a QWEN3_CHUNK piece at a time
 * straight into what this rank holds of it (fill_held): when sharded every parameter, so no
 * rank stages a tensor whole, and on a world of one a weight held in bf16 only (never whole in
 * fp32). Else (a world of one, fp32) they are made or loaded whole, in place. */
static int in_pieces(const TrainQwen3 *f, int i) {
    return f->sharded || f->held[i].pb;
}

/* Where element e of this rank's part of parameter i (its local, flattened shape) lies in the
 * whole tensor: *at, and how many elements from e on follow it there contiguously: to the end
 * of a row of a column-split weight (tp rank t's columns of each row), else to the end of the
 * part (a tp rank's block of rows, an ep rank's run of experts, or all of it). */
static size_t held_run(const TrainQwen3 *f, int i, size_t e, size_t *at) {
    const Qwen3Param *p = &f->m.table[i]; /* the local shape */
    size_t numel = (size_t)p->numel;
    if (f->is_expert[i]) { /* expert parallel: the rank's run of experts */
        *at = (size_t)f->q * numel + e;
        return numel - e;
    }
    if (f->tp_split[i] == TP_ROWS) {
        *at = (size_t)f->t * numel + e;
        return numel - e;
    }
    if (f->tp_split[i] == TP_COLS) {
        size_t cols = p->ndim == 2 ? (size_t)p->shape[1] : 1, r = e / cols, c = e % cols;
        *at = r * cols * (size_t)f->tp + (size_t)f->t * cols + c;
        return cols - c;
    }
    *at = e;
    return numel - e;
}

/* Fills what this rank holds of parameter i a run of held_run at a time, at most QWEN3_CHUNK
 * elements through tmp (QWEN3_CHUNK floats): drawn from seed (keys NULL), or read from the
 * mapped files (HF index k; k < 0: zeros, training state not in HF files) and converted to
 * fp32; fp32 straight into the shard, a bf16 weight rounded from tmp. The values are those of
 * the whole tensor made or loaded at once, element for element. */
static int fill_held(TrainQwen3 *f, int i, const HfKeyTable *keys, int k, const StSet *set,
                     uint64_t seed, float *tmp, Err *err) {
    const Held *h = &f->held[i];
    for (size_t e = h->lo, at, n; e < h->hi; e += n) {
        n = held_run(f, i, e, &at);
        /* The generator draws from an even element (rng_fill_normal_counter_at). */
        size_t odd = !keys && (at & 1);
        if (n > h->hi - e) n = h->hi - e;
        if (n > (size_t)QWEN3_CHUNK - odd) n = QWEN3_CHUNK - odd;
        float *dst = h->pb || odd ? tmp : h->p + (e - h->lo);
        if (!keys)
            qwen3_init_param_range(whole(f), i, seed, dst, (long)(at - odd), (long)(n + odd));
        else if (k < 0)
            memset(dst, 0, n * sizeof *dst);
        else
            TRY(hf_keys_load_param_range(dst, keys, k, set, (int64_t)at, (int64_t)n, err));
        if (h->pb)
            simd_f32_to_bf16(h->pb + (e - h->lo), dst + odd, (long)n);
        else if (odd)
            memcpy(h->p + (e - h->lo), dst + odd, n * sizeof *dst);
    }
    return 0;
}

void train_qwen3_init(TrainQwen3 *f, uint64_t seed) {
    float *tmp = xmalloc(QWEN3_CHUNK * sizeof *tmp);
    for (int i = 0; i < f->m.nparams; i++)
        if (in_pieces(f, i))
            fill_held(f, i, NULL, -1, NULL, seed, tmp, NULL);
        else
            qwen3_init_param(whole(f), i, seed, f->held[i].p);
    free(tmp);
    for (int s = 0; s < NSLOTS; s++)
        f->slot[s].holds = -1;
}

int train_qwen3_load_hf(TrainQwen3 *f, const char *path, Err *err) {
    StSet set;
    TRY(qwen3_hf_open(&set, path, err));
    float *tmp = xmalloc(QWEN3_CHUNK * sizeof *tmp);
    HfKeyTable keys;
    hf_keys_build(&keys, &whole(f)->spec);
    int rc = qwen3_hf_check(&whole(f)->spec, &set, path, err);
    if (f->sharded) { /* the progress counts up to the bytes of this rank's part */
        double bytes = 0;
        for (int i = 0; i < f->m.nparams; i++) {
            int k = hf_keys_find_param(&keys, whole(f)->table[i].name);
            if (k >= 0)
                bytes += (double)(f->held[i].hi - f->held[i].lo) *
                         (double)hf_keys_file_elem_size(&keys, k, &set);
        }
        st_set_progress_total(&set, bytes);
    }
    for (int i = 0; i < f->m.nparams && rc == 0; i++) {
        const Qwen3Param *p = &whole(f)->table[i];
        const Held *h = &f->held[i];
        int k = p->kind->hf ? hf_keys_find_param(&keys, p->name) : -1;
        if (p->kind->hf && k < 0)
            rc = err_set(err, "model parameter %s is not in the Hugging Face name table", p->name);
        else if (!p->kind->hf && !f->sharded) /* training state (expert_bias) */
            memset(h->p, 0, (size_t)p->numel * sizeof *h->p);
        else if (f->sharded ? fill_held(f, i, &keys, k, &set, 0, tmp, err)
                 : h->pb    ? hf_keys_load_param_bf16(h->pb, &keys, k, &set, err)
                            : hf_keys_load_param(h->p, &keys, k, &set, err))
            rc = err_wrap(err, "%s", path);
    }
    hf_keys_free(&keys);
    free(tmp);
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
 * depends only on the counts, so they come out as on one process and are written back.
 * A frozen base (LoRA) keeps its biases as loaded: HF files have none, so the merged export
 * routes as training did, and LoRA checkpoints hold the adapters alone. */
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
    int rc = moe_train_step(&f->m, f->mesh->dp, update && !f->frozen, extra, nextra,
                            TRAIN_MAX_EXTRA, err);
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

/* On a world of one the model's bf16 copies are kept by the optimizer over the run's steps
 * (qwen3_keep_bf16), a frozen base's made once; sharded, the bf16 copy of the shard (mp16) is
 * cast whole here and then kept by the optimizer, and the units it does not cover are cast
 * once per gather (ensure). */
static void keep_copies(void *ctx, int on) {
    TrainQwen3 *f = ctx;
    if (f->keeps) qwen3_keep_bf16(&f->m, on);
    if (!f->mp16) return;
    for (int s = 0; s < NSLOTS; s++) { /* gathered the other way: gather again */
        wait_gather(f, &f->slot[s]);
        f->slot[s].holds = -1;
    }
    if (on) simd_f32_to_bf16(f->copy16, f->shard, (long)f->plan.shard_numel);
    f->mp16_kept = on;
}

void train_qwen3_model(TrainQwen3 *f, TrainModel *out, int exempt) {
    for (int k = 0; k < f->npieces; k++) {
        f->piece_decay[k] = param_decays(f->m.table[f->piece_param[k]].kind, exempt, exempt);
        int i = f->piece_param[k];
        if (!f->sharded)
            f->piece_copies[k] = qwen3_bf16_copy(&f->m, i);
        else if (f->mp16 && !f->reads_f32[i] && f->mp16_unit[f->plan.params[i].unit])
            f->piece_copies[k] = f->copy16 + (f->held[i].p - f->shard);
    }
    f->keeps = !f->sharded && f->m.bf16;
    *out = (TrainModel){.ctx = f,
                        .nparams = f->npieces,
                        .params = f->pieces,
                        .grads = f->piece_grads,
                        .decay = f->piece_decay,
                        .slices = f->sharded ? f->slices : NULL,
                        .copies = f->piece_copies,
                        .keep_copies = keep_copies,
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
    if (f->mesh->dims.dp_replicate > 1 && f->grad)
        rc = fsdp_all_reduce_replicas(&f->plan, f->mesh->dp_replicate, f->grad, err);
    /* LoRA: the adapters' gradient slices, reduce-scattered with their units, as the base's. */
    if (rc == 0 && f->mesh->dims.dp_replicate > 1 && f->lgrad)
        rc = fsdp_all_reduce_replicas(&f->lplan, f->mesh->dp_replicate, f->lgrad, err);
    /* The replicas' ranks of the same (s, t) hold the same expert slices. */
    if (rc == 0 && f->ep > 1 && f->mesh->dims.dp_replicate > 1 && f->xgrad)
        rc = fsdp_all_reduce_replicas(&f->xplan, f->mesh->dp_replicate, f->xgrad, err);
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
    /* With tensor parallelism the replicated parameters' squares count once, not per rank
     * (LoRA: the adapters' factors whole over the group); with expert parallelism the experts'
     * slices are of their own plan and sum over the ranks of the replica holding the same
     * experts, then over the EP group (each of its ranks holds other ones). A frozen base's
     * experts have no gradient. */
    int experts_ep = f->ep > 1 && !f->frozen;
    if (f->frozen && f->tp > 1)
        fsdp_shard_sq_sums(&f->lplan, f->lgrad, f->lrepl, &sharded, &replicated);
    else if (!f->frozen && (f->tp > 1 || f->ep > 1))
        fsdp_shard_sq_sums(&f->plan, f->grad, f->tp_repl, &sharded, &replicated);
    double experts = 0, ignored;
    if (experts_ep) fsdp_shard_sq_sums(&f->xplan, f->xgrad, NULL, &experts, &ignored);
    double t0 = now_seconds();
    int rc = mesh_global_norm(norm, f->mesh, sharded, replicated, err);
    if (rc == 0 && experts_ep)
        rc = comm_all_reduce_sum(f->mesh->ep_shard, &experts, 1, COMM_F64, err);
    if (rc == 0 && experts_ep) {
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
    *out =
        (TrainParallel){.ctx = f,
                        .world = f->mesh->world,
                        .mesh = {f->mesh->dims.dp_replicate, f->mesh->dims.dp_shard, f->tp, f->ep},
                        .finish_grads = finish_grads,
                        .grad_norm = grad_norm,
                        .comm_seconds = comm_seconds};
}

/* LoRA on a mesh: the adapters' plan (lplan) over this rank's tensor-parallel blocks of them,
 * their gathered workspaces in their layers' slots (the adapters' pointers set into them once,
 * as the base's are), and this rank's share of every block cut from lo's whole factors, which
 * are then freed: a rank keeps 1/dp_shard of its blocks, with their gradient slices. */
static int shard_lora(TrainQwen3 *f, Lora *lo, Err *err) {
    int n = 2 * lo->n, nunits = f->L + 2;
    size_t *numel = xcalloc((size_t)n, sizeof *numel), total = 0;
    int *unit = xcalloc((size_t)n, sizeof *unit);
    for (int k = 0; k < n; k++) {
        const LoraAdapter *ad = &lo->ad[k / 2];
        numel[k] = (size_t)lo->rank * (size_t)(k % 2 ? ad->out_l : ad->in_l);
        unit[k] = 1 + ad->layer;
        total += numel[k];
    }
    int rc = fsdp_plan(&f->lplan, numel, unit, n, nunits, f->mesh->dims.dp_shard,
                       f->mesh->dp_shard->rank, err);
    free(unit);
    if (rc != 0) {
        free(numel);
        return -1;
    }
    size_t cap = 16;
    for (int u = 1; u <= f->L; u++)
        if (f->lplan.units[u].full_numel > cap) cap = f->lplan.units[u].full_numel;
    for (int s = 0; s < NSLOTS; s++) {
        Slot *sl = &f->slot[s];
        wait_gather(f, sl);
        sl->holds = -1;          /* gathered again, adapters and all */
        if (s == EDGE) continue; /* the layers' slots only */
        sl->lp = xcalloc(cap, sizeof(float));
        sl->lg = xcalloc(cap, sizeof(float));
        sl->lscratch = xcalloc(f->lplan.max_unit_shard + 16, sizeof(float));
    }
    f->lshard = xcalloc(f->lplan.shard_numel + 16, sizeof(float));
    f->lgrad = xcalloc(f->lplan.shard_numel + 16, sizeof(float));
    f->lrepl = xcalloc((size_t)n, 1);
    float *blocks = xmalloc((total + 1) * sizeof *blocks),
          **full = xcalloc((size_t)n, sizeof *full);
    for (size_t k = 0, at = 0; k < (size_t)n; at += numel[k++])
        full[k] = blocks + at;
    for (int i = 0; i < lo->n; i++) {
        LoraAdapter *ad = &lo->ad[i];
        lora_block(lo, ad, ad->a, ad->b, full[2 * i], full[2 * i + 1]);
        f->lrepl[2 * i] = f->tp > 1 && lora_tp_whole(ad, 'A');
        f->lrepl[2 * i + 1] = f->tp > 1 && lora_tp_whole(ad, 'B');
        const Slot *sl = &f->slot[slot_of(f, 1 + ad->layer)];
        size_t oa = f->lplan.params[2 * i].full_offset, ob = f->lplan.params[2 * i + 1].full_offset;
        ad->a = sl->lp + oa, ad->da = sl->lg + oa;
        ad->b = sl->lp + ob, ad->db = sl->lg + ob;
    }
    fsdp_shard_from_full(&f->lplan, f->lshard, (const float *const *)full);
    free(blocks), free(full), free(numel);
    free(lo->param), free(lo->grad);
    lo->param = lo->grad = NULL;
    return 0;
}

int train_qwen3_model_lora(TrainQwen3 *q, Lora *lo, TrainModel *out, Err *err) {
    q->m.lora = lo;
    q->keeps = !q->sharded;
    lora_set_tp(lo, q->tp, q->t);
    if (q->sharded) TRY(shard_lora(q, lo, err));
    int n = 2 * lo->n;
    q->lparams = xcalloc((size_t)n, sizeof *q->lparams);
    q->lgrads = xcalloc((size_t)n, sizeof *q->lgrads);
    q->lnames = xcalloc((size_t)n, sizeof *q->lnames);
    q->lslices = xcalloc((size_t)n, sizeof *q->lslices);
    long held = 0;
    for (int k = 0; k < n; k++) {
        const LoraAdapter *ad = &lo->ad[k / 2];
        int b = k % 2;
        char mod[64];
        lora_module_name(mod, sizeof mod, ad->layer, ad->site);
        snprintf(q->lnames[k], sizeof q->lnames[0], "%s.lora_%c", mod, b ? 'B' : 'A');
        CkptTensor *t = &q->lparams[q->nl];
        int64_t rows = b ? ad->out : lo->rank, cols = b ? lo->rank : ad->in;
        if (!q->sharded) { /* the adapters are host memory of their own (model/lora.c) */
            *t = (CkptTensor){q->lnames[k], 2, {rows, cols}, b ? ad->b : ad->a, NULL};
            q->lgrads[q->nl++] = b ? ad->db : ad->da;
            continue;
        }
        size_t l0, l1, at;
        fsdp_param_shard(&q->lplan, k, &l0, &l1, &at);
        if (l1 <= l0) continue;
        *t = (CkptTensor){q->lnames[k], 1, {(int64_t)(l1 - l0)}, q->lshard + at, NULL};
        q->lgrads[q->nl] = q->lgrad + at;
        /* A checkpoint records the piece as its part of the whole tensor, so a resume on
         * another mesh (or one process) reads it from whichever ranks' files hold it. */
        int64_t local[2] = {b ? ad->out_l : lo->rank, b ? lo->rank : ad->in_l};
        int dim = q->lrepl[k] || q->tp == 1 ? -1 : b ? 0 : 1;
        slice_of(&q->lslices[q->nl++], 2, local, dim, q->tp, q->t, l0, l1);
        held += (long)(l1 - l0);
    }
    if (q->sharded)
        log_info("lora: rank 0 holds %ld of the %ld adapter parameters (1/%d of its "
                 "tensor-parallel blocks), with their gradients and AdamW state",
                 held, lora_numel(lo), q->mesh->dims.dp_shard);
    *out = (TrainModel){.ctx = q,
                        .nparams = q->nl,
                        .params = q->lparams,
                        .grads = q->lgrads,
                        .slices = q->sharded ? q->lslices : NULL,
                        .keep_copies = keep_copies,
                        .forward_backward = forward_backward,
                        .before_optimizer_step = q->m.n_moe_layers ? before_optimizer_step : NULL};
    return 0;
}

/* A weight of a bf16 base (lora.base_dtype), held in bf16 only, as the merged export writes
 * it: widened exactly to fp32 and, when an adapter sits on it, s B A added in fp32 (peft's
 * merge computes the delta in fp32 too), a chunk of rows at a time, so the base is never
 * held in fp32. */
typedef struct MergedBf16 {
    const uint16_t *w; /* (O, I) */
    size_t cols;       /* I */
    const Lora *lo;
    const LoraAdapter *ad; /* NULL: no adapter on this weight */
} MergedBf16;

static int pull_merged_bf16(void *ctx, float *dst, size_t first, size_t n, Err *err) {
    (void)err;
    const MergedBf16 *s = ctx;
    if (!s->ad) {
        simd_bf16_to_f32(dst, s->w + first, (long)n);
        return 0;
    }
    size_t r0 = first / s->cols, r1 = (first + n + s->cols - 1) / s->cols;
    float *rows = xmalloc((r1 - r0) * s->cols * sizeof *rows);
    simd_bf16_to_f32(rows, s->w + r0 * s->cols, (long)((r1 - r0) * s->cols));
    lora_merge(s->lo, s->ad, s->ad->a, s->ad->b, rows, (int)r0, (int)(r1 - r0));
    memcpy(dst, rows + (first - r0 * s->cols), n * sizeof *dst);
    free(rows);
    return 0;
}

/* m's parameters as an HF directory; a table entry held in bf16 only is pulled from bf16[i]
 * (bf16 NULL: m holds every parameter in fp32). */
static int export_model(const Qwen3 *m, const char *dir, const HfExportOptions *o, MergedBf16 *bf16,
                        Err *err) {
    HfExportTensor *t = xcalloc((size_t)m->nparams, sizeof *t);
    for (int i = 0; i < m->nparams; i++) {
        const Qwen3Param *p = &m->table[i];
        t[i] = (HfExportTensor){
            .name = p->name, .numel = p->numel, .data = p->data, .device = m->param_arena.device};
        if (!p->data && bf16) t[i].source = (HfKeySource){pull_merged_bf16, &bf16[i]};
    }
    int rc = hf_export(dir, &m->spec, t, m->nparams, o, err);
    free(t);
    return rc;
}

/* The merged export of a sharded run, one unit at a time (below). */
static int export_merged_sharded(TrainQwen3 *q, const char *dir, const HfExportOptions *o,
                                 Err *err);

int train_qwen3_export_merged(TrainQwen3 *q, const char *dir, const HfExportOptions *o, Err *err) {
    if (q->sharded) return export_merged_sharded(q, dir, o, err);
    Lora *lo = q->m.lora;
    MergedBf16 *bf16 = xcalloc((size_t)q->m.nparams, sizeof *bf16);
    for (int i = 0; i < q->m.nparams; i++) {
        const Qwen3Param *p = &q->m.table[i];
        bf16[i] = (MergedBf16){p->data_bf16, (size_t)p->shape[p->ndim - 1], lo, NULL};
    }
    for (int i = 0; lo && i < lo->n; i++) {
        const LoraAdapter *ad = &lo->ad[i];
        ParamKindId kind = lora_site_kind(ad->site);
        float *w = *qwen3_param_field(&q->m.p, kind, ad->layer);
        if (w) { /* fp32: merged in place */
            lora_merge(lo, ad, ad->a, ad->b, w, 0, ad->out);
            continue;
        }
        for (int k = 0; k < q->m.nparams; k++)
            if (q->m.table[k].kind->id == kind && q->m.table[k].layer == ad->layer) bf16[k].ad = ad;
    }
    q->m.lora = NULL;
    int rc = export_model(&q->m, dir, o, bf16, err);
    free(bf16);
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

/* The whole (rows, cols * tp) tensor from its tensor-parallel blocks of columns (rows x cols
 * each, t-ordered in parts). */
static void join_cols(float *whole_t, const float *parts, long rows, long cols, int tp) {
    for (int t = 0; t < tp; t++)
        for (long r = 0; r < rows; r++)
            memcpy(whole_t + r * cols * tp + (long)t * cols, parts + (t * rows + r) * cols,
                   (size_t)cols * sizeof *whole_t);
}

/* Parameter i's tensor-parallel parts (numel each, t-ordered in parts) as the whole tensor. */
static void join_tp(const TrainQwen3 *f, int i, float *whole_t, const float *parts) {
    const Qwen3Param *p = &f->m.table[i]; /* the local shape */
    long numel = (long)p->numel;
    if (f->tp_split[i] == TP_ROWS) {
        memcpy(whole_t, parts, (size_t)(numel * f->tp) * sizeof *whole_t);
        return;
    }
    join_cols(whole_t, parts, (long)p->shape[0], p->ndim == 2 ? (long)p->shape[1] : 1, f->tp);
}

/* LoRA on a mesh: adapter ad's whole A (r, I) at whole and B (O, r) at whole + r I (whole
 * NULL: this rank only takes part), from its unit's gathered blocks: the split factor's blocks
 * gathered over the tensor-parallel group and joined. parts: r x max(I, O) floats when tp > 1.
 * Collective over the tp group; the unit must be gathered (ensure). */
static int adapter_whole(TrainQwen3 *f, const LoraAdapter *ad, float *whole, float *parts,
                         Err *err) {
    int r = f->m.lora->rank;
    size_t na = (size_t)r * (size_t)ad->in_l, nb = (size_t)ad->out_l * (size_t)r;
    float *a = whole, *b = whole ? whole + (long)r * ad->in : NULL;
    if (f->tp == 1 || lora_tp_whole(ad, 'A')) {
        if (a) memcpy(a, ad->a, na * sizeof *a);
    } else {
        TRY(comm_all_gather(f->mesh->tp, parts, ad->a, na, COMM_F32, err));
        if (a) join_cols(a, parts, r, ad->in_l, f->tp);
    }
    if (f->tp == 1 || lora_tp_whole(ad, 'B')) {
        if (b) memcpy(b, ad->b, nb * sizeof *b);
        return 0;
    }
    return comm_all_gather(f->mesh->tp, b ? b : parts, ad->b, nb, COMM_F32, err); /* row blocks */
}

/* The base parameter (table index) adapter ad sits on. */
static int adapted_param(const TrainQwen3 *f, const LoraAdapter *ad) {
    ParamKindId kind = lora_site_kind(ad->site);
    for (int i = 0; i < f->m.nparams; i++)
        if (f->m.table[i].kind->id == kind && f->m.table[i].layer == ad->layer) return i;
    return -1;
}

int train_qwen3_lora_params(TrainQwen3 *f, float *out, Err *err) {
    const Lora *lo = f->m.lora;
    if (!f->sharded) {
        if (out) memcpy(out, lo->param, (size_t)lora_numel(lo) * sizeof *out);
        return 0;
    }
    int rc = 0;
    float *parts = NULL;
    if (f->tp > 1) {
        size_t most = 1;
        for (int i = 0; i < lo->n; i++) {
            size_t side = (size_t)(lo->ad[i].in > lo->ad[i].out ? lo->ad[i].in : lo->ad[i].out);
            if (side * (size_t)lo->rank > most) most = side * (size_t)lo->rank;
        }
        parts = xmalloc(most * sizeof *parts);
    }
    for (int u = 1; u <= f->L && rc == 0; u++) {
        if (!has_adapters(f, u)) continue;
        /* the unit's adapters alone, into its slot, which then holds no unit */
        Slot *s = &f->slot[slot_of(f, u)];
        wait_gather(f, s);
        s->holds = -1;
        rc = fsdp_gather_unit(&f->lplan, f->mesh->dp_shard, s->lp, f->lshard, u, COMM_F32, err);
        for (int i = 0; i < lo->n && rc == 0; i++)
            if (lo->ad[i].layer == u - 1)
                rc = adapter_whole(f, &lo->ad[i], out ? out + lo->ad[i].at : NULL, parts, err);
    }
    free(parts);
    return rc;
}

/* Unit u of the sharded model: gathered as for a forward and, under tensor parallelism, each
 * split parameter's parts joined; under expert parallelism the layer's experts gathered from
 * the EP group (which holds them all, in order along dimension 0, each rank a run of them
 * whole outside the FSDP units). Parameter i's whole values go to dest[i] (dest NULL, or a
 * NULL entry: this rank only takes part; a replicated parameter is then left in its slot).
 * parts: staging of the largest split parameter's whole floats when tp > 1 or ep > 1. */
static int gather_unit_to(TrainQwen3 *f, int u, float *const *dest, float *parts, Err *err) {
    int rc = 0;
    if (f->plan.units[u].full_numel == 0 && (!f->base16 || f->bplan.units[u].full_numel == 0))
        return rc; /* the head when tied */
    ensure(f, u);  /* the unit's (tensor-parallel part of the) parameters, as in a forward */
    const Slot *s = &f->slot[slot_of(f, u)];
    for (int i = 0; i < f->m.nparams && rc == 0; i++) {
        const Qwen3Param *p = &f->m.table[i];
        if (param_unit(f, p) != u) continue;
        const float *local = *qwen3_param_field(&f->m.p, p->kind->id, p->layer);
        float *to = dest ? dest[i] : NULL;
        float *widened = NULL;
        /* a bf16 base's gathered weight, or one gathered in bf16 only: widened exactly */
        if (f->in_bf16[i] || (s->b16 && !f->reads_f32[i])) {
            const FsdpPlan *b = f->base16 ? &f->bplan : &f->plan;
            widened = xmalloc((size_t)p->numel * sizeof *widened);
            simd_bf16_to_f32(widened, s->bp + b->params[i].full_offset, p->numel);
            local = widened;
        }
        if (f->is_expert[i])
            /* the EP group (ordered by its index q) holds every run of experts, in order along
             * dimension 0 */
            rc = comm_all_gather(f->mesh->ep, to ? to : parts, local, (size_t)p->numel, COMM_F32,
                                 err);
        else if (f->tp_split[i] == TP_REPLICATED && to)
            memcpy(to, local, (size_t)p->numel * sizeof *to);
        else if (f->tp_split[i] != TP_REPLICATED) {
            rc = comm_all_gather(f->mesh->tp, parts, local, (size_t)p->numel, COMM_F32, err);
            if (rc == 0 && to) join_tp(f, i, to, parts);
        }
        free(widened);
    }
    /* LoRA: each adapter of the unit whole, merged into its weight's whole values (as the
     * one-process merge: W + s B A over all rows). */
    const Lora *lo = f->m.lora;
    for (int k = 0; has_adapters(f, u) && k < lo->n && rc == 0; k++) {
        const LoraAdapter *ad = &lo->ad[k];
        if (1 + ad->layer != u) continue;
        float *to = dest ? dest[adapted_param(f, ad)] : NULL;
        float *w = to ? xmalloc((size_t)lo->rank * (size_t)(ad->in + ad->out) * sizeof *w) : NULL;
        rc = adapter_whole(f, ad, w, parts, err);
        if (rc == 0 && to) lora_merge(lo, ad, w, w + (long)lo->rank * ad->in, to, 0, ad->out);
        free(w);
    }
    return rc;
}

/* gather_unit_to with every parameter's whole values into its place in dst (NULL: this rank
 * only takes part). */
static int gather_unit_into(TrainQwen3 *f, int u, Qwen3 *dst, float *parts, Err *err) {
    float **dest = dst ? xcalloc((size_t)f->m.nparams, sizeof *dest) : NULL;
    for (int i = 0; dst && i < f->m.nparams; i++)
        dest[i] = *qwen3_param_field(&dst->p, f->m.table[i].kind->id, f->m.table[i].layer);
    int rc = gather_unit_to(f, u, dest, parts, err);
    free(dest);
    return rc;
}

int train_qwen3_gather_whole(TrainQwen3 *f, Qwen3 *dst, Err *err) {
    int rc = 0;
    if (!f->sharded) {
        for (int i = 0; i < f->m.nparams; i++) {
            const Qwen3Param *p = &f->m.table[i];
            if (p->data)
                memcpy(dst->table[i].data, p->data, (size_t)p->numel * sizeof(float));
            else /* a bf16 base's weight, held in bf16 only: widened exactly */
                simd_bf16_to_f32(dst->table[i].data, p->data_bf16, p->numel);
        }
    }
    float *parts = f->tp > 1 || f->ep > 1 ? xmalloc(max_numel(f) * sizeof *parts) : NULL;
    for (int u = 0; f->sharded && u < f->L + 2 && rc == 0; u++)
        rc = gather_unit_into(f, u, dst, parts, err);
    free(parts);
    /* LoRA on one process: the adapters merged as the merged export merges them (sharded, each
     * unit's were as it was gathered). */
    const Lora *lo = f->m.lora;
    for (int i = 0; !f->sharded && dst && lo && i < lo->n; i++) {
        const LoraAdapter *ad = &lo->ad[i];
        lora_merge(lo, ad, ad->a, ad->b,
                   *qwen3_param_field(&dst->p, lora_site_kind(ad->site), ad->layer), 0, ad->out);
    }
    if (rc == 0 && dst && dst->bf16) qwen3_refresh_bf16(dst);
    return rc;
}

/* ---- the whole model one unit at a time (samples through the shards) ---- */

/* Which of the two buffers unit u lives in: 0 the edge units, 1 the layers. */
static int uw_buf(const TrainQwen3 *f, int u) {
    return u == 0 || u == f->L + 1 ? 0 : 1;
}

int train_qwen3_unitwise_create(TrainQwen3 *f, Qwen3 *out, Err *err) {
    const ModelSpec *spec = &whole(f)->spec;
    Qwen3Modules *mod = train_qwen3_modules(spec, f->kernels, 0);
    int rc = qwen3_create_unowned_with(out, spec, 1, 1, AC_NONE, 1, mod, err);
    free(mod);
    TRY(rc);
    if (f->m.bf16 && qwen3_enable_bf16_by_hook(out, err) != 0) {
        qwen3_free(out);
        return -1;
    }
    /* Each unit's parameters in table order from the start of its buffer. */
    int nu = f->L + 2;
    f->uw_numel = xcalloc((size_t)nu, sizeof *f->uw_numel);
    size_t *at = xcalloc((size_t)out->nparams, sizeof *at), cap[2] = {1, 1};
    for (int i = 0; i < out->nparams; i++) {
        int u = param_unit(f, &out->table[i]);
        at[i] = f->uw_numel[u];
        f->uw_numel[u] += (size_t)out->table[i].numel;
        if (f->uw_numel[u] > cap[uw_buf(f, u)]) cap[uw_buf(f, u)] = f->uw_numel[u];
    }
    for (int b = 0; b < 2; b++) {
        f->uw[b] = xcalloc(cap[b], sizeof(float));
        if (f->m.bf16) f->uwb[b] = xcalloc(cap[b], sizeof(uint16_t));
    }
    for (int i = 0; i < out->nparams; i++) {
        const Qwen3Param *p = &out->table[i];
        *qwen3_param_field(&out->p, p->kind->id, p->layer) =
            f->uw[uw_buf(f, param_unit(f, p))] + at[i];
    }
    free(at);
    if (f->tied) out->p.output = out->p.tok_embeddings;
    if (f->m.bf16) {
        /* Each weight's bf16 twin sits at its offset in the twin buffer. */
#define TWIN(b, w) ((w) ? f->uwb[b] + ((w)-f->uw[b]) : NULL)
        for (int l = 0; l < f->L; l++) {
            const Qwen3LayerParams *p = &out->p.layers[l];
            Qwen3Bf16Layer *t = &out->pb.layers[l];
            t->wq = TWIN(1, p->wq), t->wk = TWIN(1, p->wk), t->wv = TWIN(1, p->wv);
            t->wo = TWIN(1, p->wo), t->w1 = TWIN(1, p->w1), t->w3 = TWIN(1, p->w3);
            t->w2 = TWIN(1, p->w2);
        }
        out->pb.output = TWIN(0, out->p.output);
#undef TWIN
    }
    return 0;
}

void train_qwen3_gather_unit(TrainQwen3 *f, Qwen3 *dst, int unit) {
    if (!f->uw_parts && (f->tp > 1 || f->ep > 1))
        f->uw_parts = xmalloc(max_numel(f) * sizeof *f->uw_parts);
    Err err;
    if (gather_unit_into(f, unit, dst, f->uw_parts, &err)) fail("gather for samples", &err);
    if (dst && dst->bf16 && f->uw_numel[unit])
        simd_f32_to_bf16(f->uwb[uw_buf(f, unit)], f->uw[uw_buf(f, unit)], (long)f->uw_numel[unit]);
}

/* ---- the merged export through the shards (LoRA on a mesh, checkpoint.last_save_in_hf) ---- */

/* The adapter lo puts on the weight of kind `kind` in layer `layer`, or NULL. */
static const LoraAdapter *adapter_on(const Lora *lo, ParamKindId kind, int layer) {
    for (int i = 0; lo && i < lo->n; i++)
        if (lo->ad[i].layer == layer && lora_site_kind(lo->ad[i].site) == kind) return &lo->ad[i];
    return NULL;
}

/* 1 for a parameter whose unit's gather leaves parts of it on other ranks: split over the
 * tensor-parallel group (tp_split) or, as experts, over the EP group (is_expert). */
static int split_over_ranks(const ParamKind *k, int tp, int ep) {
    return (tp > 1 && k->tp != TP_REPLICATED) || (ep > 1 && k->role == ROLE_EXPERTS);
}

/* 1 for a parameter the export stages whole on rank 0 while its unit is written: its parts
 * joined, its adapter merged, or (base16: a bf16 base's matmul weights and embedding, gathered
 * in bf16) widened. Rank 0 reads the others where the unit's gather left them. */
static int export_stages(const ParamKind *k, int layer, int tp, int ep, const Lora *lo,
                         int base16) {
    return split_over_ranks(k, tp, ep) || adapter_on(lo, k->id, layer) ||
           (base16 && (k->role == ROLE_LINEAR || k->role == ROLE_EMBEDDING));
}

void train_qwen3_export_sizes(const ModelSpec *spec, int tp, int ep, const Lora *lo, int base16,
                              size_t *stage, size_t *parts) {
    int np = param_list(spec, NULL), nu = spec->n_layers + 2;
    ParamInfo *pi = xcalloc((size_t)np, sizeof *pi);
    param_list(spec, pi);
    size_t *in_unit = xcalloc((size_t)nu, sizeof *in_unit);
    *stage = *parts = 0;
    for (int i = 0; i < np; i++) {
        const ParamKind *k = pi[i].kind;
        size_t n = (size_t)pi[i].numel;
        if (!export_stages(k, pi[i].layer, tp, ep, lo, base16)) continue;
        size_t *u = &in_unit[unit_of(k->id, pi[i].layer, spec->n_layers, spec->tie_embeddings)];
        *u += n;
        if (*u > *stage) *stage = *u;
        if (split_over_ranks(k, tp, ep) && n > *parts) *parts = n;
    }
    free(in_unit);
    free(pi);
}

/* The export's state. All ranks walk the units rank 0's writer asks for, in its order: rank 0
 * broadcasts each unit's number (-1: done), then every rank gathers it, rank 0 merges its
 * adapters, and all agree on the outcome, so an error on any rank stops every rank with its
 * sentence. */
typedef struct MergeStream {
    TrainQwen3 *f;
    int unit;     /* rank 0: the unit whose values are ready, -1 none */
    int failed;   /* rank 0: the ranks stopped walking on an error */
    float *parts; /* the tensor- and expert-parallel gathers' staging, NULL when tp = ep = 1 */
    float *stage; /* rank 0: the staged parameters of one unit */
    float **to;   /* rank 0: (nparams) parameter i's whole values in stage, NULL: in its slot */
} MergeStream;

/* One source per parameter (HfKeySource's context). */
typedef struct StreamParam {
    MergeStream *s;
    int i;
} StreamParam;

static void merge_stream_open(MergeStream *s, TrainQwen3 *f) {
    const Lora *lo = f->m.lora;
    size_t stage, parts;
    train_qwen3_export_sizes(&whole(f)->spec, f->tp, f->ep, lo, f->base16, &stage, &parts);
    *s = (MergeStream){.f = f, .unit = -1};
    s->parts = parts ? xmalloc(parts * sizeof *s->parts) : NULL;
    if (f->mesh->world->rank != 0) return;
    int n = f->m.nparams;
    s->stage = xmalloc((stage + 1) * sizeof *s->stage);
    s->to = xcalloc((size_t)n, sizeof *s->to);
    size_t *at = xcalloc((size_t)f->L + 2, sizeof *at);
    for (int i = 0; i < n; i++) {
        const Qwen3Param *p = &f->m.table[i];
        if (!export_stages(p->kind, p->layer, f->tp, f->ep, lo, f->base16)) continue;
        int u = param_unit(f, p);
        s->to[i] = s->stage + at[u];
        at[u] += (size_t)whole(f)->table[i].numel;
    }
    free(at);
}

static void merge_stream_close(MergeStream *s) {
    free(s->parts);
    free(s->stage);
    free(s->to);
}

/* Every rank: unit u gathered, on rank 0 into its staging with the adapters merged
 * (gather_unit_to), then the ranks' agreement. */
static int stream_unit(MergeStream *s, int u, Err *err) {
    TrainQwen3 *f = s->f;
    int rc = gather_unit_to(f, u, s->to, s->parts, err);
    return comm_agree(f->mesh->world, rc, err);
}

/* Rank 0's source of parameter i: its unit made ready when another unit was. */
static int pull_streamed(void *ctx, float *dst, size_t first, size_t n, Err *err) {
    const StreamParam *sp = ctx;
    MergeStream *s = sp->s;
    TrainQwen3 *f = s->f;
    const Qwen3Param *p = &f->m.table[sp->i];
    int u = param_unit(f, p);
    if (s->unit != u) {
        s->unit = -1;
        if (comm_broadcast(f->mesh->world, &u, sizeof u, 0, err) != 0 ||
            stream_unit(s, u, err) != 0) {
            s->failed = 1;
            return -1;
        }
        s->unit = u;
    }
    const float *v =
        s->to[sp->i] ? s->to[sp->i] : *qwen3_param_field(&f->m.p, p->kind->id, p->layer);
    memcpy(dst, v + first, n * sizeof *dst);
    return 0;
}

/* The other ranks: the units rank 0 asks for, until it says done or a unit fails. */
static int follow_stream(MergeStream *s, Err *err) {
    for (;;) {
        int u;
        TRY(comm_broadcast(s->f->mesh->world, &u, sizeof u, 0, err));
        if (u < 0) return 0;
        TRY(stream_unit(s, u, err));
    }
}

/* Rank 0 writes the whole model's tensors, each pulled from its unit as the writer reaches it
 * (hf_export: the values' check in table order, then each file's tensors by name), so rank 0
 * holds one unit's staged parameters and the writer's chunks, never the whole model; a unit
 * the writer comes back to (a tied norm after the layers, a layer split over two files) is
 * gathered again. A bf16 base's weights, gathered in bf16, are staged widened (exactly), so
 * the merge is the one-process merge of bf16(W). */
static int export_merged_sharded(TrainQwen3 *q, const char *dir, const HfExportOptions *o,
                                 Err *err) {
    Comm *world = q->mesh->world;
    MergeStream s;
    merge_stream_open(&s, q);
    int rc;
    if (world->rank == 0) {
        int n = q->m.nparams;
        HfExportTensor *t = xcalloc((size_t)n, sizeof *t);
        StreamParam *sp = xcalloc((size_t)n, sizeof *sp);
        for (int i = 0; i < n; i++) {
            sp[i] = (StreamParam){&s, i};
            t[i] = (HfExportTensor){.name = whole(q)->table[i].name,
                                    .numel = whole(q)->table[i].numel,
                                    .source = {pull_streamed, &sp[i]}};
        }
        rc = hf_export(dir, &whole(q)->spec, t, n, o, err);
        free(sp);
        free(t);
        int done = -1;
        Err e;
        if (!s.failed && comm_broadcast(world, &done, sizeof done, 0, &e) != 0 && rc == 0) {
            *err = e;
            rc = -1;
        }
    } else {
        rc = follow_stream(&s, err);
    }
    merge_stream_close(&s);
    return comm_agree(world, rc, err);
}
