/* Op kinds and the per-instance implementation pointer. Every module instance of the model
 * tree (model/qwen3.h, qwen3_module_tree) holds `const XxxOp *` for its op kind; the model calls
 * ops only through these pointers, so a kernel registry can swap an implementation per instance by
 * name. Each op struct starts with an OpHeader, so generic code reads name/kind/device through a
 * `const OpHeader *` whatever the kind.
 *
 * Weight gradients: a backward adds them into its dw arguments, or, when those are NULL (a
 * frozen weight: the base of a LoRA run), skips their products and still writes dx. The
 * embedding has no dx, so the model does not call its backward for a frozen table.
 * verify-kernels checks that dx is the same either way. */
#ifndef QT_OP_H
#define QT_OP_H

#include "core/model_spec.h"

/* The op kinds, one row each, and the only list of them: X(ID, id, "name", OpType, reference).
 * OP_<ID> is the enum value, "name" what configs and logs say, OpType the struct holding the
 * kind's function pointers (ops/<id>.h), reference its plain implementation there. Everything
 * indexed by kind (names, references, the typed slot access in op_kinds.c, the registry's reference
 * rows, verify-kernels' checks) is generated from this list, so a new kind is a new row plus
 * its files (docs/kernels.md, "Adding an op kind"). */
#define QT_OP_KINDS(X)                                                                             \
    X(EMBEDDING, embedding, "embedding", EmbeddingOp, embedding_reference)                         \
    X(RMSNORM, rmsnorm, "rmsnorm", RmsnormOp, rmsnorm_reference)                                   \
    X(LINEAR, linear, "linear", LinearOp, linear_reference)                                        \
    X(ROPE, rope, "rope", RopeOp, rope_reference)                                                  \
    X(SDPA, sdpa, "sdpa", SdpaOp, sdpa_reference)                                                  \
    X(SWIGLU, swiglu, "swiglu", SwigluOp, swiglu_reference)                                        \
    X(CROSS_ENTROPY, cross_entropy, "cross_entropy", CrossEntropyOp, cross_entropy_reference)      \
    /* output projection + cross-entropy as one op (ops/lm_head_loss.h) */                         \
    X(LM_HEAD_LOSS, lm_head_loss, "lm_head_loss", LmHeadLossOp, lm_head_loss_reference)            \
    X(MOE_EXPERTS, moe_experts, "moe.experts", MoeExpertsOp, moe_experts_reference)

typedef enum OpKind {
#define QT_OP_ENUM(ID, id, name, Type, ref) OP_##ID,
    QT_OP_KINDS(QT_OP_ENUM)
#undef QT_OP_ENUM
        OP_NKINDS
} OpKind;

/* What a kernel's supports() may look at: the model and the shape of the run, known from the
 * spec and the job config before any memory is sized. */
typedef struct OpRun {
    const ModelSpec *spec;
    int B, T;          /* local batch rows, sequence length */
    int document_mask; /* packed documents: positions restart and attention stops at boundaries */
    int bf16;          /* 1 when activations are bf16 (mixed_precision_param = "bfloat16") */
} OpRun;

/* NULL when the implementation handles run, else one sentence naming the failed rule
 * ("seq_len must be a multiple of 64"); the string is static. */
typedef const char *(*OpSupportsFn)(const OpRun *run);

typedef struct OpHeader {
    const char *name; /* "reference", "flash", ... unique within its kind */
    OpKind kind;
    const char *device;    /* "cpu", "cuda" */
    OpSupportsFn supports; /* NULL: every run */
} OpHeader;

/* A module instance by name (e.g. "layers.3.attention.rope"), for the kernel registry:
 * field is the address of the instance's `const XxxOp *` of kind `kind`. */
typedef struct ModuleSlot {
    char fqn[64];
    OpKind kind;
    void *field;
} ModuleSlot;

const OpHeader *module_slot_get(const ModuleSlot *s);
/* Replaces the instance's implementation; impl->kind must equal s->kind (returns -1 if not). */
int module_slot_set(const ModuleSlot *s, const OpHeader *impl);

/* "embedding", "rmsnorm", ... */
const char *op_kind_name(OpKind kind);
/* The reference implementation of a kind (a `const XxxOp *` behind the header). */
const OpHeader *op_reference(OpKind kind);

#endif
