#!/usr/bin/env bash
# bf16 training on the AMX route end to end, with the tile products emulated (ops/gemm_amx.h,
# QT_AMX_EMULATE) so that any AVX-512 host runs it: the AMX GEMM with the layers' weights
# prepacked and repacked by AdamW every step, attention on tiles (head_dim 32) and the output
# layer in vocabulary panels. The run logs the prepack in its op profile, records the path
# "amx" in its checkpoints, and a run resumed from its step-2 checkpoint (whose packed forms
# are rebuilt from the loaded weights) ends with bitwise the same weights and optimizer state
# as the run that never stopped.
# shellcheck source=tests/c4_lib.sh
. "$(dirname "$0")/c4_lib.sh"
if ! grep -qw avx512f /proc/cpuinfo; then echo "skip: the emulation needs AVX-512"; exit 77; fi
export QT_AMX_EMULATE=1 QT_GEMM_BF16=amx
train() {
  "$QT_BINARY" train --config "$QT_SOURCE_DIR/configs/debug.toml" \
    --model.tokenizer_path="$tok" --training.dataset_path="$data" \
    --model.vocab_size=151936 --model.dim=64 --model.n_layers=2 --model.n_heads=2 \
    --model.n_kv_heads=1 --model.head_dim=32 --model.hidden_dim=96 \
    --training.seq_len=32 --training.local_batch_size=2 --training.steps=4 \
    --training.mixed_precision_param=bfloat16 \
    --checkpoint.enable=true --checkpoint.interval=2 --metrics.peak_tflops=1 \
    --job.dump_folder="$1" "${@:2}" 2>&1
}
QT_PROFILE=1 train "$tmp/a" >"$tmp/a.log" || { cat "$tmp/a.log"; echo "FAIL: emulated AMX run"; exit 1; }
[ "$(grep -c '^step: ' "$tmp/a.log")" = 4 ] || { cat "$tmp/a.log"; echo "FAIL: expected 4 step lines"; exit 1; }
grep -q "gemm: .*qtitan's AMX tiles" "$tmp/a.log" || { grep gemm "$tmp/a.log"; echo "FAIL: not on the AMX path"; exit 1; }
# 2 layers x 7 weights repacked once per step
grep -Eq '^  bf16 weight prepack +fwd +14\.0 ' "$tmp/a.log" \
  || { grep -A30 'op profile' "$tmp/a.log"; echo "FAIL: the profile should show 14 prepacks per step"; exit 1; }
# the output layer in vocabulary panels: one fused op, no cross-entropy op of its own
grep -Eq '^  lm_head_loss \[reference\] +fwd' "$tmp/a.log" && ! grep -q '^  cross_entropy' "$tmp/a.log" \
  || { grep -A30 'op profile' "$tmp/a.log"; echo "FAIL: the output layer should run in vocabulary panels"; exit 1; }
# attention on tiles: its tile products are in the profile's GEMM column, the rest of the op
# (softmax, casts) is not; two steps at 512 tokens (the profile skips the first), long enough
# for both parts to show in the profile's tenths of a millisecond
QT_PROFILE=1 train "$tmp/s" --training.seq_len=512 --training.local_batch_size=1 \
  --training.steps=2 --checkpoint.enable=false >"$tmp/s.log" || { cat "$tmp/s.log"; echo "FAIL: profile run"; exit 1; }
awk '$1 == "sdpa" { found++; if (!($6 > 0 && $6 < $5)) bad = 1 } END { exit !(found == 2 && !bad) }' "$tmp/s.log" \
  || { grep -A30 'op profile' "$tmp/s.log" || cat "$tmp/s.log"; echo "FAIL: sdpa's tile products should be GEMM time, and only they"; exit 1; }
[ "$(jq -r .gemm_bf16 "$tmp/a/checkpoint/step-4/train_state.json")" = amx ] \
  || { echo "FAIL: the checkpoint should record the path amx"; exit 1; }
train "$tmp/b" >/dev/null || { echo "FAIL: second run"; exit 1; }
rm -rf "$tmp/b/checkpoint/step-4"
train "$tmp/b" >"$tmp/b2.log" || { cat "$tmp/b2.log"; echo "FAIL: resume"; exit 1; }
grep -q 'resumed from .*step-2' "$tmp/b2.log" || { cat "$tmp/b2.log"; echo "FAIL: no resume"; exit 1; }
for f in model.safetensors optim.safetensors; do
  cmp "$tmp/a/checkpoint/step-4/$f" "$tmp/b/checkpoint/step-4/$f" \
    || { echo "FAIL: $f after a resume differs from the uninterrupted run"; exit 1; }
done
la=$(jq -c '[.loss]' "$tmp/a/metrics.jsonl" | tr -d '\n')
lb=$(jq -c '[.loss]' "$tmp/b/metrics.jsonl" | tr -d '\n')
[ "$la" = "$lb" ] || { echo "FAIL: resumed losses differ: $la vs $lb"; exit 1; }
echo "e2e_train_amx_emulated: ok"
