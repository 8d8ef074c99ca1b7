#!/usr/bin/env python3
"""The merged export of LoRA on a bf16 base, as HF peft makes it: the tiny Qwen3 of
tests/fixtures/train_parity loaded with torch_dtype=bfloat16, the adapters of
tests/fixtures/lora (A and B random, on every linear) loaded with PeftModel.from_pretrained
(which keeps them in fp32), then merge_and_unload: each targeted weight becomes
bf16(fp32(W_bf16) + (alpha / r) B A), the delta computed in fp32.

Writes tests/fixtures/lora/merged_bf16.safetensors: the merged weights (BF16) of every targeted
linear under their HF names. tests/test_lora.c compares qtitan's merged export with them.
Run from the repo root: python3 tools/make_lora_merge_fixture.py
"""
import os

import torch
from peft import PeftModel
from safetensors.torch import save_file
from transformers import Qwen3ForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = os.path.join(ROOT, "tests", "fixtures", "train_parity")
LORA = os.path.join(ROOT, "tests", "fixtures", "lora")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def main():
    base = Qwen3ForCausalLM.from_pretrained(BASE, torch_dtype=torch.bfloat16,
                                            attn_implementation="eager")
    model = PeftModel.from_pretrained(base, LORA)
    a = next(p for n, p in model.named_parameters() if "lora_A" in n)
    assert a.dtype == torch.float32, "peft should keep the adapters in fp32 on a bf16 base"
    merged = model.merge_and_unload()
    out = {}
    for name, p in merged.state_dict().items():
        if any(f".{t}." in name for t in TARGETS):
            assert p.dtype == torch.bfloat16
            out[name] = p.detach().clone().contiguous()
    assert len(out) == 2 * len(TARGETS)
    save_file(out, os.path.join(LORA, "merged_bf16.safetensors"), metadata={"format": "pt"})


if __name__ == "__main__":
    main()
