#!/usr/bin/env python3
"""Builds tiny Qwen3 / Qwen3-MoE models with transformers, saves them with save_pretrained,
and writes what landed on disk to tests/fixtures/hf_keys/:

  NAME.config.json  the config.json transformers wrote (read by our HF config reader)
  NAME.txt          one line per tensor in the saved safetensors: `hf_name d0,d1,...`, sorted

so tests/test_hf_keys.c checks the C key table against transformers, not against itself.
The on-disk layout (not model.state_dict()) is what matters: transformers 5 fuses MoE
experts in memory but saves them per expert."""
import json
import os
import struct
import sys
import tempfile

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
out = os.path.join(root, "tests", "fixtures", "hf_keys")
os.makedirs(out, exist_ok=True)

common = dict(vocab_size=40, hidden_size=16, num_attention_heads=4, num_key_value_heads=2,
              head_dim=8, intermediate_size=24, max_position_embeddings=64, rope_theta=1e6)
cases = {
    "dense_tied": (Qwen3Config, Qwen3ForCausalLM,
                   dict(common, num_hidden_layers=2, tie_word_embeddings=True)),
    "dense_untied": (Qwen3Config, Qwen3ForCausalLM,
                     dict(common, num_hidden_layers=2, tie_word_embeddings=False)),
    "moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM,
            dict(common, num_hidden_layers=3, tie_word_embeddings=False, num_experts=4,
                 num_experts_per_tok=2, moe_intermediate_size=12, decoder_sparse_step=1,
                 mlp_only_layers=[1], norm_topk_prob=True)),
    "moe_step2_tied": (Qwen3MoeConfig, Qwen3MoeForCausalLM,
                       dict(common, num_hidden_layers=4, tie_word_embeddings=True,
                            num_experts=3, num_experts_per_tok=1, moe_intermediate_size=12,
                            decoder_sparse_step=2)),
}


def safetensors_keys(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return {k: v["shape"] for k, v in header.items()}


torch.manual_seed(0)
for name, (cfg_cls, model_cls, kw) in cases.items():
    model = model_cls(cfg_cls(**kw))
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        keys = {}
        for fn in sorted(os.listdir(d)):
            if fn.endswith(".safetensors"):
                keys.update(safetensors_keys(os.path.join(d, fn)))
        with open(os.path.join(d, "config.json")) as f:
            config = f.read()
    with open(os.path.join(out, name + ".config.json"), "w") as f:
        f.write(config)
    with open(os.path.join(out, name + ".txt"), "w") as f:
        for k in sorted(keys):
            f.write("%s %s\n" % (k, ",".join(str(x) for x in keys[k])))
    print(name, len(keys), "tensors", file=sys.stderr)
