/* Each kernel of the library against its op's reference at a realistic shape: wall time of
 * forward + backward (best of --reps, after one warm-up) and peak resident memory: each
 * implementation runs in its own child process, so the max RSS (inputs included) is its own.
 *   build/bench_kernels [--T 2048] [--reps 2] [--only sdpa]
 * Shapes: sdpa B1 x T, Qwen3-0.6B heads (16 / 8, head_dim 128); loss N = T tokens, D 1024,
 * V 151,936; swiglu N = T/4, D 1024, F 3072; rope and rmsnorm N = T tokens of 0.6B. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

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

/* Runs setup + impl in a child process so its peak resident memory (inputs, outputs and
 * whatever the implementation needs) is its own: prints time and peak RSS. */
typedef void (*SetupFn)(void **ctx, int T);
typedef void (*FreeFn)(void *ctx);

static void measure(const char *op, const char *shape, const OpHeader *impl, SetupFn setup, RunFn f,
                    FreeFn fr, int T, double *t_out) {
    int fd[2];
    if (pipe(fd)) return;
    fflush(stdout); /* the child must not print the parent's buffered lines again */
    pid_t pid = fork();
    if (pid == 0) {
        void *ctx;
        setup(&ctx, T);
        double res[2];
        res[0] = best(f, impl, ctx);
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        res[1] = (double)ru.ru_maxrss / 1024.0; /* KiB -> MiB */
        fr(ctx);
        if (write(fd[1], res, sizeof res) != (ssize_t)sizeof res) _exit(1);
        _exit(0);
    }
    double res[2] = {-1, -1};
    if (read(fd[0], res, sizeof res) != (ssize_t)sizeof res) res[0] = -1;
    waitpid(pid, NULL, 0);
    close(fd[0]);
    close(fd[1]);
    printf("%-13s %-26s %-14s %9.3f s %10.0f MiB", op, shape, impl->name, res[0], res[1]);
    if (*t_out > 0 && res[0] > 0) printf("   x%.2f", *t_out / res[0]);
    printf("\n");
    fflush(stdout);
    *t_out = res[0];
}

/* Each op: a context with its inputs, setup (at T) and run (forward + backward). */

typedef struct {
    int B, T, H, K, E;
    float *q, *k, *v, *o, *l, *dout, *dq, *dk, *dv;
} SdpaCtx;
static void setup_sdpa(void **c, int T) {
    SdpaCtx *s = xcalloc(1, sizeof *s);
    *s = (SdpaCtx){.B = 1, .T = T, .H = 16, .K = 8, .E = 128};
    long nq = (long)T * 16 * 128, nk = (long)T * 8 * 128;
    s->q = randn(nq, 1, 3), s->k = randn(nk, 1, 4), s->v = randn(nk, 1, 5);
    s->dout = randn(nq, 1, 6), s->o = xcalloc((size_t)nq, 4), s->l = xcalloc((size_t)T * 16, 4);
    s->dq = xcalloc((size_t)nq, 4), s->dk = xcalloc((size_t)nk, 4), s->dv = xcalloc((size_t)nk, 4);
    *c = s;
}
static void run_sdpa(const OpHeader *op, void *c) {
    SdpaCtx *s = c;
    const SdpaOp *p = (const SdpaOp *)op;
    p->forward(s->o, s->l, s->q, s->k, s->v, NULL, s->B, s->T, s->H, s->K, s->E);
    p->backward(s->dq, s->dk, s->dv, s->dout, s->q, s->k, s->v, s->o, s->l, NULL, s->B, s->T, s->H,
                s->K, s->E);
}
static void free_sdpa(void *c) {
    SdpaCtx *s = c;
    free(s->q), free(s->k), free(s->v), free(s->dout), free(s->o), free(s->l), free(s->dq),
        free(s->dk), free(s->dv), free(s);
}

typedef struct {
    long N;
    int D, V;
    float *x, *w, *dw, *dx, *ls, *lse, *ws;
    int32_t *tg;
    const OpHeader *impl; /* the workspace is sized for it on first run */
} LossCtx;
static void setup_loss(void **c, int T) {
    LossCtx *s = xcalloc(1, sizeof *s);
    s->N = T, s->D = 1024, s->V = 151936;
    s->x = randn(s->N * s->D, 1, 1), s->w = randn((long)s->V * s->D, 0.02f, 2);
    s->dw = xcalloc((size_t)s->V * s->D, 4), s->dx = xcalloc((size_t)s->N * s->D, 4);
    s->ls = xcalloc((size_t)s->N, 4), s->lse = xcalloc((size_t)s->N, 4);
    s->tg = xmalloc((size_t)s->N * 4);
    for (long i = 0; i < s->N; i++)
        s->tg[i] = (int32_t)((i * 7919) % s->V);
    *c = s;
}
static void run_loss(const OpHeader *op, void *c) {
    LossCtx *s = c;
    const LmHeadLossOp *p = (const LmHeadLossOp *)op;
    const LinearOp *proj = (const LinearOp *)op_reference(OP_LINEAR);
    if (!s->ws) s->ws = xmalloc((size_t)p->workspace_floats(s->N, s->D, s->V) * 4);
    p->forward(s->ls, s->lse, s->ws, s->x, s->w, NULL, NULL, s->tg, proj, s->N, s->D, s->V);
    p->backward(s->dx, s->dw, s->ws, s->x, s->w, NULL, NULL, s->tg, s->lse, proj, s->N, s->D, s->V,
                1e-3f);
}
static void free_loss(void *c) {
    LossCtx *s = c;
    free(s->x), free(s->w), free(s->dw), free(s->dx), free(s->ls), free(s->lse), free(s->tg),
        free(s->ws), free(s);
}

typedef struct {
    long N;
    int D, F;
    float *x, *w1, *w3, *w2, *o, *h1, *h3, *g, *dx, *dw1, *dw3, *dw2, *s1, *s3, *dout, *ws;
} FfnCtx;
static void setup_ffn(void **c, int T) {
    FfnCtx *s = xcalloc(1, sizeof *s);
    s->N = T / 4, s->D = 1024, s->F = 3072;
    long nd = s->N * s->D, nf = s->N * s->F, fd = (long)s->F * s->D;
    s->x = randn(nd, 1, 7), s->w1 = randn(fd, 0.02f, 8), s->w3 = randn(fd, 0.02f, 9);
    s->w2 = randn(fd, 0.02f, 10), s->dout = randn(nd, 1, 11);
    s->o = xcalloc((size_t)nd, 4), s->dx = xcalloc((size_t)nd, 4);
    s->h1 = xcalloc((size_t)nf, 4), s->h3 = xcalloc((size_t)nf, 4), s->g = xcalloc((size_t)nf, 4);
    s->s1 = xcalloc((size_t)nf, 4), s->s3 = xcalloc((size_t)nf, 4);
    s->dw1 = xcalloc((size_t)fd, 4), s->dw3 = xcalloc((size_t)fd, 4);
    s->dw2 = xcalloc((size_t)fd, 4);
    *c = s;
}
static void run_ffn(const OpHeader *op, void *c) {
    FfnCtx *s = c;
    const SwigluOp *p = (const SwigluOp *)op;
    if (!s->ws && p->workspace_floats)
        s->ws = xmalloc((size_t)p->workspace_floats(s->N, s->D, s->F) * 4);
    p->forward(s->o, s->h1, s->h3, s->g, s->x, s->w1, s->w3, s->w2, s->ws, s->N, s->D, s->F);
    p->backward(s->dx, s->dw1, s->dw3, s->dw2, s->s1, s->s3, s->dout, s->x, s->h1, s->h3, s->g,
                s->w1, s->w3, s->w2, s->ws, s->N, s->D, s->F);
}
static void free_ffn(void *c) {
    FfnCtx *s = c;
    free(s->x), free(s->w1), free(s->w3), free(s->w2), free(s->dout), free(s->o), free(s->dx),
        free(s->h1), free(s->h3), free(s->g), free(s->s1), free(s->s3), free(s->dw1), free(s->dw3),
        free(s->dw2), free(s->ws), free(s);
}

typedef struct {
    long N;
    int NH, E;
    float *x, *o;
    int32_t *pos;
    RopeFreqs f;
} RopeCtx;
static void setup_rope(void **c, int T) {
    RopeCtx *s = xcalloc(1, sizeof *s);
    s->N = 4L * T, s->NH = 24, s->E = 128;
    rope_freqs_plain(&s->f, 1e6, s->E);
    s->x = randn(s->N * s->NH * s->E, 1, 12), s->o = xcalloc((size_t)(s->N * s->NH * s->E), 4);
    s->pos = xmalloc((size_t)s->N * 4);
    for (long i = 0; i < s->N; i++)
        s->pos[i] = (int32_t)(i % T);
    *c = s;
}
static void run_rope(const OpHeader *op, void *c) {
    RopeCtx *s = c;
    const RopeOp *p = (const RopeOp *)op;
    p->forward(s->o, s->x, s->pos, s->N, s->NH, s->E, &s->f);
    p->backward(s->x, s->o, s->pos, s->N, s->NH, s->E, &s->f);
}
static void free_rope(void *c) {
    RopeCtx *s = c;
    free(s->x), free(s->o), free(s->pos), free(s);
}

typedef struct {
    long R;
    int C;
    float *x, *w, *o, *rs, *dx, *dw;
} NormCtx;
static void setup_norm(void **c, int T) {
    NormCtx *s = xcalloc(1, sizeof *s);
    s->R = 4L * T, s->C = 1024;
    long n = s->R * s->C;
    s->x = randn(n, 1, 13), s->w = randn(s->C, 1, 14), s->o = xcalloc((size_t)n, 4);
    s->rs = xcalloc((size_t)s->R, 4), s->dx = xcalloc((size_t)n, 4);
    s->dw = xcalloc((size_t)s->C, 4);
    *c = s;
}
/* forward + backward; the fused residual add is not timed here */
static void run_norm(const OpHeader *op, void *c) {
    NormCtx *s = c;
    const RmsnormOp *p = (const RmsnormOp *)op;
    p->forward(s->o, s->rs, s->x, s->w, s->R, s->C, 1e-6f);
    p->backward(s->dx, s->dw, s->o, s->x, s->w, s->rs, s->R, s->C);
}
static void free_norm(void *c) {
    NormCtx *s = c;
    free(s->x), free(s->w), free(s->o), free(s->rs), free(s->dx), free(s->dw), free(s);
}

int main(int argc, char **argv) {
    int T = 2048;
    const char *only = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--T") == 0) T = atoi(argv[i + 1]);
        if (strcmp(argv[i], "--reps") == 0) reps = atoi(argv[i + 1]);
        if (strcmp(argv[i], "--only") == 0) only = argv[i + 1];
    }
    struct {
        const char *op;
        const OpHeader *ref, *ker;
        SetupFn setup;
        RunFn run;
        FreeFn fr;
        const char *shape;
    } rows[] = {
        {"lm_head_loss", &lm_head_loss_reference.h, &loss_chunked.h, setup_loss, run_loss,
         free_loss, "N=T D1024 V151936"},
        {"sdpa", &sdpa_reference.h, &sdpa_flash.h, setup_sdpa, run_sdpa, free_sdpa,
         "B1 T H16 K8 E128"},
        {"swiglu", &swiglu_reference.h, &swiglu_fused.h, setup_ffn, run_ffn, free_ffn,
         "N=T/4 D1024 F3072"},
        {"rope", &rope_reference.h, &rope_nogather.h, setup_rope, run_rope, free_rope,
         "B4 T heads24 E128"},
        {"rmsnorm", &rmsnorm_reference.h, &rmsnorm_fused.h, setup_norm, run_norm, free_norm,
         "R=4T C1024"},
    };
    printf("T = %d, best of %d after a warm-up; peak = the process's max RSS (inputs included)\n",
           T, reps);
    printf("%-13s %-26s %-14s %11s %14s\n", "op", "shape", "impl", "fwd+bwd", "peak RSS");
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (only && strcmp(only, rows[i].op) != 0) continue;
        double t = 0;
        measure(rows[i].op, rows[i].shape, rows[i].ref, rows[i].setup, rows[i].run, rows[i].fr, T,
                &t);
        measure(rows[i].op, rows[i].shape, rows[i].ker, rows[i].setup, rows[i].run, rows[i].fr, T,
                &t);
    }
    return 0;
}
