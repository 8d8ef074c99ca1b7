#!/usr/bin/env bash
# Generation benchmark: qtitan against transformers on CPU, the same random Qwen3-0.6B-shaped
# model (bf16 weights), prompt lengths and thread count. Usage (from the repository root,
# after scripts/build.sh): bash bench/generate/run.sh [THREADS] [NEW] [PROMPT_LENGTHS...]
# ROUNDS (default 2) alternates the two sides that many times, so a shared machine's changing
# load falls on both.
set -euo pipefail
threads=${1:-$(nproc)}
new=${2:-16}
shift $(( $# > 2 ? 2 : $# ))
lens=("$@")
[ ${#lens[@]} -gt 0 ] || lens=(32 128)
model=${QT_BENCH_MODEL:-/tmp/qtitan_bench_qwen3_0.6b}
[ -f "$model/config.json" ] || python3 bench/generate/make_model.py "$model"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for round in $(seq "${ROUNDS:-2}"); do
    echo "round $round qtitan: load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u)"
    OMP_NUM_THREADS=$threads build/bench_generate "$model" bfloat16 "$new" "${lens[@]}" 2>/dev/null
    echo "round $round transformers: load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u)"
    python3 bench/generate/bench_transformers.py "$model" "$threads" "$new" "${lens[@]}" 2>/dev/null
done
