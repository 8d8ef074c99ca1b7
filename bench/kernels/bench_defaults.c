/* Every registered CPU implementation of each op kind (reference, the CPU default, the named
 * overrides) timed forward + backward at one model's shapes, in rounds that alternate the order
 * (A B C, then C B A, ...) so a shared machine's load drifts onto all sides alike; prints the
 * median and the best per implementation. This is what docs/kernels.md's table of defaults is
 * settled by.
 *   build/bench_defaults [--flavor debugmodel_moe] [--B 4] [--T 128] [--rounds 6]
 *                        [--experts X --top-k k] [--vocab V] [--head-dim E] [--only KIND]
 * Shapes: the flavor's dims at B x T tokens; rmsnorm the (N, D) norm, rope and sdpa the
 * attention's heads, swiglu the dense FFN (F = hidden_dim), linear the qkv projection,
 * cross_entropy and lm_head_loss the vocabulary, moe.experts the flavor's (or --experts /
 * --top-k) experts with moe_hidden_dim. An sdpa with bf16 entries (the mixed-precision path,
 * ops/sdpa.h) is timed twice, fp32 and "[bf16]". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/model_spec.h"
#include "core/rng.h"
#include "core/timer.h"
#include "kernels/registry.h"
#include "ops/op_all.h"

static float *randn(long n, float std, uint64_t stream) {
    float *x = xmalloc((size_t)n * sizeof *x);
    Rng r;
    rng_seed(&r, 3, stream);
    rng_fill_normal(&r, x, n, std);
    return x;
}
static float *zeros(long n) {
    return xcalloc((size_t)n, sizeof(float));
}

/* One set of inputs and outputs big enough for every kind at the shapes (fields per kind). */
typedef struct Ctx {
    ModelSpec s;
    int B, T;
    long N;
    float *x, *dx, *o, *dout, *w, *dw, *w1, *w3, *w2, *dw1, *dw3, *dw2, *h1, *h3, *g, *s1, *s3, *ws,
        *rs, *lse, *ls, *big, *big2, *q, *k, *v, *dq, *dk, *dv;
    int32_t *pos, *tg, *idx;
    float *gw, *dgw, *sv, *sc;
    int32_t *ints;
    MoeExpertsBufs eb;
    uint16_t *scratch16; /* the bf16 entries' scratch */
    int bf16;            /* run the op's bf16 entries */
    RopeFreqs rope;      /* rope_freqs(s), computed once as a model does */
} Ctx;

static void run(const OpHeader *op, Ctx *c) {
    const ModelSpec *s = &c->s;
    long N = c->N;
    int D = s->dim, H = s->n_heads, K = s->n_kv_heads, E = s->head_dim, V = s->vocab_size;
    switch (op->kind) {
    case OP_RMSNORM: {
        const RmsnormOp *p = (const RmsnormOp *)op;
        p->forward(c->o, c->rs, c->x, c->w, N, D, 1e-6f);
        p->backward(c->dx, c->dw, c->dout, c->x, c->w, c->rs, N, D);
        break;
    }
    case OP_ROPE: {
        const RopeOp *p = (const RopeOp *)op;
        p->forward(c->dq, c->q, c->pos, N, H + K, E, &c->rope);
        p->backward(c->dk, c->dq, c->pos, N, H + K, E, &c->rope);
        break;
    }
    case OP_SDPA: {
        const SdpaOp *p = (const SdpaOp *)op;
        if (c->bf16) {
            p->forward_bf16(c->o, c->lse, c->q, c->k, c->v, NULL, c->B, c->T, H, K, E,
                            c->scratch16);
            p->backward_bf16(c->dq, c->dk, c->dv, c->dout, c->q, c->k, c->v, c->o, c->lse, NULL,
                             c->B, c->T, H, K, E, c->scratch16);
            break;
        }
        p->forward(c->o, c->lse, c->q, c->k, c->v, NULL, c->B, c->T, H, K, E);
        p->backward(c->dq, c->dk, c->dv, c->dout, c->q, c->k, c->v, c->o, c->lse, NULL, c->B, c->T,
                    H, K, E);
        break;
    }
    case OP_SWIGLU: {
        const SwigluOp *p = (const SwigluOp *)op;
        int F = s->hidden_dim;
        p->forward(c->o, c->h1, c->h3, c->g, c->x, c->w1, c->w3, c->w2, c->ws, N, D, F);
        p->backward(c->dx, c->dw1, c->dw3, c->dw2, c->s1, c->s3, c->dout, c->x, c->h1, c->h3, c->g,
                    c->w1, c->w3, c->w2, c->ws, N, D, F);
        break;
    }
    case OP_LINEAR: {
        const LinearOp *p = (const LinearOp *)op;
        int O = (H + 2 * K) * E;
        p->forward(c->big, c->x, c->w1, N, D, O);
        p->backward(c->dx, c->dw1, c->big2, c->x, c->w1, N, D, O, 0.0f);
        break;
    }
    case OP_CROSS_ENTROPY: {
        const CrossEntropyOp *p = (const CrossEntropyOp *)op;
        p->forward(c->ls, c->lse, c->big, c->tg, N, V);
        p->backward(c->big2, c->big, c->lse, c->tg, N, V, 1e-3f);
        break;
    }
    case OP_LM_HEAD_LOSS: {
        const LmHeadLossOp *p = (const LmHeadLossOp *)op;
        const LinearOp *proj =
            (const LinearOp *)kernel_default_op(OP_LINEAR, "cpu", &(OpRun){.spec = s});
        p->forward(c->ls, c->lse, c->big2, c->x, c->w, NULL, NULL, c->tg, proj, N, D, V);
        p->backward(c->dx, c->dw, c->big2, c->x, c->w, NULL, NULL, c->tg, c->lse, proj, N, D, V,
                    1e-3f);
        break;
    }
    case OP_MOE_EXPERTS: {
        const MoeExpertsOp *p = (const MoeExpertsOp *)op;
        int k = s->top_k, F = s->moe_hidden_dim, X = s->num_experts;
        p->forward(c->o, &c->eb, c->x, c->idx, c->gw, c->w1, c->w3, c->w2, N, k, D, F, X);
        p->backward(c->dx, c->dgw, c->dw1, c->dw3, c->dw2, &c->eb, c->dout, c->x, c->idx, c->gw,
                    c->w1, c->w3, c->w2, N, k, D, F, X);
        break;
    }
    default:
        break;
    }
}

static void setup(Ctx *c) {
    const ModelSpec *s = &c->s;
    long N = c->N, D = s->dim, V = s->vocab_size,
         HE = (long)(s->n_heads + 2 * s->n_kv_heads) * s->head_dim;
    long F = s->hidden_dim > s->moe_hidden_dim ? s->hidden_dim : s->moe_hidden_dim;
    long X = s->num_experts > 0 ? s->num_experts : 1, kk = s->top_k > 0 ? s->top_k : 1;
    long wrows = (X * F > HE ? X * F : HE);
    rope_freqs(&c->rope, s);
    c->x = randn(N * D, 1, 1), c->dout = randn(N * HE > N * D ? N * HE : N * D, 1, 2);
    c->dx = zeros(N * D), c->o = zeros(N * HE > N * D ? N * HE : N * D);
    c->w = randn(V * D, 0.02f, 3), c->dw = zeros(V * D);
    c->w1 = randn(wrows * D, 0.05f, 4), c->w3 = randn(X * F * D, 0.05f, 5);
    c->w2 = randn(X * F * D, 0.05f, 6);
    c->dw1 = zeros(wrows * D), c->dw3 = zeros(X * F * D), c->dw2 = zeros(X * F * D);
    c->h1 = zeros(N * F), c->h3 = zeros(N * F), c->g = zeros(N * F);
    c->s1 = zeros(N * F), c->s3 = zeros(N * F), c->ws = zeros(4 * F * D + 2 * N * F);
    c->rs = zeros(N * 64), c->lse = zeros(N * 64), c->ls = zeros(N);
    long nb = N * V > N * HE ? N * V : N * HE;
    c->big = randn(nb, 1, 7), c->big2 = randn(nb, 1, 8);
    c->q = randn(N * HE, 1, 9), c->k = randn(N * HE, 1, 10), c->v = randn(N * HE, 1, 11);
    c->dq = zeros(N * HE), c->dk = zeros(N * HE), c->dv = zeros(N * HE);
    c->scratch16 = xmalloc((size_t)SDPA_BF16_SCRATCH(c->B, c->T, s->n_kv_heads, s->head_dim) *
                           sizeof(uint16_t));
    c->pos = xmalloc((size_t)N * sizeof *c->pos), c->tg = xmalloc((size_t)N * sizeof *c->tg);
    c->idx = xmalloc((size_t)(N * kk) * sizeof *c->idx);
    for (long i = 0; i < N; i++) {
        c->pos[i] = (int32_t)(i % c->T), c->tg[i] = (int32_t)((i * 7919) % V);
        for (long j = 0; j < kk; j++) /* distinct experts, spread like a trained router */
            c->idx[i * kk + j] = (int32_t)((i * 13 + j * (X / kk > 0 ? X / kk : 1)) % X);
    }
    c->gw = randn(N * kk, 0.3f, 12), c->dgw = zeros(N * kk);
    int k = (int)kk, Fm = s->moe_hidden_dim > 0 ? s->moe_hidden_dim : 1;
    c->sv = zeros(moe_experts_saved_floats(N, k, (int)D, Fm));
    c->sc = zeros(moe_experts_scratch_floats(N, k, (int)D, Fm));
    c->ints = xcalloc((size_t)moe_experts_saved_ints(N, k, (int)X), sizeof(int32_t));
    moe_experts_bufs_place(&c->eb, c->sv, c->ints, c->sc, N, k, (int)D, Fm, (int)X);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const char *flavor = "debugmodel_moe", *only = NULL;
    int B = 4, T = 128, rounds = 6, X = 0, topk = 0, vocab = 0, head_dim = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--flavor") == 0) flavor = argv[i + 1];
        if (strcmp(argv[i], "--B") == 0) B = atoi(argv[i + 1]);
        if (strcmp(argv[i], "--T") == 0) T = atoi(argv[i + 1]);
        if (strcmp(argv[i], "--rounds") == 0) rounds = atoi(argv[i + 1]);
        if (strcmp(argv[i], "--experts") == 0) X = atoi(argv[i + 1]);
        if (strcmp(argv[i], "--top-k") == 0) topk = atoi(argv[i + 1]);
        if (strcmp(argv[i], "--only") == 0) only = argv[i + 1];
        if (strcmp(argv[i], "--vocab") == 0) vocab = atoi(argv[i + 1]);
        if (strcmp(argv[i], "--head-dim") == 0) head_dim = atoi(argv[i + 1]);
    }
    static Ctx c;
    Err err;
    if (model_spec_flavor(&c.s, flavor, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    if (X) c.s.num_experts = X;
    if (topk) c.s.top_k = topk;
    if (vocab) c.s.vocab_size = vocab;     /* keeps the (N, V) buffers small when V is not timed */
    if (head_dim) c.s.head_dim = head_dim; /* sdpa and rope at other head sizes */
    if (c.s.moe_hidden_dim == 0) c.s.moe_hidden_dim = 1;
    c.B = B, c.T = T, c.N = (long)B * T;
    setup(&c);
    OpRun orun = {.spec = &c.s, .B = B, .T = T};
    printf("flavor %s (dim %d, heads %d/%d, head_dim %d, ffn %d, vocab %d, experts %d top-%d "
           "moe ffn %d), B %d x T %d, %d rounds alternating order; seconds per forward+backward\n",
           flavor, c.s.dim, c.s.n_heads, c.s.n_kv_heads, c.s.head_dim, c.s.hidden_dim,
           c.s.vocab_size, c.s.num_experts, c.s.top_k, c.s.moe_hidden_dim, B, T, rounds);
    printf("%-14s %-16s %-8s %10s %10s\n", "op", "impl", "default", "median", "best");
    int n;
    const KernelInfo *reg = kernel_registry(&n);
    for (int kind = 0; kind < OP_NKINDS; kind++) {
        if (kind == OP_EMBEDDING) continue; /* one implementation */
        if (kind == OP_MOE_EXPERTS && c.s.num_experts == 0) continue;
        if (only && strcmp(only, op_kind_name((OpKind)kind)) != 0) continue;
        const KernelInfo *impl[16];
        int bf[16], ni = 0;
        for (int i = 0; i < n && ni < 15; i++)
            if ((int)reg[i].op->kind == kind && strcmp(reg[i].op->device, "cpu") == 0 &&
                (!reg[i].op->supports || !reg[i].op->supports(&orun))) {
                bf[ni] = 0, impl[ni++] = &reg[i];
                if (kind == OP_SDPA && ((const SdpaOp *)reg[i].op)->forward_bf16)
                    bf[ni] = 1, impl[ni++] = &reg[i];
            }
        double t[16][64];
        for (int j = 0; j < ni; j++)
            c.bf16 = bf[j], run(impl[j]->op, &c); /* warm-up: oneDNN primitives, page faults */
        for (int r = 0; r < rounds && r < 64; r++)
            for (int jj = 0; jj < ni; jj++) {
                int j = r % 2 ? ni - 1 - jj : jj;
                c.bf16 = bf[j];
                double t0 = now_seconds();
                run(impl[j]->op, &c);
                t[j][r] = now_seconds() - t0;
            }
        const KernelInfo *def = kernel_default((OpKind)kind, "cpu");
        for (int j = 0; j < ni; j++) {
            char name[40];
            snprintf(name, sizeof name, "%s%s", impl[j]->op->name, bf[j] ? " [bf16]" : "");
            qsort(t[j], (size_t)rounds, sizeof(double), cmp_double);
            printf("%-14s %-16s %-8s %10.5f %10.5f\n", op_kind_name((OpKind)kind), name,
                   def == impl[j] ? "yes" : "", t[j][rounds / 2], t[j][0]);
        }
        fflush(stdout);
    }
    return 0;
}
