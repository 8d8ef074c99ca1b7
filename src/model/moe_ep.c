/* Expert parallelism for the MoE block: dispatch, the local experts, combine (model/moe_ep.h). */
#include "model/moe_ep.h"

#include <stdlib.h>
#include <string.h>

#include "core/err.h"

/* What backward needs of a layer's forward. */
struct MoeEpLayer {
    long A, M;          /* assignments sent, rows received */
    int32_t *row;       /* (A) send row of assignment a (expert order) */
    int32_t *order;     /* (A) assignment of send row r */
    size_t *sent_rows;  /* (P) rows sent to each rank */
    size_t *recv_rows;  /* (P) rows received from each rank */
    float *recv_counts; /* (P, Xl) rows received from each rank for each local expert */
    float *xr;          /* (M, D) received input rows */
    float *ysend;       /* (A, D) the experts' outputs of this rank's assignments */
    float *saved;       /* the experts op's saved floats for M rows */
    int32_t *ints;      /* and its saved ints */
    size_t row_cap, order_cap, xr_cap, y_cap, saved_cap, ints_cap;
};

/* Grows *buf to at least n elements of size es (never shrinks; at least one element, so an
 * empty run still has an address to give MPI). */
static void grow(void *buf, size_t *cap, size_t n, size_t es) {
    if (n < 1) n = 1;
    if (n <= *cap) return;
    void **p = buf;
    free(*p);
    *p = xmalloc(n * es);
    *cap = n;
}

MoeEp *moe_ep_create(int P, int q, int X, int tb, int tb_at, int L, MoeEpAllToAll fn, void *ctx) {
    MoeEp *ep = xcalloc(1, sizeof *ep);
    *ep = (MoeEp){.P = P,
                  .q = q,
                  .X = X,
                  .Xl = X / P,
                  .tb = tb,
                  .tb_at = tb_at,
                  .all_to_all = fn,
                  .ctx = ctx,
                  .L = L};
    ep->layers = xcalloc((size_t)L, sizeof *ep->layers);
    for (int l = 0; l < L; l++) {
        MoeEpLayer *y = &ep->layers[l];
        y->sent_rows = xcalloc((size_t)P, sizeof *y->sent_rows);
        y->recv_rows = xcalloc((size_t)P, sizeof *y->recv_rows);
        y->recv_counts = xcalloc((size_t)X, sizeof *y->recv_counts);
    }
    ep->counts = xcalloc(4 * (size_t)P, sizeof *ep->counts);
    ep->ecount = xcalloc(2 * (size_t)X, sizeof *ep->ecount);
    ep->cursor = xcalloc((size_t)X + 1, sizeof *ep->cursor);
    return ep;
}

void moe_ep_free(MoeEp *ep) {
    if (!ep) return;
    for (int l = 0; l < ep->L; l++) {
        MoeEpLayer *y = &ep->layers[l];
        free(y->row), free(y->order), free(y->sent_rows), free(y->recv_rows);
        free(y->recv_counts), free(y->xr), free(y->ysend), free(y->saved), free(y->ints);
    }
    free(ep->layers);
    free(ep->send), free(ep->recv), free(ep->rows_gw), free(ep->scratch), free(ep->rows_idx);
    free(ep->drows), free(ep->rows_dgw);
    free(ep->counts), free(ep->ecount), free(ep->cursor);
    free(ep);
}

long moe_ep_block(const MoeEp *ep, long N, long *first) {
    long n = N / ep->tb;
    *first = ep->tb_at * n;
    return n;
}

/* Rows per rank (run lengths) times `width` floats into out (P). */
static void scaled(size_t *out, const size_t *rows, int P, int width) {
    for (int p = 0; p < P; p++)
        out[p] = rows[p] * (size_t)width;
}

/* The received rows' local expert ids (source-major, expert order inside) and unit gate
 * weights, into the shared row buffers. */
static void rows_meta(MoeEp *ep, const MoeEpLayer *y) {
    grow(&ep->rows_idx, &ep->rows_cap, (size_t)y->M, sizeof(int32_t));
    grow(&ep->rows_gw, &ep->rows_gw_cap, (size_t)y->M, sizeof(float));
    long r = 0;
    for (int p = 0; p < ep->P; p++)
        for (int e = 0; e < ep->Xl; e++)
            for (long c = (long)y->recv_counts[p * ep->Xl + e]; c > 0; c--)
                ep->rows_idx[r++] = e;
    for (long i = 0; i < y->M; i++)
        ep->rows_gw[i] = 1.0f;
}

/* The experts op's buffers for the layer's M rows: saved per layer, scratch shared. */
static void place(MoeEp *ep, MoeEpLayer *y, MoeExpertsBufs *b, int D, int F) {
    long M = y->M > 0 ? y->M : 1;
    grow(&y->saved, &y->saved_cap, (size_t)moe_experts_saved_floats(M, 1, D, F), sizeof(float));
    grow(&y->ints, &y->ints_cap, (size_t)moe_experts_saved_ints(M, 1, ep->Xl), sizeof(int32_t));
    grow(&ep->scratch, &ep->scratch_cap, (size_t)moe_experts_scratch_floats(M, 1, D, F),
         sizeof(float));
    memset(b, 0, sizeof *b);
    moe_experts_bufs_place(b, y->saved, y->ints, ep->scratch, M, 1, D, F, ep->Xl);
}

void moe_ep_forward(MoeEp *ep, int l, const MoeExpertsOp *op, float *out, const float *x,
                    const int32_t *idx, const float *gw, const float *w1, const float *w3,
                    const float *w2, long N, int k, int D, int F) {
    MoeEpLayer *y = &ep->layers[l];
    int P = ep->P, X = ep->X, Xl = ep->Xl;
    long first, n = moe_ep_block(ep, N, &first), A = n * k;
    const int32_t *ix = idx + first * k;
    const float *g = gw + first * k;
    y->A = A;
    /* Stable counting sort of the block's assignments by expert: send row of each. */
    grow(&y->row, &y->row_cap, (size_t)A, sizeof(int32_t));
    grow(&y->order, &y->order_cap, (size_t)A, sizeof(int32_t));
    float *sent = ep->ecount, *got = ep->ecount + X;
    long *at = ep->cursor;
    memset(at, 0, ((size_t)X + 1) * sizeof *at);
    for (long a = 0; a < A; a++)
        at[ix[a] + 1]++;
    for (int e = 0; e < X; e++) {
        sent[e] = (float)at[e + 1];
        at[e + 1] += at[e];
    }
    for (long a = 0; a < A; a++) {
        long r = at[ix[a]]++;
        y->row[a] = (int32_t)r;
        y->order[r] = (int32_t)a;
    }
    /* Counts: Xl per peer, the peer's experts. */
    size_t *sc = ep->counts, *rc = sc + P;
    for (int p = 0; p < P; p++)
        sc[p] = rc[p] = (size_t)Xl;
    ep->all_to_all(ep->ctx, got, rc, sent, sc);
    memcpy(y->recv_counts, got, (size_t)X * sizeof *got);
    y->M = 0;
    for (int p = 0; p < P; p++) {
        y->sent_rows[p] = y->recv_rows[p] = 0;
        for (int e = 0; e < Xl; e++) {
            y->sent_rows[p] += (size_t)sent[p * Xl + e];
            y->recv_rows[p] += (size_t)got[p * Xl + e];
        }
        y->M += (long)y->recv_rows[p];
    }
    /* Dispatch the input rows. */
    grow(&ep->send, &ep->send_cap, (size_t)A * D, sizeof(float));
#pragma omp parallel for schedule(static)
    for (long r = 0; r < A; r++)
        memcpy(ep->send + r * D, x + (first + y->order[r] / k) * D, (size_t)D * sizeof(float));
    grow(&y->xr, &y->xr_cap, (size_t)y->M * D, sizeof(float));
    scaled(sc, y->sent_rows, P, D);
    scaled(rc, y->recv_rows, P, D);
    ep->all_to_all(ep->ctx, y->xr, rc, ep->send, sc);
    /* The local experts on the received rows. */
    rows_meta(ep, y);
    MoeExpertsBufs b;
    place(ep, y, &b, D, F);
    grow(&ep->recv, &ep->recv_cap, (size_t)y->M * D, sizeof(float));
    if (y->M > 0)
        op->forward(ep->recv, &b, y->xr, ep->rows_idx, ep->rows_gw, w1, w3, w2, y->M, 1, D, F, Xl);
    /* Combine: the outputs come back in send order. */
    grow(&y->ysend, &y->y_cap, (size_t)A * D, sizeof(float));
    ep->all_to_all(ep->ctx, y->ysend, sc, ep->recv, rc);
    if (ep->tb > 1) memset(out, 0, (size_t)N * D * sizeof *out);
#pragma omp parallel for schedule(static)
    for (long t = 0; t < n; t++) {
        float *o = out + (first + t) * D;
        memset(o, 0, (size_t)D * sizeof *o);
        for (int j = 0; j < k; j++) {
            const float *yr = y->ysend + (long)y->row[t * k + j] * D;
            float w = g[t * k + j];
            for (int d = 0; d < D; d++)
                o[d] += w * yr[d];
        }
    }
}

void moe_ep_backward(MoeEp *ep, int l, const MoeExpertsOp *op, float *dx, float *dgw, float *dw1,
                     float *dw3, float *dw2, const float *dout, const int32_t *idx, const float *gw,
                     const float *w1, const float *w3, const float *w2, long N, int k, int D,
                     int F) {
    (void)idx;
    MoeEpLayer *y = &ep->layers[l];
    int P = ep->P;
    long first, n = moe_ep_block(ep, N, &first), A = y->A;
    const float *g = gw + first * k;
    float *dg = dgw + first * k;
    /* Gate-weight gradients here; the weighted output gradients go to the experts' ranks. */
    grow(&ep->send, &ep->send_cap, (size_t)A * D, sizeof(float));
#pragma omp parallel for schedule(static)
    for (long a = 0; a < A; a++) {
        const float *dy = dout + (first + a / k) * D, *yr = y->ysend + (long)y->row[a] * D;
        float *s = ep->send + (long)y->row[a] * D, acc = 0.0f;
        for (int d = 0; d < D; d++) {
            acc += dy[d] * yr[d];
            s[d] = g[a] * dy[d];
        }
        dg[a] = acc;
    }
    size_t *sc = ep->counts, *rc = sc + P;
    scaled(sc, y->sent_rows, P, D);
    scaled(rc, y->recv_rows, P, D);
    grow(&ep->recv, &ep->recv_cap, (size_t)y->M * D, sizeof(float));
    ep->all_to_all(ep->ctx, ep->recv, rc, ep->send, sc);
    rows_meta(ep, y);
    MoeExpertsBufs b;
    place(ep, y, &b, D, F);
    /* The rows' input gradients, and their (unused) gate-weight gradients. */
    grow(&ep->drows, &ep->drows_cap, (size_t)y->M * D, sizeof(float));
    grow(&ep->rows_dgw, &ep->rows_dgw_cap, (size_t)y->M, sizeof(float));
    if (y->M > 0)
        op->backward(ep->drows, ep->rows_dgw, dw1, dw3, dw2, &b, ep->recv, y->xr, ep->rows_idx,
                     ep->rows_gw, w1, w3, w2, y->M, 1, D, F, ep->Xl);
    ep->all_to_all(ep->ctx, ep->send, sc, ep->drows, rc);
    if (ep->tb > 1) memset(dx, 0, (size_t)N * D * sizeof *dx);
#pragma omp parallel for schedule(static)
    for (long t = 0; t < n; t++) {
        float *o = dx + (first + t) * D;
        memset(o, 0, (size_t)D * sizeof *o);
        for (int j = 0; j < k; j++) {
            const float *src = ep->send + (long)y->row[t * k + j] * D;
            for (int d = 0; d < D; d++)
                o[d] += src[d];
        }
    }
}
