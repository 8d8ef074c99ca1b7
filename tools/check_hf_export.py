#!/usr/bin/env python3
"""Loads an HF model directory written by qtitan (`qtitan export`, a checkpoint's hf/ folder)
with transformers and fails unless it loads with no missing, unexpected or mismatched keys
and every tensor that transformers keeps under its file name holds exactly the file's values
(transformers 5 fuses MoE experts in memory, so those are checked by the key lists only).

With --tokens FILE (lines of token ids, as `qtitan tokenize` writes them) it also runs
`qtitan eval --model DIR --tokens FILE --dump-logits` and compares qtitan's fp32 logits with
transformers' (fp32, eager attention), line by line, printing the max abs difference; it fails
when that exceeds --tol (default 1e-3 relative to the largest logit magnitude).

usage: tools/check_hf_export.py DIR [--tokens FILE] [--qtitan build/qtitan] [--tol 1e-3]"""
import argparse
import glob
import os
import subprocess
import sys
import tempfile

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM


def compare_logits(d, tokens, qtitan, tol):
    lines = [[int(t) for t in l.split()] for l in open(tokens) if l.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "logits.safetensors")
        out = subprocess.run([qtitan, "eval", "--model", d, "--tokens", tokens,
                              "--dump-logits", dump], check=True, capture_output=True, text=True)
        print("  qtitan eval:", out.stdout.strip())
        with safe_open(dump, "pt") as f:
            ours = [f.get_tensor(f"logits.{i}") for i in range(len(lines))]
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    worst, scale, nll, n = 0.0, 0.0, 0.0, 0
    with torch.no_grad():
        for ids, mine in zip(lines, ours):
            ref = model(torch.tensor([ids])).logits[0].float()
            worst = max(worst, (ref - mine).abs().max().item())
            scale = max(scale, ref.abs().max().item())
            if len(ids) > 1:
                nll += torch.nn.functional.cross_entropy(ref[:-1], torch.tensor(ids[1:]),
                                                         reduction="sum").item()
                n += len(ids) - 1
    print(f"  transformers loss: {nll / max(n, 1):.8f}")
    print(f"  logits vs transformers: max abs diff {worst:.3e} (max |logit| {scale:.3g}, "
          f"{sum(map(len, lines))} positions in {len(lines)} lines)")
    return worst <= tol * max(scale, 1.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--tokens")
    ap.add_argument("--qtitan", default=os.path.join(os.path.dirname(__file__), "..", "build",
                                                     "qtitan"))
    ap.add_argument("--tol", type=float, default=1e-3)
    a = ap.parse_args()
    d = a.dir
    model, info = AutoModelForCausalLM.from_pretrained(d, output_loading_info=True, dtype="auto")
    print(type(model).__name__, "tied:", model.config.tie_word_embeddings,
          "dtype:", model.dtype, "params:", sum(p.numel() for p in model.parameters()))
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
    if a.tokens and not compare_logits(d, a.tokens, a.qtitan, a.tol):
        print("  FAIL: logits differ beyond tolerance")
        problems += 1
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
