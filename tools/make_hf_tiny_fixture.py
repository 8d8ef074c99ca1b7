#!/usr/bin/env python3
"""Saves two tiny random HF model directories with transformers' save_pretrained into
tests/fixtures/hf_tiny/ for tests/e2e_inspect.sh: dense_tied (one model.safetensors, BF16)
and moe_sharded (shards + model.safetensors.index.json, BF16). The shell test derives its
broken cases from these by editing config.json, so it needs no Python.

Also writes NAME.sums next to each directory: `hf_name first_value sum` per tensor, read
with the Python safetensors package and summed in float64, for tests/test_hf_keys.c to check
the values it loads (through the shard index and the expert slicing) against."""
import os
import glob
import shutil

import torch
from safetensors import safe_open
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
out = os.path.join(root, "tests", "fixtures", "hf_tiny")

common = dict(vocab_size=40, hidden_size=16, num_attention_heads=4, num_key_value_heads=2,
              head_dim=8, intermediate_size=24, max_position_embeddings=64, rope_theta=1e6,
              bos_token_id=1, eos_token_id=2)
torch.manual_seed(0)
models = {
    "dense_tied": (Qwen3ForCausalLM(Qwen3Config(**common, num_hidden_layers=2,
                                                tie_word_embeddings=True)), "1GB"),
    "moe_sharded": (Qwen3MoeForCausalLM(Qwen3MoeConfig(
        **common, num_hidden_layers=2, tie_word_embeddings=False, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=12)), "8KB"),
}
for name, (model, shard) in models.items():
    d = os.path.join(out, name)
    shutil.rmtree(d, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(d, max_shard_size=shard)
    os.remove(os.path.join(d, "generation_config.json"))
    print(name, sorted(os.listdir(d)))
    with open(os.path.join(out, name + ".sums"), "w") as f:
        for fn in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
            with safe_open(fn, "pt") as sf:
                for k in sorted(sf.keys()):
                    t = sf.get_tensor(k).to(torch.float64).flatten()
                    f.write("%s %s %s\n" % (k, float(t[0]).hex(), float(t.sum()).hex()))
