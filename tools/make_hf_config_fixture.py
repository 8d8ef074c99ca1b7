#!/usr/bin/env python3
"""Writes tests/fixtures/hf_config/cases.txt: config.json inputs (both the transformers 4.x
layout of the published Qwen3 configs and sparse ones that lean on defaults) with the values
transformers resolves from them, so tests/test_hf_config.c checks our defaults and key
handling against transformers itself.

Each case is two lines: `json <one-line config.json>` then `want key=value ...` with the keys
of our ModelSpec (dim n_layers n_heads n_kv_heads head_dim hidden_dim vocab_size max_seq_len
norm_eps rope_theta tie_embeddings num_experts top_k moe_hidden_dim norm_topk_prob
decoder_sparse_step mlp_only_layers router_aux_loss_coef), and the RoPE transformers computes
from them: rope_scale (the attention scaling cos and sin are multiplied by) and inv_freq (the
head_dim / 2 frequencies, float32 values), which test_hf_config compares with ops/rope.c's."""
import copy
import json
import os

from transformers import AutoConfig
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeRotaryEmbedding

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
out = os.path.join(root, "tests", "fixtures", "hf_config")
os.makedirs(out, exist_ok=True)

# The transformers 4.x layout of Qwen/Qwen3-0.6B's and Qwen/Qwen3-30B-A3B's config.json.
qwen3_06b = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False,
    "vocab_size": 151936,
}
qwen3_30b = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
    "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
    "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}
cases = [
    qwen3_06b,
    qwen3_30b,
    {"architectures": ["Qwen3ForCausalLM"]},
    {"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4,
     "num_key_value_heads": None},
    {"model_type": "qwen3_moe", "hidden_size": 64, "num_attention_heads": 4},
    {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 32, "num_attention_heads": 4,
     "num_hidden_layers": 6, "num_local_experts": 6, "num_experts_per_tok": 2,
     "decoder_sparse_step": 2,
     "mlp_only_layers": [3, 5], "rope_parameters": {"rope_type": "default", "rope_theta": 5e5},
     "rms_norm_eps": 1e-5, "router_aux_loss_coef": 0.01},
    {"architectures": ["Qwen3ForCausalLM"], "rope_scaling": {"type": "default"},
     "rope_theta": 123456.5, "tie_word_embeddings": True},
    # YaRN as Qwen's model cards enable it for long contexts (4.x layout).
    dict(qwen3_06b, max_position_embeddings=131072,
         rope_scaling={"rope_type": "yarn", "factor": 4.0,
                       "original_max_position_embeddings": 32768}),
    # The older "type" key, no original length (max_position_embeddings then), the mscale
    # ratio, ramp bounds of its own and an untruncated ramp.
    {"architectures": ["Qwen3ForCausalLM"], "head_dim": 64, "max_position_embeddings": 4096,
     "rope_theta": 10000.0,
     "rope_scaling": {"type": "yarn", "factor": 2.5, "mscale": 0.9, "mscale_all_dim": 0.4,
                      "beta_fast": 16, "beta_slow": 2, "truncate": False}},
    # transformers 5's rope_parameters, an explicit attention factor, and a top-level
    # original_max_position_embeddings, which the rotary embedding takes over the one inside.
    {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
     "head_dim": 32, "max_position_embeddings": 8192, "original_max_position_embeddings": 1024,
     "rope_parameters": {"rope_type": "yarn", "rope_theta": 5e5, "factor": 8.0,
                         "attention_factor": 1.25, "original_max_position_embeddings": 2048}},
    {"architectures": ["Qwen3ForCausalLM"], "head_dim": 16, "rope_theta": 1000.0,
     "rope_scaling": {"rope_type": "linear", "factor": 3.0}},
]


def fmt(v):
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, list):
        return ",".join(repr(x) if isinstance(x, float) else str(x) for x in v) or "-"
    return str(v)


with open(os.path.join(out, "cases.txt"), "w") as f:
    for c in cases:
        text = json.dumps(c)  # before transformers, which edits the dict it is given
        c = copy.deepcopy(c)
        cfg = AutoConfig.for_model(**c) if "model_type" in c else None
        if cfg is None:
            mt = "qwen3_moe" if "Moe" in c["architectures"][0] else "qwen3"
            cfg = AutoConfig.for_model(mt, **c)
        moe = cfg.model_type == "qwen3_moe"
        # What the modeling code uses, not just the stored attribute.
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        want = dict(
            dim=cfg.hidden_size, n_layers=cfg.num_hidden_layers, n_heads=cfg.num_attention_heads,
            n_kv_heads=cfg.num_key_value_heads, head_dim=head_dim,
            hidden_dim=cfg.intermediate_size, vocab_size=cfg.vocab_size,
            max_seq_len=cfg.max_position_embeddings, norm_eps=float(cfg.rms_norm_eps),
            rope_theta=float(cfg.rope_parameters["rope_theta"]),
            tie_embeddings=bool(cfg.tie_word_embeddings),
            num_experts=cfg.num_experts if moe else 0,
            top_k=cfg.num_experts_per_tok if moe else 0,
            moe_hidden_dim=cfg.moe_intermediate_size if moe else 0,
            norm_topk_prob=bool(cfg.norm_topk_prob) if moe else False,
            decoder_sparse_step=cfg.decoder_sparse_step if moe else 0,
            mlp_only_layers=list(cfg.mlp_only_layers) if moe else [],
            router_aux_loss_coef=float(cfg.router_aux_loss_coef) if moe else 0.0,
        )
        # The model's own rotary embedding: the frequencies and scale its forward uses.
        rotary = (Qwen3MoeRotaryEmbedding if moe else Qwen3RotaryEmbedding)(cfg)
        want["rope_scale"] = float(rotary.attention_scaling)
        want["inv_freq"] = [float(x) for x in rotary.inv_freq.tolist()]
        f.write("json " + text + "\n")
        f.write("want " + " ".join("%s=%s" % (k, fmt(v)) for k, v in want.items()) + "\n")
print(open(os.path.join(out, "cases.txt")).read())
