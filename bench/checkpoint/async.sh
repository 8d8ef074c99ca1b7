#!/usr/bin/env bash
# What checkpoint.async_mode = "async" takes off a training run: the same job with
# checkpoint.interval = K (3) run with synchronous saves and with background ones, alternating
# for R rounds; per run the wall seconds, the sum of the step times (metrics.jsonl step_time_s:
# training alone, slowed by a write running beside it), the seconds the loop spent saving
# (synchronous writes and staging), and the background writes' own seconds. The save of the
# last step is synchronous in both modes.
#   bash bench/checkpoint/async.sh [--rounds R] [--interval K] [--binary PATH] -- ARGS...
# e.g. (bench/README.md, Checkpoints) Qwen3-0.6B at 2 layers, 1 x 512, 6 steps:
#   bash bench/checkpoint/async.sh --rounds 2 -- --config configs/qwen3_0.6b.toml \
#     --model.n_layers=2 --training.seq_len=512 --training.local_batch_size=1 \
#     --training.steps=9 --model.tokenizer_path=../shared/tokenizers/qwen3 \
#     --training.dataset_path=../shared/data/c4_sample/c4_sample.jsonl
# The checkpoints go to a temporary folder under /tmp (removed at the end), on its disk.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$root/build/qtitan
rounds=1 interval=3
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case $1 in
    --binary) bin=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --interval) interval=$2; shift 2 ;;
    *) echo "async.sh: unknown option $1 (expected --binary, --rounds, --interval or --)"; exit 2 ;;
  esac
done
[ $# -gt 0 ] && shift
work=$(mktemp -d /tmp/qt_ckpt_async_XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cpus; $(date -u '+%Y-%m-%d %H:%M UTC')"
for r in $(seq 1 "$rounds"); do
  for mode in disabled async; do
    rm -rf "$work/run"
    load=$(cut -d' ' -f1 /proc/loadavg)
    t0=$(date +%s.%N)
    "$bin" train "$@" --checkpoint.enable=true --checkpoint.interval="$interval" \
      --checkpoint.async_mode=$mode --metrics.log_freq=1 --job.dump_folder="$work/run" \
      >"$work/log" 2>&1 || { cat "$work/log"; exit 1; }
    t1=$(date +%s.%N)
    steps=$(grep -o '"step_time_s":[0-9.e-]*' "$work/run/metrics.jsonl" | cut -d: -f2 |
      awk '{ s += $1 } END { printf "%.2f", s }')
    saves=$(grep -c '^\[checkpoint\] \(saved\|staged\) step [0-9]* in' "$work/log" || true)
    staged=$(sed -n 's/^\[checkpoint\] staged step [0-9]* in \([0-9.]*\) s.*/\1/p' "$work/log" |
      awk '{ s += $1 } END { printf "%.2f", s }')
    sync=$(sed -n 's/^\[checkpoint\] saved step [0-9]* in \([0-9.]*\) s$/\1/p' "$work/log" |
      awk '{ s += $1 } END { printf "%.2f", s }')
    bg=$(sed -n 's/^\[checkpoint\] saved step [0-9]* in \([0-9.]*\) s, in the background$/\1/p' \
      "$work/log" | awk '{ s += $1 } END { printf "%.2f", s }')
    awk -v r="$r" -v m="$mode" -v w="$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" \
      -v st="$steps" -v sy="$sync" -v sg="$staged" -v bg="$bg" -v n="$saves" -v l="$load" \
      'BEGIN { printf "round %d %-8s: wall %6.2f s, steps %6.2f s, saves on the loop %6.2f s (written at once %s, staged %s), written in the background %s s, %d log lines of saves, load %s\n", r, m, w, st, sy + sg, sy, sg, bg, n, l }'
  done
done
