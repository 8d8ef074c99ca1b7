/* Each kernel of the library against its op's reference at a realistic shape: wall time of
 * forward + backward (best of --reps, after one warm-up) and the bytes of the buffers the op
 * needs beyond its inputs and outputs (logits workspace, scores, stacked weights).
 *   build/bench_kernels [--T 2048] [--reps 2]
 * Shapes: sdpa B1 x T, Qwen3-0.6B heads (16 / 8, head_dim 128); loss N = T tokens, D 1024,
 * V 151,936; swiglu N = T/4, D 1024, F 3072; rope and rmsnorm N = T tokens of 0.6B. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/rng.h"
#include "core/timer.h"
#include "kernels/kernels.h"
#include "kernels/registry.h"

static int reps = 2;

static float *randn(long n, float std, uint64_t stream) {
    float *x = xmalloc((size_t)n * sizeof *x);
    Rng r;
    rng_seed(&r, 3, stream);
    rng_fill_normal(&r, x, n, std);
    return x;
}

typedef void (*RunFn)(const OpHeader *op, void *ctx);

static double best(RunFn f, const OpHeader *op, void *ctx) {
    f(op, ctx);
    double b = 1e30;
    for (int i = 0; i < reps; i++) {
        double t0 = now_seconds();
        f(op, ctx);
        double t = now_seconds() - t0;
        b = t < b ? t : b;
    }
    return b;
}

static void row(const char *op, const char *shape, const OpHeader *ref, const OpHeader *ker,
                RunFn f, void *ctx, double mem_ref, double mem_ker) {
    double tr = best(f, ref, ctx), tk = best(f, ker, ctx);
    printf("%-13s %-30s %-14s %9.3f s %10.1f MiB\n", op, shape, "reference", tr, mem_ref / 1048576);
    printf("%-13s %-30s %-14s %9.3f s %10.1f MiB   x%.2f\n", op, shape, ker->name, tk,
           mem_ker / 1048576, tr / tk);
    fflush(stdout);
}

/* sdpa */
typedef struct {
    int B, T, H, K, E;
    float *q, *k, *v, *o, *l, *dout, *dq, *dk, *dv;
} SdpaCtx;
static void run_sdpa(const OpHeader *op, void *c) {
    SdpaCtx *s = c;
    const SdpaOp *p = (const SdpaOp *)op;
    p->forward(s->o, s->l, s->q, s->k, s->v, NULL, s->B, s->T, s->H, s->K, s->E);
    p->backward(s->dq, s->dk, s->dv, s->dout, s->q, s->k, s->v, s->o, s->l, NULL, s->B, s->T, s->H,
                s->K, s->E);
}

/* lm_head + loss */
typedef struct {
    long N;
    int D, V;
    float *x, *w, *dw, *dx, *ls, *lse, *ws;
    int32_t *tg;
} LossCtx;
static void run_loss(const OpHeader *op, void *c) {
    LossCtx *s = c;
    const LmHeadLossOp *p = (const LmHeadLossOp *)op;
    const LinearOp *proj = (const LinearOp *)op_reference(OP_LINEAR);
    p->forward(s->ls, s->lse, s->ws, s->x, s->w, s->tg, proj, s->N, s->D, s->V);
    p->backward(s->dx, s->dw, s->ws, s->x, s->w, s->tg, s->lse, proj, s->N, s->D, s->V, 1e-3f);
}

/* swiglu */
typedef struct {
    long N;
    int D, F;
    float *x, *w1, *w3, *w2, *o, *h1, *h3, *g, *dx, *dw1, *dw3, *dw2, *s1, *s3, *dout;
} FfnCtx;
static void run_ffn(const OpHeader *op, void *c) {
    FfnCtx *s = c;
    const SwigluOp *p = (const SwigluOp *)op;
    p->forward(s->o, s->h1, s->h3, s->g, s->x, s->w1, s->w3, s->w2, s->N, s->D, s->F);
    p->backward(s->dx, s->dw1, s->dw3, s->dw2, s->s1, s->s3, s->dout, s->x, s->h1, s->h3, s->g,
                s->w1, s->w3, s->w2, s->N, s->D, s->F);
}

/* rope */
typedef struct {
    long N;
    int NH, E;
    float *x, *o;
    int32_t *pos;
} RopeCtx;
static void run_rope(const OpHeader *op, void *c) {
    RopeCtx *s = c;
    const RopeOp *p = (const RopeOp *)op;
    p->forward(s->o, s->x, s->pos, s->N, s->NH, s->E, 1e6);
    p->backward(s->x, s->o, s->pos, s->N, s->NH, s->E, 1e6);
}

/* rmsnorm (forward + backward; the fused residual add is not timed here) */
typedef struct {
    long R;
    int C;
    float *x, *w, *o, *rs, *dx, *dw;
} NormCtx;
static void run_norm(const OpHeader *op, void *c) {
    NormCtx *s = c;
    const RmsnormOp *p = (const RmsnormOp *)op;
    p->forward(s->o, s->rs, s->x, s->w, s->R, s->C, 1e-6f);
    p->backward(s->dx, s->dw, s->o, s->x, s->w, s->rs, s->R, s->C);
}

int main(int argc, char **argv) {
    int T = 2048;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--T") == 0) T = atoi(argv[i + 1]);
        if (strcmp(argv[i], "--reps") == 0) reps = atoi(argv[i + 1]);
    }
    printf("%-13s %-30s %-14s %11s %14s\n", "op", "shape", "impl", "fwd+bwd", "extra memory");
    char shape[64];

    {
        LossCtx s = {.N = T, .D = 1024, .V = 151936};
        s.x = randn(s.N * s.D, 1, 1), s.w = randn((long)s.V * s.D, 0.02f, 2);
        s.dw = calloc((size_t)s.V * s.D, 4), s.dx = calloc((size_t)s.N * s.D, 4);
        s.ls = calloc((size_t)s.N, 4), s.lse = calloc((size_t)s.N, 4);
        s.tg = malloc((size_t)s.N * 4);
        for (long i = 0; i < s.N; i++)
            s.tg[i] = (int32_t)((i * 7919) % s.V);
        long wr = lm_head_loss_reference.workspace_floats(s.N, s.V);
        long wk = loss_chunked.workspace_floats(s.N, s.V);
        s.ws = malloc((size_t)wr * 4);
        snprintf(shape, sizeof shape, "N%ld D%d V%d", s.N, s.D, s.V);
        row("lm_head_loss", shape, &lm_head_loss_reference.h, &loss_chunked.h, run_loss, &s,
            (double)wr * 4, (double)wk * 4);
        free(s.x), free(s.w), free(s.dw), free(s.dx), free(s.ls), free(s.lse), free(s.tg),
            free(s.ws);
    }
    {
        SdpaCtx s = {.B = 1, .T = T, .H = 16, .K = 8, .E = 128};
        long nq = (long)T * 16 * 128, nk = (long)T * 8 * 128;
        s.q = randn(nq, 1, 3), s.k = randn(nk, 1, 4), s.v = randn(nk, 1, 5);
        s.dout = randn(nq, 1, 6), s.o = calloc((size_t)nq, 4), s.l = calloc((size_t)T * 16, 4);
        s.dq = calloc((size_t)nq, 4), s.dk = calloc((size_t)nk, 4), s.dv = calloc((size_t)nk, 4);
        snprintf(shape, sizeof shape, "B1 T%d H16 K8 E128", T);
        /* Neither keeps (T, T) scores: the reference works row by row; flash holds one
         * 64 x 64 tile of scores and a 64 x E accumulator per thread (2 threads). */
        row("sdpa", shape, &sdpa_reference.h, &sdpa_flash.h, run_sdpa, &s, 0,
            2.0 * (64 * 64 * 2 + 64 * 256) * 4);
        free(s.q), free(s.k), free(s.v), free(s.dout), free(s.o), free(s.l), free(s.dq), free(s.dk),
            free(s.dv);
    }
    {
        FfnCtx s = {.N = T / 4, .D = 1024, .F = 3072};
        long nd = s.N * s.D, nf = s.N * s.F, fd = (long)s.F * s.D;
        s.x = randn(nd, 1, 7), s.w1 = randn(fd, 0.02f, 8), s.w3 = randn(fd, 0.02f, 9);
        s.w2 = randn(fd, 0.02f, 10), s.dout = randn(nd, 1, 11);
        s.o = calloc((size_t)nd, 4), s.dx = calloc((size_t)nd, 4);
        s.h1 = calloc((size_t)nf, 4), s.h3 = calloc((size_t)nf, 4), s.g = calloc((size_t)nf, 4);
        s.s1 = calloc((size_t)nf, 4), s.s3 = calloc((size_t)nf, 4);
        s.dw1 = calloc((size_t)fd, 4), s.dw3 = calloc((size_t)fd, 4), s.dw2 = calloc((size_t)fd, 4);
        snprintf(shape, sizeof shape, "N%ld D%d F%d", s.N, s.D, s.F);
        row("swiglu", shape, &swiglu_reference.h, &swiglu_fused.h, run_ffn, &s, 0,
            (4.0 * fd + 2.0 * nf) * 4);
        free(s.x), free(s.w1), free(s.w3), free(s.w2), free(s.dout), free(s.o), free(s.dx),
            free(s.h1), free(s.h3), free(s.g), free(s.s1), free(s.s3), free(s.dw1), free(s.dw3),
            free(s.dw2);
    }
    {
        RopeCtx s = {.N = 4L * T, .NH = 24, .E = 128};
        s.x = randn(s.N * s.NH * s.E, 1, 12), s.o = calloc((size_t)(s.N * s.NH * s.E), 4);
        s.pos = malloc((size_t)s.N * 4);
        for (long i = 0; i < s.N; i++)
            s.pos[i] = (int32_t)(i % T);
        snprintf(shape, sizeof shape, "B4 T%d heads24 E128", T);
        row("rope", shape, &rope_reference.h, &rope_nogather.h, run_rope, &s, 0, 0);
        free(s.x), free(s.o), free(s.pos);
    }
    {
        NormCtx s = {.R = 4L * T, .C = 1024};
        long n = s.R * s.C;
        s.x = randn(n, 1, 13), s.w = randn(s.C, 1, 14), s.o = calloc((size_t)n, 4);
        s.rs = calloc((size_t)s.R, 4), s.dx = calloc((size_t)n, 4), s.dw = calloc((size_t)s.C, 4);
        snprintf(shape, sizeof shape, "R%ld C%d", s.R, s.C);
        row("rmsnorm", shape, &rmsnorm_reference.h, &rmsnorm_fused.h, run_norm, &s, 0, 0);
        free(s.x), free(s.w), free(s.o), free(s.rs), free(s.dx), free(s.dw);
    }
    return 0;
}
