#!/usr/bin/env bash
# LoRA step time and peak memory on a small shape: Qwen3-0.6B's layer shapes cut to 2 layers,
# random frozen base weights, rank-16 adapters on every linear, seq 256, 4 steps (the first
# two are warm-up). Usage: bench/lora/run.sh [QTITAN_BINARY] [extra qtitan train args...]
# Prints the median step time of steps 3-4 and the peak RSS (metrics.jsonl memory_gib).
# The 4B measurement of bench/README.md ("LoRA"): bench/lora/run.sh build/qtitan
#   --model.flavor=4B --training.seq_len=2048 --training.steps=2 --lora.base_dtype=bfloat16
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${1:-$root/build/qtitan}; shift || true
shared=${QT_SHARED_DIR:-$root/../shared}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export QT_CACHE_DIR=$tmp/cache
"$bin" train --config "$root/configs/debug.toml" --model.flavor=0.6B --model.n_layers=2 \
  --model.tokenizer_path="$shared/tokenizers/qwen3" \
  --training.dataset_path="$shared/data/c4_sample/c4_sample.jsonl" \
  --training.local_batch_size=1 --training.seq_len=256 --training.steps=4 \
  --metrics.peak_tflops=1 --lora.rank=16 --lora.alpha=32 \
  "--lora.targets=layers.*.attention.*,layers.*.feed_forward.*" \
  --job.dump_folder="$tmp/run" "$@" >"$tmp/log" 2>&1 || { cat "$tmp/log"; exit 1; }
python3 - "$tmp/run/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in rows if "step" in r and "loss" in r]
# Steps 3.. are warm; a shorter run (a large shape) reports its last step's time.
warm = steps[2:] or steps[-1:]
times = [r.get("step_time_s", r.get("time_s")) for r in warm]
print("median step time %.3f s (steps %d-%d), peak memory %.3f GiB, last loss %.4f"
      % (statistics.median(times), len(steps) - len(warm) + 1, len(steps),
         max(r["memory_gib"] for r in steps), steps[-1]["loss"]))
PY
