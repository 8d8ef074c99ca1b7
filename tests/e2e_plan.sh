#!/usr/bin/env bash
# qtitan plan against real runs: for jobs whose arenas dominate (the debug model with a
# bigger batch, and the 0.6B shape cut to 2 layers at seq 256; each also with LoRA, and the
# 0.6B one with a bf16 base), plan's total must be within 10% of the peak RSS the real
# training reports in metrics.jsonl (memory_gib) after 2 steps.
# shellcheck source=tests/c4_lib.sh
. "$(dirname "$0")/c4_lib.sh"
# debugmodel has a 2048-token vocabulary: train a tokenizer of that size on the sample.
"$QT_BINARY" tokenizer-train --input "$data" --vocab-size 2048 --output "$tmp/tok2048" >/dev/null 2>&1

check() { # name, then the job's arguments
  local name=$1; shift
  local args=(--config "$QT_SOURCE_DIR/configs/debug.toml" --training.dataset_path="$data"
    --training.steps=2 --metrics.peak_tflops=1 --job.dump_folder="$tmp/$name" "$@")
  "$QT_BINARY" plan "${args[@]}" >"$tmp/$name.plan" || { cat "$tmp/$name.plan"; echo "FAIL: plan $name"; exit 1; }
  rm -rf "$QT_CACHE_DIR" # the plan counts a first run's tokenization
  "$QT_BINARY" train "${args[@]}" >"$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log"; echo "FAIL: train $name"; exit 1; }
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
# Kernel replacements are logged once, as training logs them.
"$QT_BINARY" plan --config "$QT_SOURCE_DIR/configs/debug_kernels.toml" >"$tmp/kernels.plan" 2>&1
[ "$(grep -c 'layers.0.attention.sdpa: sdpa -> flash' "$tmp/kernels.plan")" = 1 ] \
  || { cat "$tmp/kernels.plan"; echo "FAIL: plan should log each replacement once"; exit 1; }
echo "e2e_plan: ok"
