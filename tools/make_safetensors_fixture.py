#!/usr/bin/env python3
"""Writes tests/fixtures/safetensors/py_written.safetensors with the Python `safetensors`
package, and py_written.txt listing the same tensors as exact fp32 hex values, so the C
reader is checked against bytes it did not write and the C writer must reproduce them.

Format of the .txt: one tensor per line, `name dtype ndim d0 .. dn-1 v0 v1 ...` with values
as float.hex() (exact for every dtype used here)."""
import os
import sys

import torch
from safetensors.torch import save_file

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
out = os.path.join(root, "tests", "fixtures", "safetensors")
os.makedirs(out, exist_ok=True)

g = torch.Generator().manual_seed(1234)
tensors = {
    "model.embed_tokens.weight": torch.randn(4, 3, generator=g).to(torch.bfloat16),
    "model.norm.weight": torch.randn(3, generator=g),
    "lm_head.weight": torch.randn(2, 3, generator=g).to(torch.float16),
    "b.scalar": torch.tensor(2.5),
    "c.empty": torch.zeros(0, 5),
    "counts": torch.tensor([1, -2, 3], dtype=torch.int64),
    "ids": torch.tensor([7, 8], dtype=torch.int32),
    "mask": torch.tensor([0, 1, 255], dtype=torch.uint8),
    "a.odd.bf16": torch.tensor([1.0, -0.0, 3.140625], dtype=torch.bfloat16),
}
save_file(tensors, os.path.join(out, "py_written.safetensors"), metadata={"format": "pt"})

names = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
         torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8"}
with open(os.path.join(out, "py_written.txt"), "w") as f:
    for name, t in tensors.items():
        vals = [float(v).hex() for v in t.to(torch.float64).flatten().tolist()]
        f.write(" ".join([name, names[t.dtype], str(t.dim())] + [str(d) for d in t.shape] + vals))
        f.write("\n")
print("wrote", out, file=sys.stderr)
