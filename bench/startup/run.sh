#!/usr/bin/env bash
# Time to the first step of a qtitan train job: seconds from launch to the model's log line
# ("model: ...", arenas placed and parameters filled) and to the start of step 1 (its log line's
# time less the step's own step_time_s from metrics.jsonl), then the job is stopped. (Until
# 2026-12-05 it stopped at the first "gemm:" line, the first step's first GEMM; the GEMM layer
# now prints that line when the bf16 path is picked, while the model is built.)
#   bash bench/startup/run.sh [--binary PATH] [--rounds R] [--command train|eval|generate] -- ARGS...
# e.g. the 0.6B recipe at 1 x 512 (bench/README.md, Start-up):
#   bash bench/startup/run.sh --rounds 3 -- --config configs/qwen3_0.6b.toml \
#     --training.seq_len=512 --training.local_batch_size=1 \
#     --model.tokenizer_path=../shared/tokenizers/qwen3 \
#     --training.dataset_path=../shared/data/c4_sample/c4_sample.jsonl
# Prints one line per round: model_s, first_step_start_s, step1_s (wall clock),
# cpu_s_to_step1_end (user + system time of the job to the end of step 1, which a loaded machine
# disturbs less) and the load average.
# --command eval / generate times a whole `qtitan eval` / `qtitan generate` run instead (give
# it a short input: eval one short line, generate --max-new-tokens 1, so the run is its
# start-up and first forward or token): wall seconds, CPU seconds and peak RSS of the process.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=$root/build/qtitan
rounds=1 command=train
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case $1 in
    --binary) bin=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --command) command=$2; shift 2 ;;
    *) echo "run.sh: unknown option $1 (expected --binary, --rounds, --command or --)"; exit 2 ;;
  esac
done
[ $# -gt 0 ] && shift
work=$(mktemp -d /tmp/qt_startup_XXXXXX)
trap 'rm -rf "$work"' EXIT
if [ "$command" != train ]; then
  for r in $(seq 1 "$rounds"); do
    load=$(cut -d' ' -f1 /proc/loadavg)
    /usr/bin/time -o "$work/time" -f '%e %U %S %M' "$bin" "$command" "$@" >/dev/null 2>"$work/err" ||
      { cat "$work/err"; exit 1; }
    read -r wall user sys rss <"$work/time"
    printf 'round %d: wall_s %s cpu_s %s peak_rss_mib %d load %s\n' "$r" "$wall" \
      "$(echo "$user + $sys" | bc)" $((rss / 1024)) "$load"
  done
  exit 0
fi
for r in $(seq 1 "$rounds"); do
  load=$(cut -d' ' -f1 /proc/loadavg)
  start=$(date +%s.%N)
  mkfifo "$work/out"
  rm -rf "$work/dump"
  "$bin" train "$@" --metrics.log_freq=1 --job.dump_folder="$work/dump" >"$work/out" 2>&1 &
  pid=$!
  model=- step=- cpu=-
  while IFS= read -r line; do
    now=$(date +%s.%N)
    case $line in
      model:*) model=$(echo "$now - $start" | bc) ;;
      step:*)
        step=$(echo "$now - $start" | bc)
        ticks=$(awk '{print $14 + $15}' "/proc/$pid/stat")
        cpu=$(echo "scale=2; $ticks / $(getconf CLK_TCK)" | bc)
        kill "$pid"
        break
        ;;
      *rror*) echo "$line" ;;
    esac
  done <"$work/out"
  wait "$pid" 2>/dev/null || true
  rm -f "$work/out"
  # Step 1 began its own step_time_s before its line: the time to the first step.
  st=$(grep -m1 -o '"step_time_s":[0-9.e+-]*' "$work/dump/metrics.jsonl" 2>/dev/null | cut -d: -f2)
  first=-
  [ -n "$st" ] && [ "$step" != - ] && first=$(echo "$step - $st" | bc)
  num() { [ "$1" = - ] && echo - || printf '%.2f' "$1"; }
  printf 'round %d: model_s %s first_step_start_s %s step1_s %s cpu_s_to_step1_end %s load %s\n' \
    "$r" "$(num "$model")" "$(num "$first")" "$(num "${st:--}")" "$cpu" "$load"
done
