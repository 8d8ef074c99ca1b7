/* The model side of overrides: the module tree of a spec and applying a plan to it. Kept out
 * of overrides.c, which reads core/config.h (see overrides.h). */
#include <stdio.h>
#include <stdlib.h>

#include "core/log.h"
#include "kernels/registry.h"
#include "model/overrides.h"
#include "model/qwen3.h"

int overrides_tree(const ModelSpec *spec, ModuleSlot **slots) {
    Qwen3Modules *mod = xmalloc(sizeof *mod);
    int n = qwen3_module_tree(spec, mod, NULL);
    *slots = xcalloc((size_t)n, sizeof **slots);
    qwen3_module_tree(spec, mod, *slots);
    for (int i = 0; i < n; i++)
        (*slots)[i].field = NULL; /* pointed into mod */
    free(mod);
    return n;
}

int overrides_defaults(const ModelSpec *spec, const char *device, Qwen3Modules *mod) {
    int nslots = qwen3_module_tree(spec, mod, NULL);
    ModuleSlot *slots = xcalloc((size_t)nslots, sizeof *slots);
    qwen3_module_tree(spec, mod, slots);
    OpRun run = {.spec = spec}; /* defaults are chosen from the spec alone (registry.h) */
    int fast = kernels_apply_defaults(slots, nslots, device, &run);
    /* The cross-entropy inside the reference loss op is part of the `loss` instance, not a
     * slot of its own, so it gets its kind's default here. */
    const OpHeader *ce = kernel_default_op(OP_CROSS_ENTROPY, device, &run);
    if (fast && ce) mod->ce = (const CrossEntropyOp *)ce;
    free(slots);
    return fast;
}

int overrides_apply(const OverridePlan *plan, Qwen3Modules *mod) {
    /* The CPU defaults first, so a replacement is logged against what it replaces; the slots
     * point into mod, so copying the defaults over it keeps them valid. */
    Qwen3Modules *defaults = xmalloc(sizeof *defaults);
    overrides_defaults(&plan->spec, plan->device, defaults);
    int nslots = qwen3_module_tree(&plan->spec, mod, NULL);
    ModuleSlot *slots = xcalloc((size_t)nslots, sizeof *slots);
    qwen3_module_tree(&plan->spec, mod, slots);
    *mod = *defaults;
    free(defaults);
    for (int c = 0; c < plan->n; c++) {
        const ModuleSlot *s = &slots[plan->choices[c].slot];
        const OpHeader *old = module_slot_get(s);
        module_slot_set(s, plan->choices[c].impl);
        if (old == plan->choices[c].impl) /* e.g. naming the device default explicitly */
            log_info("[override] %s: %s (already the default)", s->fqn, kernel_display_name(old));
        else
            /* The default reads as the op ("sdpa"), the choice by its own name ("flash",
             * "reference"). */
            log_info("[override] %s: %s -> %s", s->fqn, kernel_display_name(old),
                     plan->choices[c].impl->name);
    }
    log_info("applied %d override(s)", plan->n);
    free(slots);
    return plan->n;
}
