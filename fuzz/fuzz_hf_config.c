/* libFuzzer target: arbitrary bytes as an HF config.json. An accepted config must give a key
 * table, and writing it back must read back as the same model. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/hf_config.h"
#include "io/hf_keys.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ModelSpec a, b;
    HfConfigExtra xa, xb;
    Err err;
    if (model_spec_from_hf_config_text(&a, &xa, (const char *)data, size, "fuzz", &err) != 0)
        return 0;
    /* The table is linear in layers x experts; skip only the inputs that are merely slow. */
    if ((int64_t)a.n_layers * (a.num_experts + 1) <= 4096) {
        HfKeyTable t;
        hf_keys_build(&t, &a);
        for (int i = 0; i < t.nhf; i++)
            if (hf_keys_find_hf(&t, t.hf[i].name) != i) abort();
        hf_keys_free(&t);
    }
    char path[64];
    snprintf(path, sizeof path, "/tmp/fuzz_hf_config_%d.json", (int)getpid());
    if (model_spec_write_hf_config_ex(&a, &xa, path, "bfloat16", &err) != 0) abort();
    if (model_spec_from_hf_config_ex(&b, &xb, path, &err) != 0) {
        fprintf(stderr, "rewritten config rejected: %s\n", err.msg);
        abort();
    }
    unlink(path);
    /* A Qwen3-MoE config with zero experts is written as a dense one, so only the dense
     * fields survive. */
    if (a.num_experts == 0) {
        a.top_k = a.moe_hidden_dim = a.norm_topk_prob = a.decoder_sparse_step = 0;
        a.router_aux_loss_coef = 0;
        memset(a.mlp_only_layers, 0, sizeof a.mlp_only_layers);
        xa.has_router_aux_loss_coef = 0;
        xa.router_aux_loss_coef = 0;
    }
    /* output_router_logits without a coefficient (no auxiliary loss either way, and none on a
     * dense model) is written false. */
    if (a.router_aux_loss_coef == 0) xa.output_router_logits = 0;
    /* Exports are unquantized: the fp8 quantization_config is read, never written. */
    xa.fp8_block[0] = xa.fp8_block[1] = 0;
    if (memcmp(&a, &b, sizeof a) != 0 || memcmp(&xa, &xb, sizeof xa) != 0) abort();
    return 0;
}
