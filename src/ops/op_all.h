/* Every op kind's header (ops/<id>.h), for the code generated from QT_OP_KINDS (ops/op.h),
 * which names each kind's struct type and reference. */
#ifndef QT_OP_ALL_H
#define QT_OP_ALL_H

#include "ops/cross_entropy.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/lm_head_loss.h"
#include "ops/moe_experts.h"
#include "ops/op.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/sdpa.h"
#include "ops/swiglu.h"

#endif
