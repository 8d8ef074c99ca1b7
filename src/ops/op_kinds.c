/* ops/op.h's functions: op kind names, the reference implementation of each kind and typed slot
 * access, all generated from QT_OP_KINDS (ops/op.h). */
#include "ops/op.h"

#include "ops/op_all.h"

const char *op_kind_name(OpKind kind) {
#define QT_OP_NAME(ID, id, name, Type, ref) name,
    static const char *const names[OP_NKINDS] = {QT_OP_KINDS(QT_OP_NAME)};
#undef QT_OP_NAME
    return (unsigned)kind < OP_NKINDS ? names[kind] : "?";
}

const OpHeader *op_reference(OpKind kind) {
#define QT_OP_REF(ID, id, name, Type, ref) &ref.h,
    static const OpHeader *const refs[OP_NKINDS] = {QT_OP_KINDS(QT_OP_REF)};
#undef QT_OP_REF
    return (unsigned)kind < OP_NKINDS ? refs[kind] : 0;
}

/* Each field holds a pointer to a struct whose first member is an OpHeader, so converting
 * between the two pointer types is well defined; the generated cases keep every access typed. */
const OpHeader *module_slot_get(const ModuleSlot *s) {
    switch (s->kind) {
#define QT_OP_GET(ID, id, name, Type, ref)                                                         \
    case OP_##ID:                                                                                  \
        return &(*(const Type **)s->field)->h;
        QT_OP_KINDS(QT_OP_GET)
#undef QT_OP_GET
    default:
        return 0;
    }
}

int module_slot_set(const ModuleSlot *s, const OpHeader *impl) {
    if (!impl || impl->kind != s->kind) return -1;
    switch (s->kind) {
#define QT_OP_SET(ID, id, name, Type, ref)                                                         \
    case OP_##ID:                                                                                  \
        *(const Type **)s->field = (const Type *)impl;                                             \
        break;
        QT_OP_KINDS(QT_OP_SET)
#undef QT_OP_SET
    default:
        return -1;
    }
    return 0;
}
