#!/usr/bin/env python3
"""Reference values for the optimizer components, from PyTorch itself.

Writes tests/fixtures/train/adamw_torch.json: two small parameter tensors (one with weight
decay, one exempt) updated 5 times by torch.optim.AdamW with a changing learning rate, the same
by torch.optim.Adam (L2 weight decay, torchtitan's optimizer.name = "Adam") in adam_torch.json,
and
tests/fixtures/train/lr_schedule.json: the learning rate torch.optim.lr_scheduler.LambdaLR
produces for several warmup / decay settings, using a Python restatement of torchtitan's
warmup-stable-decay factor. Run from the repo root: python3 tools/make_optim_fixtures.py
"""
import json
import math
import os

import torch

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "train")


def wsd_factor(step, warmup, stable, decay, kind, min_factor):
    """torchtitan's factor for scheduler position `step` (0 before the first optimizer step)."""
    end = warmup + stable + decay
    step = min(step, end)
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if step < warmup + stable or decay == 0:
        return 1.0
    p = ((step + 1) - (warmup + stable)) / (decay + 1)
    adj = {"linear": 1 - p, "sqrt": 1 - math.sqrt(p), "cosine": 0.5 * (1 + math.cos(math.pi * p))}[kind]
    return min_factor + (1 - min_factor) * adj


def split_steps(steps, warmup, decay_ratio):
    if decay_ratio is None:
        decay = steps - warmup
    else:
        decay = round(steps * decay_ratio)
        if warmup + decay > steps:
            decay = steps - warmup
    return warmup, steps - warmup - decay, decay


def lr_cases():
    cases = []
    for steps, warmup, ratio, kind, min_factor in [
        (10, 2, None, "linear", 0.0),
        (20, 3, 0.5, "cosine", 0.1),
        (20, 0, 0.25, "sqrt", 0.0),
        (7, 2, 0.5, "linear", 0.2),  # round(3.5) = 4 (half to even)
        (10, 4, 0.8, "cosine", 0.0),  # warmup + decay > steps: decay shortened
        (5, 5, None, "linear", 0.0),  # no decay at all
        (16, 1, 0.125, "linear", 0.05),  # round(2.0) exactly
    ]:
        w, s, d = split_steps(steps, warmup, ratio)
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=3e-4)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda c: wsd_factor(c, w, s, d, kind, min_factor))
        lrs = []
        for _ in range(steps + 2):  # two past the end: the factor is clamped there
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        cases.append({"steps": steps, "warmup_steps": warmup,
                      "decay_ratio": -1.0 if ratio is None else ratio, "decay_type": kind,
                      "min_lr_factor": min_factor, "base_lr": 3e-4, "lr": lrs})
    return cases


def optim_case(cls):
    """Two tensors (one with weight decay, one exempt) updated 5 times by cls (torch.optim.AdamW,
    or torch.optim.Adam, whose weight decay is L2: added to the gradient)."""
    g = torch.Generator().manual_seed(1234)
    shapes = [(3, 5), (7,)]
    params = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]
    opt = cls([{"params": [params[0]], "weight_decay": 0.1},
               {"params": [params[1]], "weight_decay": 0.0}],
              lr=1e-2, betas=(0.9, 0.95), eps=1e-8, foreach=False, fused=False)
    init = [p.detach().clone().flatten().tolist() for p in params]
    lrs = [2e-3, 5e-3, 1e-2, 8e-3, 4e-3]
    steps = []
    for lr in lrs:
        for group in opt.param_groups:
            group["lr"] = lr
        grads = [torch.randn(s, generator=g) * 0.5 for s in shapes]
        grads[1][0] = 0.0  # a zero gradient exercises v = 0 in the denominator
        for p, gr in zip(params, grads):
            p.grad = gr.clone()
        opt.step()
        steps.append({"lr": lr, "grads": [gr.flatten().tolist() for gr in grads],
                      "params": [p.detach().flatten().tolist() for p in params]})
    return {"betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": [0.1, 0.0],
            "init": init, "steps": steps}


def main():
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "adamw_torch.json"), "w") as f:
        json.dump(optim_case(torch.optim.AdamW), f)
    with open(os.path.join(OUT, "adam_torch.json"), "w") as f:
        json.dump(optim_case(torch.optim.Adam), f)
    with open(os.path.join(OUT, "lr_schedule.json"), "w") as f:
        json.dump(lr_cases(), f, indent=1)


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
