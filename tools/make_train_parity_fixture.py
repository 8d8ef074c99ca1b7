#!/usr/bin/env python3
"""Reference for a whole short training run: tiny Qwen3ForCausalLM (fp32, eager attention,
untied lm_head), 5 steps of torch.optim.AdamW with torchtitan's warmup-stable-decay LR and
gradient clipping that is active on every step.

Writes tests/fixtures/train_parity/:
  config.json          the HF model config (Qwen3ForCausalLM)
  model.safetensors    initial weights, HF names, F32
  batches.txt          one line per step: B rows of T+1 token ids, rows separated by " | ";
                       inputs are row[:T], labels row[1:] (every label counts)
  expected.json        hyper-parameters, and per step: lr used, loss (mean cross-entropy over the
                       B*T labels), grad_norm (global L2 norm before clipping)
  final.safetensors    parameters after the 5 steps, HF names, F32
Every parameter is weight-decayed, embeddings and norms included, as torchtitan does.
Run from the repo root: python3 tools/make_train_parity_fixture.py
"""
import json
import os

import torch
import torch.nn.functional as F
from fixture_util import adamw_steps, eager_model
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "train_parity")
STEPS, WARMUP, B, T = 5, 2, 2, 16
LR, WD, BETAS, EPS, MAX_NORM = 1e-2, 0.1, (0.9, 0.95), 1e-8, 0.5


def main():
    torch.manual_seed(0)
    cfg, model = eager_model(Qwen3Config, Qwen3ForCausalLM, vocab_size=64, hidden_size=32,
                             intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                             rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False,
                             attention_bias=False, torch_dtype="float32")
    with torch.no_grad():  # norms away from 1 so their gradients matter
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    model.train()
    os.makedirs(OUT, exist_ok=True)
    cfg.save_pretrained(OUT)
    # transformers 5 writes rope_theta inside rope_parameters and no architectures; published
    # Qwen3 config.json files have both at the top level, so the fixture does too.
    cfg_path = os.path.join(OUT, "config.json")
    with open(cfg_path) as f:
        hf = json.load(f)
    hf["architectures"] = ["Qwen3ForCausalLM"]
    hf["rope_theta"] = cfg.rope_parameters["rope_theta"] if hasattr(cfg, "rope_parameters") \
        else cfg.rope_theta
    hf["torch_dtype"] = "float32"
    with open(cfg_path, "w") as f:
        json.dump(hf, f, indent=2, sort_keys=True)
    save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()},
              os.path.join(OUT, "model.safetensors"))

    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, cfg.vocab_size, (B, T + 1), generator=g) for _ in range(STEPS)]
    with open(os.path.join(OUT, "batches.txt"), "w") as f:
        for rows in batches:
            f.write(" | ".join(" ".join(str(int(t)) for t in row) for row in rows) + "\n")

    def loss_of(rows):
        logits = model(input_ids=rows[:, :T]).logits
        return F.cross_entropy(logits.reshape(-1, cfg.vocab_size).float(), rows[:, 1:].reshape(-1))

    steps = adamw_steps(list(model.parameters()), batches, loss_of, LR, BETAS, EPS, WD, WARMUP,
                        MAX_NORM)
    save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()},
              os.path.join(OUT, "final.safetensors"))
    expected = {
        "optimizer": {"name": "AdamW", "lr": LR, "beta1": BETAS[0], "beta2": BETAS[1],
                      "eps": EPS, "weight_decay": WD, "weight_decay_on": "all parameters"},
        "lr_scheduler": {"warmup_steps": WARMUP, "decay_ratio": None, "decay_type": "linear",
                         "min_lr_factor": 0.0},
        "training": {"steps": STEPS, "local_batch_size": B, "seq_len": T, "max_norm": MAX_NORM,
                     "loss": "mean cross-entropy over all B*seq_len labels"},
        "tie_word_embeddings": False,
        "steps": steps,
    }
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)


if __name__ == "__main__":
    main()
