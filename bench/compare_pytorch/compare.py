#!/usr/bin/env python3
"""qtitan vs PyTorch (transformers Qwen3ForCausalLM) training throughput and memory on CPU.

Each case trains the same Qwen3 shape from the same initial weights on the same token rows,
with the same batch, sequence length, precision and thread count, in qtitan and in PyTorch,
each in its own process under /usr/bin/time -v (peak RSS = its high-water mark), alternating
for --rounds rounds (2; --quick 1). Steady-state tokens/s are the median (and best) over the
steps after the warm-up steps; each side reports its best round's median.

Same data: the C4 sample's texts joined into one plain-text document (so qtitan's document
shuffle is the identity), tokenized by `qtitan tokenize` (the ids qtitan's dataset makes),
EOS appended, packed as qtitan packs: row g is stream[g*T : g*T + T + 1] (inputs, then targets
shifted by one), document_mask off (positions 0..T-1, plain causal attention). Same weights:
the model is created once by transformers (seed 0) and saved; qtitan loads it with
checkpoint.initial_load_in_hf. The step-1 losses are printed side by side as the check that
both saw the same model and rows.

--full06b adds the full 28-layer Qwen3-0.6B in bf16 with full activation checkpointing at
batch 1 x 2048 (qtitan activation_checkpoint.mode = "full", transformers'
gradient_checkpointing_enable), 3 steps (1 warm-up excluded) per side. Each side needs about
11 GiB, so the sides run one after the other and the case is skipped when the machine has less
than FULL_MIN_FREE_GIB available.

--ac full or --ac n runs the other cases with activation checkpointing: every layer, or
torchtitan's layer-wise selective mode (every n-th layer checkpointed, counting from 1; in
PyTorch transformers' gradient checkpointing turned on for those layers only).

Usage (run.sh calls it): compare.py --qtitan BUILD/qtitan --work DIR [--quick] [--threads N]
  [--rounds R] [--only NAME] [--peak-tflops P] [--full06b] [--ac none|full|N]
"""
import argparse
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# name, qtitan flavor, field replacements, HF shape, batch, seq_len; optional: precisions
# (default fp32 and bf16), activation checkpointing ("full": every layer recomputed on both
# sides), steps and warm-up steps, opt_in (run only with --full06b).
SHAPES = {
    "debugmodel": dict(flavor="debugmodel", fields={}, dim=256, layers=8, heads=16, kv=8,
                       ffn=3072, vocab=2048, B=4, T=128),
    "0.6B-2layers": dict(flavor="0.6B", fields={"n_layers": 2}, dim=1024, layers=2, heads=16,
                         kv=8, ffn=3072, vocab=151936, B=2, T=512),
    "0.6B-full": dict(flavor="0.6B", fields={}, dim=1024, layers=28, heads=16, kv=8, ffn=3072,
                      vocab=151936, B=1, T=2048, precs=("bf16",), ac="full", steps=3, warmup=1,
                      opt_in=True),
}
# The full 0.6B case holds ~11 GiB per side (fp32 weights, gradients, AdamW moments, bf16
# copies); below this much available memory it is skipped rather than pushing others out.
FULL_MIN_FREE_GIB = 13.0
LR, BETAS, EPS, WD, MAX_NORM = 3e-4, (0.9, 0.95), 1e-8, 0.1, 1.0


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def max_rss_gib(time_v_stderr):
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", time_v_stderr)
    return int(m.group(1)) / 1048576.0 if m else float("nan")


def cpu_seconds(time_v_stderr):
    """User + system CPU seconds of the whole process: on a shared machine the wall clock
    measures the queue for the cores as well, the CPU time mostly the work."""
    u = re.search(r"User time \(seconds\): ([0-9.]+)", time_v_stderr)
    k = re.search(r"System time \(seconds\): ([0-9.]+)", time_v_stderr)
    return float(u.group(1)) + float(k.group(1)) if u and k else float("nan")


def mem_available_gib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1048576.0
    return float("nan")


def eos_id(tok_dir):
    with open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8") as f:
        for t in json.load(f).get("added_tokens", []):
            if t["content"] == "<|endoftext|>":
                return t["id"]
    raise SystemExit(f"{tok_dir}: no <|endoftext|> token")


def prepare_data(args, tok_dir, tag):
    """corpus.txt (one document) and its ids from `qtitan tokenize`, EOS appended."""
    data = os.path.join(args.shared, "data/c4_sample/c4_sample.jsonl")
    corpus = os.path.join(args.work, "corpus.txt")
    if not os.path.exists(corpus):
        with open(data, encoding="utf-8") as f:
            texts = [json.loads(line)["text"] for line in f if line.strip()]
        with open(corpus, "w", encoding="utf-8") as f:
            f.write("\n\n".join(texts))
    ids_path = os.path.join(args.work, f"ids_{tag}.txt")
    if not os.path.exists(ids_path):
        with open(corpus, encoding="utf-8") as f:
            text = f.read()
        one = os.path.join(args.work, "corpus.jsonl")
        with open(one, "w", encoding="utf-8") as f:
            f.write(json.dumps({"text": text}) + "\n")
        sh([args.qtitan, "tokenize", "--tokenizer", tok_dir, "--input", one, "--output", ids_path])
    with open(ids_path) as f:
        ids = [int(x) for x in f.read().split()]
    return corpus, ids + [eos_id(tok_dir)]


def make_init(args, shape, name):
    """HF model directory with seed-0 weights for the shape (made once per shape)."""
    out = os.path.join(args.work, f"init_{name}")
    if os.path.exists(os.path.join(out, "config.json")):
        return out
    import torch
    import transformers
    from transformers import Qwen3ForCausalLM
    torch.manual_seed(0)
    cfg = hf_config(shape)
    transformers.utils.logging.disable_progress_bar()
    model = Qwen3ForCausalLM(cfg)
    model.save_pretrained(out, safe_serialization=True)
    return out


def hf_config(s):
    from transformers import Qwen3Config
    return Qwen3Config(vocab_size=s["vocab"], hidden_size=s["dim"], intermediate_size=s["ffn"],
                       num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                       num_key_value_heads=s["kv"], head_dim=128, max_position_embeddings=4096,
                       rms_norm_eps=1e-6,
                       rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                       tie_word_embeddings=True, attention_bias=False, use_cache=False)


def torch_worker(spec_path):
    """Runs in its own process: trains and prints one JSON line of results."""
    with open(spec_path) as f:
        w = json.load(f)
    import torch
    import torch.nn.functional as F
    from transformers import Qwen3ForCausalLM
    torch.set_num_threads(w["threads"])
    with open(w["ids"]) as f:
        stream = [int(x) for x in f.read().split()]
    model = Qwen3ForCausalLM.from_pretrained(w["init"], attn_implementation="sdpa",
                                             dtype=torch.float32)
    model.train()
    if w["ac"] != "none":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if w["ac"] != "full":
            # torchtitan's layer-wise selective mode (selective_ac_option = n): counting the
            # layers from 1, every n-th is checkpointed and the others keep their activations.
            n = int(w["ac"])
            for i, layer in enumerate(model.model.layers):
                layer.gradient_checkpointing = (i + 1) % n == 0
    kind = "fused"
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                                weight_decay=WD, fused=True)
    except (RuntimeError, TypeError):
        opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                                weight_decay=WD, foreach=True)
        kind = "foreach"
    B, T, V = w["B"], w["T"], w["vocab"]
    times, losses = [], []
    for step in range(1, w["steps"] + 1):
        rows = [stream[g * T:g * T + T + 1] for g in range((step - 1) * B, step * B)]
        batch = torch.tensor(rows, dtype=torch.long)
        x, y = batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if w["bf16"]:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(input_ids=x).logits
        else:
            logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.float().view(-1, V), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM, foreach=True)
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    print(json.dumps({"step_time_s": times, "loss": losses, "adamw": kind,
                      "torch": torch.__version__}))


def run_pytorch(args, case, ids_path, init):
    spec = dict(ids=ids_path, init=init, threads=args.threads, steps=case["steps"],
                B=case["B"], T=case["T"], vocab=case["vocab"], bf16=case["bf16"],
                ac=case["ac"])
    spec_path = os.path.join(args.work, f"torch_{case['name']}.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    p = subprocess.run(["/usr/bin/time", "-v", sys.executable, os.path.abspath(__file__),
                        "--torch-worker", spec_path], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(f"pytorch {case['name']} failed:\n{p.stderr[-3000:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["rss_gib"] = max_rss_gib(p.stderr)
    r["cpu_s"] = cpu_seconds(p.stderr)
    return r


def run_qtitan(args, case, corpus, tok_dir, init):
    dump = os.path.join(args.work, f"qt_{case['name']}")
    cmd = [args.qtitan, "train", "--config", os.path.join(ROOT, "configs/debug.toml"),
           f"--model.flavor={case['flavor']}", f"--model.tokenizer_path={tok_dir}"]
    cmd += [f"--model.{k}={v}" for k, v in case["fields"].items()]
    cmd += [f"--training.dataset_path={corpus}", "--training.document_mask=false",
            f"--training.local_batch_size={case['B']}", f"--training.seq_len={case['T']}",
            f"--training.steps={case['steps']}", f"--training.max_norm={MAX_NORM}",
            f"--optimizer.lr={LR}", f"--optimizer.beta1={BETAS[0]}",
            f"--optimizer.beta2={BETAS[1]}", f"--optimizer.eps={EPS}",
            f"--optimizer.weight_decay={WD}", "--lr_scheduler.warmup_steps=0",
            f"--checkpoint.initial_load_path={init}", "--checkpoint.initial_load_in_hf=true",
            "--checkpoint.enable=false", f"--job.dump_folder={dump}",
            "--training.mixed_precision_param=" + ("bfloat16" if case["bf16"] else "float32")]
    if case.get("ac", "none") in ("none", "full"):
        cmd.append(f"--activation_checkpoint.mode={case.get('ac', 'none')}")
    else:
        cmd += ["--activation_checkpoint.mode=selective",
                f"--activation_checkpoint.selective_ac_option={case['ac']}"]
    if args.peak_tflops:
        cmd.append(f"--metrics.peak_tflops={args.peak_tflops}")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads),
               QT_CACHE_DIR=os.path.join(args.work, "cache"))
    if os.path.exists(os.path.join(dump, "metrics.jsonl")):
        os.remove(os.path.join(dump, "metrics.jsonl"))
    if case["bf16"]:
        # A qtitan without bf16 training warns before building the model and trains in fp32:
        # ask with a 1-step run of a tiny model instead of timing an fp32 run.
        probe = [c for c in cmd if not c.startswith(("--training.steps", "--checkpoint.initial"))]
        probe += ["--training.steps=1", "--model.n_layers=1", "--training.seq_len=8",
                  "--training.local_batch_size=1", "--metrics.peak_tflops=1",
                  f"--job.dump_folder={dump}_probe"]
        pr = subprocess.run(probe, capture_output=True, text=True, env=env)
        if "the reference path computes in fp32" in pr.stdout + pr.stderr:
            return None
    p = subprocess.run(["/usr/bin/time", "-v"] + cmd, capture_output=True, text=True, env=env)
    log = p.stdout + p.stderr
    if p.returncode != 0:
        raise SystemExit(f"qtitan {case['name']} failed:\n{log[-3000:]}\ncommand: {' '.join(cmd)}")
    with open(os.path.join(dump, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f]
    m = re.search(r"measured peak: ([0-9.]+) TFLOP/s (fp32|bf16)", log)
    peak = float(m.group(1)) if m else args.peak_tflops
    peak_kind = m.group(2) if m else "given"
    return {"step_time_s": [r["step_time_s"] for r in recs], "loss": [r["loss"] for r in recs],
            "tflops": [r["tflops"] for r in recs], "rss_gib": max_rss_gib(p.stderr),
            "cpu_s": cpu_seconds(p.stderr),
            "peak_tflops": peak, "peak_kind": peak_kind, "command": " ".join(cmd)}


def steady(r, case):
    """Median and best tokens/s over the steps after the warm-up."""
    t = r["step_time_s"][case["warmup"]:]
    tok = case["B"] * case["T"]
    return tok / statistics.median(t), tok / min(t)


def flops_per_token(s, T):
    D, L, H, K, E, F, V = s["dim"], s["layers"], s["heads"], s["kv"], 128, s["ffn"], s["vocab"]
    mm = L * (D * H * E * 2 + 2 * D * K * E + 3 * D * F) + V * D
    return 6 * mm + 12 * L * H * E * T


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--torch-worker")
    ap.add_argument("--qtitan")
    ap.add_argument("--work")
    ap.add_argument("--shared", default=os.path.join(ROOT, "..", "shared"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--peak-tflops", type=float, default=0.0)
    ap.add_argument("--only", default="", help="run the cases whose name contains this")
    ap.add_argument("--full06b", action="store_true",
                    help="add the full 28-layer 0.6B bf16 case (1 x 2048, activation "
                    "checkpointing; ~11 GiB per side)")
    ap.add_argument("--ac", default="none",
                    help="activation checkpointing of the cases without their own: none, full, "
                    "or n (every n-th layer, torchtitan's selective_ac_option = n)")
    ap.add_argument("--rounds", type=int, default=0,
                    help="qtitan / PyTorch runs per case, alternating (default 2, --quick 1)")
    args = ap.parse_args()
    if args.ac not in ("none", "full") and not (args.ac.isdigit() and int(args.ac) >= 2):
        ap.error(f"--ac {args.ac}: expected none, full or a number of layers >= 2")
    if args.torch_worker:
        return torch_worker(args.torch_worker)
    os.makedirs(args.work, exist_ok=True)
    import torch
    import transformers
    cpu = "?"
    try:
        cpu = re.search(r"Model name:\s*(.*)", sh(["lscpu"]).stdout).group(1).strip()
    except Exception:
        pass
    print(f"machine: {cpu}, {os.cpu_count()} cpus; {platform.platform()}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average at start: "
          f"{loadavg()}")
    print(f"threads: {args.threads} (torch.set_num_threads and OMP_NUM_THREADS); torch "
          f"{torch.__version__}, transformers {transformers.__version__}; "
          f"{'quick' if args.quick else 'full'} mode, "
          f"{args.rounds or (1 if args.quick else 2)} round(s) per case")
    tok2048 = os.path.join(args.work, "tok2048")
    if not os.path.exists(os.path.join(tok2048, "tokenizer.json")):
        sh([args.qtitan, "tokenizer-train", "--input",
            os.path.join(args.shared, "data/c4_sample/c4_sample.jsonl"), "--vocab-size", "2048",
            "--output", tok2048])
    qwen3_tok = os.path.join(args.shared, "tokenizers/qwen3")
    toks = {"debugmodel": tok2048, "0.6B-2layers": qwen3_tok, "0.6B-full": qwen3_tok}
    rounds = args.rounds or (1 if args.quick else 2)
    ratios, lines = [], []
    for sname, s in SHAPES.items():
        if s.get("opt_in") and not args.full06b:
            continue
        steps, warmup = (3, 1) if args.quick else (6, 2)
        steps, warmup = s.get("steps", steps), s.get("warmup", warmup)
        tag = "2048" if s["vocab"] == 2048 else "qwen3"
        corpus, stream = prepare_data(args, toks[sname], tag)
        ids_path = os.path.join(args.work, f"stream_{tag}.txt")
        with open(ids_path, "w") as f:
            f.write(" ".join(map(str, stream)))
        init = None
        for prec in s.get("precs", ("fp32", "bf16")):
            case = dict(s, name=f"{sname}-{prec}", bf16=prec == "bf16", steps=steps,
                        warmup=warmup, ac=s.get("ac", args.ac))
            if args.only and args.only not in case["name"]:
                continue
            init = init or make_init(args, s, sname)
            need = steps * s["B"] * s["T"] + 1
            assert len(stream) >= need, f"{len(stream)} tokens, need {need}"
            print(f"\n== {sname} {prec}: batch {s['B']} x seq {s['T']}, {steps} steps "
                  f"({warmup} warm-up excluded), activation checkpointing "
                  f"{case['ac']}, load {loadavg()}", flush=True)
            if s.get("opt_in") and mem_available_gib() < FULL_MIN_FREE_GIB:
                print(f"skipped: {mem_available_gib():.1f} GiB available, the case needs "
                      f"{FULL_MIN_FREE_GIB} GiB per side")
                continue
            # The two sides alternate for `rounds` rounds, and each side's figure is the best of
            # its rounds' medians: on a shared VM a neighbour can slow one run by a third, and
            # alternating keeps such a stretch from landing on one side only.
            qr, pr = [], []
            for rd in range(rounds):
                q = run_qtitan(args, case, corpus, toks[sname], init)
                if s.get("opt_in") and mem_available_gib() < FULL_MIN_FREE_GIB:
                    raise SystemExit(f"{case['name']}: {mem_available_gib():.1f} GiB available "
                                     f"before PyTorch's side, it needs {FULL_MIN_FREE_GIB} GiB")
                pt = run_pytorch(args, case, ids_path, init)
                pr.append((steady(pt, case), pt))
                if q is not None:
                    qr.append((steady(q, case), q))
                if rounds > 1 or s.get("opt_in"):
                    print(f"  round {rd + 1}: qtitan "
                          f"{qr[-1][0][0] if q is not None else float('nan'):.1f}, pytorch "
                          f"{pr[-1][0][0]:.1f} tokens/s median; CPU seconds of the whole run: "
                          f"qtitan {q['cpu_s'] if q is not None else float('nan'):.0f}, pytorch "
                          f"{pt['cpu_s']:.0f}; step times qtitan "
                          f"{[round(x, 1) for x in q['step_time_s']] if q is not None else []}, "
                          f"pytorch {[round(x, 1) for x in pt['step_time_s']]} s; peak RSS "
                          f"qtitan {q['rss_gib'] if q is not None else float('nan'):.3f}, "
                          f"pytorch {pt['rss_gib']:.3f} GiB (load {loadavg()})", flush=True)
            (pt_med, pt_best), pt = max(pr, key=lambda x: x[0][0])
            pt = dict(pt, rss_gib=max(x[1]["rss_gib"] for x in pr))
            q = None
            if qr:
                (q_med, q_best), q = max(qr, key=lambda x: x[0][0])
                q = dict(q, rss_gib=max(x[1]["rss_gib"] for x in qr))
            if q is None:
                print(f"qtitan {prec}: not available (training.mixed_precision_param = bfloat16 "
                      f"is not built into this qtitan)")
            else:
                fpt = flops_per_token(s, s["T"])
                mfu = 100 * fpt * q_med / 1e12 / q["peak_tflops"] if q["peak_tflops"] else 0
                print(f"qtitan : {q_med:9.1f} tokens/s median ({q_best:.1f} best), peak RSS "
                      f"{q['rss_gib']:.3f} GiB, MFU {mfu:.1f}% of the measured {q['peak_kind']} peak "
                      f"{q['peak_tflops']:.3f} TFLOP/s, step-1 loss {q['loss'][0]:.5f}")
            print(f"pytorch: {pt_med:9.1f} tokens/s median ({pt_best:.1f} best), peak RSS "
                  f"{pt['rss_gib']:.3f} GiB, AdamW {pt['adamw']}, step-1 loss {pt['loss'][0]:.5f}")
            if q is not None:
                r = q_med / pt_med
                ratios.append(r)
                lines.append(f"{case['name']}: tokens/s ratio {r:.2f}, peak RSS ratio "
                             f"{q['rss_gib'] / pt['rss_gib']:.2f}")
                print(f"{case['name']} qtitan/pytorch: tokens/s {r:.2f}x, memory "
                      f"{q['rss_gib'] / pt['rss_gib']:.2f}x")
    print(f"\nload average at end: {loadavg()}")
    print("summary:")
    for line in lines:
        print("  " + line)
    if ratios:
        g = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"qtitan/pytorch tokens/s ratio: {g:.2f} (geometric mean over {len(ratios)} "
              f"case(s))")
    else:
        print("qtitan/pytorch tokens/s ratio: n/a")


if __name__ == "__main__":
    main()
