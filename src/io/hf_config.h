/* HF config.json <-> ModelSpec for Qwen3ForCausalLM and Qwen3MoeForCausalLM. */
#ifndef QT_HF_CONFIG_H
#define QT_HF_CONFIG_H

#include "core/err.h"
#include "core/model_spec.h"

/* Reads an HF config.json; an unsupported architecture or rope_scaling type is an error. */
int model_spec_from_hf_config(ModelSpec *spec, const char *config_json_path, Err *err);
/* Writes an HF config.json for spec (torch_dtype names the exported dtype). */
int model_spec_write_hf_config(const ModelSpec *spec, const char *path, const char *torch_dtype,
                               Err *err);

#endif
