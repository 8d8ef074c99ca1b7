/* AdamW update in torch's fp32 operation order (torch/optim/adam.py, _single_tensor_adam with
 * decoupled weight decay):
 *   p *= 1 - lr*wd        (Adam, AdamWConfig.l2: g = g + wd*p instead)
 *   m  = lerp(m, g, 1 - b1)
 *   v  = v*b2 + (1 - b2)*g*g
 *   denom = sqrt(v) / sqrt(1 - b2^t) + eps
 *   p += -(lr / (1 - b1^t)) * m / denom
 * Scalars are computed in double (Python floats) and rounded to fp32 once, as torch does when
 * it passes them to its fp32 kernels. */
#include "train/adamw.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu_simd.h"
#include "ops/gemm.h"

/* Elements updated before their copy is written: x, g, m, v and the copy of a run stay in
 * L2. The split over threads is by runs; every element's result is independent of it. */
#define ADAMW_RUN 8192L

int adamw_init(AdamW *opt, const AdamWConfig *cfg, const AdamWParam *params, int nparams,
               Err *err) {
    memset(opt, 0, sizeof *opt);
    opt->cfg = *cfg;
    if (!(cfg->beta1 >= 0 && cfg->beta1 < 1) || !(cfg->beta2 >= 0 && cfg->beta2 < 1))
        return err_set(err, "optimizer betas must be in [0, 1), got beta1 %g and beta2 %g",
                       cfg->beta1, cfg->beta2);
    if (!(cfg->eps >= 0)) return err_set(err, "optimizer eps must be >= 0, got %g", cfg->eps);
    opt->nparams = nparams;
    opt->params = xcalloc((size_t)(nparams > 0 ? nparams : 1), sizeof *opt->params);
    opt->m = xcalloc((size_t)(nparams > 0 ? nparams : 1), sizeof *opt->m);
    opt->v = xcalloc((size_t)(nparams > 0 ? nparams : 1), sizeof *opt->v);
    opt->copy = xcalloc((size_t)(nparams > 0 ? nparams : 1), sizeof *opt->copy);
    opt->wide = xcalloc((size_t)(nparams > 0 ? nparams : 1), sizeof *opt->wide);
    if (nparams > 0) memcpy(opt->params, params, (size_t)nparams * sizeof *params);
    /* Same layout code twice: once to size the arena, once to place the tensors. */
    Arena count;
    arena_init_counting(&count, "optimizer state");
    for (int i = 0; i < nparams; i++) {
        arena_floats(&count, params[i].n);
        arena_floats(&count, params[i].n);
    }
    if (arena_init(&opt->state, "optimizer state", count.used > 0 ? count.used : 64, err) != 0) {
        adamw_free(opt);
        return -1;
    }
    for (int i = 0; i < nparams; i++) {
        opt->m[i] = arena_floats(&opt->state, params[i].n);
        opt->v[i] = arena_floats(&opt->state, params[i].n);
    }
    return 0;
}

void adamw_free(AdamW *opt) {
    free(opt->params);
    free(opt->m);
    free(opt->v);
    free(opt->copy);
    free(opt->wide);
    arena_free(&opt->state);
    memset(opt, 0, sizeof *opt);
}

void adamw_set_copies(AdamW *opt, uint16_t *const *copies) {
    for (int i = 0; i < opt->nparams; i++) {
        opt->copy[i] = copies[i];
        opt->wide[i] = copies[i] ? gemm_widened_values(copies[i]) : NULL;
    }
}

void adamw_step(AdamW *opt, double lr) {
    adamw_step_scaled(opt, lr, 1.0f);
}

/* The scalars of one update, computed once per step. */
typedef struct Coefs {
    float decay_mul, l2, w1, b2, one_minus_b2, bc2_sqrt, eps, neg_step_size, grad_scale;
    int use_lerp_low;
} Coefs;

/* One element's second moment and update, from its scaled gradient gj and new first moment mj
 * (the part both lerp forms share). */
static inline void finish_elem(const Coefs *k, float dm, float *restrict x, float *restrict m,
                               float *restrict v, long j, float gj, float mj) {
    float vj = v[j] * k->b2;
    vj = vj + k->one_minus_b2 * gj * gj;
    float denom = sqrtf(vj) / k->bc2_sqrt + k->eps;
    x[j] = x[j] * dm + k->neg_step_size * mj / denom;
    m[j] = mj;
    v[j] = vj;
}

/* Elements [lo, hi) of one tensor; dm is its decay multiplier, l2 1 to add k->l2 times the
 * parameter to the gradient (Adam). Elementwise and branch-free, so the vector code gives
 * bitwise the scalar results (no FMA contraction in ISO C mode); torch's lerp picks the form
 * that is exact at its nearer end, one loop per form and decay kind (gj is exactly the scaled
 * gradient without L2). */
static inline __attribute__((always_inline)) void
update_form(const Coefs *k, float dm, int l2, int low, float *restrict x, const float *restrict g,
            float *restrict m, float *restrict v, long lo, long hi) {
    const float w1 = k->w1, grad_scale = k->grad_scale, wd = k->l2;
#pragma omp simd
    for (long j = lo; j < hi; j++) {
        float gj = g[j] * grad_scale; /* exact when 1 */
        if (l2) gj = fmaf(x[j], wd, gj);
        finish_elem(k, dm, x, m, v, j, gj,
                    low ? m[j] + w1 * (gj - m[j]) : gj - (gj - m[j]) * (1.0f - w1));
    }
}

static void update_run(const Coefs *k, float dm, int l2, float *restrict x, const float *restrict g,
                       float *restrict m, float *restrict v, long lo, long hi) {
    if (k->use_lerp_low)
        l2 ? update_form(k, dm, 1, 1, x, g, m, v, lo, hi)
           : update_form(k, dm, 0, 1, x, g, m, v, lo, hi);
    else
        l2 ? update_form(k, dm, 1, 0, x, g, m, v, lo, hi)
           : update_form(k, dm, 0, 0, x, g, m, v, lo, hi);
}

void adamw_step_scaled(AdamW *opt, double lr, float grad_scale) {
    opt->step++;
    const AdamWConfig *c = &opt->cfg;
    double t = (double)opt->step;
    double bias_correction1 = 1.0 - pow(c->beta1, t);
    double bias_correction2 = 1.0 - pow(c->beta2, t);
    Coefs k = {.decay_mul = (float)(1.0 - lr * c->weight_decay),
               .l2 = (float)c->weight_decay,
               .w1 = (float)(1.0 - c->beta1), /* lerp weight */
               .b2 = (float)c->beta2,
               .one_minus_b2 = (float)(1.0 - c->beta2),
               .bc2_sqrt = (float)sqrt(bias_correction2),
               .eps = (float)c->eps,
               .neg_step_size = (float)(-(lr / bias_correction1)),
               .grad_scale = grad_scale};
    k.use_lerp_low = fabsf(k.w1) < 0.5f;
#pragma omp parallel
    for (int i = 0; i < opt->nparams; i++) {
        const AdamWParam *p = &opt->params[i];
        /* Multiplying by 1 is exact, so one loop serves tensors with and without decay. */
        int decays = p->decay && c->weight_decay != 0.0;
        const float dm = decays && !c->l2 ? k.decay_mul : 1.0f;
        int l2 = decays && c->l2;
        long n = (long)p->n;
        uint16_t *copy = opt->copy[i];
        float *wide = opt->wide[i];
#pragma omp for schedule(static) nowait
        for (long lo = 0; lo < n; lo += ADAMW_RUN) {
            long hi = n - lo < ADAMW_RUN ? n : lo + ADAMW_RUN;
            update_run(&k, dm, l2, p->param, p->grad, opt->m[i], opt->v[i], lo, hi);
            if (copy)
                simd_bf16_weight_copy_serial(wide ? NULL : copy + lo, wide ? wide + lo : NULL,
                                             p->param + lo, hi - lo);
        }
    }
    /* Copies the products read in a packed form are repacked once here (ops/gemm.h). */
    for (int i = 0; i < opt->nparams; i++)
        if (opt->copy[i] && !opt->wide[i]) gemm_bf16_weight_written(opt->copy[i]);
}
