/* Loading Hugging Face Qwen3ForCausalLM weights into a Qwen3 model, through the one name table
 * of io/hf_keys.h. */
#ifndef QT_QWEN3_HF_H
#define QT_QWEN3_HF_H

#include "core/err.h"
#include "io/safetensors.h"
#include "model/qwen3.h"

/* Fills every parameter of m from the tensors of set (F32, BF16 or F16). The set must hold
 * exactly the model's HF tensors: otherwise the error lists every missing, unexpected and
 * misshaped key (as many as fit in one message, with the counts of each). A tied model accepts
 * and ignores an lm_head.weight of the embedding's shape, as transformers does; MoE
 * expert_bias (no HF tensor) is set to zero. what names the
 * weights in the message (a path). */
int qwen3_load_hf(Qwen3 *m, const StSet *set, const char *what, Err *err);
/* The check qwen3_load_hf starts with: 0 when set holds exactly spec's HF tensors, else -1
 * with the sentence listing every problem. */
int qwen3_hf_check(const ModelSpec *spec, const StSet *set, const char *what, Err *err);

#endif
