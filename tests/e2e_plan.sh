#!/usr/bin/env bash
# qtitan plan against real runs: for jobs whose arenas dominate (the debug model with a
# bigger batch, and the 0.6B shape cut to 2 layers at seq 256; each also with LoRA, and the
# 0.6B one with a bf16 base, also on FSDP 2; with [sample]), plan's total must be within 10% of
# the peak RSS the real training reports in metrics.jsonl (memory_gib) after 2 steps.
# shellcheck source=tests/c4_lib.sh
. "$(dirname "$0")/c4_lib.sh"
# debugmodel has a 2048-token vocabulary: train a tokenizer of that size on the sample.
"$QT_BINARY" tokenizer-train --input "$data" --vocab-size 2048 --output "$tmp/tok2048" >/dev/null 2>&1

launch=() # a launcher for the training run (mpirun for the mesh check below)
check() { # name, then the job's arguments
  local name=$1; shift
  local args=(--config "$QT_SOURCE_DIR/configs/debug.toml" --training.dataset_path="$data"
    --training.steps=2 --metrics.peak_tflops=1 --job.dump_folder="$tmp/$name" "$@")
  "$QT_BINARY" plan "${args[@]}" >"$tmp/$name.plan" || { cat "$tmp/$name.plan"; echo "FAIL: plan $name"; exit 1; }
  rm -rf "$QT_CACHE_DIR" # the plan counts a first run's tokenization
  ${launch[@]+"${launch[@]}"} "$QT_BINARY" train "${args[@]}" >"$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log"; echo "FAIL: train $name"; exit 1; }
  local planned measured
  planned=$(sed -n 's/^plan: total_gib=\([0-9.]*\).*/\1/p' "$tmp/$name.plan")
  measured=$(tail -1 "$tmp/$name/metrics.jsonl" | sed -n 's/.*"memory_gib":\([0-9.eE+-]*\).*/\1/p')
  [ -n "$planned" ] && [ -n "$measured" ] || { cat "$tmp/$name.plan" "$tmp/$name.log"; echo "FAIL: $name: no numbers"; exit 1; }
  awk -v p="$planned" -v m="$measured" -v n="$name" 'BEGIN {
    d = (p - m) / m; printf "%s: plan %.3f GiB, measured peak %.3f GiB (%+.1f%%)\n", n, p, m, 100 * d;
    exit (d > 0.10 || d < -0.10) }' || { cat "$tmp/$name.plan"; echo "FAIL: $name: plan is more than 10% off"; exit 1; }
}
check debug --model.tokenizer_path="$tmp/tok2048" --training.local_batch_size=4 --training.seq_len=64
check qwen3_0.6B_2l --model.tokenizer_path="$tok" --model.flavor=0.6B --model.n_layers=2 \
  --training.local_batch_size=1 --training.seq_len=256
# LoRA: the frozen base (fp32, and held in bf16), adapters on every linear, their AdamW state.
lora=(--lora.rank=16 --lora.alpha=32 "--lora.targets=layers.*.attention.*,layers.*.feed_forward.*")
check lora_debug --model.tokenizer_path="$tmp/tok2048" --training.local_batch_size=4 --training.seq_len=64 "${lora[@]}"
check lora_0.6B_2l --model.tokenizer_path="$tok" --model.flavor=0.6B --model.n_layers=2 \
  --training.local_batch_size=1 --training.seq_len=256 "${lora[@]}"
check lora_bf16_0.6B_2l --model.tokenizer_path="$tok" --model.flavor=0.6B --model.n_layers=2 \
  --training.local_batch_size=1 --training.seq_len=256 "${lora[@]}" --lora.base_dtype=bfloat16
# On FSDP 2 (rank 0's peak): a bf16 base's shards and gathers are bf16, 2 bytes a parameter of
# the rank's half (and of the gathered units, plus their widened fp32 copies: the bf16 path is
# forced to widen so that plan and run cannot pick different ones).
if command -v mpirun >/dev/null && [ -x "$(dirname "$QT_BINARY")/mpi_comm" ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
  launch=(env OMP_NUM_THREADS=1 mpirun --oversubscribe -np 2)
  QT_GEMM_BF16=widen check lora_bf16_fsdp2_0.6B_2l --model.tokenizer_path="$tok" --model.flavor=0.6B \
    --model.n_layers=2 --training.local_batch_size=1 --training.seq_len=256 "${lora[@]}" \
    --lora.base_dtype=bfloat16 --parallelism.data_parallel_shard_degree=2
  launch=()
else
  echo "skip: the FSDP 2 check (no mpirun or a build without MPI)"
fi
# [sample] (docs/generate.md): a LoRA run samples from a merged whole copy of the model (about
# as big as the frozen base), and the debug model with 8 long prompts is dominated by the
# decoder's KV cache (bf16 matmuls: the decoder's bf16 scratch too). The plan names the way.
long=$(printf 'the quick brown fox jumps over the lazy dog near the river bank %.0s' {1..24})
prompts="--sample.prompts=$(for i in 1 2 3 4 5 6 7 8; do echo "$i $long"; done)"
check lora_sample_0.6B_2l --model.tokenizer_path="$tok" --model.flavor=0.6B --model.n_layers=2 \
  --training.local_batch_size=1 --training.seq_len=256 "${lora[@]}" --sample.freq=1 \
  --sample.max_new_tokens=2 "--sample.prompts=the quick brown fox"
grep -q '^  samples .*(whole copy)' "$tmp/lora_sample_0.6B_2l.plan" \
  || { cat "$tmp/lora_sample_0.6B_2l.plan"; echo "FAIL: plan should count LoRA's whole copy"; exit 1; }
check sample_kv_debug --model.tokenizer_path="$tmp/tok2048" --training.local_batch_size=4 --training.seq_len=64 \
  --training.mixed_precision_param=bfloat16 --sample.freq=1 --sample.max_new_tokens=2 \
  --sample.temperature=0 "$prompts"
grep -q '^  samples .*(own model)' "$tmp/sample_kv_debug.plan" \
  || { cat "$tmp/sample_kv_debug.plan"; echo "FAIL: plan should count the KV cache"; exit 1; }
# Kernel replacements are logged once, as training logs them.
"$QT_BINARY" plan --config "$QT_SOURCE_DIR/configs/debug_kernels.toml" >"$tmp/kernels.plan" 2>&1
[ "$(grep -c 'layers.0.attention.sdpa: sdpa -> flash' "$tmp/kernels.plan")" = 1 ] \
  || { cat "$tmp/kernels.plan"; echo "FAIL: plan should log each replacement once"; exit 1; }
# The step-time model on an EP 4 x TP 2 MoE mesh over two hosts of 4 (data_parallel_shard_degree
# = -1 taking the cluster's ranks, which the expert-parallel degree needs): the memory plan keeps
# 1/2 of each rank's experts (FSDP over 4 x 2 / 4 ranks), and the experts' gathers run over that
# group across the hosts, the all-to-all inside one (4 consecutive ranks), the router's gradient
# over tp.
"$QT_BINARY" plan --config "$QT_SOURCE_DIR/configs/debug_moe.toml" --cluster 2x4 --flops 989 \
  --intra-bw 450 --inter-bw 400 --parallelism.tensor_parallel_degree=2 \
  --parallelism.expert_parallel_degree=4 >"$tmp/ep.plan" 2>&1 || { cat "$tmp/ep.plan"; echo "FAIL: plan EP x TP"; exit 1; }
for want in "expert parallel 4: 2 of the 8 experts of each MoE layer per rank, 1/2 of them kept" \
  "mesh: dp_replicate 1, dp_shard 4, tp 2, ep 4;" "FSDP all-gather (experts)      ep_shard        2 ranks inter-host" \
  "EP all-to-all                  ep              4 ranks intra-host" "TP router all-reduce           tp              2 ranks"; do
  grep -qF "$want" "$tmp/ep.plan" || { cat "$tmp/ep.plan"; echo "FAIL: plan EP x TP lacks: $want"; exit 1; }
done
# Every LoRA target counts, however long the list (past 256 the rest were silently dropped):
# 256 copies of one target then a second adapt what the two alone adapt.
many="$(printf 'layers.0.attention.wq,%.0s' $(seq 256))layers.*.feed_forward.w2"
for t in "$many" 'layers.0.attention.wq,layers.*.feed_forward.w2'; do
  "$QT_BINARY" plan --config "$QT_SOURCE_DIR/configs/debug.toml" --lora.rank=4 --lora.targets="$t" 2>&1 | grep '^lora: '
done >"$tmp/targets.txt"
[ "$(wc -l <"$tmp/targets.txt")" = 2 ] && [ "$(sort -u "$tmp/targets.txt" | wc -l)" = 1 ] ||
  { cat "$tmp/targets.txt"; echo "FAIL: a long lora.targets list should adapt every target"; exit 1; }
echo "e2e_plan: ok"
