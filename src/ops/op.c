/* Op kind names and the reference implementation of each kind. */
#include "ops/op.h"

#include "ops/cross_entropy.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/lm_head_loss.h"
#include "ops/moe_experts.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/sdpa.h"
#include "ops/swiglu.h"

const char *op_kind_name(OpKind kind) {
    static const char *const names[OP_NKINDS] = {"embedding",     "rmsnorm",      "linear",
                                                 "rope",          "sdpa",         "swiglu",
                                                 "cross_entropy", "lm_head_loss", "moe.experts"};
    return (unsigned)kind < OP_NKINDS ? names[kind] : "?";
}

const OpHeader *op_reference(OpKind kind) {
    switch (kind) {
    case OP_EMBEDDING:
        return &embedding_reference.h;
    case OP_RMSNORM:
        return &rmsnorm_reference.h;
    case OP_LINEAR:
        return &linear_reference.h;
    case OP_ROPE:
        return &rope_reference.h;
    case OP_SDPA:
        return &sdpa_reference.h;
    case OP_SWIGLU:
        return &swiglu_reference.h;
    case OP_CROSS_ENTROPY:
        return &cross_entropy_reference.h;
    case OP_LM_HEAD_LOSS:
        return &lm_head_loss_reference.h;
    case OP_MOE_EXPERTS:
        return &moe_experts_reference.h;
    default:
        return 0;
    }
}

/* Each field holds a pointer to a struct whose first member is an OpHeader, so converting
 * between the two pointer types is well defined; the switch keeps every access typed. */
const OpHeader *module_slot_get(const ModuleSlot *s) {
    switch (s->kind) {
    case OP_EMBEDDING:
        return &(*(const EmbeddingOp **)s->field)->h;
    case OP_RMSNORM:
        return &(*(const RmsnormOp **)s->field)->h;
    case OP_LINEAR:
        return &(*(const LinearOp **)s->field)->h;
    case OP_ROPE:
        return &(*(const RopeOp **)s->field)->h;
    case OP_SDPA:
        return &(*(const SdpaOp **)s->field)->h;
    case OP_SWIGLU:
        return &(*(const SwigluOp **)s->field)->h;
    case OP_CROSS_ENTROPY:
        return &(*(const CrossEntropyOp **)s->field)->h;
    case OP_LM_HEAD_LOSS:
        return &(*(const LmHeadLossOp **)s->field)->h;
    case OP_MOE_EXPERTS:
        return &(*(const MoeExpertsOp **)s->field)->h;
    default:
        return 0;
    }
}

int module_slot_set(const ModuleSlot *s, const OpHeader *impl) {
    if (!impl || impl->kind != s->kind) return -1;
    switch (s->kind) {
    case OP_EMBEDDING:
        *(const EmbeddingOp **)s->field = (const EmbeddingOp *)impl;
        break;
    case OP_RMSNORM:
        *(const RmsnormOp **)s->field = (const RmsnormOp *)impl;
        break;
    case OP_LINEAR:
        *(const LinearOp **)s->field = (const LinearOp *)impl;
        break;
    case OP_ROPE:
        *(const RopeOp **)s->field = (const RopeOp *)impl;
        break;
    case OP_SDPA:
        *(const SdpaOp **)s->field = (const SdpaOp *)impl;
        break;
    case OP_SWIGLU:
        *(const SwigluOp **)s->field = (const SwigluOp *)impl;
        break;
    case OP_CROSS_ENTROPY:
        *(const CrossEntropyOp **)s->field = (const CrossEntropyOp *)impl;
        break;
    case OP_LM_HEAD_LOSS:
        *(const LmHeadLossOp **)s->field = (const LmHeadLossOp *)impl;
        break;
    case OP_MOE_EXPERTS:
        *(const MoeExpertsOp **)s->field = (const MoeExpertsOp *)impl;
        break;
    default:
        return -1;
    }
    return 0;
}
