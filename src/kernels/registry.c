/* The registry table: the references (generated from QT_OP_KINDS), then the kernel library.
 * Which implementation is each kind's CPU default, and which named overrides stay, is settled
 * by measurement: docs/kernels.md, "Defaults and overrides", gives the numbers. */
#include "kernels/registry.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "kernels/cpu_ops.h"
#include "kernels/kernels.h"
#include "ops/op_all.h"

static const KernelInfo REGISTRY[] = {
/* The references are the truth verify-kernels measures against: tolerance 0. */
#define QT_OP_REF_ROW(ID, id, name, Type, ref) {&ref.h, 0, 0, 0, "the reference (src/ops)"},
    QT_OP_KINDS(QT_OP_REF_ROW)
#undef QT_OP_REF_ROW
    /* Named overrides, kept for a measured win (loss_chunked: memory, no (N, V) logits) or to
     * show the mechanism (flash, rope_nogather, swiglu_fused, rmsnorm_fused: slower than or at
     * parity with the cpu defaults where measured; docs/kernels.md has the numbers). */
    {&sdpa_flash.h, 0, 5e-5, 1e-4, "tiled online-softmax attention, memory linear in T"},
    {&rope_nogather.h, 0, 1e-6, 1e-5, "positions 0..T-1 from the row index, no table"},
    {&swiglu_fused.h, 0, 1e-4, 1e-3, "one GEMM against [w1; w3], fused SiLU * up"},
    {&rmsnorm_fused.h, 0, 1e-4, 1e-3, "AVX-512 rows, residual add fused into the norm"},
    {&loss_chunked.h, 0, 2e-5, 1e-4, "lm_head + CE in token chunks, fused in training"},
    /* The CPU defaults. Tolerances: fp32 kernels that reorder sums (tiles, chunks, SIMD, GEMM
     * shapes) differ from the references by rounding only, growing with the reduced length
     * (head_dim, dim, ffn); each bound sits several times above what verify-kernels measures
     * at the debug model's dims (docs/kernels.md has the table). */
    {&sdpa_cpu.h, 1, 5e-5, 1e-4, "CPU default: 64x256 tiles, online softmax, mask skips"},
    {&rope_cpu.h, 1, 1e-6, 1e-5, "CPU default: cos/sin once per token"},
    {&swiglu_cpu.h, 1, 1e-4, 1e-3, "CPU default: vector gate, bf16 path"},
    {&rmsnorm_cpu.h, 1, 1e-4, 1e-3, "CPU default: vector row sums"},
    {&linear_cpu.h, 1, 1e-5, 1e-4, "CPU default: the reference's GEMMs, bf16 path"},
    {&cross_entropy_cpu.h, 1, 1e-5, 1e-4, "CPU default: rows over threads, vector exp"},
    /* moe.experts: grouped is the CPU default (docs/kernels.md measures it against the
     * per-token reference at debugmodel_moe and Qwen3-30B-A3B-like shapes). */
    {&moe_experts_grouped.h, 1, 5e-5, 1e-3, "tokens grouped by expert, one GEMM per expert"},
};

/* The rows of a GPU backend built into this program (e.g. src/cuda/registry_cuda.c defines
 * them); weak, so a CPU build links without one and they are NULL. */
extern const KernelInfo KERNELS_CUDA[] __attribute__((weak));
extern const int KERNELS_CUDA_N __attribute__((weak));

static KernelInfo *g_all; /* REGISTRY then KERNELS_CUDA, when a backend is linked in */
static int g_nall;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void join_tables(void) {
    int ncpu = (int)(sizeof REGISTRY / sizeof REGISTRY[0]);
    g_all = xmalloc((size_t)(ncpu + KERNELS_CUDA_N) * sizeof *g_all);
    memcpy(g_all, REGISTRY, sizeof REGISTRY);
    memcpy(g_all + ncpu, KERNELS_CUDA, (size_t)KERNELS_CUDA_N * sizeof *g_all);
    g_nall = ncpu + KERNELS_CUDA_N;
}

const KernelInfo *kernel_registry(int *n) {
    if (!KERNELS_CUDA || !&KERNELS_CUDA_N) {
        *n = (int)(sizeof REGISTRY / sizeof REGISTRY[0]);
        return REGISTRY;
    }
    pthread_once(&g_once, join_tables);
    *n = g_nall;
    return g_all;
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
    return kernel_find(kind, "reference", device);
}

const OpHeader *kernel_default_op(OpKind kind, const char *device, const OpRun *run) {
    const KernelInfo *k = kernel_default(kind, device);
    if (k && k->op->supports && k->op->supports(run)) k = kernel_find(kind, "reference", device);
    return k ? k->op : NULL;
}

int kernels_apply_defaults(const ModuleSlot *slots, int n, const char *device, const OpRun *run) {
    const char *env = getenv("QT_KERNELS");
    if (env && strcmp(env, "reference") == 0) return 0;
    for (int i = 0; i < n; i++) {
        const OpHeader *op = kernel_default_op(slots[i].kind, device, run);
        if (op) module_slot_set(&slots[i], op);
    }
    return 1;
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
