/* [[override]] entries (docs/kernels.md) checked against the module tree and the kernel registry
 * before any memory is sized, then applied to the model's module implementations.
 *
 * Use (train/train_job.c and train/train_qwen3.c do this for `qtitan train`):
 *   OverridePlan plan;
 *   overrides_resolve(&plan, &spec, cfg.overrides, cfg.n_overrides, cfg.path, "cpu", &run, err);
 *   Qwen3Modules mod;
 *   overrides_apply(&plan, &mod);                       // logs one line per replacement
 *   qwen3_create_with(&m, &spec, B, T, ac, &mod, err);  // sized for the chosen kernels
 *   overrides_plan_free(&plan);
 */
#ifndef QT_KERNELS_OVERRIDES_H
#define QT_KERNELS_OVERRIDES_H

#include "core/err.h"
#include "core/model_spec.h"
#include "ops/op.h"

/* Only pointers to these are used here, so the header does not pull in the job config or the
 * model. */
struct KernelOverride; /* core/config.h */
struct Qwen3Modules;   /* model/qwen3.h */

typedef struct OverrideChoice {
    int slot;             /* index in qwen3_module_tree order */
    char fqn[64];         /* the instance */
    const OpHeader *impl; /* the kernel that replaces the default there */
    int line;             /* config line of the [[override]] that chose it */
} OverrideChoice;

typedef struct OverridePlan {
    ModelSpec spec;
    char device[16];         /* the device the plan was resolved for ("cpu") */
    OverrideChoice *choices; /* n, in module tree order */
    int n;
    int n_unmatched; /* entries that matched no instance (warned) */
} OverridePlan;

/* Checks entries[0..n) against spec's module tree and the registry for device, with the run
 * shape for supports(); origin (the config path) labels messages. Pure: it sizes and changes
 * nothing but *plan. Every target is matched first, so entry order does not matter. Errors
 * (one sentence, -1): two entries claim one instance; an unknown kernel, or one of another op
 * kind or device (lists the valid names); a failed supports(). An entry matching nothing is
 * a warning (logged), not an error. */
int overrides_resolve(OverridePlan *plan, const ModelSpec *spec,
                      const struct KernelOverride *entries, int n, const char *origin,
                      const char *device, const OpRun *run, Err *err);
void overrides_plan_free(OverridePlan *plan);

/* Fills mod with spec's module tree and each kind's default on device (kernels/registry.h,
 * kernel_default_op; with QT_KERNELS=reference the references stay). Returns 1 when the
 * defaults were set. */
int overrides_defaults(const ModelSpec *spec, const char *device, struct Qwen3Modules *mod);
/* Fills mod with plan->spec's module tree (plan->device's defaults) and the plan's replacements,
 * logging
 * "[override] FQN: OLD -> NEW" for each and "applied N override(s)". Returns N. */
int overrides_apply(const OverridePlan *plan, struct Qwen3Modules *mod);

/* spec's module tree as FQN and kind per instance (field NULL); *slots is malloc'd. */
int overrides_tree(const ModelSpec *spec, ModuleSlot **slots);

#endif
