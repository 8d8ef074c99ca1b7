#!/usr/bin/env python3
"""Checks a LoRA run's exports against HF peft and transformers (not a CTest test: CI has no
torch). Given the base HF directory, the peft adapter folder (DUMP/adapter) and the merged HF
directory (DUMP/merged) that `qtitan train` wrote:
  1. peft.PeftModel.from_pretrained(base, adapter) loads the adapters with no missing and no
     unexpected adapter keys (it warns and ignores such keys, so the check re-applies the file
     with set_peft_model_state_dict and reads the load result);
  2. transformers loads the merged directory and its logits equal the base + adapters logits
     within fp32 rounding.
Usage: python3 tools/check_lora_export.py BASE_DIR ADAPTER_DIR MERGED_DIR
"""
import sys

import torch
from peft import PeftModel
from peft.utils import set_peft_model_state_dict
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def main():
    base_dir, adapter_dir, merged_dir = sys.argv[1:4]
    kw = dict(torch_dtype=torch.float32, attn_implementation="eager")
    base = AutoModelForCausalLM.from_pretrained(base_dir, **kw)
    model = PeftModel.from_pretrained(base, adapter_dir).eval()
    state = load_file(f"{adapter_dir}/adapter_model.safetensors")
    res = set_peft_model_state_dict(model, state)
    missing = [k for k in res.missing_keys if "lora_" in k]
    unexpected = list(res.unexpected_keys)
    print(f"adapter tensors: {len(state)}; missing lora keys: {missing}; unexpected: {unexpected}")
    assert not missing and not unexpected
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, **kw).eval()
    ids = torch.randint(0, base.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a = model(input_ids=ids).logits
        b = merged(input_ids=ids).logits
        plain = AutoModelForCausalLM.from_pretrained(base_dir, **kw).eval()(input_ids=ids).logits
    d = (a - b).abs().max().item()
    scale = a.abs().max().item()
    moved = (a - plain).abs().max().item()
    print(f"logits: merged vs peft max abs difference {d:.3g} (largest logit {scale:.3g}); "
          f"the adapters move them by {moved:.3g}")
    assert d <= 1e-5 * scale, "merged logits differ from base + adapters"
    assert moved > 100 * d, "the adapters change nothing: the check would pass vacuously"
    print("ok")


if __name__ == "__main__":
    main()
