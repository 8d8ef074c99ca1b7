#!/usr/bin/env bash
# FSDP communication on 2 ranks: the debugmodel (tied, 8 layers, dim 256) trained for a few
# steps under mpirun, with the next unit's gather prefetched (default) and without
# (QTITAN_FSDP_PREFETCH=0), and on one process for reference. Prints the mean step time and the
# time spent waiting in collectives (metrics.jsonl's comm_s) over the steps after the first.
#   bash bench/dist/run.sh [STEPS]        (from the repo root, after scripts/build.sh)
# Runs use OMP_NUM_THREADS=1 per rank; on a 2-core machine two ranks then use both cores.
set -euo pipefail
steps=${1:-8}
# shellcheck source=bench/dist/common.sh
. "$(dirname "$0")/common.sh"
args=(train --config configs/debug.toml --model.tokenizer_path=tests/fixtures/tokenizer/tiny_gpt2
  --training.dataset_path="$tmp/data.jsonl" --training.seq_len=128 --training.local_batch_size=2
  --training.global_batch_size=4 --training.steps="$steps" --metrics.peak_tflops=1)
# mean over steps 2.. of step_time_s and comm_s
summary() {
  sed -E 's/.*"step":([0-9]+),.*"step_time_s":([^,}]+).*/\1 \2/' "$1/metrics.jsonl" >"$tmp/t"
  grep -o '"comm_s":[^,}]*' "$1/metrics.jsonl" | cut -d: -f2 >"$tmp/c" || : >"$tmp/c"
  paste -d' ' "$tmp/t" "$tmp/c" | awk -v name="$2" 'NR > 1 { t += $2; c += $3; n++ }
    END { printf "%-28s step %.3f s   comm_s %.3f s (%.0f%% of the step)\n", name, t / n, c / n, 100 * c / t }'
}
nice "$bin" "${args[@]}" --job.dump_folder="$tmp/one" >/dev/null 2>&1
summary "$tmp/one" "1 process (2 micro-batches)"
nice mpirun --oversubscribe -np 2 "$bin" "${args[@]}" --job.dump_folder="$tmp/pf" >/dev/null 2>&1
summary "$tmp/pf" "FSDP 2 ranks, prefetch"
QTITAN_FSDP_PREFETCH=0 nice mpirun --oversubscribe -np 2 -x QTITAN_FSDP_PREFETCH "$bin" "${args[@]}" \
  --job.dump_folder="$tmp/nopf" >/dev/null 2>&1
summary "$tmp/nopf" "FSDP 2 ranks, no prefetch"
