/* [[override]] resolution: match every target against the whole tree, then check each claimed
 * instance's kernel (name, kind, device, supports) in tree order. */
#include "model/overrides.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "core/log.h"
#include "core/strutil.h"
#include "kernels/registry.h"

/* The kernel name for kind on device, or an error sentence about entry e at instance fqn. */
static const KernelInfo *pick_kernel(const KernelOverride *e, const char *origin, OpKind kind,
                                     const char *fqn, const char *device, Err *err) {
    const KernelInfo *k = kernel_find(kind, e->kernel, device);
    if (k) return k;
    char valid[512];
    kernel_names(valid, sizeof valid, kind, device);
    int n;
    const KernelInfo *r = kernel_registry(&n);
    for (int i = 0; i < n; i++) {
        if (strcmp(r[i].op->name, e->kernel) != 0) continue;
        if (r[i].op->kind != kind) {
            err_set(err,
                    "%s:%d: [[override]] kernel \"%s\" implements op %s, but %s is op %s; "
                    "valid kernels for %s on %s: %s",
                    origin, e->line, e->kernel, op_kind_name(r[i].op->kind), fqn,
                    op_kind_name(kind), op_kind_name(kind), device, valid);
            return NULL;
        }
        err_set(err,
                "%s:%d: [[override]] kernel \"%s\" for op %s runs on %s, but this run is on "
                "%s; valid kernels for %s on %s: %s",
                origin, e->line, e->kernel, op_kind_name(kind), r[i].op->device, device,
                op_kind_name(kind), device, valid);
        return NULL;
    }
    err_set(err, "%s:%d: [[override]] kernel \"%s\" is unknown for %s (op %s); valid: %s", origin,
            e->line, e->kernel, fqn, op_kind_name(kind), valid);
    return NULL;
}

int overrides_resolve(OverridePlan *plan, const ModelSpec *spec, const KernelOverride *entries,
                      int n, const char *origin, const char *device, const OpRun *run, Err *err) {
    memset(plan, 0, sizeof *plan);
    plan->spec = *spec;
    snprintf(plan->device, sizeof plan->device, "%s", device);
    if (!origin || !*origin) origin = "config";
    ModuleSlot *slots;
    int nslots = overrides_tree(spec, &slots);
    int *owner = xmalloc((size_t)nslots * sizeof *owner); /* entry index per slot, -1 none */
    for (int i = 0; i < nslots; i++)
        owner[i] = -1;
    int rc = -1;

    for (int e = 0; e < n; e++) {
        int matched = 0;
        for (int i = 0; i < nslots; i++) {
            if (!str_glob_match(entries[e].target, slots[i].fqn)) continue;
            matched++;
            if (owner[i] >= 0) {
                const KernelOverride *a = &entries[owner[i]], *b = &entries[e];
                err_set(err,
                        "%s: [[override]] entries at line %d (target \"%s\", kernel %s) and "
                        "line %d (target \"%s\", kernel %s) both claim %s; make their targets "
                        "disjoint",
                        origin, a->line, a->target, a->kernel, b->line, b->target, b->kernel,
                        slots[i].fqn);
                goto out;
            }
            owner[i] = e;
        }
        if (!matched) {
            log_warn("%s:%d: [[override]] target \"%s\" matches no module instance; the entry "
                     "is ignored",
                     origin, entries[e].line, entries[e].target);
            plan->n_unmatched++;
        }
    }

    plan->choices = xcalloc((size_t)nslots + 1, sizeof *plan->choices);
    for (int i = 0; i < nslots; i++) {
        if (owner[i] < 0) continue;
        const KernelOverride *e = &entries[owner[i]];
        const KernelInfo *k = pick_kernel(e, origin, slots[i].kind, slots[i].fqn, device, err);
        if (!k) goto out;
        const char *why = k->op->supports ? k->op->supports(run) : NULL;
        if (why) {
            err_set(err,
                    "%s:%d: [[override]] kernel %s cannot run %s: %s (this run: batch %d, "
                    "seq_len %d, document_mask %s, %s)",
                    origin, e->line, k->op->name, slots[i].fqn, why, run->B, run->T,
                    run->document_mask ? "true" : "false", run->bf16 ? "bf16" : "fp32");
            goto out;
        }
        OverrideChoice *c = &plan->choices[plan->n++];
        c->slot = i;
        snprintf(c->fqn, sizeof c->fqn, "%s", slots[i].fqn);
        c->impl = k->op;
        c->line = e->line;
    }
    rc = 0;
out:
    if (rc) overrides_plan_free(plan);
    free(owner);
    free(slots);
    return rc;
}

void overrides_plan_free(OverridePlan *plan) {
    free(plan->choices);
    plan->choices = NULL;
    plan->n = 0;
}
