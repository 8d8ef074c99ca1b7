#!/usr/bin/env python3
"""A Qwen3-0.6B-shaped model with random weights, saved in bf16 as an HF directory, for the
generation benchmark (weights do not change speed). Usage: make_model.py OUT_DIR [N_LAYERS]"""
import sys

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

out = sys.argv[1]
layers = int(sys.argv[2]) if len(sys.argv) > 2 else 28
cfg = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                  num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=8,
                  head_dim=128, max_position_embeddings=40960, rope_theta=1000000.0,
                  rms_norm_eps=1e-6, tie_word_embeddings=True, eos_token_id=None)
torch.manual_seed(0)
with torch.device("cpu"):
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(out, safe_serialization=True)
print(f"wrote {out}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, bf16")
