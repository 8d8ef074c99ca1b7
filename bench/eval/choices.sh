#!/usr/bin/env bash
# `qtitan eval --choices` timed on two kinds of multiple-choice files, on the random
# Qwen3-0.6B-shaped model of bench/generate/make_model.py (read in fp32, as eval reads it):
# "hs" (HellaSwag-like: a 70-word context, 4 choices of 16 words) and "mmlu" (MMLU-like: a
# 300-word context, 4 one-token choices), 12 questions each, --seq-len 512. BUILDS (default
# build/qtitan) lists the binaries to compare; each file runs once per binary per round,
# alternating, ROUNDS (default 2) rounds. Usage (from the repository root, after
# scripts/build.sh): BUILDS="/tmp/old/qtitan build/qtitan" bash bench/eval/choices.sh [THREADS]
set -euo pipefail
threads=${1:-$(nproc)}
model=${QT_BENCH_MODEL:-/tmp/qtitan_bench_qwen3_0.6b}
tok=${QT_SHARED_DIR:-../shared}/tokenizers/qwen3
[ -f "$model/config.json" ] || python3 bench/generate/make_model.py "$model"
[ -f "$model/tokenizer.json" ] || cp "$tok/tokenizer.json" "$model/"
dir=$(mktemp -d /tmp/qt_choices_XXXXXX)
trap 'rm -rf "$dir"' EXIT
python3 - "$dir" <<'PY'
import json, random, sys
random.seed(5)
words = ("the river mountain snow spring water valley forest stone bridge village road light "
         "night morning wind cloud field summer winter").split()
def sent(n): return " ".join(random.choice(words) for _ in range(n))
with open(sys.argv[1] + "/hs.jsonl", "w") as f:
    for i in range(12):
        f.write(json.dumps({"context": sent(70) + " ", "choices": [sent(16) for _ in range(4)],
                            "label": 0}) + "\n")
with open(sys.argv[1] + "/mmlu.jsonl", "w") as f:
    for i in range(12):
        f.write(json.dumps({"context": sent(300) + "\nAnswer:", "choices": [" A", " B", " C", " D"],
                            "label": 0}) + "\n")
PY
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $threads threads"
for round in $(seq "${ROUNDS:-2}"); do
  for qt in ${BUILDS:-build/qtitan}; do
    for f in hs mmlu; do
      t0=$(date +%s.%N)
      line=$(OMP_NUM_THREADS=$threads "$qt" eval --model "$model" --choices "$dir/$f.jsonl" \
        --seq-len 512 2>/dev/null | tail -1)
      t1=$(date +%s.%N)
      echo "round $round $qt $f: $(echo "$t1 - $t0" | bc) s (load $(cut -d' ' -f1 /proc/loadavg)): $line"
    done
  done
done
