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

# fp8_blocks.safetensors: block-quantized F8_E4M3 weights with their scales, and the values
# torch gives them (st_set_pair_fp8 with blocks of FP8_BLOCK, for test_safetensors):
#   codes.weight     every byte 0..255 as float8_e4m3fn (16 x 16), scales all 1 (F32): the
#                    decoding of each code, NaN for 0x7f and 0xff
#   ragged.weight    7 x 10 random fp8 values, BF16 scales of a 3 x 3 grid whose last row and
#                    column of blocks are cut short (ceil(7 / 3) x ceil(10 / 4))
#   *.expected       fp8 value (as float32) times its block's scale (as float32), in float32;
#   ragged.expected_bf16 the same rounded to bfloat16
FP8_BLOCK = (3, 4)


def block_scales(scale, rows, cols):
    s = scale.float().repeat_interleave(FP8_BLOCK[0], 0).repeat_interleave(FP8_BLOCK[1], 1)
    return s[:rows, :cols]


codes = torch.arange(256, dtype=torch.uint8).reshape(16, 16).view(torch.float8_e4m3fn)
codes_scale = torch.ones(6, 4)
ragged = (torch.randn(7, 10, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
ragged_scale = (torch.rand(3, 3, generator=g) * 4 + 0.01).to(torch.bfloat16)
ragged_expected = ragged.float() * block_scales(ragged_scale, 7, 10)
fp8 = {
    "codes.weight": codes,
    "codes.weight_scale_inv": codes_scale,
    "codes.expected": codes.float() * block_scales(codes_scale, 16, 16),
    "ragged.weight": ragged,
    "ragged.weight_scale_inv": ragged_scale,
    "ragged.expected": ragged_expected,
    "ragged.expected_bf16": ragged_expected.to(torch.bfloat16),
}
save_file(fp8, os.path.join(out, "fp8_blocks.safetensors"), metadata={"format": "pt"})
print("wrote", out, file=sys.stderr)
