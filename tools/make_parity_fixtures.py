#!/usr/bin/env python3
"""Builds small random Qwen3ForCausalLM checkpoints (fp32, eager attention) and the outputs
Hugging Face transformers computes for them, as references for qtitan's parity tests.

For each case writes tests/fixtures/parity/<name>/:
  config.json, model.safetensors   save_pretrained(safe_serialization=True)
  tokens.txt                       one line of token ids per sequence
  expected.safetensors             logits.<i> (len_i, vocab) per line, loss (scalar), and the
                                   gradient of loss w.r.t. every parameter under its HF name
  expected_loss.txt                the loss as text (%.9g)

A case with fp8 stores its projection weights fp8 block-quantized (fixture_util.quantize_fp8,
as Qwen's -FP8 releases do) and its references are computed by the model transformers loads
from those files (dequantized on this CPU-only machine), gradients w.r.t. the dequantized
weights.

loss is the next-token cross-entropy (labels = input_ids, HF shifts them), averaged over all
predicted positions of all lines: sum over lines of (len_i - 1) * mean_i / sum of (len_i - 1).
Lines of equal length run as one batch; otherwise each line runs alone.

Usage: python tools/make_parity_fixtures.py [OUT_DIR]
"""
import os

import torch
from fixture_util import (eager_model, load_dequantized, out_root, quantize_fp8, save_model,
                          scramble, seeded, write_ids)
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

CASES = [
    # name, config overrides, line lengths, seed
    dict(name="tied_gqa2_headdim", seed=1, lens=[13, 13],
         cfg=dict(vocab_size=96, hidden_size=48, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, intermediate_size=80, num_hidden_layers=2,
                  tie_word_embeddings=True, rope_theta=10000.0)),
    dict(name="untied_mha", seed=2, lens=[16],
         cfg=dict(vocab_size=80, hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
                  head_dim=8, intermediate_size=64, num_hidden_layers=2,
                  tie_word_embeddings=False, rope_theta=1000000.0)),
    dict(name="untied_gqa4_batch2", seed=3, lens=[11, 11],
         cfg=dict(vocab_size=128, hidden_size=64, num_attention_heads=8, num_key_value_heads=2,
                  head_dim=32, intermediate_size=96, num_hidden_layers=2,
                  tie_word_embeddings=False, rope_theta=500000.0, rms_norm_eps=1e-5)),
    # Lines of different lengths: qtitan packs them into one row with a document mask and
    # positions restarting at 0, which must equal running each line alone.
    dict(name="tied_ragged_lines", seed=4, lens=[7, 12, 5],
         cfg=dict(vocab_size=64, hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
                  head_dim=16, intermediate_size=48, num_hidden_layers=2,
                  tie_word_embeddings=True, rope_theta=1000.0)),
    # fp8 block-quantized projections: non-square blocks (a swapped row/column index shows),
    # bf16 scales as Qwen3-*-FP8 store them.
    dict(name="fp8_blocks_untied", seed=5, lens=[9, 9],
         fp8=dict(block=[16, 32], scale_dtype=torch.bfloat16),
         cfg=dict(vocab_size=72, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, intermediate_size=96, num_hidden_layers=2,
                  tie_word_embeddings=False, rope_theta=1000000.0)),
    # YaRN RoPE (factor 4 over an original context of 8, lines longer than it): blended
    # frequencies and cos / sin scaled by the attention factor, forward and backward.
    dict(name="yarn_tied", seed=6, lens=[21, 21],
         cfg=dict(vocab_size=64, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, intermediate_size=48, num_hidden_layers=2,
                  tie_word_embeddings=True, rope_theta=10000.0,
                  rope_scaling=dict(rope_type="yarn", factor=4.0,
                                    original_max_position_embeddings=8))),
]


def build(case, out_root):
    gen = seeded(case["seed"])
    cfg, model = eager_model(Qwen3Config, Qwen3ForCausalLM, max_position_embeddings=256,
                             rms_norm_eps=case["cfg"].pop("rms_norm_eps", 1e-6),
                             attn_implementation="eager", **case["cfg"])
    scramble(model, gen)
    d = os.path.join(out_root, case["name"])
    if case.get("fp8"):
        save_model(model, d)
        quantize_fp8(d, **case["fp8"])
        model = load_dequantized(Qwen3ForCausalLM, d)
    model.train()  # dropout is 0; train mode only so gradients flow as in training

    lines = [torch.randint(0, cfg.vocab_size, (n,), generator=gen) for n in case["lens"]]
    groups = [lines] if len(set(case["lens"])) == 1 else [[l] for l in lines]
    total_pred = sum(n - 1 for n in case["lens"])

    model.zero_grad()
    logits_out, loss_sum = [], 0.0
    total = None
    for g in groups:
        ids = torch.stack(g)
        out = model(input_ids=ids, labels=ids)
        n_pred = ids.shape[0] * (ids.shape[1] - 1)
        # HF's loss is the mean over this group's predicted tokens; weight it back to a sum.
        part = out.loss * n_pred / total_pred
        total = part if total is None else total + part
        logits_out.extend(out.logits.detach()[i].clone() for i in range(ids.shape[0]))
    total.backward()

    if not case.get("fp8"):
        save_model(model, d)
    write_ids(os.path.join(d, "tokens.txt"), lines)
    tensors = {f"logits.{i}": t.contiguous() for i, t in enumerate(logits_out)}
    tensors["loss"] = total.detach().reshape(()).clone()
    for name, p in model.named_parameters():
        tensors[name] = p.grad.detach().clone().contiguous()
    save_file(tensors, os.path.join(d, "expected.safetensors"))
    with open(os.path.join(d, "expected_loss.txt"), "w") as f:
        f.write("%.9g\n" % total.item())
    print(f"{case['name']}: loss {total.item():.9g}, {sum(p.numel() for p in model.parameters())} params")


def main():
    torch.set_num_threads(1)
    for case in CASES:
        build(dict(case, cfg=dict(case["cfg"])), out_root("parity"))


if __name__ == "__main__":
    main()
