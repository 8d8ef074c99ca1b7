#!/usr/bin/env python3
"""Builds small random Qwen3MoeForCausalLM checkpoints (fp32, eager attention) and the outputs
Hugging Face transformers computes for them, as references for tests/test_moe_parity.c.

For each case writes tests/fixtures/moe_parity/<name>/:
  config.json, model.safetensors   save_pretrained (per-expert HF keys)
  tokens.txt                       one line of token ids per sequence
  expected.safetensors             logits.<i> (len_i, vocab) per line, loss (scalar), and the
                                   gradient of loss w.r.t. every parameter under the key it has
                                   in model.safetensors (experts split per expert, as saved)
  expected_loss.txt                the loss as text (%.9g)

loss is the next-token cross-entropy averaged over all predicted positions of all lines (lines of
equal length run as one batch, otherwise each line alone, weighted back by its predicted count),
plus router_aux_loss_coef * aux_loss for the case with output_router_logits (one batch only, as
HF computes the auxiliary loss per forward call).

Top-k ties: torch.topk's order among equal router scores is not specified, so a case's seed is
increased until, for every token of every MoE layer, the k-th largest router probability exceeds
the (k+1)-th by more than MIN_GAP; the tool asserts that gap and prints it.

A case with fp8 stores its projection weights (attention, dense MLP and every expert's)
fp8 block-quantized (fixture_util.quantize_fp8, as Qwen3-30B-A3B-FP8 does) and its references
come from the model transformers loads from those files (dequantized on this CPU-only machine).

Usage: python tools/make_moe_parity_fixtures.py [OUT_DIR]
"""
import os

import torch
from fixture_util import (eager_model, load_dequantized, out_root, quantize_fp8, save_model,
                          scramble, seeded, write_ids)
from safetensors.torch import save_file
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

MIN_GAP = 1e-4

BASE = dict(vocab_size=64, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
            head_dim=8, intermediate_size=40, moe_intermediate_size=16, num_experts=8,
            num_experts_per_tok=2, tie_word_embeddings=False, rope_theta=10000.0)

CASES = [
    # name, config overrides, line lengths, first seed
    dict(name="all_moe_norm", seed=11, lens=[12, 12],
         cfg=dict(num_hidden_layers=2, norm_topk_prob=True)),
    dict(name="all_moe_nonorm_top3", seed=21, lens=[14],
         cfg=dict(num_hidden_layers=2, norm_topk_prob=False, num_experts_per_tok=3)),
    # Layer 1 dense through mlp_only_layers; layers 0 and 2 MoE.
    dict(name="mlp_only_layers", seed=31, lens=[10, 10],
         cfg=dict(num_hidden_layers=3, norm_topk_prob=True, mlp_only_layers=[1])),
    # decoder_sparse_step 2: only layers 1 and 3 are MoE.
    dict(name="sparse_step2_nonorm", seed=41, lens=[9, 9],
         cfg=dict(num_hidden_layers=4, norm_topk_prob=False, decoder_sparse_step=2)),
    # HF router auxiliary loss added to the loss (output_router_logits).
    dict(name="aux_loss", seed=51, lens=[11, 11], aux=True,
         cfg=dict(num_hidden_layers=2, norm_topk_prob=True, router_aux_loss_coef=0.1,
                  output_router_logits=True,
                  num_experts=6, num_experts_per_tok=2)),
    # Lines of different lengths: qtitan packs them with a document mask.
    dict(name="ragged_tied", seed=61, lens=[7, 12, 5],
         cfg=dict(num_hidden_layers=2, norm_topk_prob=True, tie_word_embeddings=True)),
    # fp8 block-quantized projections with fp32 scales (DeepSeek-style), non-square blocks;
    # layer 1 dense.
    dict(name="fp8_blocks_moe", seed=71, lens=[10, 10],
         fp8=dict(block=[8, 16], scale_dtype=torch.float32),
         cfg=dict(num_hidden_layers=3, norm_topk_prob=True, mlp_only_layers=[1],
                  intermediate_size=48)),
]


def min_topk_gap(router_logits, k):
    gap = float("inf")
    for lg in router_logits:
        p = torch.softmax(lg.detach().float(), dim=-1)
        top = torch.topk(p, k + 1, dim=-1).values
        gap = min(gap, float((top[:, k - 1] - top[:, k]).min()))
    return gap


def run(case, seed, d):
    gen = seeded(seed)
    cfg, model = eager_model(Qwen3MoeConfig, Qwen3MoeForCausalLM, max_position_embeddings=256,
                             rms_norm_eps=1e-6, **dict(BASE, **case["cfg"]))
    scramble(model, gen)
    if case.get("fp8"):
        save_model(model, d)
        quantize_fp8(d, **case["fp8"])
        model = load_dequantized(Qwen3MoeForCausalLM, d)
    model.train()  # dropout is 0; train mode only so gradients flow as in training

    lines = [torch.randint(0, cfg.vocab_size, (n,), generator=gen) for n in case["lens"]]
    groups = [lines] if len(set(case["lens"])) == 1 else [[l] for l in lines]
    if case.get("aux"):
        assert len(groups) == 1, "the auxiliary loss is per forward call: one batch only"
    total_pred = sum(n - 1 for n in case["lens"])

    model.zero_grad()
    logits_out, total, gap = [], None, float("inf")
    for g in groups:
        ids = torch.stack(g)
        out = model(input_ids=ids, labels=ids, output_router_logits=True)
        gap = min(gap, min_topk_gap(out.router_logits, cfg.num_experts_per_tok))
        loss = out.loss
        if not case.get("aux"):
            # output_router_logits=True (for the gap check) makes HF add the aux term; a
            # case without it takes the cross-entropy alone.
            loss = loss - cfg.router_aux_loss_coef * out.aux_loss
        n_pred = ids.shape[0] * (ids.shape[1] - 1)
        part = loss * n_pred / total_pred
        total = part if total is None else total + part
        logits_out.extend(out.logits.detach()[i].clone() for i in range(ids.shape[0]))
    return model, cfg, lines, logits_out, total, gap


def hf_grads(model, cfg):
    """Gradients under the keys save_pretrained writes: fused in-memory expert tensors are
    split per expert (gate_up_proj rows [0, F) are gate_proj, [F, 2F) up_proj)."""
    out = {}
    F = cfg.moe_intermediate_size
    for name, p in model.named_parameters():
        g = p.grad.detach().clone()
        if name.endswith("mlp.experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            for e in range(g.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = g[e, :F].contiguous()
                out[f"{base}{e}.up_proj.weight"] = g[e, F:].contiguous()
        elif name.endswith("mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(g.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = g[e].contiguous()
        else:
            out[name] = g.contiguous()
    return out


def build(case, out_root):
    seed = case["seed"]
    d = os.path.join(out_root, case["name"])
    while True:
        model, cfg, lines, logits_out, total, gap = run(case, seed, d)
        if gap > MIN_GAP:
            break
        seed += 1000
    assert gap > MIN_GAP
    total.backward()

    if not case.get("fp8"):
        save_model(model, d)
    write_ids(os.path.join(d, "tokens.txt"), lines)
    tensors = {f"logits.{i}": t.contiguous() for i, t in enumerate(logits_out)}
    tensors["loss"] = total.detach().reshape(()).clone()
    grads = hf_grads(model, cfg)
    from safetensors import safe_open
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        saved = {k for k in f.keys() if not k.endswith("_scale_inv")}
    missing = saved - set(grads) - ({"lm_head.weight"} if cfg.tie_word_embeddings else set())
    assert not missing, f"gradients missing for saved keys {sorted(missing)[:5]}"
    tensors.update(grads)
    save_file(tensors, os.path.join(d, "expected.safetensors"))
    with open(os.path.join(d, "expected_loss.txt"), "w") as f:
        f.write("%.9g\n" % total.item())
    print(f"{case['name']}: seed {seed}, loss {total.item():.9g}, min top-k gap {gap:.3g}, "
          f"{sum(p.numel() for p in model.parameters())} params")


def main():
    torch.set_num_threads(1)
    for case in CASES:
        build(dict(case, cfg=dict(case["cfg"])), out_root("moe_parity"))


if __name__ == "__main__":
    main()
