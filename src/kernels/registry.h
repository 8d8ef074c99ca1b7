/* The kernel registry (docs/kernels.md): every implementation of every op kind, by name and device,
 * with its supports() rule and the tolerance verify-kernels holds it to against the kind's
 * reference. The default of a kind on a device is what a module instance runs there when no
 * [[override]] names it: the row marked is_default, else the reference when it runs on that device.
 * The table (registry.c) and docs/kernels.md's table of defaults say which, and why (measured).
 * docs/kernels.md says how to add one. */
#ifndef QT_KERNELS_REGISTRY_H
#define QT_KERNELS_REGISTRY_H

#include "ops/op.h"

typedef struct KernelInfo {
    const OpHeader *op; /* the `const XxxOp` behind it: name, kind, device, supports */
    int is_default;     /* the default of its kind on its device */
    /* verify-kernels: an output element passes when |got - ref| <= tol_abs or
     * |got - ref| <= tol_rel * |ref| (fp32 inputs from the harness's generators). */
    double tol_abs, tol_rel;
    const char *summary; /* one line for listings */
} KernelInfo;

/* All registered implementations (references first); *n gets the count. */
const KernelInfo *kernel_registry(int *n);
/* The implementation named name for kind on device, or NULL. */
const KernelInfo *kernel_find(OpKind kind, const char *name, const char *device);
/* The default implementation of kind on device (see above), or NULL when the device has none. */
const KernelInfo *kernel_default(OpKind kind, const char *device);
/* What a module instance of kind runs on device when nothing overrides it: the default when its
 * supports() accepts run, else the kind's reference (NULL when that is not on device either).
 * A default's supports() may read only run->spec: the defaults are set before B and T are. */
const OpHeader *kernel_default_op(OpKind kind, const char *device, const OpRun *run);
/* Sets every instance of slots[0..n) to kernel_default_op on device. With QT_KERNELS=reference
 * in the environment leaves the references in place and returns 0, else returns 1. */
int kernels_apply_defaults(const ModuleSlot *slots, int n, const char *device, const OpRun *run);
/* The registry entry of op (NULL when op is not registered). */
const KernelInfo *kernel_info(const OpHeader *op);
/* Writes "reference, flash" (the names of kind's implementations on device) into buf. */
void kernel_names(char *buf, unsigned cap, OpKind kind, const char *device);
/* The name a log line shows for op: the kind's name for the reference ("rope"), else the
 * kernel's name ("rope_nogather"), so "[override] ...: rope -> rope_nogather" reads well. */
const char *kernel_display_name(const OpHeader *op);

#endif
