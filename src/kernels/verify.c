/* verify_kernel: builds the inputs, runs reference and kernel, compares every output. */
#include "kernels/verify.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/rng.h"
#include "kernels/kernels.h"
#include "ops/cross_entropy.h"
#include "ops/moe_experts.h"

typedef struct Cmp {
    VerifyResult *r;
    double ta, tr;
} Cmp;

static void cmp(Cmp *c, const char *name, const float *got, const float *ref, long n) {
    VerifyResult *r = c->r;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]), a = fabs((double)ref[i]);
        double rel = d / (a > 1e-6 ? a : 1e-6);
        if (!(d <= c->ta || d <= c->tr * a)) r->ok = 0; /* NaN fails too */
        if (isnan(d) || d > r->max_abs) r->max_abs = d; /* a NaN sticks in the report */
        if (isnan(rel) || rel > r->max_rel) r->max_rel = rel;
    }
    r->n_checked += n;
    size_t len = strlen(r->outputs);
    snprintf(r->outputs + len, sizeof r->outputs - len, "%s%s", len ? " " : "", name);
}

static float *randn(Rng *g, long n, float std) {
    float *x = xmalloc((size_t)n * sizeof *x);
    rng_fill_normal(g, x, n, std);
    return x;
}

static float *copy(const float *x, long n) {
    float *y = xmalloc((size_t)n * sizeof *y);
    memcpy(y, x, (size_t)n * sizeof *y);
    return y;
}

static float *zeros(long n) {
    return xcalloc((size_t)n, sizeof(float));
}

/* The start of an output the op writes (=): not zero, so a kernel that accumulates into it,
 * or reads it, differs from the reference. Both sides get the same start, so an element that
 * neither writes still compares equal. */
static float *unwritten(long n) {
    float *x = xmalloc((size_t)n * sizeof *x);
    for (long i = 0; i < n; i++)
        x[i] = 7.0f;
    return x;
}

static void verify_sdpa(Cmp *c, const SdpaOp *k, const VerifyShape *s, Rng *g) {
    const SdpaOp *r = (const SdpaOp *)op_reference(OP_SDPA);
    long nq = (long)s->B * s->T * s->H * s->E, nk = (long)s->B * s->T * s->K * s->E;
    long nl = (long)s->B * s->H * s->T;
    float *q = randn(g, nq, 1.0f), *kk = randn(g, nk, 1.0f), *v = randn(g, nk, 1.0f);
    float *dout = randn(g, nq, 1.0f);
    int32_t *doc = NULL;
    if (s->doc) {
        doc = xmalloc((size_t)s->B * s->T * sizeof *doc);
        for (int b = 0; b < s->B; b++)
            for (int t = 0; t < s->T; t++) /* three documents of ragged lengths per row */
                doc[b * s->T + t] = 10 * b + (t < s->T / 3 + b         ? 0
                                              : t < (2 * s->T) / 3 + 5 ? 1
                                                                       : 2);
    }
    float *o1 = unwritten(nq), *o2 = unwritten(nq), *l1 = unwritten(nl), *l2 = unwritten(nl);
    r->forward(o1, l1, q, kk, v, doc, s->B, s->T, s->H, s->K, s->E);
    k->forward(o2, l2, q, kk, v, doc, s->B, s->T, s->H, s->K, s->E);
    cmp(c, "out", o2, o1, nq);
    cmp(c, "lse", l2, l1, nl);
    float *dq1 = unwritten(nq), *dk1 = unwritten(nk), *dv1 = unwritten(nk);
    float *dq2 = unwritten(nq), *dk2 = unwritten(nk), *dv2 = unwritten(nk);
    r->backward(dq1, dk1, dv1, dout, q, kk, v, o1, l1, doc, s->B, s->T, s->H, s->K, s->E);
    /* The kernel's backward from its own forward's outputs, as in training. */
    k->backward(dq2, dk2, dv2, dout, q, kk, v, o2, l2, doc, s->B, s->T, s->H, s->K, s->E);
    cmp(c, "dq", dq2, dq1, nq);
    cmp(c, "dk", dk2, dk1, nk);
    cmp(c, "dv", dv2, dv1, nk);
    free(q), free(kk), free(v), free(dout), free(doc), free(o1), free(o2), free(l1), free(l2);
    free(dq1), free(dk1), free(dv1), free(dq2), free(dk2), free(dv2);
}

static void verify_rope(Cmp *c, const RopeOp *k, const VerifyShape *s, Rng *g) {
    const RopeOp *r = (const RopeOp *)op_reference(OP_ROPE);
    long N = (long)s->B * s->T, n = N * s->H * s->E;
    int32_t *pos = xmalloc((size_t)N * sizeof *pos);
    for (long i = 0; i < N; i++)
        pos[i] = (int32_t)(i % s->T);
    float *x = randn(g, n, 1.0f), *a = unwritten(n), *b = unwritten(n);
    r->forward(a, x, pos, N, s->H, s->E, s->theta);
    k->forward(b, x, pos, N, s->H, s->E, s->theta);
    cmp(c, "out", b, a, n);
    r->backward(a, x, pos, N, s->H, s->E, s->theta);
    k->backward(b, x, pos, N, s->H, s->E, s->theta);
    cmp(c, "dx", b, a, n);
    free(pos), free(x), free(a), free(b);
}

static void verify_swiglu(Cmp *c, const SwigluOp *k, const VerifyShape *s, Rng *g) {
    const SwigluOp *r = (const SwigluOp *)op_reference(OP_SWIGLU);
    long N = (long)s->B * s->T, D = s->D, F = s->F;
    /* Weights at 1/sqrt(fan_in) keep activations O(1) at any width, as trained models do. */
    float si = 1.0f / sqrtf((float)D), so = 1.0f / sqrtf((float)F);
    float *x = randn(g, N * D, 1.0f), *w1 = randn(g, F * D, si), *w3 = randn(g, F * D, si);
    float *w2 = randn(g, D * F, so), *dout = randn(g, N * D, 1.0f);
    float *dw0 = randn(g, F * D, 0.01f); /* gradients accumulate onto this start */
    float *o[2], *h1[2], *h3[2], *gg[2], *dx[2], *dw1[2], *dw3[2], *dw2[2], *s1[2], *s3[2];
    const SwigluOp *ops[2] = {r, k};
    for (int i = 0; i < 2; i++) {
        o[i] = unwritten(N * D), h1[i] = unwritten(N * F), h3[i] = unwritten(N * F);
        gg[i] = unwritten(N * F), dx[i] = unwritten(N * D);
        dw1[i] = copy(dw0, F * D), dw3[i] = copy(dw0, F * D);
        dw2[i] = copy(dw0, D * F), s1[i] = zeros(N * F), s3[i] = zeros(N * F);
        ops[i]->forward(o[i], h1[i], h3[i], gg[i], x, w1, w3, w2, N, (int)D, (int)F);
        ops[i]->backward(dx[i], dw1[i], dw3[i], dw2[i], s1[i], s3[i], dout, x, h1[i], h3[i], gg[i],
                         w1, w3, w2, N, (int)D, (int)F);
    }
    cmp(c, "out", o[1], o[0], N * D);
    cmp(c, "dx", dx[1], dx[0], N * D);
    cmp(c, "dw1", dw1[1], dw1[0], F * D);
    cmp(c, "dw3", dw3[1], dw3[0], F * D);
    cmp(c, "dw2", dw2[1], dw2[0], D * F);
    for (int i = 0; i < 2; i++)
        free(o[i]), free(h1[i]), free(h3[i]), free(gg[i]), free(dx[i]), free(dw1[i]), free(dw3[i]),
            free(dw2[i]), free(s1[i]), free(s3[i]);
    free(x), free(w1), free(w3), free(w2), free(dout), free(dw0);
}

static void verify_rmsnorm(Cmp *c, const RmsnormOp *k, const VerifyShape *s, Rng *g) {
    const RmsnormOp *r = (const RmsnormOp *)op_reference(OP_RMSNORM);
    long R = (long)s->B * s->T, C = s->D, n = R * C;
    float eps = 1e-6f;
    float *x = randn(g, n, 1.0f), *x2 = randn(g, n, 1.0f), *w = randn(g, C, 1.0f);
    float *dout = randn(g, n, 1.0f), *dres = randn(g, n, 1.0f), *dw0 = randn(g, C, 0.1f);
    float *o[2], *rs[2], *dx[2], *dw[2];
    const RmsnormOp *ops[2] = {r, k};
    for (int i = 0; i < 2; i++) {
        o[i] = unwritten(n), rs[i] = unwritten(R), dx[i] = unwritten(n), dw[i] = copy(dw0, C);
        ops[i]->forward(o[i], rs[i], x, w, R, (int)C, eps);
        ops[i]->backward(dx[i], dw[i], dout, x, w, rs[i], R, (int)C);
    }
    cmp(c, "out", o[1], o[0], n);
    cmp(c, "rstd", rs[1], rs[0], R);
    cmp(c, "dx", dx[1], dx[0], n);
    cmp(c, "dw", dw[1], dw[0], C);
    if (k->forward_add) { /* reference: add, then norm */
        float *sum = zeros(n), *sum2 = zeros(n);
        for (long i = 0; i < n; i++)
            sum[i] = x[i] + x2[i];
        r->forward(o[0], rs[0], sum, w, R, (int)C, eps);
        memcpy(sum2, x, (size_t)n * sizeof *sum2);
        k->forward_add(sum2, o[1], rs[1], sum2, x2, w, R, (int)C, eps);
        cmp(c, "add:sum", sum2, sum, n);
        cmp(c, "add:out", o[1], o[0], n);
        free(sum), free(sum2);
    }
    if (k->backward_acc) { /* reference: backward into scratch, then add */
        float *acc0 = copy(dres, n), *acc1 = copy(dres, n);
        r->backward(dx[0], dw[0], dout, x, w, rs[0], R, (int)C);
        for (long i = 0; i < n; i++)
            acc0[i] += dx[0][i];
        k->backward_acc(acc1, dw[1], dout, x, w, rs[0], R, (int)C);
        cmp(c, "acc:dx", acc1, acc0, n);
        cmp(c, "acc:dw", dw[1], dw[0], C);
        free(acc0), free(acc1);
    }
    for (int i = 0; i < 2; i++)
        free(o[i]), free(rs[i]), free(dx[i]), free(dw[i]);
    free(x), free(x2), free(w), free(dout), free(dres), free(dw0);
}

static void verify_loss(Cmp *c, const LmHeadLossOp *k, const VerifyShape *s, Rng *g) {
    const LmHeadLossOp *r = (const LmHeadLossOp *)op_reference(OP_LM_HEAD_LOSS);
    const LinearOp *proj = (const LinearOp *)op_reference(OP_LINEAR);
    long N = (long)s->B * s->T, D = s->D, V = s->V;
    float *x = randn(g, N * D, 1.0f), *w = randn(g, V * D, 2.0f / sqrtf((float)D));
    float *dw0 = randn(g, V * D, 0.01f);
    int32_t *tg = xmalloc((size_t)N * sizeof *tg);
    for (long i = 0; i < N; i++)
        tg[i] = i % 7 == 3 ? CE_IGNORE : (int32_t)rng_below(g, (uint64_t)V);
    float *ls[2], *lse[2], *ws[2], *dx[2], *dw[2];
    double sum[2];
    const LmHeadLossOp *ops[2] = {r, k};
    for (int i = 0; i < 2; i++) {
        ls[i] = unwritten(N), lse[i] = unwritten(N), dx[i] = unwritten(N * D);
        dw[i] = copy(dw0, V * D);
        ws[i] = zeros(ops[i]->workspace_floats(N, (int)V));
        sum[i] = ops[i]->forward(ls[i], lse[i], ws[i], x, w, tg, proj, N, (int)D, (int)V);
        ops[i]->backward(dx[i], dw[i], ws[i], x, w, tg, lse[i], proj, N, (int)D, (int)V, 0.01f);
    }
    float fs[2] = {(float)sum[0], (float)sum[1]};
    cmp(c, "loss_sum", &fs[1], &fs[0], 1);
    cmp(c, "losses", ls[1], ls[0], N);
    cmp(c, "lse", lse[1], lse[0], N);
    cmp(c, "dx", dx[1], dx[0], N * D);
    cmp(c, "dw", dw[1], dw[0], V * D);
    for (int i = 0; i < 2; i++)
        free(ls[i]), free(lse[i]), free(ws[i]), free(dx[i]), free(dw[i]);
    free(x), free(w), free(dw0), free(tg);
}

static void verify_experts(Cmp *c, const MoeExpertsOp *k, const VerifyShape *s, Rng *g) {
    const MoeExpertsOp *r = (const MoeExpertsOp *)op_reference(OP_MOE_EXPERTS);
    long N = (long)s->B * s->T, D = s->D, F = s->F, X = s->X, kk = s->k;
    float *x = randn(g, N * D, 1.0f), *gw = randn(g, N * kk, 0.5f), *dout = randn(g, N * D, 1.0f);
    float si = 1.0f / sqrtf((float)D), so = 1.0f / sqrtf((float)F); /* as in verify_swiglu */
    float *w1 = randn(g, X * F * D, si), *w3 = randn(g, X * F * D, si);
    float *w2 = randn(g, X * D * F, so), *dw0 = randn(g, X * F * D, 0.01f);
    int32_t *idx = xmalloc((size_t)(N * kk) * sizeof *idx);
    int usable = (int)(X > kk + 1 ? X - 1 : X); /* expert X-1 gets no token: an empty group */
    for (long n = 0; n < N; n++)
        for (long j = 0; j < kk; j++) {
            int e, dup;
            do { /* distinct experts per token */
                e = (int)rng_below(g, (uint64_t)usable);
                dup = 0;
                for (long i = 0; i < j; i++)
                    dup |= idx[n * kk + i] == e;
            } while (dup);
            idx[n * kk + j] = e;
        }
    const MoeExpertsOp *ops[2] = {r, k};
    float *o[2], *dx[2], *dgw[2], *dw1[2], *dw3[2], *dw2[2], *sv[2], *sc[2];
    int32_t *in[2];
    for (int i = 0; i < 2; i++) {
        MoeExpertsBufs b;
        sv[i] = zeros(moe_experts_saved_floats(N, (int)kk, (int)D, (int)F));
        sc[i] = zeros(moe_experts_scratch_floats(N, (int)kk, (int)D, (int)F));
        in[i] = xcalloc((size_t)moe_experts_saved_ints(N, (int)kk, (int)X), sizeof(int32_t));
        moe_experts_bufs_place(&b, sv[i], in[i], sc[i], N, (int)kk, (int)D, (int)F, (int)X);
        o[i] = unwritten(N * D), dx[i] = unwritten(N * D), dgw[i] = unwritten(N * kk);
        dw1[i] = copy(dw0, X * F * D), dw3[i] = copy(dw0, X * F * D), dw2[i] = copy(dw0, X * D * F);
        ops[i]->forward(o[i], &b, x, idx, gw, w1, w3, w2, N, (int)kk, (int)D, (int)F, (int)X);
        ops[i]->backward(dx[i], dgw[i], dw1[i], dw3[i], dw2[i], &b, dout, x, idx, gw, w1, w3, w2, N,
                         (int)kk, (int)D, (int)F, (int)X);
    }
    cmp(c, "out", o[1], o[0], N * D);
    cmp(c, "dx", dx[1], dx[0], N * D);
    cmp(c, "dgw", dgw[1], dgw[0], N * kk);
    cmp(c, "dw1", dw1[1], dw1[0], X * F * D);
    cmp(c, "dw3", dw3[1], dw3[0], X * F * D);
    cmp(c, "dw2", dw2[1], dw2[0], X * D * F);
    for (int i = 0; i < 2; i++)
        free(o[i]), free(dx[i]), free(dgw[i]), free(dw1[i]), free(dw3[i]), free(dw2[i]),
            free(sv[i]), free(sc[i]), free(in[i]);
    free(x), free(gw), free(dout), free(w1), free(w3), free(w2), free(dw0), free(idx);
}

void verify_kernel(VerifyResult *r, const KernelInfo *k, const VerifyShape *sh, unsigned seed) {
    memset(r, 0, sizeof *r);
    r->ok = 1;
    Cmp c = {r, k->tol_abs, k->tol_rel};
    Rng g;
    rng_seed(&g, seed, 7);
    switch (k->op->kind) {
    case OP_SDPA:
        verify_sdpa(&c, (const SdpaOp *)k->op, sh, &g);
        break;
    case OP_ROPE:
        verify_rope(&c, (const RopeOp *)k->op, sh, &g);
        break;
    case OP_SWIGLU:
        verify_swiglu(&c, (const SwigluOp *)k->op, sh, &g);
        break;
    case OP_RMSNORM:
        verify_rmsnorm(&c, (const RmsnormOp *)k->op, sh, &g);
        break;
    case OP_LM_HEAD_LOSS:
        verify_loss(&c, (const LmHeadLossOp *)k->op, sh, &g);
        break;
    case OP_MOE_EXPERTS:
        verify_experts(&c, (const MoeExpertsOp *)k->op, sh, &g);
        break;
    default:
        r->ok = 0;
        snprintf(r->outputs, sizeof r->outputs, "no check for op %s", op_kind_name(k->op->kind));
    }
}

void verify_shape_label(char *buf, unsigned cap, OpKind kind, const VerifyShape *s) {
    switch (kind) {
    case OP_SDPA:
        snprintf(buf, cap, "B%d T%d H%d K%d E%d%s", s->B, s->T, s->H, s->K, s->E,
                 s->doc ? " doc" : "");
        break;
    case OP_ROPE:
        snprintf(buf, cap, "B%d T%d heads%d E%d", s->B, s->T, s->H, s->E);
        break;
    case OP_SWIGLU:
        snprintf(buf, cap, "N%d D%d F%d", s->B * s->T, s->D, s->F);
        break;
    case OP_RMSNORM:
        snprintf(buf, cap, "R%d C%d", s->B * s->T, s->D);
        break;
    case OP_LM_HEAD_LOSS:
        snprintf(buf, cap, "N%d D%d V%d", s->B * s->T, s->D, s->V);
        break;
    case OP_MOE_EXPERTS:
        snprintf(buf, cap, "N%d D%d F%d X%d k%d", s->B * s->T, s->D, s->F, s->X, s->k);
        break;
    default:
        snprintf(buf, cap, "-");
    }
}
