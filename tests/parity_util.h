/* Shared by the parity tests (test_parity, test_moe_parity): how far our values are from the
 * ones Hugging Face computed. Include after cmocka.h. */
#ifndef QT_TEST_PARITY_UTIL_H
#define QT_TEST_PARITY_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "io/safetensors.h"
#include "io/token_lines.h"
#include "model/qwen3.h"

/* max |got - ref| / max |ref| over n values. Not fmax for the differences, which drops a
 * NaN: a NaN sticks and fails the check. */
static inline double rel_err(const float *got, const float *ref, long n) {
    double maxabs = 0, maxdiff = 0;
    for (long i = 0; i < n; i++) {
        maxabs = fmax(maxabs, fabs(ref[i]));
        double d = fabs((double)got[i] - ref[i]);
        if (isnan(d) || d > maxdiff) maxdiff = d;
    }
    return maxdiff / maxabs;
}

typedef struct Errs {
    double logits, loss, grad;
    char worst_grad[96];
} Errs;

/* Zeroes the gradients and runs the forward of all lines, batched (packed = 0, equal lengths)
 * or packed in one row (document mask, positions restarting at 0); the logits (logits.L) and
 * the loss against exp. The caller runs the backward. */
static inline Errs parity_forward(Qwen3 *m, const TokenLines *tl, const StFile *exp, int packed) {
    Errs e = {0, 0, 0, ""};
    long N = tl->total;
    int B = packed ? 1 : tl->n, T = (int)(packed ? N : N / tl->n);
    int32_t *tgt = malloc((size_t)N * sizeof(int32_t)), *pos = malloc((size_t)N * sizeof(int32_t));
    int32_t *doc = malloc((size_t)N * sizeof(int32_t));
    for (int l = 0; l < tl->n; l++)
        for (long i = tl->start[l]; i < tl->start[l + 1]; i++) {
            tgt[i] = i + 1 == tl->start[l + 1] ? CE_IGNORE : tl->ids[i + 1];
            pos[i] = (int32_t)(i - tl->start[l]);
            doc[i] = l;
        }
    qwen3_zero_grads(m);
    float loss = qwen3_forward(m, tl->ids, tgt, packed ? pos : NULL, packed ? doc : NULL, B, T);
    int V = m->spec.vocab_size;
    for (int l = 0; l < tl->n; l++) {
        char name[32];
        snprintf(name, sizeof name, "logits.%d", l);
        const StTensor *t = st_find(exp, name);
        assert_non_null(t);
        assert_true(t->numel == (tl->start[l + 1] - tl->start[l]) * V);
        float *ref = malloc((size_t)t->numel * sizeof(float));
        st_to_f32(t, ref);
        double r = rel_err(m->a.logits + tl->start[l] * V, ref, t->numel);
        if (isnan(r) || r > e.logits) e.logits = r;
        free(ref);
    }
    float ref_loss;
    st_to_f32(st_find(exp, "loss"), &ref_loss);
    e.loss = fabs(loss - ref_loss) / fabs(ref_loss);
    free(tgt), free(pos), free(doc);
    return e;
}

/* p's gradient against ref by relative L2, kept in e when the worst so far (a NaN sticks as
 * the worst, and fails); returns sum ref^2. */
static inline double parity_grad(Errs *e, const Qwen3Param *p, const float *ref) {
    double d2 = 0, r2 = 0;
    for (long k = 0; k < p->numel; k++) {
        d2 += ((double)p->grad[k] - ref[k]) * ((double)p->grad[k] - ref[k]);
        r2 += (double)ref[k] * ref[k];
    }
    double rel = sqrt(d2 / r2);
    if (isnan(rel) || rel > e->grad) {
        e->grad = rel;
        snprintf(e->worst_grad, sizeof e->worst_grad, "%s", p->name);
    }
    return r2;
}

#endif
