/* Inference on a Qwen3 model (dense and MoE, fp32 or bf16 weights): a KV cache sized up front,
 * the prefill of one sequence's prompt, and batched one-token decode steps. Every op runs
 * through the model's own module implementations (m->mod: the CPU kernels or the overrides
 * training uses) and the same bf16 path, so a prefill computes what qwen3_forward computes.
 * Local to this file are attention against the cache during decode (one query row per
 * sequence, which the training sdpa op does not take) and, with bf16 weights, the products of
 * a decode step of up to 4 rows: such a step reads every weight once for a few rows, so they go
 * through kernels/gemv_bf16.h (the bf16 inputs and fp32 accumulation of the bf16 linear ops,
 * added in another order); a step of more rows runs the model's ops. Nothing is allocated after
 * decoder_create.
 *
 * Letters as in model/qwen3.h; S sequences (cache rows), C cache positions per sequence. */
#ifndef QT_DECODE_H
#define QT_DECODE_H

#include <stdint.h>

#include "core/arena.h"
#include "core/err.h"
#include "model/qwen3.h"
#include "ops/moe_experts.h"

/* Called before each unit of the model runs (0 the embedding, 1 + l layer l, n_layers + 1 the
 * final norm and lm_head), so a driver can bring its weights in just then. */
typedef void (*DecoderFetchFn)(void *ctx, int unit);

typedef struct Decoder {
    Qwen3 *m; /* weights and module implementations; not owned */
    Arena mem;
    DecoderFetchFn fetch; /* NULL: m holds every weight all along */
    void *fetch_ctx;
    int S;          /* sequences */
    int C;          /* cache positions per sequence: prompt + generated tokens */
    long R;         /* rows one call processes: max(C, S) */
    float *kc, *vc; /* (L, S, C, K*E) keys after q/k norm and rope; values */
    int *len;       /* (S) positions filled */
    int32_t *ids;   /* (S, C) the ids of the positions filled */
    /* Work rows (R of each). */
    float *x, *out, *xmid;  /* (R, D) residual stream, layer output, x + attention */
    float *xn, *xn2;        /* (R, D) norm outputs */
    float *rstd;            /* (R * H) norm rstd (largest: q_norm) */
    float *q, *qn, *qr;     /* (R, H*E) */
    float *k, *kn, *kr, *v; /* (R, K*E) */
    float *att;             /* (R, H*E) */
    float *lse;             /* (H * C) prefill sdpa */
    float *scores;          /* (S * H, C) decode attention */
    float *h1, *h3, *g;     /* (R, F) */
    float *ffn_ws;          /* the feed-forward kernel's declared workspace, or NULL */
    int32_t *pos;           /* (R) each row's position */
    int *row_seq;           /* (R) each row's sequence, for decoder_extend */
    uint16_t *scratch;      /* bf16 casts of matmul inputs */
    /* MoE layers */
    float *router_logits, *probs; /* (R, X) */
    int32_t *topk_idx;            /* (R, k) */
    float *topk_w;                /* (R, k) */
    MoeExpertsBufs ex;
    float *ex_mem;
    int32_t *ex_ints;
} Decoder;

/* Sizes the cache for S sequences of up to C positions each and the work rows. The model's
 * parameters must stay where they are while the decoder lives; with mixed precision on
 * (m->bf16) the caller refreshes the bf16 copies (qwen3_refresh_bf16) after changing weights. */
int decoder_create(Decoder *d, Qwen3 *m, int S, int C, Err *err);
/* Bytes decoder_create allocates for a model of spec running mod (bf16: mixed precision on). */
size_t decoder_bytes(const ModelSpec *spec, const Qwen3Modules *mod, int bf16, int S, int C);
void decoder_free(Decoder *d);
/* Empties every sequence's cache. */
void decoder_reset(Decoder *d);

/* Runs prompt ids[0..T) of sequence s from an empty cache (T <= C) and writes the logits of
 * its last position to logits (V). Ids must be checked against the vocabulary. */
void decoder_prefill(Decoder *d, int s, const int32_t *ids, int T, float *logits);
/* Appends ids[0..T) to sequence s after the positions its cache holds (len[s] + T <= C; from
 * an empty cache this is decoder_prefill) and writes the logits of the last to logits (V): the
 * new rows go through the model's ops as a prompt's do, each attending to the cache and the
 * rows before it. A conversation's next turn runs only what its cache does not hold yet. */
void decoder_extend(Decoder *d, int s, const int32_t *ids, int T, float *logits);
/* Sequence s keeps its first n cached positions (n >= its length: unchanged). */
void decoder_truncate(Decoder *d, int s, int n);
/* Keeps the longest run of sequence s's cached positions that holds ids[0..n) for the prompt
 * ids[0..T), at most T - 1 of them (the last prompt position is always run, for its logits):
 * the rest is run again by the next decoder_extend. Returns the positions kept. */
int decoder_reuse(Decoder *d, int s, const int32_t *ids, int T);
/* Sequence dst's cache becomes a copy of sequence src's (several completions of one prompt). */
void decoder_copy(Decoder *d, int dst, int src);
/* Appends row r's token ids[r] to sequence seq[r], after the positions its cache holds and the
 * rows before r of the same sequence (a decode step: one row a sequence; candidates checked in
 * one pass: several, generate.h), n rows in all (at most R, each sequence within its C
 * positions); logits (n, V) of every row. */
void decoder_step(Decoder *d, const int *seq, const int32_t *ids, int n, float *logits);

#endif
