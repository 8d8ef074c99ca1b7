/* sdpa "cpu": the default CPU attention. Same math as the reference (ops/sdpa.c), computed on
 * blocks of SDPA_BQ query rows of one head against chunks of up to SDPA_BK keys, so that the
 * four kinds of products (scores Q K^T, output P V, and in backward dP = dO V^T, dQ = dS K,
 * dK = dS^T Q, dV = P^T dO) are GEMMs (ops/gemm.h) reading the token-major tensors in place
 * through their row strides; only the softmax and the masks are vector loops. Chunks past the
 * causal diagonal or before the block's earliest document start are skipped, and the forward
 * keeps a running max and sum per row across chunks (online softmax), so no T x T matrix is
 * stored whatever the sequence length.
 *
 * Threads: forward is parallel over (batch, head, query block); backward over (batch, kv head),
 * so each thread owns its dK / dV rows and walks the kv head's query heads and blocks in order.
 * Each unit is computed by one thread, whose GEMMs run single-threaded inside the parallel
 * region, so the result does not depend on the thread count (tests/test_cpu_ops.c checks it
 * bitwise). Each thread takes its score scratch (2 x SDPA_BQ x SDPA_BK floats, 128 KiB) from the
 * heap once per call.
 *
 * Mixed precision (forward_bf16 / backward_bf16): the same blocks with every product's inputs
 * in bf16 (q, k, v and dout cast once per call, P and dS per chunk) and fp32 accumulation, as
 * PyTorch's CPU autocast runs attention; the softmax, its max and sum, lse and the outputs stay
 * fp32. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "kernels/cpu_ops.h"
#include "kernels/cpu_simd.h"
#include "ops/gemm.h"

#define SDPA_BQ 64
#define SDPA_BK 256

/* A GEMM operand: fp32 values, and in mixed precision their bf16 copy (else NULL). */
typedef struct Operand {
    const float *f;
    const uint16_t *h;
} Operand;

static Operand at(Operand o, long off) {
    return (Operand){o.f + off, o.h ? o.h + off : NULL};
}

/* C = alpha op(A) op(B) + beta C, in bf16 when both operands have a bf16 copy. */
static void mm(int ta, int tb, int M, int N, int K, float alpha, Operand A, long lda, Operand B,
               long ldb, float beta, float *C, long ldc) {
    if (A.h && B.h)
        gemm_bf16(ta, tb, M, N, K, alpha, A.h, (int)lda, B.h, (int)ldb, beta, C, (int)ldc);
    else
        gemm_f32(ta, tb, M, N, K, alpha, A.f, (int)lda, B.f, (int)ldb, beta, C, (int)ldc);
}

/* A bf16 copy of x (n values) from the heap, cast in parallel; NULL when !bf16. */
static uint16_t *bf16_copy(int bf16, const float *x, long n) {
    if (!bf16) return NULL;
    uint16_t *h = xmalloc((size_t)n * sizeof *h);
    const long chunk = 1 << 16;
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i += chunk)
        simd_f32_to_bf16(h + i, x + i, n - i < chunk ? n - i : chunk);
    return h;
}

/* The bf16 copy of an nq x nk block of rows (stride SDPA_BK) into h, when h is not NULL. */
static Operand block_operand(const float *x, uint16_t *h, int nq, int nk) {
    if (h)
        for (int i = 0; i < nq; i++)
            simd_f32_to_bf16(h + (long)i * SDPA_BK, x + (long)i * SDPA_BK, nk);
    return (Operand){x, h};
}

/* Rows t0 .. t0+nq-1 of a block: start[i] is the first key row t0+i may see (its document's
 * first token, or 0). Starts never decrease along a row, so start[0] bounds the block. */
static void block_starts(int *start, const int32_t *db, int t0, int nq) {
    int s = 0;
    if (db) {
        s = t0;
        while (s > 0 && db[s - 1] == db[t0])
            s--;
    }
    for (int i = 0; i < nq; i++) {
        int t = t0 + i;
        if (db && i > 0 && db[t - 1] != db[t]) s = t;
        start[i] = s;
    }
}

static float row_max(const float *x, int lo, int hi, float init) {
    float m = init;
#pragma omp simd reduction(max : m)
    for (int j = lo; j < hi; j++)
        m = x[j] > m ? x[j] : m;
    return m;
}

static float row_sum(const float *x, int lo, int hi) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int j = lo; j < hi; j++)
        s += x[j];
    return s;
}

/* Keys [lo, hi) of row i within the chunk of nk keys from s0 (empty when lo >= hi). */
static void row_range(const int *start, int t0, int s0, int nk, int i, int *lo, int *hi) {
    int a = start[i] - s0, b = t0 + i + 1 - s0;
    *lo = a > 0 ? a : 0;
    *hi = b < nk ? b : nk;
}

static void sdpa_forward_blocks(int bf16, float *out, float *lse, const float *q, const float *k,
                                const float *v, const int32_t *doc, int B, int T, int H, int K,
                                int E) {
    const float scale = (float)(1.0 / sqrt((double)E));
    const int rep = H / K, nblk = (T + SDPA_BQ - 1) / SDPA_BQ;
    const long qs = (long)H * E, ks = (long)K * E; /* token strides */
    const long units = (long)B * H * nblk;
    const Operand Q = {q, bf16_copy(bf16, q, (long)B * T * qs)};
    const Operand Kx = {k, bf16_copy(bf16, k, (long)B * T * ks)};
    const Operand Vx = {v, bf16_copy(bf16, v, (long)B * T * ks)};
#pragma omp parallel
    {
        float *S = xmalloc((size_t)SDPA_BQ * SDPA_BK * sizeof *S);
        uint16_t *Sh = bf16 ? xmalloc((size_t)SDPA_BQ * SDPA_BK * sizeof *Sh) : NULL;
#pragma omp for schedule(dynamic, 1)
        for (long u = 0; u < units; u++) {
            int b = (int)(u / ((long)H * nblk)), h = (int)(u / nblk % H);
            int t0 = (int)(u % nblk) * SDPA_BQ, nq = T - t0 < SDPA_BQ ? T - t0 : SDPA_BQ;
            const int32_t *db = doc ? doc + (long)b * T : NULL;
            const Operand kb = at(Kx, (long)b * T * ks + (long)(h / rep) * E);
            const Operand vb = at(Vx, (long)b * T * ks + (long)(h / rep) * E);
            const Operand qt = at(Q, ((long)b * T + t0) * qs + (long)h * E);
            float *ot = out + ((long)b * T + t0) * qs + (long)h * E;
            int start[SDPA_BQ];
            float mrow[SDPA_BQ], lrow[SDPA_BQ];
            block_starts(start, db, t0, nq);
            for (int i = 0; i < nq; i++)
                mrow[i] = -INFINITY, lrow[i] = 0.0f;
            int kend = t0 + nq, first = 1;
            for (int s0 = start[0]; s0 < kend; s0 += SDPA_BK, first = 0) {
                int nk = kend - s0 < SDPA_BK ? kend - s0 : SDPA_BK;
                mm(0, 1, nq, nk, E, scale, qt, qs, at(kb, (long)s0 * ks), ks, 0.0f, S, SDPA_BK);
                for (int i = 0; i < nq; i++) {
                    float *sr = S + (long)i * SDPA_BK;
                    int lo, hi;
                    row_range(start, t0, s0, nk, i, &lo, &hi);
                    float mx = row_max(sr, lo, hi, mrow[i]);
                    if (mx == -INFINITY) { /* no key of this chunk, none before */
                        memset(sr, 0, (size_t)nk * sizeof *sr);
                        continue;
                    }
                    for (int j = 0; j < lo; j++)
                        sr[j] = -INFINITY;
                    for (int j = hi; j < nk; j++)
                        sr[j] = -INFINITY;
#pragma omp simd
                    for (int j = 0; j < nk; j++)
                        sr[j] -= mx;
                    simd_exp(sr, sr, nk);
                    float corr = expf(mrow[i] - mx), sum = row_sum(sr, lo, hi);
                    lrow[i] = lrow[i] * corr + sum;
                    mrow[i] = mx;
                    if (!first && corr != 1.0f)
                        for (int e = 0; e < E; e++)
                            ot[i * qs + e] *= corr;
                }
                /* O (+)= P V over the chunk's keys */
                mm(0, 0, nq, E, nk, 1.0f, block_operand(S, Sh, nq, nk), SDPA_BK,
                   at(vb, (long)s0 * ks), ks, first ? 0.0f : 1.0f, ot, qs);
            }
            for (int i = 0; i < nq; i++) {
                float inv = 1.0f / lrow[i];
                for (int e = 0; e < E; e++)
                    ot[i * qs + e] *= inv;
                lse[((long)b * H + h) * T + t0 + i] = mrow[i] + logf(lrow[i]);
            }
        }
        free(S);
        free(Sh);
    }
    free((void *)Q.h), free((void *)Kx.h), free((void *)Vx.h);
}

static void sdpa_backward_blocks(int bf16, float *dq, float *dk, float *dv, const float *dout,
                                 const float *q, const float *k, const float *v, const float *out,
                                 const float *lse, const int32_t *doc, int B, int T, int H, int K,
                                 int E) {
    const float scale = (float)(1.0 / sqrt((double)E));
    const int rep = H / K;
    const long qs = (long)H * E, ks = (long)K * E;
    const Operand Q = {q, bf16_copy(bf16, q, (long)B * T * qs)};
    const Operand dO = {dout, bf16_copy(bf16, dout, (long)B * T * qs)};
    const Operand Kx = {k, bf16_copy(bf16, k, (long)B * T * ks)};
    const Operand Vx = {v, bf16_copy(bf16, v, (long)B * T * ks)};
#pragma omp parallel
    {
        float *P = xmalloc((size_t)2 * SDPA_BQ * SDPA_BK * sizeof *P);
        float *dS = P + SDPA_BQ * SDPA_BK; /* dP, then dS in place */
        uint16_t *Ph = bf16 ? xmalloc((size_t)2 * SDPA_BQ * SDPA_BK * sizeof *Ph) : NULL;
        uint16_t *dSh = Ph ? Ph + SDPA_BQ * SDPA_BK : NULL;
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int b = 0; b < B; b++)
            for (int kh = 0; kh < K; kh++) {
                const int32_t *db = doc ? doc + (long)b * T : NULL;
                const Operand kb = at(Kx, (long)b * T * ks + (long)kh * E);
                const Operand vb = at(Vx, (long)b * T * ks + (long)kh * E);
                float *dkb = dk + (long)b * T * ks + (long)kh * E;
                float *dvb = dv + (long)b * T * ks + (long)kh * E;
                int start[SDPA_BQ];
                float Dt[SDPA_BQ], z[SDPA_BQ];
                for (int t = 0; t < T; t++) {
                    memset(dkb + (long)t * ks, 0, (size_t)E * sizeof(float));
                    memset(dvb + (long)t * ks, 0, (size_t)E * sizeof(float));
                }
                for (int h = kh * rep; h < (kh + 1) * rep; h++)
                    for (int t0 = 0; t0 < T; t0 += SDPA_BQ) {
                        int nq = T - t0 < SDPA_BQ ? T - t0 : SDPA_BQ;
                        long qoff = ((long)b * T + t0) * qs + (long)h * E;
                        const Operand qt = at(Q, qoff), dot = at(dO, qoff);
                        const float *ot = out + qoff;
                        float *dqt = dq + qoff;
                        block_starts(start, db, t0, nq);
                        for (int i = 0; i < nq; i++) {
                            /* D_t = sum_s p_s dP_s = dout_t . out_t */
                            Dt[i] = simd_dot(dot.f + i * qs, ot + i * qs, E);
                            z[i] = lse[((long)b * H + h) * T + t0 + i];
                        }
                        int kend = t0 + nq, first = 1;
                        for (int s0 = start[0]; s0 < kend; s0 += SDPA_BK, first = 0) {
                            int nk = kend - s0 < SDPA_BK ? kend - s0 : SDPA_BK;
                            const Operand kc = at(kb, (long)s0 * ks), vc = at(vb, (long)s0 * ks);
                            mm(0, 1, nq, nk, E, scale, qt, qs, kc, ks, 0.0f, P, SDPA_BK);
                            mm(0, 1, nq, nk, E, 1.0f, dot, qs, vc, ks, 0.0f, dS, SDPA_BK);
                            for (int i = 0; i < nq; i++) {
                                float *pr = P + (long)i * SDPA_BK, *dsr = dS + (long)i * SDPA_BK;
                                int lo, hi;
                                row_range(start, t0, s0, nk, i, &lo, &hi);
#pragma omp simd
                                for (int j = 0; j < nk; j++)
                                    pr[j] -= z[i];
                                simd_exp(pr, pr, nk);
                                /* Masked keys have P = 0, hence dS = 0. */
                                for (int j = 0; j < lo; j++)
                                    pr[j] = 0.0f;
                                for (int j = hi > lo ? hi : lo; j < nk; j++)
                                    pr[j] = 0.0f;
                                float di = Dt[i];
#pragma omp simd
                                for (int j = 0; j < nk; j++)
                                    dsr[j] = pr[j] * (dsr[j] - di) * scale;
                            }
                            /* dv += P^T dout, dk += dS^T q, dq (+)= dS K over the chunk */
                            const Operand Pc = block_operand(P, Ph, nq, nk);
                            const Operand dSc = block_operand(dS, dSh, nq, nk);
                            mm(1, 0, nk, E, nq, 1.0f, Pc, SDPA_BK, dot, qs, 1.0f,
                               dvb + (long)s0 * ks, ks);
                            mm(1, 0, nk, E, nq, 1.0f, dSc, SDPA_BK, qt, qs, 1.0f,
                               dkb + (long)s0 * ks, ks);
                            mm(0, 0, nq, E, nk, 1.0f, dSc, SDPA_BK, kc, ks, first ? 0.0f : 1.0f,
                               dqt, qs);
                        }
                    }
            }
        free(P);
        free(Ph);
    }
    free((void *)Q.h), free((void *)dO.h), free((void *)Kx.h), free((void *)Vx.h);
}

static void cpu_sdpa_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                             const int32_t *doc, int B, int T, int H, int K, int E) {
    sdpa_forward_blocks(0, out, lse, q, k, v, doc, B, T, H, K, E);
}

static void cpu_sdpa_forward_bf16(float *out, float *lse, const float *q, const float *k,
                                  const float *v, const int32_t *doc, int B, int T, int H, int K,
                                  int E) {
    sdpa_forward_blocks(1, out, lse, q, k, v, doc, B, T, H, K, E);
}

static void cpu_sdpa_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                              const float *k, const float *v, const float *out, const float *lse,
                              const int32_t *doc, int B, int T, int H, int K, int E) {
    sdpa_backward_blocks(0, dq, dk, dv, dout, q, k, v, out, lse, doc, B, T, H, K, E);
}

static void cpu_sdpa_backward_bf16(float *dq, float *dk, float *dv, const float *dout,
                                   const float *q, const float *k, const float *v,
                                   const float *out, const float *lse, const int32_t *doc, int B,
                                   int T, int H, int K, int E) {
    sdpa_backward_blocks(1, dq, dk, dv, dout, q, k, v, out, lse, doc, B, T, H, K, E);
}

const SdpaOp sdpa_cpu = {.h = {.name = "cpu", .kind = OP_SDPA, .device = "cpu"},
                         .forward = cpu_sdpa_forward,
                         .backward = cpu_sdpa_backward,
                         .forward_bf16 = cpu_sdpa_forward_bf16,
                         .backward_bf16 = cpu_sdpa_backward_bf16};
