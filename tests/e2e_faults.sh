#!/usr/bin/env bash
# Bad configs and faults in `qtitan train`. Each bad config fails with exit 2 (config file) or
# 1 (job) and one "error:" sentence naming the key, before anything large is allocated: the
# model is the 4B flavor (~64 GB of parameters, gradients and AdamW state), so a check that
# came after the allocation would not finish within the timeout. Then: an unwritable dump
# folder; a disk that fills up at a checkpoint (a file-size limit) keeps the earlier
# checkpoint intact and leaves no partial one; a diverging run (lr 1e30) stops naming the
# step, or with training.skip_nonfinite finishes, leaving the model (MoE expert_bias included)
# as it was on the skipped steps; no checkpoint of it holds NaN.
set -euo pipefail
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export QT_CACHE_DIR=$tmp/cache
q=$QT_BINARY
awk -v docs=300 -v seed=5 -f "$QT_SOURCE_DIR/scripts/gen_corpus.awk" >"$tmp/corpus.jsonl"
"$q" tokenizer-train --input "$tmp/corpus.jsonl" --vocab-size 300 --output "$tmp/tok" 2>/dev/null
big=(--config "$QT_SOURCE_DIR/configs/debug.toml" --model.flavor=4B --model.tokenizer_path="$tmp/tok"
     --training.dataset_path="$tmp/corpus.jsonl" --training.seq_len=64 --training.local_batch_size=1
     --job.dump_folder="$tmp/big")

fails() { # exit code, expected text, then arguments to qtitan train
  local code=$1 want=$2; shift 2
  local rc=0
  timeout 20 "$q" train "$@" >"$tmp/out" 2>&1 || rc=$?
  [ "$rc" = "$code" ] || { cat "$tmp/out"; echo "FAIL: exit $rc, expected $code for: $want"; exit 1; }
  grep -qF -- "$want" "$tmp/out" || { cat "$tmp/out"; echo "FAIL: no \"$want\""; exit 1; }
  [ "$(grep -c '^error: ' "$tmp/out")" = 1 ] || { cat "$tmp/out"; echo "FAIL: one error line"; exit 1; }
  grep '^error: ' "$tmp/out"
}
printf '[training]\nsteps = "ten"\n' >"$tmp/type.toml"
fails 2 'unknown key "stepz" in [training]' "${big[@]}" --training.stepz=3
fails 2 'did you mean "steps"' "${big[@]}" --training.stepz=3
fails 2 "training.steps" --config "$tmp/type.toml"
fails 1 "global_batch_size = 5 is not a multiple" "${big[@]}" --training.global_batch_size=5 \
  --training.local_batch_size=2
fails 1 "training.seq_len = 50000 exceeds the model's max_seq_len 40960" "${big[@]}" \
  --training.seq_len=50000
fails 1 "initial_load_in_hf = true needs checkpoint.initial_load_path" "${big[@]}" \
  --checkpoint.initial_load_in_hf=true
fails 1 "$tmp/nowhere/data.jsonl" "${big[@]}" --training.dataset_path="$tmp/nowhere/data.jsonl"
touch "$tmp/file"
fails 1 "job.dump_folder $tmp/file/out cannot be created" "${big[@]}" --job.dump_folder="$tmp/file/out"

small=(--config "$QT_SOURCE_DIR/configs/debug.toml" --model.tokenizer_path="$tmp/tok"
       --training.dataset_path="$tmp/corpus.jsonl" --model.vocab_size=320 --model.dim=32
       --model.n_layers=2 --model.n_heads=4 --model.n_kv_heads=2 --model.head_dim=8
       --model.hidden_dim=64 --training.seq_len=32 --training.local_batch_size=2
       --metrics.peak_tflops=1 --checkpoint.enable=true --checkpoint.interval=1
       --lr_scheduler.warmup_steps=0)
# A full disk at the step-3 checkpoint: step 2 stays complete, no step 3 or temporary folder.
"$q" train "${small[@]}" --training.steps=2 --job.dump_folder="$tmp/full" >/dev/null 2>&1
rc=0
(trap '' XFSZ; ulimit -f 40; exec "$q" train "${small[@]}" --training.steps=4 \
  --job.dump_folder="$tmp/full") >"$tmp/out" 2>&1 || rc=$?
[ "$rc" = 1 ] || { cat "$tmp/out"; echo "FAIL: a full disk should fail the run"; exit 1; }
grep -q "^error: .*checkpoint of step 3 .* failed" "$tmp/out" || { cat "$tmp/out"; echo "FAIL: message"; exit 1; }
grep '^error: ' "$tmp/out"
[ "$(ls "$tmp/full/checkpoint" | tr '\n' ' ')" = "step-1 step-2 " ] \
  || { ls "$tmp/full/checkpoint"; echo "FAIL: leftovers"; exit 1; }
"$q" export --checkpoint "$tmp/full/checkpoint/step-2" --out "$tmp/full_hf" 2>/dev/null \
  || { echo "FAIL: step 2 no longer verifies"; exit 1; }

# Divergence: lr 1e30 makes the weights huge after step 1, so step 2's loss is not finite.
fails 1 "step 2: loss" "${small[@]}" --optimizer.lr=1e30 --training.steps=4 --job.dump_folder="$tmp/nan"
grep -q "training diverged" "$tmp/out" || { echo "FAIL: divergence message"; exit 1; }
[ "$(ls "$tmp/nan/checkpoint")" = step-1 ] || { ls "$tmp/nan/checkpoint"; echo "FAIL: checkpoints"; exit 1; }
"$q" train "${small[@]}" --optimizer.lr=1e30 --training.steps=4 --training.skip_nonfinite=true \
  --job.dump_folder="$tmp/skip" >"$tmp/out" 2>&1 || { cat "$tmp/out"; echo "FAIL: skip_nonfinite"; exit 1; }
[ "$(grep -c 'update skipped' "$tmp/out")" = 3 ] || { cat "$tmp/out"; echo "FAIL: 3 skipped updates"; exit 1; }
# A skipped step leaves the whole model as it was, an MoE model's expert_bias included (it
# moved on skipped steps before): steps 2-4 are skipped, so their checkpoints equal step 1's.
"$q" train "${small[@]}" --model.num_experts=4 --model.top_k=2 --model.moe_hidden_dim=32 \
  --optimizer.lr=1e30 --training.steps=4 --training.skip_nonfinite=true \
  --job.dump_folder="$tmp/skip_moe" >"$tmp/out" 2>&1 || { cat "$tmp/out"; echo "FAIL: skip_nonfinite MoE"; exit 1; }
[ "$(grep -c 'update skipped' "$tmp/out")" = 3 ] || { cat "$tmp/out"; echo "FAIL: 3 skipped MoE updates"; exit 1; }
for s in 2 4; do
  cmp "$tmp/skip_moe/checkpoint/step-1/model.safetensors" "$tmp/skip_moe/checkpoint/step-$s/model.safetensors" \
    || { echo "FAIL: skipped MoE step $s changed the model"; exit 1; }
done
# Every saved checkpoint's export evaluates to a finite loss (NaN weights would not).
head -3 "$tmp/corpus.jsonl" | "$q" tokenize --tokenizer "$tmp/tok" >"$tmp/ids"
for s in 1 4; do
  "$q" export --checkpoint "$tmp/skip/checkpoint/step-$s" --out "$tmp/skip_hf$s" 2>/dev/null
  loss=$("$q" eval --model "$tmp/skip_hf$s" --tokens "$tmp/ids" 2>/dev/null | sed -n 's/^loss: //p')
  case $loss in *nan*|*inf*|"") echo "FAIL: step-$s holds non-finite weights ($loss)"; exit 1 ;; esac
done
echo "e2e_faults: ok"
