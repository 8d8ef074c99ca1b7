/* A Qwen3 model ready for inference, from an HF directory or a training checkpoint step: the
 * architecture (config.json), the weights, the CPU kernels training runs by default, optional
 * bf16 weights, the EOS ids, and the tokenizer when the directory holds one. Used by
 * `qtitan generate` and `qtitan eval`. */
#ifndef QT_INFER_MODEL_H
#define QT_INFER_MODEL_H

#include <stdint.h>

#include "core/err.h"
#include "infer/gen_config.h"
#include "io/hf_config.h"
#include "model/qwen3.h"
#include "text/tokenizer.h"

typedef struct InferModel {
    Qwen3 m;
    HfConfigExtra extra;
    Tokenizer *tok; /* NULL when the directory has no tokenizer.json */
    char *dir;      /* the HF directory or checkpoint step the model came from */
    int32_t eos[HF_MAX_TOKEN_IDS + GEN_CONFIG_MAX_EOS + 2];
    /* config.json's eos_token_id(s), then <|im_end|> and <|endoftext|> if known, then what
     * infer_model_add_eos adds (generate: generation_config.json's) */
    int n_eos;
} InferModel;

/* hf_dir: an HF model directory (config.json + safetensors). step_dir: a checkpoint step
 * (DUMP/checkpoint/step-N; cli_checkpoint_step finds a folder's newest); exactly one of the two
 * is set. B x T: the activation capacity of m for full forwards (eval); 1 x 1 when
 * only a Decoder runs the model. adapter (NULL: none): a peft LoRA adapter folder merged into the
 * weights (qwen3_merge_peft: W + s B A, and peft's variants DoRA, rank and alpha patterns,
 * modules_to_save and trainable tokens), so a LoRA run's adapter computes what its merged
 * export does. bf16: multiply with bf16 weights, held without fp32 masters
 * (qwen3_create_inference_bf16); with an adapter the merge needs the fp32 weights, so they stay
 * and the bf16 copies are cast after it (qwen3_enable_bf16). */
int infer_model_open(InferModel *im, const char *hf_dir, const char *step_dir, const char *adapter,
                     int B, int T, int bf16, Err *err);
/* Weights that a caller reads from where this layer cannot (a many-process checkpoint's
 * pieces, joined by the command): load fills every parameter of m (its fp32 data, or its
 * data_bf16 when it has no fp32 copy; qwen3_param_store after each fp32 one) or fails with a
 * sentence. */
typedef struct InferWeights {
    int (*load)(void *ctx, Qwen3 *m, Err *err);
    void *ctx;
} InferWeights;
/* infer_model_open with the architecture and tokenizer from dir (config.json, tokenizer
 * files) and the weights from w. */
int infer_model_open_from(InferModel *im, const char *dir, const InferWeights *w,
                          const char *adapter, int B, int T, int bf16, Err *err);
void infer_model_close(InferModel *im);
/* Adds id to the EOS ids (once; ids beyond the capacity are dropped). */
void infer_model_add_eos(InferModel *im, int64_t id);

#endif
