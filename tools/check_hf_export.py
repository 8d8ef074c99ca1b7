#!/usr/bin/env python3
"""Loads an HF model directory written by qtitan (`qtitan export`, a checkpoint's hf/ folder)
with transformers and fails unless it loads with no missing, unexpected or mismatched keys
and every tensor that transformers keeps under its file name holds exactly the file's values
(transformers 5 fuses MoE experts in memory, so those are checked by the key lists only).

usage: tools/check_hf_export.py DIR"""
import glob
import os
import sys

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    d = sys.argv[1]
    model, info = AutoModelForCausalLM.from_pretrained(d, output_loading_info=True, dtype="auto")
    print(type(model).__name__, "tied:", model.config.tie_word_embeddings,
          "params:", sum(p.numel() for p in model.parameters()))
    problems = 0
    for k, v in info.items():
        print(" ", k, sorted(v) if not isinstance(v, list) else v)
        problems += len(v)
    state = model.state_dict()
    compared = 0
    for fn in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        with safe_open(fn, "pt") as f:
            for k in f.keys():
                if k in state:
                    compared += 1
                    if not torch.equal(f.get_tensor(k), state[k]):
                        print("  values differ:", k)
                        problems += 1
    print("  compared", compared, "tensors bit for bit")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
