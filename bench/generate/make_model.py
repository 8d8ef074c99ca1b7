#!/usr/bin/env python3
"""A Qwen3-0.6B-shaped model with random weights, saved in bf16 as an HF directory, for the
generation benchmark (weights do not change speed). Usage: make_model.py OUT_DIR [N_LAYERS]
[--fp8]; --fp8 then stores it as Qwen's -FP8 releases do (tools/fixture_util.quantize_fp8:
128 x 128 blocks, fp32 scales), for timing the load of such a checkpoint (bench/README.md)."""
import os
import sys

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

fp8 = "--fp8" in sys.argv
args = [a for a in sys.argv[1:] if a != "--fp8"]
out = args[0]
layers = int(args[1]) if len(args) > 1 else 28
cfg = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                  num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=8,
                  head_dim=128, max_position_embeddings=40960, rope_theta=1000000.0,
                  rms_norm_eps=1e-6, tie_word_embeddings=True, eos_token_id=None)
torch.manual_seed(0)
with torch.device("cpu"):
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(out, safe_serialization=True)
if fp8:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
    from fixture_util import quantize_fp8
    quantize_fp8(out, (128, 128), torch.float32)
print(f"wrote {out}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, "
      f"{'fp8 blocks' if fp8 else 'bf16'}")
