/* Op kinds and the per-instance implementation pointer. Every module instance of the model
 * tree (DESIGN §4) holds `const XxxOp *` for its op kind; the model calls ops only through
 * these pointers, so a kernel registry can swap an implementation per instance by name.
 * Each op struct starts with an OpHeader, so generic code reads name/kind/device through a
 * `const OpHeader *` whatever the kind. */
#ifndef QT_OP_H
#define QT_OP_H

typedef enum OpKind {
    OP_EMBEDDING = 0,
    OP_RMSNORM,
    OP_LINEAR,
    OP_ROPE,
    OP_SDPA,
    OP_SWIGLU,
    OP_CROSS_ENTROPY,
    OP_MOE_EXPERTS,
    OP_NKINDS
} OpKind;

typedef struct OpHeader {
    const char *name; /* "reference", "flash", ... unique within its kind */
    OpKind kind;
    const char *device; /* "cpu", "cuda" */
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
