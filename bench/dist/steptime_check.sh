#!/usr/bin/env bash
# The step-time model (qtitan plan --cluster) against measured runs on this machine, with every
# input of the model measured in the same session: the fp32 peak and the kernels' efficiency
# from a one-process run (its mfu), the shared-memory all-gather bandwidth between two ranks
# and the latency of a small all-gather that follows 2 ms of work on each rank (mpi_comm
# bench). Then the debugmodel (seq 128, local batch 2, global batch 4) on
# FSDP 2 and on TP 2 under mpirun, each rank with one OpenMP thread, and the model's step time
# for the same meshes; with `moe`, configs/debug_moe.toml's model (8 experts, top 2, 4 layers)
# on EP 2 and EP 2 x TP 2 instead. Prints measured and modeled step times (mean over steps 2..),
# the measured time in collectives (comm_s) beside the modeled exposed communication, and the
# error.
#   bash bench/dist/steptime_check.sh [STEPS] [dense|moe]   (from the repo root, after
#   scripts/build.sh)
set -euo pipefail
steps=${1:-6}
kind=${2:-dense}
# shellcheck source=bench/dist/common.sh
. "$(dirname "$0")/common.sh"
config=configs/debug.toml meshes="fsdp2 tp2"
[ "$kind" = moe ] && config=configs/debug_moe.toml meshes="ep2 ep2tp2"
job=(--config "$config" --model.tokenizer_path=tests/fixtures/tokenizer/tiny_gpt2
  --training.dataset_path="$tmp/data.jsonl" --training.seq_len=128 --training.local_batch_size=2
  --training.global_batch_size=4 --training.steps="$steps")
mean() { # field of metrics.jsonl, mean over steps 2..
  grep -o "\"$2\":[^,}]*" "$1/metrics.jsonl" | cut -d: -f2 | awk 'NR > 1 { t += $1; n++ } END { printf "%.6g", t / n }'
}
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
mpirun --oversubscribe -np 2 "$(dirname "$bin")/mpi_comm" bench 4000000 >"$tmp/bench.log" 2>&1
bw=$(sed -n 's/.*all-gather of [0-9]* floats: [0-9.]* ms, \([0-9.]*\) GB\/s.*/\1/p' "$tmp/bench.log")
lat=$(sed -n 's/.*after 2 ms of work: \([0-9.]*\) us per message/\1/p' "$tmp/bench.log")
"$bin" train "${job[@]}" --job.dump_folder="$tmp/one" >"$tmp/one.log" 2>&1
peak=$(sed -n 's/.*measured peak: \([0-9.]*\) TFLOP\/s.*/\1/p' "$tmp/one.log" | head -1)
eff=$(awk -v m="$(mean "$tmp/one" mfu)" 'BEGIN { printf "%.4f", m / 100 }')
echo "inputs: peak $peak TFLOP/s per rank, eff $eff (1 process: step $(mean "$tmp/one" step_time_s) s), all-gather $bw GB/s, $lat us per message"
printf '%-6s %24s %24s %8s\n' mesh "measured: step (comm_s)" "modeled: step (exposed)" error
for mesh in $meshes; do
  case $mesh in
    fsdp2) par=(--parallelism.data_parallel_shard_degree=2) ;;
    tp2) par=(--parallelism.data_parallel_shard_degree=1 --parallelism.tensor_parallel_degree=2) ;;
    ep2) par=(--parallelism.data_parallel_shard_degree=2 --parallelism.expert_parallel_degree=2) ;;
    ep2tp2) par=(--parallelism.data_parallel_shard_degree=1 --parallelism.tensor_parallel_degree=2
      --parallelism.expert_parallel_degree=2) ;;
  esac
  mpirun --oversubscribe -np 2 "$bin" train "${job[@]}" "${par[@]}" --metrics.peak_tflops="$peak" \
    --job.dump_folder="$tmp/$mesh" >"$tmp/$mesh.log" 2>&1
  "$bin" plan "${job[@]}" "${par[@]}" --cluster 1x2 --flops "$peak" --eff "$eff" --intra-bw "$bw" \
    --inter-bw "$bw" --latency-us "$lat" --overlap 0.25 --mem 20 >"$tmp/$mesh.plan" 2>/dev/null
  awk -v m="$mesh" -v g="$(mean "$tmp/$mesh" step_time_s)" -v gc="$(mean "$tmp/$mesh" comm_s)" \
    -v w="$(sed -n '0,/^steptime:/s/^steptime: step_s=\([0-9.e+-]*\).*/\1/p' "$tmp/$mesh.plan")" \
    -v wc="$(sed -n '0,/exposed communication/s/.*exposed communication \([0-9.]*\) s/\1/p' "$tmp/$mesh.plan")" \
    'BEGIN { printf "%-6s %12.3f s (%6.3f s) %12.3f s (%6.3f s) %+7.0f%%\n", m, g, gc, w, wc, 100 * (w - g) / g }'
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
