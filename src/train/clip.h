/* Gradient clipping by global L2 norm, like torch.nn.utils.clip_grad_norm_: the norm over all
 * gradient tensors together, and a scale of max_norm / (norm + 1e-6) when that is below 1. */
#ifndef QT_CLIP_H
#define QT_CLIP_H

#include <stddef.h>

#include "core/device.h"

/* One gradient tensor. */
typedef struct GradRef {
    float *g; /* (n) */
    size_t n;
    /* The device g lives on; NULL = host memory. On a device that is not host-visible the
     * norm reads g through device_host_view and the scale writes it back with from_host, a
     * bounded piece at a time, serially and in the same order (so the same sums). */
    const Device *device;
} GradRef;

/* Global L2 norm of all tensors. Squares are summed in double in fixed-size chunks whose
 * partial sums are added in a fixed order, so the result does not depend on the thread count.
 * Returns NaN or inf when any gradient is non-finite. */
double grad_global_norm(const GradRef *grads, int n);
/* Sum of squares only (for data-parallel runs that all-reduce it before the square root). */
double grad_sum_squares(const GradRef *grads, int n);
/* Scales every gradient by min(1, max_norm / (total_norm + 1e-6)) computed in fp32 as torch
 * does. Returns the scale applied (1 when no clipping was needed). Does nothing and returns 1
 * when total_norm is not finite or max_norm <= 0; the caller decides what a non-finite norm
 * means (skip the step or stop). */
float grad_clip_scale(const GradRef *grads, int n, double total_norm, double max_norm);
/* The scale grad_clip_scale would apply, without applying it (the trainer passes it to
 * adamw_step_scaled, which saves a pass over every gradient). */
float grad_clip_coef(double total_norm, double max_norm);
/* Both of the above: returns the pre-clip norm; *finite is 0 when the norm is NaN or inf. */
double grad_clip(const GradRef *grads, int n, double max_norm, int *finite);

#endif
