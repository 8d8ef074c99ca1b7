/* The kernel check behind `qtitan verify-kernels`: one registered implementation against its
 * op kind's reference on seeded random fp32 inputs of one shape, forward and every backward
 * output (parameter gradients accumulate onto a non-zero start, so += is checked too, and
 * written outputs start non-zero, so a kernel that accumulates into one fails). */
#ifndef QT_KERNELS_VERIFY_H
#define QT_KERNELS_VERIFY_H

#include "kernels/registry.h"

/* The dims a kind reads (others ignored):
 *   embedding     B*T tokens, D, V (tokens repeat, so backward sums rows)
 *   linear        B*T tokens, D in, F out (backward with dx_beta 0 and 1)
 *   cross_entropy B*T tokens, V (every 7th target ignored)
 *   sdpa          B, T, H, K, E, doc (1 = three packed documents per row)
 *   rope          B, T, H (heads per token), E, and rope (its frequencies, scaling included)
 *                 or else plain RoPE of theta
 *   swiglu        B*T tokens, D, F
 *   rmsnorm       B*T rows, D columns (also forward_add / backward_acc when present)
 *   lm_head_loss  B*T tokens, D, V (every 7th target ignored)
 *   moe.experts   B*T tokens, D, F (expert ffn), X experts, k per token (distinct random
 *                 experts per token, one expert left without tokens when X > k + 1) */
typedef struct VerifyShape {
    int B, T, H, K, E, D, F, V, doc, X, k;
    double theta;
    const ModelSpec *rope;
} VerifyShape;

typedef struct VerifyResult {
    double max_abs, max_rel; /* over every output element; rel = |d| / max(|ref|, 1e-6) */
    int ok;                  /* every element within tol_abs or tol_rel * |ref| */
    long n_checked;
    char outputs[96]; /* the outputs compared, e.g. "out lse dq dk dv" */
} VerifyResult;

/* Runs k (not a reference) against op_reference(k's kind) at sh; seed picks the inputs. */
void verify_kernel(VerifyResult *r, const KernelInfo *k, const VerifyShape *sh, unsigned seed);
/* "B2 T128 H4 K2 E64 doc" style label of the dims sh gives kind. */
void verify_shape_label(char *buf, unsigned cap, OpKind kind, const VerifyShape *sh);
/* The shapes `qtitan verify-kernels` checks kind's kernels at; *n gets the count. */
const VerifyShape *verify_shapes(OpKind kind, int *n);

#endif
