#!/usr/bin/env python3
"""LoRA reference from HF peft on the tiny Qwen3 of tests/fixtures/train_parity (fp32, eager).

Writes tests/fixtures/lora/:
  adapter_config.json, adapter_model.safetensors
                   the initial adapters exactly as peft saves them (save_pretrained): r 4,
                   alpha 8, dropout 0, on every linear of both layers; A and B both random so
                   that every gradient is non-zero (peft starts B at zero)
  expected.safetensors
                   "grad.<peft key>": the gradient of every adapter tensor for step 1's batch
                   "final.<peft key>": the adapters after 5 steps of AdamW
  expected.json    the batches (B rows of T inputs and T targets, -100 where not counted), per
                   step loss / grad_norm / lr, and the hyper-parameters
The base model is frozen; AdamW (weight decay 0.1 on every adapter) with torchtitan's
warmup-stable-decay LR and clipping active on every step, as tools/make_train_parity_fixture.py.

And tests/fixtures/lora/rslora/: peft's use_rslora (scale alpha / sqrt(r)) on q_proj, v_proj and
down_proj, r 4, alpha 8 (scale 4 where plain LoRA's is 2), A and B random: the adapter folder,
and the loss of one masked batch with the gradient of every adapter tensor
(expected.safetensors "grad.<peft key>", expected.json: the batch and the loss).
Run from the repo root: python3 tools/make_lora_fixture.py
"""
import json
import os

import torch
import torch.nn.functional as F
from fixture_util import adamw_steps
from peft import LoraConfig, get_peft_model
from peft.tuners.lora import LoraLayer
from safetensors.torch import save_file
from transformers import Qwen3ForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = os.path.join(ROOT, "tests", "fixtures", "train_parity")
OUT = os.path.join(ROOT, "tests", "fixtures", "lora")
STEPS, WARMUP, B, T = 5, 2, 2, 12
LR, WD, BETAS, EPS, MAX_NORM = 1e-2, 0.1, (0.9, 0.95), 1e-8, 0.05
RANK, ALPHA = 4, 8
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


RS_TARGETS = ["down_proj", "q_proj", "v_proj"]


def random_adapters(model):
    """A and B both random, so every gradient is non-zero (peft starts B at zero)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn_like(p))
            elif "lora_A" in name:
                p.copy_(0.2 * torch.randn_like(p))


def save_adapter(model, out, base_path):
    """save_pretrained without README.md, with a base path that does not name this machine's
    checkout and a stable key order."""
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out)
    readme = os.path.join(out, "README.md")
    if os.path.exists(readme):
        os.remove(readme)
    cfg_path = os.path.join(out, "adapter_config.json")
    with open(cfg_path) as f:
        ac = json.load(f)
    ac["base_model_name_or_path"] = base_path
    ac["target_modules"] = sorted(ac["target_modules"])
    with open(cfg_path, "w") as f:
        json.dump(ac, f, indent=2, sort_keys=True)


def masked_batch(g):
    ids = torch.randint(0, 64, (B, T + 1), generator=g)
    tgt = ids[:, 1:].clone()
    tgt[torch.rand(B, T, generator=g) < 0.4] = -100  # masked (non-assistant) positions
    return ids[:, :T], tgt


def masked_loss(model, batch):
    inp, tgt = batch
    logits = model(input_ids=inp).logits
    return F.cross_entropy(logits.reshape(-1, 64).float(), tgt.reshape(-1), ignore_index=-100)


def rslora():
    torch.manual_seed(1)
    base = Qwen3ForCausalLM.from_pretrained(BASE, torch_dtype=torch.float32,
                                            attn_implementation="eager")
    cfg = LoraConfig(r=RANK, lora_alpha=ALPHA, use_rslora=True, lora_dropout=0.0,
                     target_modules=RS_TARGETS, bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(base, cfg)
    scales = {m.scaling["default"] for m in model.modules() if isinstance(m, LoraLayer)}
    assert scales == {ALPHA / RANK ** 0.5}, scales
    random_adapters(model)
    model.train()
    out = os.path.join(OUT, "rslora")
    save_adapter(model, out, "../../train_parity")
    batch = masked_batch(torch.Generator().manual_seed(5))
    loss = masked_loss(model, batch)
    loss.backward()
    grads = {"grad." + n.replace(".default", ""): p.grad.detach().clone().contiguous()
             for n, p in model.named_parameters() if p.requires_grad}
    save_file(grads, os.path.join(out, "expected.safetensors"))
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump({"tokens": batch[0].tolist(), "targets": batch[1].tolist(),
                   "loss": loss.item()}, f)


def adapter_state(model):
    """peft's saved keys (no adapter name) -> tensors."""
    out = {}
    for name, p in model.named_parameters():
        if "lora_" in name:
            out[name.replace(".default", "")] = p.detach().clone().contiguous()
    return out


def main():
    torch.manual_seed(0)
    base = Qwen3ForCausalLM.from_pretrained(BASE, torch_dtype=torch.float32,
                                            attn_implementation="eager")
    cfg = LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS,
                     bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(base, cfg)
    random_adapters(model)
    model.train()
    save_adapter(model, OUT, "../train_parity")

    g = torch.Generator().manual_seed(3)
    batches = [masked_batch(g) for _ in range(STEPS)]

    tensors = {}

    def loss_of(batch):
        return masked_loss(model, batch)

    def first_grads(s):
        if s == 0:
            for name, p in model.named_parameters():
                if p.requires_grad:
                    tensors["grad." + name.replace(".default", "")] = p.grad.detach().clone()

    steps = adamw_steps([p for p in model.parameters() if p.requires_grad], batches, loss_of, LR,
                        BETAS, EPS, WD, WARMUP, MAX_NORM, first_grads)
    for k, v in adapter_state(model).items():
        tensors["final." + k] = v
    save_file({k: v.contiguous() for k, v in tensors.items()},
              os.path.join(OUT, "expected.safetensors"))
    expected = {
        "lora": {"rank": RANK, "alpha": ALPHA, "targets": TARGETS},
        "optimizer": {"lr": LR, "beta1": BETAS[0], "beta2": BETAS[1], "eps": EPS,
                      "weight_decay": WD},
        "lr_scheduler": {"warmup_steps": WARMUP, "decay_type": "linear"},
        "training": {"steps": STEPS, "local_batch_size": B, "seq_len": T, "max_norm": MAX_NORM},
        "batches": [{"tokens": i.tolist(), "targets": t.tolist()} for i, t in batches],
        "steps": steps,
    }
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f)


if __name__ == "__main__":
    main()
    rslora()
