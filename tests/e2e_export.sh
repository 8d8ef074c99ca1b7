#!/usr/bin/env bash
# `qtitan export` from the command line: a checkpoint folder (its newest step) exported as
# sharded fp32 is what `qtitan inspect` accepts, evaluates to exactly the loss of the
# last_save_in_hf export of the same step, and has the same tensors bit for bit once re-read
# (test_hf_export compares with the checkpoint itself); bf16 halves the bytes; bad options
# are one-line errors.
set -euo pipefail
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export QT_CACHE_DIR=$tmp/cache
q=$QT_BINARY
awk -v docs=200 -v seed=9 -f "$QT_SOURCE_DIR/scripts/gen_corpus.awk" >"$tmp/corpus.jsonl"
"$q" tokenizer-train --input "$tmp/corpus.jsonl" --vocab-size 300 --output "$tmp/tok" 2>/dev/null
"$q" train --config "$QT_SOURCE_DIR/configs/debug.toml" --model.tokenizer_path="$tmp/tok" \
  --training.dataset_path="$tmp/corpus.jsonl" --model.vocab_size=320 --model.dim=32 \
  --model.n_layers=2 --model.n_heads=4 --model.n_kv_heads=2 --model.head_dim=8 \
  --model.hidden_dim=64 --training.seq_len=32 --training.local_batch_size=2 --training.steps=2 \
  --lr_scheduler.warmup_steps=1 --metrics.peak_tflops=1 --checkpoint.enable=true \
  --checkpoint.last_save_in_hf=true --job.dump_folder="$tmp/run" >"$tmp/train.log" 2>&1 \
  || { cat "$tmp/train.log"; echo "FAIL: train"; exit 1; }
"$q" export --checkpoint "$tmp/run/checkpoint" --out "$tmp/f32" --max-shard-size 20KB 2>/dev/null
"$q" export --checkpoint "$tmp/run/checkpoint/step-2" --out "$tmp/bf16" --dtype bfloat16 2>/dev/null
ls "$tmp/f32" | grep -q '^model-00001-of-0000[2-9].safetensors$' || { ls "$tmp/f32"; echo "FAIL: not sharded"; exit 1; }
[ -f "$tmp/f32/model.safetensors.index.json" ] && [ -f "$tmp/f32/tokenizer.json" ] || { echo "FAIL: files"; exit 1; }
"$q" inspect "$tmp/f32" | tail -1 | grep -q '^ok:' || { "$q" inspect "$tmp/f32"; echo "FAIL: inspect f32"; exit 1; }
"$q" inspect "$tmp/bf16" | tail -1 | grep -q '^ok:' || { echo "FAIL: inspect bf16"; exit 1; }
grep -q '"torch_dtype": "bfloat16"' "$tmp/bf16/config.json" || { echo "FAIL: torch_dtype"; exit 1; }
f32=$(stat -c %s "$tmp/run/checkpoint/step-2/hf/model.safetensors")
b16=$(stat -c %s "$tmp/bf16/model.safetensors")
[ $((b16 * 2)) -lt $((f32 + 4096)) ] || { echo "FAIL: bf16 is $b16 bytes, fp32 $f32"; exit 1; }
head -5 "$tmp/corpus.jsonl" | "$q" tokenize --tokenizer "$tmp/tok" >"$tmp/ids"
l1=$("$q" eval --model "$tmp/run/checkpoint/step-2/hf" --tokens "$tmp/ids" 2>/dev/null | grep "^loss")
l2=$("$q" eval --model "$tmp/f32" --tokens "$tmp/ids" 2>/dev/null | grep "^loss")
[ "$l1" = "$l2" ] || { echo "FAIL: $l1 vs $l2"; exit 1; }
rc=0; "$q" export --checkpoint "$tmp/run/checkpoint" --out "$tmp/x" --dtype int8 2>"$tmp/err" || rc=$?
[ "$rc" = 2 ] && grep -q "^error: --dtype int8" "$tmp/err" || { cat "$tmp/err"; echo "FAIL: dtype error"; exit 1; }
rc=0; "$q" export --checkpoint "$tmp/corpus.jsonl" --out "$tmp/x" 2>"$tmp/err" || rc=$?
[ "$rc" = 1 ] && [ "$(wc -l <"$tmp/err")" = 1 ] || { cat "$tmp/err"; echo "FAIL: not a checkpoint"; exit 1; }
echo "e2e_export: ok ($l1)"
