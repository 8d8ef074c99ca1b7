/* verify_kernel: builds the inputs, runs reference and kernel, compares every output. */
#include "kernels/verify.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/rng.h"
#include "kernels/kernels.h"
#include "ops/op_all.h"

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

static void verify_sdpa(Cmp *c, const OpHeader *kh, const VerifyShape *s, Rng *g) {
    const SdpaOp *k = (const SdpaOp *)kh;
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

static void verify_rope(Cmp *c, const OpHeader *kh, const VerifyShape *s, Rng *g) {
    const RopeOp *k = (const RopeOp *)kh;
    const RopeOp *r = (const RopeOp *)op_reference(OP_ROPE);
    long N = (long)s->B * s->T, n = N * s->H * s->E;
    int32_t *pos = xmalloc((size_t)N * sizeof *pos);
    for (long i = 0; i < N; i++)
        pos[i] = (int32_t)(i % s->T);
    RopeFreqs *f = xmalloc(sizeof *f);
    if (s->rope)
        rope_freqs(f, s->rope);
    else
        rope_freqs_plain(f, s->theta, s->E);
    float *x = randn(g, n, 1.0f), *a = unwritten(n), *b = unwritten(n);
    r->forward(a, x, pos, N, s->H, s->E, f);
    k->forward(b, x, pos, N, s->H, s->E, f);
    cmp(c, "out", b, a, n);
    r->backward(a, x, pos, N, s->H, s->E, f);
    k->backward(b, x, pos, N, s->H, s->E, f);
    cmp(c, "dx", b, a, n);
    free(pos), free(x), free(a), free(b), free(f);
}

static void verify_swiglu(Cmp *c, const OpHeader *kh, const VerifyShape *s, Rng *g) {
    const SwigluOp *k = (const SwigluOp *)kh;
    const SwigluOp *r = (const SwigluOp *)op_reference(OP_SWIGLU);
    long N = (long)s->B * s->T, D = s->D, F = s->F;
    /* Weights at 1/sqrt(fan_in) keep activations O(1) at any width, as trained models do. */
    float si = 1.0f / sqrtf((float)D), so = 1.0f / sqrtf((float)F);
    float *x = randn(g, N * D, 1.0f), *w1 = randn(g, F * D, si), *w3 = randn(g, F * D, si);
    float *w2 = randn(g, D * F, so), *dout = randn(g, N * D, 1.0f);
    float *dw0 = randn(g, F * D, 0.01f); /* gradients accumulate onto this start */
    float *o[2], *h1[2], *h3[2], *gg[2], *dx[2], *dw1[2], *dw3[2], *dw2[2], *s1[2], *s3[2], *ws[2];
    const SwigluOp *ops[2] = {r, k};
    for (int i = 0; i < 2; i++) {
        o[i] = unwritten(N * D), h1[i] = unwritten(N * F), h3[i] = unwritten(N * F);
        gg[i] = unwritten(N * F), dx[i] = unwritten(N * D);
        dw1[i] = copy(dw0, F * D), dw3[i] = copy(dw0, F * D);
        dw2[i] = copy(dw0, D * F), s1[i] = zeros(N * F), s3[i] = zeros(N * F);
        ws[i] =
            ops[i]->workspace_floats ? zeros(ops[i]->workspace_floats(N, (int)D, (int)F)) : NULL;
        ops[i]->forward(o[i], h1[i], h3[i], gg[i], x, w1, w3, w2, ws[i], N, (int)D, (int)F);
        ops[i]->backward(dx[i], dw1[i], dw3[i], dw2[i], s1[i], s3[i], dout, x, h1[i], h3[i], gg[i],
                         w1, w3, w2, ws[i], N, (int)D, (int)F);
    }
    cmp(c, "out", o[1], o[0], N * D);
    cmp(c, "dx", dx[1], dx[0], N * D);
    cmp(c, "dw1", dw1[1], dw1[0], F * D);
    cmp(c, "dw3", dw3[1], dw3[0], F * D);
    cmp(c, "dw2", dw2[1], dw2[0], D * F);
    /* Frozen weights (NULL dw, ops/op.h): the same dx. */
    k->backward(dx[1], NULL, NULL, NULL, s1[1], s3[1], dout, x, h1[1], h3[1], gg[1], w1, w3, w2,
                ws[1], N, (int)D, (int)F);
    cmp(c, "frozen:dx", dx[1], dx[0], N * D);
    for (int i = 0; i < 2; i++)
        free(o[i]), free(h1[i]), free(h3[i]), free(gg[i]), free(dx[i]), free(dw1[i]), free(dw3[i]),
            free(dw2[i]), free(s1[i]), free(s3[i]), free(ws[i]);
    free(x), free(w1), free(w3), free(w2), free(dout), free(dw0);
}

static void verify_rmsnorm(Cmp *c, const OpHeader *kh, const VerifyShape *s, Rng *g) {
    const RmsnormOp *k = (const RmsnormOp *)kh;
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
    k->backward(dx[1], NULL, dout, x, w, rs[1], R, (int)C); /* frozen (ops/op.h) */
    cmp(c, "frozen:dx", dx[1], dx[0], n);
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

static void verify_lm_head_loss(Cmp *c, const OpHeader *kh, const VerifyShape *s, Rng *g) {
    const LmHeadLossOp *k = (const LmHeadLossOp *)kh;
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
        ws[i] = zeros(ops[i]->workspace_floats(N, (int)D, (int)V));
        sum[i] =
            ops[i]->forward(ls[i], lse[i], ws[i], x, w, NULL, NULL, tg, proj, N, (int)D, (int)V);
        ops[i]->backward(dx[i], dw[i], ws[i], x, w, NULL, NULL, tg, lse[i], proj, N, (int)D, (int)V,
                         0.01f);
    }
    if (k->forward_backward) {
        /* The fused path training takes, against the same reference outputs. */
        float *fls = unwritten(N), *flse = unwritten(N), *fdx = unwritten(N * D);
        float *fdw = copy(dw0, V * D);
        float fsum = (float)k->forward_backward(fls, flse, fdx, fdw, ws[1], x, w, NULL, NULL, tg,
                                                proj, N, (int)D, (int)V, 0.01f);
        float rsum = (float)sum[0];
        cmp(c, "fused loss_sum", &fsum, &rsum, 1);
        cmp(c, "fused losses", fls, ls[0], N);
        cmp(c, "fused lse", flse, lse[0], N);
        cmp(c, "fused dx", fdx, dx[0], N * D);
        cmp(c, "fused dw", fdw, dw[0], V * D);
        free(fls), free(flse), free(fdx), free(fdw);
    }
    float fs[2] = {(float)sum[0], (float)sum[1]};
    cmp(c, "loss_sum", &fs[1], &fs[0], 1);
    cmp(c, "losses", ls[1], ls[0], N);
    cmp(c, "lse", lse[1], lse[0], N);
    cmp(c, "dx", dx[1], dx[0], N * D);
    cmp(c, "dw", dw[1], dw[0], V * D);
    /* Frozen (ops/op.h); backward used the logits workspace up, so forward again. */
    k->forward(ls[1], lse[1], ws[1], x, w, NULL, NULL, tg, proj, N, (int)D, (int)V);
    k->backward(dx[1], NULL, ws[1], x, w, NULL, NULL, tg, lse[1], proj, N, (int)D, (int)V, 0.01f);
    cmp(c, "frozen:dx", dx[1], dx[0], N * D);
    for (int i = 0; i < 2; i++)
        free(ls[i]), free(lse[i]), free(ws[i]), free(dx[i]), free(dw[i]);
    free(x), free(w), free(dw0), free(tg);
}

static void verify_moe_experts(Cmp *c, const OpHeader *kh, const VerifyShape *s, Rng *g) {
    const MoeExpertsOp *k = (const MoeExpertsOp *)kh;
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
    MoeExpertsBufs b;
    for (int i = 0; i < 2; i++) {
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
    /* Frozen (ops/op.h): b is the kernel's buffers, still holding its forward. */
    k->backward(dx[1], dgw[1], NULL, NULL, NULL, &b, dout, x, idx, gw, w1, w3, w2, N, (int)kk,
                (int)D, (int)F, (int)X);
    cmp(c, "frozen:dx", dx[1], dx[0], N * D);
    cmp(c, "frozen:dgw", dgw[1], dgw[0], N * kk);
    for (int i = 0; i < 2; i++)
        free(o[i]), free(dx[i]), free(dgw[i]), free(dw1[i]), free(dw3[i]), free(dw2[i]),
            free(sv[i]), free(sc[i]), free(in[i]);
    free(x), free(gw), free(dout), free(w1), free(w3), free(w2), free(dw0), free(idx);
}

static void verify_embedding(Cmp *c, const OpHeader *kh, const VerifyShape *s, Rng *g) {
    const EmbeddingOp *k = (const EmbeddingOp *)kh;
    const EmbeddingOp *r = (const EmbeddingOp *)op_reference(OP_EMBEDDING);
    long N = (long)s->B * s->T, D = s->D, V = s->V;
    float *table = randn(g, V * D, 1.0f), *dout = randn(g, N * D, 1.0f);
    float *dt0 = randn(g, V * D, 0.1f); /* gradients accumulate onto this start */
    int32_t *tok = xmalloc((size_t)N * sizeof *tok);
    for (long i = 0; i < N; i++) /* repeats, so the scatter-add sums rows */
        tok[i] = (int32_t)rng_below(g, (uint64_t)(V > 3 ? V / 3 : V));
    const EmbeddingOp *ops[2] = {r, k};
    float *o[2], *dt[2];
    for (int i = 0; i < 2; i++) {
        o[i] = unwritten(N * D), dt[i] = copy(dt0, V * D);
        ops[i]->forward(o[i], tok, table, N, (int)D);
        ops[i]->backward(dt[i], dout, tok, N, (int)D);
    }
    cmp(c, "out", o[1], o[0], N * D);
    cmp(c, "dtable", dt[1], dt[0], V * D);
    for (int i = 0; i < 2; i++)
        free(o[i]), free(dt[i]);
    free(table), free(dout), free(dt0), free(tok);
}

static void verify_linear(Cmp *c, const OpHeader *kh, const VerifyShape *s, Rng *g) {
    const LinearOp *k = (const LinearOp *)kh;
    const LinearOp *r = (const LinearOp *)op_reference(OP_LINEAR);
    long N = (long)s->B * s->T, I = s->D, O = s->F;
    float *x = randn(g, N * I, 1.0f), *w = randn(g, O * I, 1.0f / sqrtf((float)I));
    float *dout = randn(g, N * O, 1.0f), *dw0 = randn(g, O * I, 0.01f);
    float *dx0 = randn(g, N * I, 1.0f); /* dx_beta = 1 adds onto it */
    const LinearOp *ops[2] = {r, k};
    float *o[2], *dx[2], *dxa[2], *dw[2];
    for (int i = 0; i < 2; i++) {
        o[i] = unwritten(N * O), dx[i] = unwritten(N * I), dxa[i] = copy(dx0, N * I);
        dw[i] = copy(dw0, O * I);
        ops[i]->forward(o[i], x, w, N, (int)I, (int)O);
        ops[i]->backward(dx[i], dw[i], dout, x, w, N, (int)I, (int)O, 0.0f);
        ops[i]->backward(dxa[i], dw[i], dout, x, w, N, (int)I, (int)O, 1.0f);
    }
    cmp(c, "out", o[1], o[0], N * O);
    cmp(c, "dx", dx[1], dx[0], N * I);
    cmp(c, "dx+=", dxa[1], dxa[0], N * I);
    cmp(c, "dw", dw[1], dw[0], O * I);
    k->backward(dx[1], NULL, dout, x, w, N, (int)I, (int)O, 0.0f); /* frozen (ops/op.h) */
    cmp(c, "frozen:dx", dx[1], dx[0], N * I);
    for (int i = 0; i < 2; i++)
        free(o[i]), free(dx[i]), free(dxa[i]), free(dw[i]);
    free(x), free(w), free(dout), free(dw0), free(dx0);
}

static void verify_cross_entropy(Cmp *c, const OpHeader *kh, const VerifyShape *s, Rng *g) {
    const CrossEntropyOp *k = (const CrossEntropyOp *)kh;
    const CrossEntropyOp *r = (const CrossEntropyOp *)op_reference(OP_CROSS_ENTROPY);
    long N = (long)s->B * s->T, V = s->V;
    float *logits = randn(g, N * V, 2.0f);
    int32_t *tg = xmalloc((size_t)N * sizeof *tg);
    for (long i = 0; i < N; i++)
        tg[i] = i % 7 == 3 ? CE_IGNORE : (int32_t)rng_below(g, (uint64_t)V);
    const CrossEntropyOp *ops[2] = {r, k};
    float *ls[2], *lse[2], *dl[2];
    float sum[2];
    for (int i = 0; i < 2; i++) {
        ls[i] = unwritten(N), lse[i] = unwritten(N), dl[i] = unwritten(N * V);
        sum[i] = (float)ops[i]->forward(ls[i], lse[i], logits, tg, N, (int)V);
        ops[i]->backward(dl[i], logits, lse[i], tg, N, (int)V, 0.01f);
    }
    cmp(c, "loss_sum", &sum[1], &sum[0], 1);
    cmp(c, "losses", ls[1], ls[0], N);
    cmp(c, "lse", lse[1], lse[0], N);
    cmp(c, "dlogits", dl[1], dl[0], N * V);
    for (int i = 0; i < 2; i++)
        free(ls[i]), free(lse[i]), free(dl[i]);
    free(logits), free(tg);
}

/* The shape label of each kind. */
static void label_embedding(char *b, unsigned n, const VerifyShape *s) {
    snprintf(b, n, "N%d D%d V%d", s->B * s->T, s->D, s->V);
}
static void label_rmsnorm(char *b, unsigned n, const VerifyShape *s) {
    snprintf(b, n, "R%d C%d", s->B * s->T, s->D);
}
static void label_linear(char *b, unsigned n, const VerifyShape *s) {
    snprintf(b, n, "N%d I%d O%d", s->B * s->T, s->D, s->F);
}
static void label_rope(char *b, unsigned n, const VerifyShape *s) {
    int scaled = s->rope && s->rope->rope_scaling.type != ROPE_PLAIN;
    snprintf(b, n, "B%d T%d heads%d E%d%s%s", s->B, s->T, s->H, s->E, scaled ? " " : "",
             scaled ? model_spec_rope_name(s->rope->rope_scaling.type) : "");
}
static void label_sdpa(char *b, unsigned n, const VerifyShape *s) {
    snprintf(b, n, "B%d T%d H%d K%d E%d%s", s->B, s->T, s->H, s->K, s->E, s->doc ? " doc" : "");
}
static void label_swiglu(char *b, unsigned n, const VerifyShape *s) {
    snprintf(b, n, "N%d D%d F%d", s->B * s->T, s->D, s->F);
}
static void label_cross_entropy(char *b, unsigned n, const VerifyShape *s) {
    snprintf(b, n, "N%d V%d", s->B * s->T, s->V);
}
static void label_lm_head_loss(char *b, unsigned n, const VerifyShape *s) {
    snprintf(b, n, "N%d D%d V%d", s->B * s->T, s->D, s->V);
}
static void label_moe_experts(char *b, unsigned n, const VerifyShape *s) {
    snprintf(b, n, "N%d D%d F%d X%d k%d", s->B * s->T, s->D, s->F, s->X, s->k);
}

/* The default shapes per kind: small, ragged where supports() allows (odd rows, columns, head
 * counts, documents of uneven length), and across tile / chunk edges. */
static const VerifyShape embedding_shapes[] = {
    {.B = 1, .T = 7, .D = 16, .V = 37},
    {.B = 2, .T = 65, .D = 257, .V = 1001},
};
static const VerifyShape rmsnorm_shapes[] = {
    {.B = 1, .T = 7, .D = 16},
    {.B = 3, .T = 11, .D = 257},
    {.B = 1, .T = 64, .D = 1024},
};
static const VerifyShape linear_shapes[] = {
    {.B = 1, .T = 7, .D = 16, .F = 24},
    {.B = 2, .T = 33, .D = 257, .F = 96},
};
/* YaRN (factor 4 over an original context of 16), whose frequencies and scale differ from
 * plain RoPE's in every dim. */
static const ModelSpec rope_yarn = {.head_dim = 32,
                                    .rope_theta = 1e4,
                                    .rope_scaling = {.type = ROPE_YARN,
                                                     .factor = 4,
                                                     .original_max_seq_len = 16,
                                                     .beta_fast = 32,
                                                     .beta_slow = 1,
                                                     .truncate = 1}};
static const VerifyShape rope_shapes[] = {
    {.B = 2, .T = 7, .H = 3, .E = 8, .theta = 1e6},
    {.B = 2, .T = 40, .H = 2, .E = 32, .rope = &rope_yarn},
    {.B = 1, .T = 33, .H = 5, .E = 128, .theta = 1e6},
    {.B = 3, .T = 64, .H = 1, .E = 2, .theta = 1e4},
};
static const VerifyShape sdpa_shapes[] = {
    {.B = 1, .T = 64, .H = 2, .K = 1, .E = 16},
    {.B = 2, .T = 128, .H = 4, .K = 2, .E = 32, .doc = 1},
    {.B = 1, .T = 192, .H = 3, .K = 3, .E = 8, .doc = 1},
    {.B = 1, .T = 128, .H = 2, .K = 1, .E = 128},
};
static const VerifyShape swiglu_shapes[] = {
    {.B = 1, .T = 7, .D = 16, .F = 24},
    {.B = 1, .T = 65, .D = 64, .F = 96},
    {.B = 2, .T = 33, .D = 48, .F = 200},
};
static const VerifyShape cross_entropy_shapes[] = {
    {.B = 1, .T = 5, .V = 37},
    {.B = 3, .T = 67, .V = 1001},
};
static const VerifyShape lm_head_loss_shapes[] = {
    {.B = 1, .T = 5, .D = 16, .V = 37},
    {.B = 1, .T = 300, .D = 32, .V = 1001},
    {.B = 3, .T = 171, .D = 8, .V = 257},
};
static const VerifyShape moe_experts_shapes[] = {
    {.B = 1, .T = 9, .D = 16, .F = 8, .X = 4, .k = 2},
    {.B = 2, .T = 37, .D = 48, .F = 24, .X = 16, .k = 4},
    {.B = 1, .T = 64, .D = 64, .F = 32, .X = 8, .k = 8},
};

/* Per kind, from QT_OP_KINDS: a new kind fails to compile until it has verify_<id>, label_<id>
 * and <id>_shapes here. */
typedef struct KindCheck {
    void (*run)(Cmp *c, const OpHeader *k, const VerifyShape *s, Rng *g);
    void (*label)(char *buf, unsigned cap, const VerifyShape *s);
    const VerifyShape *shapes;
    int nshapes;
} KindCheck;

static const KindCheck CHECKS[OP_NKINDS] = {
#define QT_OP_CHECK(ID, id, name, Type, ref)                                                       \
    [OP_##ID] = {verify_##id, label_##id, id##_shapes,                                             \
                 (int)(sizeof id##_shapes / sizeof id##_shapes[0])},
    QT_OP_KINDS(QT_OP_CHECK)
#undef QT_OP_CHECK
};

void verify_kernel(VerifyResult *r, const KernelInfo *k, const VerifyShape *sh, unsigned seed) {
    memset(r, 0, sizeof *r);
    r->ok = 1;
    Cmp c = {r, k->tol_abs, k->tol_rel};
    Rng g;
    rng_seed(&g, seed, 7);
    CHECKS[k->op->kind].run(&c, k->op, sh, &g);
}

void verify_shape_label(char *buf, unsigned cap, OpKind kind, const VerifyShape *s) {
    CHECKS[kind].label(buf, cap, s);
}

const VerifyShape *verify_shapes(OpKind kind, int *n) {
    *n = CHECKS[kind].nshapes;
    return CHECKS[kind].shapes;
}
