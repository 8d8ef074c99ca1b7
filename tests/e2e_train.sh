#!/usr/bin/env bash
# qtitan train end to end on the C4 sample with the Qwen3 tokenizer and a tiny model: the run
# logs every step, writes metrics.jsonl and checkpoints, and a run resumed from its step-2
# checkpoint ends with bitwise the same losses, parameters and optimizer state as a run that
# never stopped (docs/training.md).
# shellcheck source=tests/c4_lib.sh
. "$(dirname "$0")/c4_lib.sh"
train() {
  "$QT_BINARY" train --config "$QT_SOURCE_DIR/configs/debug.toml" \
    --model.tokenizer_path="$tok" --training.dataset_path="$data" \
    --model.vocab_size=151936 --model.dim=32 --model.n_layers=2 --model.n_heads=4 \
    --model.n_kv_heads=2 --model.head_dim=8 --model.hidden_dim=64 \
    --training.seq_len=32 --training.local_batch_size=2 --training.steps=4 \
    --checkpoint.enable=true --checkpoint.interval=2 --metrics.peak_tflops=1 \
    --job.dump_folder="$1" "${@:2}" 2>&1
}
train "$tmp/a" >"$tmp/a.log"
[ "$(grep -c '^step: ' "$tmp/a.log")" = 4 ] || { cat "$tmp/a.log"; echo "FAIL: expected 4 step lines"; exit 1; }
grep -q '^steady state over 3 steps' "$tmp/a.log" || { echo "FAIL: no steady-state summary"; exit 1; }
[ "$(wc -l <"$tmp/a/metrics.jsonl")" = 4 ] || { echo "FAIL: metrics.jsonl should have 4 lines"; exit 1; }
[ -f "$tmp/a/checkpoint/step-2/model.safetensors" ] && [ -f "$tmp/a/checkpoint/step-4/train_state.json" ] \
  || { ls -R "$tmp/a"; echo "FAIL: checkpoints missing"; exit 1; }

# Run d: checkpoint.async_mode = "async" (torchtitan's): steps 1-3 are staged and written by a
# thread while training goes on, the last step at once; keep_latest_k = 2 prunes as a
# synchronous run does, and the files hold bitwise what run a saved.
train "$tmp/d" --checkpoint.interval=1 --checkpoint.async_mode=async --checkpoint.keep_latest_k=2 >"$tmp/d.log"
[ "$(grep -c '^\[checkpoint\] staged step [123] in .*; writing it in the background$' "$tmp/d.log")" = 3 ] &&
  [ "$(grep -c '^\[checkpoint\] saved step [123] in .* s, in the background$' "$tmp/d.log")" = 3 ] &&
  grep -q '^\[checkpoint\] saved step 4 in [0-9.]* s$' "$tmp/d.log" ||
  { cat "$tmp/d.log"; echo "FAIL: async saves of steps 1-3 and a synchronous last one expected"; exit 1; }
[ "$(cd "$tmp/d/checkpoint" && echo step-*)" = "step-3 step-4" ] ||
  { ls -R "$tmp/d"; echo "FAIL: keep_latest_k = 2 should leave steps 3 and 4"; exit 1; }
for f in model.safetensors optim.safetensors; do
  cmp "$tmp/a/checkpoint/step-4/$f" "$tmp/d/checkpoint/step-4/$f" \
    || { echo "FAIL: $f of the async run differs from run a's"; exit 1; }
done
# Resumed from its step-3 checkpoint (written in the background), it ends as run a.
rm -rf "$tmp/d/checkpoint/step-4"
train "$tmp/d" --checkpoint.interval=1 --checkpoint.async_mode=async >"$tmp/d2.log"
grep -q 'resumed from .*step-3' "$tmp/d2.log" && cmp "$tmp/a/checkpoint/step-4/optim.safetensors" \
  "$tmp/d/checkpoint/step-4/optim.safetensors" || { cat "$tmp/d2.log"; echo "FAIL: resume from an async save"; exit 1; }
# A background write that fails (files over 2 MB refused: the model file is 19 MB) stops the
# run at a later step with the write's sentence.
set +e
(trap '' XFSZ; ulimit -f 2048; train "$tmp/e" --checkpoint.interval=1 --checkpoint.async_mode=async) >"$tmp/e.log"
rc=$?
set -e
[ $rc -ne 0 ] && grep -q 'checkpoint of step 1 in .*/e/checkpoint failed' "$tmp/e.log" &&
  [ "$(grep -c '^step: ' "$tmp/e.log")" -le 2 ] ||
  { cat "$tmp/e.log"; echo "FAIL: a failed background write should stop the run with its sentence"; exit 1; }

# Run b: the same job, interrupted after step 2 (its step-4 checkpoint removed), then resumed;
# its checkpoint.folder is absolute, so it lives outside the dump folder (as in torchtitan).
train "$tmp/b" --checkpoint.folder="$tmp/b_ckpt" >"$tmp/b1.log"
[ -d "$tmp/b_ckpt/step-2" ] && [ ! -e "$tmp/b/checkpoint" ] \
  || { ls -R "$tmp"; echo "FAIL: an absolute checkpoint.folder should be used as it is"; exit 1; }
rm -rf "$tmp/b_ckpt/step-4"
train "$tmp/b" --checkpoint.folder="$tmp/b_ckpt" >"$tmp/b2.log"
grep -q 'resumed from .*step-2' "$tmp/b2.log" || { cat "$tmp/b2.log"; echo "FAIL: no resume"; exit 1; }
[ "$(grep -c '^step: ' "$tmp/b2.log")" = 2 ] || { echo "FAIL: the resumed run should run steps 3-4"; exit 1; }
for f in model.safetensors optim.safetensors; do
  cmp "$tmp/a/checkpoint/step-4/$f" "$tmp/b_ckpt/step-4/$f" \
    || { echo "FAIL: $f after a resume differs from the uninterrupted run"; exit 1; }
done
# Losses of steps 3 and 4, as written with 17 significant digits; two finite ones each, so
# that a format change (no match in either file) cannot pass as equal.
losses() { grep -o '"step":[34],"loss":[0-9][^,]*' "$1" || true; }
la=$(losses "$tmp/a/metrics.jsonl"); lb=$(losses "$tmp/b/metrics.jsonl")
[ "$(grep -c . <<<"$la")" = 2 ] || { cat "$tmp/a/metrics.jsonl"; echo "FAIL: no losses of steps 3-4"; exit 1; }
[ "$la" = "$lb" ] || { echo "FAIL: resumed losses differ"; exit 1; }
# The resumed run redid steps 3-4: metrics.jsonl has each step once, in order.
[ "$(grep -o '"step":[0-9]*' "$tmp/b/metrics.jsonl" | tr '\n' ' ')" = '"step":1 "step":2 "step":3 "step":4 ' ] \
  || { cat "$tmp/b/metrics.jsonl"; echo "FAIL: metrics.jsonl after a resume should hold steps 1-4 once"; exit 1; }

# Run c: checkpoint.last_save_model_only. Step 2 keeps the optimizer state, the last step holds
# the weights only (the same bytes as run a's), a re-run of the finished job has nothing to do,
# and continuing past it is refused with a sentence.
train "$tmp/c" --checkpoint.last_save_model_only=true >"$tmp/c1.log"
jq -e '.model_only == true' "$tmp/c/checkpoint/step-4/train_state.json" >/dev/null \
  || { cat "$tmp/c/checkpoint/step-4/train_state.json"; echo "FAIL: step 4 should be model-only"; exit 1; }
jq -e 'has("model_only") | not' "$tmp/c/checkpoint/step-2/train_state.json" >/dev/null \
  || { echo "FAIL: step 2 should keep the optimizer state"; exit 1; }
cmp "$tmp/a/checkpoint/step-4/model.safetensors" "$tmp/c/checkpoint/step-4/model.safetensors" \
  || { echo "FAIL: the model-only save differs from the full one"; exit 1; }
[ "$(stat -c %s "$tmp/c/checkpoint/step-4/optim.safetensors")" -lt 1000 ] \
  || { echo "FAIL: the model-only save holds optimizer tensors"; exit 1; }
train "$tmp/c" --checkpoint.last_save_model_only=true >"$tmp/c2.log" \
  || { cat "$tmp/c2.log"; echo "FAIL: re-running the finished job should succeed"; exit 1; }
[ "$(grep -c '^step: ' "$tmp/c2.log" || true)" = 0 ] || { echo "FAIL: nothing should be retrained"; exit 1; }
grep -q 'already at training.steps = 4; nothing to train' "$tmp/c2.log" \
  || { cat "$tmp/c2.log"; echo "FAIL: a finished run should say it has nothing to train"; exit 1; }
if train "$tmp/c" --training.steps=6 >"$tmp/c3.log"; then
  echo "FAIL: continuing from a model-only checkpoint should fail"; exit 1
fi
grep -q 'holds the model only' "$tmp/c3.log" || { cat "$tmp/c3.log"; echo "FAIL: no sentence"; exit 1; }
"$QT_BINARY" export --checkpoint "$tmp/c/checkpoint" --out "$tmp/c_hf" >/dev/null 2>&1 \
  || { echo "FAIL: qtitan export of a model-only checkpoint"; exit 1; }

# Run g: bf16 mixed precision. The checkpoint records how its bf16 products were multiplied
# (oneDNN's bf16 matmul, qtitan's AMX tiles or fp32 GEMMs on widened operands, ops/gemm.h), and a resume multiplies
# alike even where this host's own choice is the other path: a run pinned to the path the host
# would not choose, stopped after step 2 and resumed unpinned, ends bitwise as the pinned run
# that never stopped. A resume pinned to the other path warns.
bf16=(--training.mixed_precision_param=bfloat16)
train "$tmp/g_auto" "${bf16[@]}" >"$tmp/g_auto.log" || { cat "$tmp/g_auto.log"; echo "FAIL: bf16 run"; exit 1; }
auto=$(jq -r .gemm_bf16 "$tmp/g_auto/checkpoint/step-4/train_state.json")
case $auto in widen) other=onednn ;; onednn | amx) other=widen ;;
  *) echo "FAIL: train_state.json of a bf16 run should record gemm_bf16, got '$auto'"; exit 1 ;; esac
jq -e 'has("gemm_bf16") | not' "$tmp/a/checkpoint/step-4/train_state.json" >/dev/null \
  || { echo "FAIL: an fp32 run's train_state.json should not record gemm_bf16"; exit 1; }
QT_GEMM_BF16=$other train "$tmp/g_ref" "${bf16[@]}" >"$tmp/g_ref.log" || { cat "$tmp/g_ref.log"; echo "FAIL: pinned bf16 run"; exit 1; }
QT_GEMM_BF16=$other train "$tmp/g" "${bf16[@]}" >/dev/null
cp -r "$tmp/g/checkpoint/step-2" "$tmp/g_step2"
rm -rf "$tmp/g/checkpoint/step-4"
train "$tmp/g" "${bf16[@]}" >"$tmp/g2.log" || { cat "$tmp/g2.log"; echo "FAIL: bf16 resume"; exit 1; }
grep -q "gemm: .*(the path checkpoint step 2 was trained with)" "$tmp/g2.log" \
  || { grep gemm "$tmp/g2.log"; echo "FAIL: the resume should multiply as step 2 did ($other)"; exit 1; }
[ "$(jq -r .gemm_bf16 "$tmp/g/checkpoint/step-4/train_state.json")" = "$other" ] \
  || { echo "FAIL: the resumed run's step 4 should record $other"; exit 1; }
for f in model.safetensors optim.safetensors; do
  cmp "$tmp/g_ref/checkpoint/step-4/$f" "$tmp/g/checkpoint/step-4/$f" \
    || { echo "FAIL: bf16 $f after a resume differs from the uninterrupted run"; exit 1; }
done
rm -rf "$tmp/g/checkpoint/step-4" && rm -rf "$tmp/g/checkpoint/step-2" && cp -r "$tmp/g_step2" "$tmp/g/checkpoint/step-2"
QT_GEMM_BF16=$auto train "$tmp/g" "${bf16[@]}" >"$tmp/g3.log" || { cat "$tmp/g3.log"; echo "FAIL: pinned bf16 resume"; exit 1; }
grep -q 'step 2 multiplied its bf16 products .*QT_GEMM_BF16.*last bits' "$tmp/g3.log" \
  || { cat "$tmp/g3.log"; echo "FAIL: a resume pinned to the other bf16 path should warn"; exit 1; }
echo "e2e_train: ok"
