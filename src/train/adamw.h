/* AdamW with decoupled weight decay, computed in fp32 in the same operation order as
 * torch.optim.AdamW's single-tensor CPU path, so parameters after N steps agree with torch to
 * rounding; with AdamWConfig.l2, torch.optim.Adam (torchtitan's optimizer.name = "Adam"), whose
 * weight decay is added to the gradient instead. The optimizer state (exp_avg m, exp_avg_sq v)
 * lives in one arena sized at init. */
#ifndef QT_ADAMW_H
#define QT_ADAMW_H

#include <stddef.h>
#include <stdint.h>

#include "core/arena.h"
#include "core/err.h"

typedef struct AdamWConfig {
    double beta1, beta2; /* torch defaults 0.9, 0.999; torchtitan uses 0.9, 0.95 */
    double eps;
    double weight_decay; /* applied only to tensors with decay = 1 */
    /* 0: decoupled (AdamW: p *= 1 - lr wd). 1: L2, as torch.optim.Adam: g += wd p before the
     * moments, so the decay passes through Adam's normalisation. */
    int l2;
} AdamWConfig;

/* One parameter tensor the optimizer updates; param and grad are caller-owned. */
typedef struct AdamWParam {
    const char *name;  /* FQN, for checkpoints and errors (borrowed) */
    float *param;      /* (n) */
    const float *grad; /* (n) */
    size_t n;
    int decay; /* 1: weight decay applies; 0: exempt (param_decays in core/param_table.h) */
} AdamWParam;

typedef struct AdamW {
    AdamWConfig cfg;
    int64_t step; /* completed steps; bias corrections use step + 1 on the next update */
    int nparams;
    AdamWParam *params; /* (nparams), copied at init */
    float **m;          /* (nparams) pointers into state: exp_avg per tensor */
    float **v;          /* (nparams) pointers into state: exp_avg_sq per tensor */
    /* (nparams) adamw_set_copies: param i's low-precision copy and, when it is widened, its
     * values; NULL entries (and all NULL before the call): none. */
    uint16_t **copy;
    float **wide;
    Arena state;
} AdamW;

/* Copies the parameter table and allocates zeroed m and v for every element. */
int adamw_init(AdamW *opt, const AdamWConfig *cfg, const AdamWParam *params, int nparams, Err *err);
void adamw_free(AdamW *opt);
/* copies (nparams, NULL entries allowed): the low-precision copy of each parameter that a
 * model's bf16 products read (ops/gemm.h: bf16, or a widened copy's handle), written from the
 * updated values by every update from now on (and repacked where the products read a packed
 * form: gemm_bf16_weight_written). */
void adamw_set_copies(AdamW *opt, uint16_t *const *copies);
/* One update of every parameter with learning rate lr (increments opt->step first, as torch
 * does), and of each parameter's copy where it has one, a run of elements at a time while they
 * are in cache (so no separate pass casts the weights). Elementwise and statically
 * partitioned over OpenMP threads, so results do not depend on the thread count. */
void adamw_step(AdamW *opt, double lr);
/* adamw_step on the gradients times grad_scale (a clipping coefficient from grad_clip_coef),
 * bitwise as if they had been scaled in place first, without writing them. */
void adamw_step_scaled(AdamW *opt, double lr, float grad_scale);

#endif
