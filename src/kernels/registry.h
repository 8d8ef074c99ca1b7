/* The kernel registry (docs/kernels.md): every implementation of every op kind, by name and device,
 * with its supports() rule and the tolerance verify-kernels holds it to against the kind's
 * reference. The default per device is what a module instance runs when no [[override]]
 * names it; on the CPU the defaults are the references (kernels are opt-in by name).
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
/* The default implementation of kind on device, or NULL when the device has none. */
const KernelInfo *kernel_default(OpKind kind, const char *device);
/* The registry entry of op (NULL when op is not registered). */
const KernelInfo *kernel_info(const OpHeader *op);
/* Writes "reference, flash" (the names of kind's implementations on device) into buf. */
void kernel_names(char *buf, unsigned cap, OpKind kind, const char *device);
/* The name a log line shows for op: the kind's name for the reference ("rope"), else the
 * kernel's name ("rope_nogather"), so "[override] ...: rope -> rope_nogather" reads well. */
const char *kernel_display_name(const OpHeader *op);

#endif
