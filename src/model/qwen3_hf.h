/* Loading Hugging Face Qwen3ForCausalLM weights into a Qwen3 model, through the one name table
 * of io/hf_keys.h. */
#ifndef QT_QWEN3_HF_H
#define QT_QWEN3_HF_H

#include "core/err.h"
#include "io/safetensors.h"
#include "model/qwen3.h"

/* Opens the HF weights at path (st_set_open's forms: a directory, a .safetensors file, an
 * index file) for qwen3_load_hf. When they hold F8_E4M3 tensors, the config.json beside them
 * must declare fp8 block quantization (io/hf_config's fp8_block): each such weight is paired
 * with its block scales and reads dequantized; otherwise the sentence names the file and what
 * is missing. */
int qwen3_hf_open(StSet *set, const char *path, Err *err);
/* Fills every parameter of m from the tensors of set (F32, BF16, F16, or F8_E4M3 paired with
 * block scales by qwen3_hf_open). The set must hold
 * exactly the model's HF tensors: otherwise the error lists every missing, unexpected and
 * misshaped key (as many as fit in one message, with the counts of each). A tied model accepts
 * and ignores an lm_head.weight of the embedding's shape, as transformers does; MoE
 * expert_bias (no HF tensor) is set to zero. what names the
 * weights in the message (a path). */
int qwen3_load_hf(Qwen3 *m, const StSet *set, const char *what, Err *err);
/* The check qwen3_load_hf starts with: 0 when set holds exactly spec's HF tensors, else -1
 * with the sentence listing every problem. */
int qwen3_hf_check(const ModelSpec *spec, const StSet *set, const char *what, Err *err);
/* Merges the peft adapter folder dir into m's fp32 weights (model/lora.h, lora_peft_merge). */
int qwen3_merge_peft(Qwen3 *m, const char *dir, Err *err);

#endif
