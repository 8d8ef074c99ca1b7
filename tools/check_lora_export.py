#!/usr/bin/env python3
"""Checks a LoRA run's exports against HF peft and transformers (not a CTest test: CI has no
torch). Given the base HF directory, the peft adapter folder (DUMP/adapter) and the merged HF
directory (DUMP/merged) that `qtitan train` wrote:
  1. peft.PeftModel.from_pretrained(base, adapter) loads the adapters with no missing and no
     unexpected adapter keys (it warns and ignores such keys, so the check re-applies the file
     with set_peft_model_state_dict and reads the load result);
  2. transformers loads the merged directory and its logits equal the base + adapters logits
     within fp32 rounding.
With --bf16-base (a run with lora.base_dtype = "bfloat16"), the base is loaded with
torch_dtype=bfloat16 as a peft user would, and instead of 2. every weight of the merged
directory is compared with peft's merge_and_unload of that model (bf16(W + s B A), the delta in
fp32): equal, or within one bf16 step, when the export dtype is bfloat16; within half a bf16
step (peft's rounding) when it is float32.
Usage: python3 tools/check_lora_export.py BASE_DIR ADAPTER_DIR MERGED_DIR [--bf16-base]
"""
import glob
import sys

import torch
from peft import PeftModel
from peft.utils import set_peft_model_state_dict
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def check_bf16_merge(model, merged_dir):
    """Our merged weights against peft's merge_and_unload on the bf16 base."""
    theirs = model.merge_and_unload().state_dict()
    ours = {}
    for f in sorted(glob.glob(f"{merged_dir}/*.safetensors")):
        ours.update(load_file(f))
    if "lm_head.weight" not in ours:
        ours["lm_head.weight"] = ours["model.embed_tokens.weight"]
    n = differ = 0
    worst = 0.0
    for k, t in theirs.items():
        o = ours[k].float()
        t = t.float()
        # the spacing of bf16 values at t: 2^(exponent - 7)
        step = torch.pow(2.0, torch.floor(torch.log2(t.abs().clamp_min(1e-30))) - 7)
        d = ((o - t).abs() / step).max().item()
        worst = max(worst, d)
        differ += int((o != t).sum())
        n += t.numel()
    exact = next(iter(ours.values())).dtype == torch.bfloat16
    print(f"merged weights vs peft merge_and_unload on the bf16 base: {differ} of {n} values "
          f"differ, the largest by {worst:.3g} bf16 step(s) (our export: "
          f"{'bfloat16' if exact else 'float32'})")
    assert worst <= (1.0 if exact else 0.5 + 1e-6)


def main():
    base_dir, adapter_dir, merged_dir = sys.argv[1:4]
    bf16 = "--bf16-base" in sys.argv[4:]
    kw = dict(torch_dtype=torch.bfloat16 if bf16 else torch.float32, attn_implementation="eager")
    base = AutoModelForCausalLM.from_pretrained(base_dir, **kw)
    model = PeftModel.from_pretrained(base, adapter_dir).eval()
    state = load_file(f"{adapter_dir}/adapter_model.safetensors")
    res = set_peft_model_state_dict(model, state)
    missing = [k for k in res.missing_keys if "lora_" in k]
    unexpected = list(res.unexpected_keys)
    print(f"adapter tensors: {len(state)}; missing lora keys: {missing}; unexpected: {unexpected}")
    assert not missing and not unexpected
    if bf16:
        check_bf16_merge(model, merged_dir)
        print("ok")
        return
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
