/* qtitan's side of the generation benchmark (bench/generate/run.sh): prompt processing
 * (decoder_prefill over P tokens) and per-token greedy decode (decoder_step, batch 1) on an HF
 * directory, with bf16 or fp32 weights, and decode against the memory-bandwidth limit: the
 * bytes of weights one token reads divided into the measured copy bandwidth.
 * Usage: bench_generate MODEL_DIR float32|bfloat16 NEW P1 [P2 ...] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/timer.h"
#include "infer/decode.h"
#include "infer/infer_model.h"

/* STREAM's copy convention: bytes read + bytes written per second, best of 5 over 1 GiB. */
static double copy_bandwidth(void) {
    size_t n = (size_t)1 << 29;
    char *a = malloc(n), *b = malloc(n);
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = now_seconds();
#pragma omp parallel for schedule(static)
        for (int c = 0; c < 64; c++)
            memcpy(b + n / 64 * c, a + n / 64 * c, n / 64);
        double dt = now_seconds() - t0;
        if (dt < best) best = dt;
    }
    free(a), free(b);
    return 2.0 * (double)n / best;
}

/* Weights one decode token reads: every matmul weight (bf16 or fp32), norms in fp32, one
 * embedding row. */
static double weight_bytes(const ModelSpec *s, int bf16) {
    double D = s->dim, HE = (double)s->n_heads * s->head_dim,
           KE = (double)s->n_kv_heads * s->head_dim;
    double mm =
        s->n_layers * (2 * D * HE + 2 * D * KE + 3 * D * s->hidden_dim) + (double)s->vocab_size * D;
    return mm * (bf16 ? 2 : 4) + 4.0 * (s->n_layers * (2 * D + 2 * s->head_dim) + D + D);
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: bench_generate MODEL_DIR float32|bfloat16 NEW P1 [P2 ...]\n");
        return 2;
    }
    int bf16 = strcmp(argv[2], "bfloat16") == 0, new = atoi(argv[3]);
    InferModel im;
    Err err;
    if (infer_model_open(&im, argv[1], NULL, NULL, 1, 1, bf16, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    int V = im.m.spec.vocab_size, maxp = 0;
    for (int i = 4; i < argc; i++)
        if (atoi(argv[i]) > maxp) maxp = atoi(argv[i]);
    Decoder d;
    if (decoder_create(&d, &im.m, 1, maxp + new + 1, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    double bw = copy_bandwidth(), wb = weight_bytes(&im.m.spec, bf16);
    printf("copy bandwidth %.2f GB/s; weights read per token %.3f GB; limit %.2f tokens/s\n",
           bw / 1e9, wb / 1e9, bw / wb);
    float *logits = malloc((size_t)V * sizeof *logits);
    Rng r;
    rng_seed(&r, 0, 0);
    for (int i = 4; i < argc; i++) {
        int P = atoi(argv[i]);
        int32_t *ids = malloc((size_t)P * sizeof *ids);
        for (int t = 0; t < P; t++)
            ids[t] = (int32_t)rng_below(&r, (uint64_t)V);
        double best_pre = 1e30, best_dec = 1e30;
        for (int round = 0; round < 2; round++) { /* the first round warms up */
            decoder_reset(&d);
            double t0 = now_seconds();
            decoder_prefill(&d, 0, ids, P, logits);
            double t1 = now_seconds();
            int seq = 0;
            for (int g = 0; g < new; g++) {
                int32_t tok = argmax(logits, V);
                decoder_step(&d, &seq, &tok, 1, logits);
            }
            double t2 = now_seconds();
            if (t1 - t0 < best_pre) best_pre = t1 - t0;
            if (t2 - t1 < best_dec) best_dec = t2 - t1;
        }
        printf("qtitan %s P=%d: prefill %.1f tokens/s, decode %.2f tokens/s (%d threads), "
               "%.0f%% of the bandwidth limit\n",
               argv[2], P, P / best_pre, new / best_dec, omp_get_max_threads(),
               100.0 * (new / best_dec) / (bw / wb));
        fflush(stdout);
        free(ids);
    }
    free(logits);
    decoder_free(&d);
    infer_model_close(&im);
    return 0;
}
