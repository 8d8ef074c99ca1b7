"""What the fixture generators in tools/ share: seeding, building a random model with eager
attention, scrambling its weights, saving it as the tests read it, writing token ids, and the
AdamW run under torchtitan's warmup-stable-decay LR that the training references record."""
import os
import sys

import torch


def out_root(name):
    """The output folder: the first command-line argument, else tests/fixtures/<name>."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "tests", "fixtures", name)


def seeded(seed):
    """Seeds torch's global generator (weight init) and returns a generator for the data."""
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def eager_model(config_cls, model_cls, **kw):
    """A config_cls(**kw) model in fp32 with eager attention (the reference's softmax)."""
    cfg = config_cls(**kw)
    cfg._attn_implementation = "eager"
    return cfg, model_cls(cfg).float()


def scramble(model, gen):
    """Large random weights, so logits, routing and gradients are far from trivial (and greedy
    choices clear), and norm weights away from 1 so a dropped weight multiplication shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif name.endswith("mlp.gate.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.4)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.25)


def save_model(model, d):
    """config.json and model.safetensors into d; no generation_config.json, which no test
    reads."""
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    gc = os.path.join(d, "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)


def quantize_fp8(d, block, scale_dtype):
    """Rewrites the checkpoint in d as fp8 block-quantized, as Qwen's -FP8 releases store one:
    every projection weight of the layers (attention, MLP and expert *_proj.weight) becomes
    float8_e4m3fn with a <name>_scale_inv of one scale per block[0] x block[1] block (the
    block's largest magnitude / 448, stored as scale_dtype), and config.json gets
    quantization_config. Embeddings, norms, the router and lm_head stay as they were. Every
    weight dimension must be a multiple of its block side, as transformers requires."""
    import json
    import math
    from safetensors.torch import load_file, save_file
    path = os.path.join(d, "model.safetensors")
    out = {}
    for name, w in load_file(path).items():
        if not name.endswith("proj.weight"):
            out[name] = w
            continue
        rows, cols = w.shape
        assert rows % block[0] == 0 and cols % block[1] == 0, (name, w.shape, block)
        grid = w.float().reshape(rows // block[0], block[0], cols // block[1], block[1])
        scale = (grid.abs().amax(dim=(1, 3)) / 448).to(scale_dtype)
        s = scale.float()[:, None, :, None]
        q = (grid / s).clamp(-448, 448).to(torch.float8_e4m3fn).reshape(rows, cols)
        out[name] = q
        out[name + "_scale_inv"] = scale
    save_file(out, path, metadata={"format": "pt"})
    cfg_path = os.path.join(d, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3",
                                  "quant_method": "fp8", "weight_block_size": list(block)}
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def load_dequantized(model_cls, d):
    """The fp8 checkpoint in d as transformers loads it on a machine without a GPU: every
    weight dequantized (fp8 value times its block's scale, in fp32), eager attention."""
    model = model_cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    assert all(p.dtype == torch.float32 for p in model.parameters())
    return model


def write_ids(path, rows):
    """One line of space-separated token ids per row."""
    with open(path, "w") as f:
        f.writelines(" ".join(str(int(x)) for x in row) + "\n" for row in rows)


def wsd_factor(step, warmup, stable, decay, min_factor=0.0):
    """torchtitan's linear warmup / stable / linear decay factor for LambdaLR position step."""
    step = min(step, warmup + stable + decay)
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if step < warmup + stable or decay == 0:
        return 1.0
    p = ((step + 1) - (warmup + stable)) / (decay + 1)
    return min_factor + (1 - min_factor) * (1 - p)


def adamw_steps(params, batches, loss_of, lr, betas, eps, wd, warmup, max_norm, after_backward=None):
    """One step of torch.optim.AdamW per batch, warmup then linear decay to 0 over the rest, the
    gradients clipped to max_norm (which must bind on every step). loss_of(batch) is the loss;
    after_backward(step) sees the gradients before clipping. Returns per step the lr used, the
    loss and the pre-clip gradient norm."""
    opt = torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=wd, foreach=False,
                            fused=False)
    decay = len(batches) - warmup
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda c: wsd_factor(c, warmup, 0, decay))
    steps = []
    for s, batch in enumerate(batches):
        opt.zero_grad(set_to_none=True)
        loss = loss_of(batch)
        loss.backward()
        if after_backward:
            after_backward(s)
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=False)
        assert norm.item() > max_norm, "clipping must be active on every step"
        lr_used = opt.param_groups[0]["lr"]
        opt.step()
        sched.step()
        steps.append({"lr": lr_used, "loss": loss.item(), "grad_norm": norm.item()})
        print(f"lr {lr_used:.6f}  loss {loss.item():.6f}  grad_norm {norm.item():.6f}")
    return steps
