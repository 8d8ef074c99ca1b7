/* Loading Hugging Face Qwen3ForCausalLM weights into a Qwen3 model. */
#ifndef QT_QWEN3_HF_H
#define QT_QWEN3_HF_H

#include <stddef.h>

#include "core/err.h"
#include "io/safetensors.h"
#include "model/qwen3.h"

/* HF key of a qtitan parameter name ("layers.0.attention.wq.weight" ->
 * "model.layers.0.self_attn.q_proj.weight"); -1 when the name is not a Qwen3 parameter. */
int qwen3_hf_name(char *out, size_t cap, const char *qt_name);
/* Fills every parameter of m from the tensors of set (F32, BF16 or F16), checking shapes. A
 * tied model ignores lm_head.weight; an untied one requires it. MoE layers: the router and
 * the per-expert tensors (stacked) come through io/hf_keys; expert_bias is set to zero. */
int qwen3_load_hf(Qwen3 *m, const StSet *set, Err *err);

#endif
