/* Which implementation each op kind runs on the CPU when nothing overrides it. */
#include "kernels/cpu_ops.h"

#include <stdlib.h>
#include <string.h>

const OpHeader *cpu_default_op(OpKind kind, const ModelSpec *spec) {
    switch (kind) {
    case OP_SDPA:
        return spec->head_dim <= SDPA_MAX_HEAD_DIM ? &sdpa_cpu.h : op_reference(kind);
    case OP_ROPE:
        return spec->head_dim <= SDPA_MAX_HEAD_DIM ? &rope_cpu.h : op_reference(kind);
    case OP_CROSS_ENTROPY:
        return &cross_entropy_cpu.h;
    case OP_RMSNORM:
        return &rmsnorm_cpu.h;
    case OP_SWIGLU:
        return &swiglu_cpu.h;
    case OP_LINEAR:
        return &linear_cpu.h;
    default:
        return op_reference(kind);
    }
}

int cpu_apply_defaults(const ModuleSlot *slots, int nslots, const ModelSpec *spec) {
    const char *env = getenv("QT_KERNELS");
    if (env && strcmp(env, "reference") == 0) return 0;
    for (int i = 0; i < nslots; i++)
        module_slot_set(&slots[i], cpu_default_op(slots[i].kind, spec));
    return 1;
}
