/* The registry table: references first, then the kernel library. */
#include "kernels/registry.h"

#include <stdio.h>
#include <string.h>

#include "kernels/cpu_ops.h"
#include "kernels/kernels.h"
#include "ops/cross_entropy.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/moe_experts.h"

static const KernelInfo REGISTRY[] = {
    {&embedding_reference.h, 1, 0, 0, "row gather / scatter-add"},
    {&rmsnorm_reference.h, 1, 0, 0, "plain loops, fp32"},
    {&linear_reference.h, 1, 0, 0, "x W^T through gemm_f32"},
    {&rope_reference.h, 1, 0, 0, "rotate-half with a position per token"},
    {&sdpa_reference.h, 1, 0, 0, "per query row, full causal/document mask"},
    {&swiglu_reference.h, 1, 0, 0, "three GEMMs and a separate activation"},
    {&cross_entropy_reference.h, 1, 0, 0, "row log-sum-exp in double"},
    {&lm_head_loss_reference.h, 1, 0, 0, "full (N, V) logits, then cross-entropy"},
    /* moe.experts: the per-token reference is the truth; grouped is the CPU default. */
    {&moe_experts_reference.h, 0, 0, 0, "per token, per chosen expert matvecs"},
    {&moe_experts_grouped.h, 1, 5e-5, 1e-3, "tokens grouped by expert, one GEMM per expert"},
    /* Tolerances: fp32 kernels that reorder sums (tiles, chunks, SIMD, GEMM shapes) differ
     * from the references by rounding only, growing with the reduced length (head_dim, dim,
     * ffn); each bound sits several times above what verify-kernels measures at the debug
     * model's dims (docs/kernels.md has the table). */
    {&sdpa_flash.h, 0, 5e-5, 1e-4, "tiled online-softmax attention, memory linear in T"},
    {&rope_nogather.h, 0, 1e-6, 1e-5, "positions 0..T-1 from the row index, no table"},
    {&swiglu_fused.h, 0, 1e-4, 1e-3, "one GEMM against [w1; w3], fused SiLU * up"},
    {&rmsnorm_fused.h, 0, 1e-4, 1e-3, "AVX-512 rows, residual add fused into the norm"},
    {&loss_chunked.h, 0, 2e-5, 1e-4, "lm_head + cross-entropy in token chunks, no (N, V)"},
    /* The CPU defaults the trainer runs when nothing overrides a module (kernels/cpu_ops.h). */
    {&sdpa_cpu.h, 0, 5e-5, 1e-4, "CPU default: 16x64 tiles, online softmax, mask skips"},
    {&rope_cpu.h, 0, 1e-6, 1e-5, "CPU default: cos/sin once per token"},
    {&swiglu_cpu.h, 0, 1e-4, 1e-3, "CPU default: vector gate, bf16 path"},
    {&rmsnorm_cpu.h, 0, 1e-4, 1e-3, "CPU default: vector row sums"},
};

const KernelInfo *kernel_registry(int *n) {
    *n = (int)(sizeof REGISTRY / sizeof REGISTRY[0]);
    return REGISTRY;
}

const KernelInfo *kernel_find(OpKind kind, const char *name, const char *device) {
    int n;
    const KernelInfo *r = kernel_registry(&n);
    for (int i = 0; i < n; i++)
        if (r[i].op->kind == kind && strcmp(r[i].op->name, name) == 0 &&
            strcmp(r[i].op->device, device) == 0)
            return &r[i];
    return NULL;
}

const KernelInfo *kernel_default(OpKind kind, const char *device) {
    int n;
    const KernelInfo *r = kernel_registry(&n);
    for (int i = 0; i < n; i++)
        if (r[i].is_default && r[i].op->kind == kind && strcmp(r[i].op->device, device) == 0)
            return &r[i];
    return NULL;
}

const KernelInfo *kernel_info(const OpHeader *op) {
    int n;
    const KernelInfo *r = kernel_registry(&n);
    for (int i = 0; i < n; i++)
        if (r[i].op == op) return &r[i];
    return NULL;
}

void kernel_names(char *buf, unsigned cap, OpKind kind, const char *device) {
    int n;
    const KernelInfo *r = kernel_registry(&n);
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (r[i].op->kind != kind || strcmp(r[i].op->device, device) != 0) continue;
        int w = snprintf(buf + used, cap - used, "%s%s", used ? ", " : "", r[i].op->name);
        if (w < 0 || (size_t)w >= cap - used) break;
        used += (size_t)w;
    }
}

/* The reference and the CPU default read as the op itself ("sdpa -> flash"). */
const char *kernel_display_name(const OpHeader *op) {
    int plain = strcmp(op->name, "reference") == 0 || strcmp(op->name, "cpu") == 0;
    return plain ? op_kind_name(op->kind) : op->name;
}
