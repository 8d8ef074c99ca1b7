#!/usr/bin/env bash
# qtitan generate --adapter (and eval --dataset --adapter): a tiny base model is trained two
# steps and exported as an HF directory, then LoRA-fine-tuned three steps from it (rsLoRA:
# lora.use_rslora, scale alpha / sqrt(r)), which writes the peft adapter folder and the merged
# model. Greedy generation of a batch of prompts from
# the base with the adapter folder is token-for-token (and log-prob for log-prob) the merged
# export's, in fp32 and bf16, and differs from the base's alone; eval --dataset gives the
# merged model's loss; the LoRA run's own greedy samples of its last step are generate
# --adapter's; a missing or foreign adapter folder fails with one sentence.
# shellcheck source=tests/infer_lib.sh
. "$(dirname "$0")/infer_lib.sh"

common=(--config "$SRC/configs/debug.toml" --model.tokenizer_path="$FIX"
  --training.dataset_path="$FIX/docs.jsonl" --training.seq_len=16 --training.local_batch_size=2
  --metrics.peak_tflops=1 --checkpoint.enable=true --checkpoint.last_save_in_hf=true)
"$QT" train "${common[@]}" --model.vocab_size=608 --model.dim=32 --model.n_layers=2 \
  --model.n_heads=2 --model.n_kv_heads=1 --model.head_dim=16 --model.hidden_dim=64 \
  --training.steps=2 --job.dump_folder="$TMP/base" >"$TMP/base.log" 2>&1 ||
  fail "base run: $(tail -3 "$TMP/base.log")"
base=$TMP/base/checkpoint/step-2/hf
"$QT" train "${common[@]}" --model.flavor=hf --model.hf_assets_path="$base" \
  --checkpoint.initial_load_path="$base" --checkpoint.initial_load_in_hf=true --lora.rank=4 \
  --lora.alpha=8 --lora.use_rslora=true --optimizer.lr=5e-2 --training.steps=3 --job.dump_folder="$TMP/lora" \
  --sample.freq=3 --sample.temperature=0 --sample.max_new_tokens=24 "--sample.prompts=The quick
A cafe and the
hello" \
  >"$TMP/lora.log" 2>&1 || fail "LoRA run: $(tail -3 "$TMP/lora.log")"
[ -f "$TMP/lora/adapter/adapter_model.safetensors" ] && [ -f "$TMP/lora/merged/model.safetensors" ] ||
  fail "the LoRA run wrote no adapter or merged model: $(ls -R "$TMP/lora")"
grep -q 'scale 4 = alpha / sqrt(rank): rsLoRA' "$TMP/lora.log" ||
  fail "the LoRA run's log does not give rsLoRA's scale 8 / sqrt(4): $(grep 'lora:' "$TMP/lora.log")"
grep -q '"use_rslora": true' "$TMP/lora/adapter/adapter_config.json" ||
  fail "adapter_config.json does not say use_rslora: $(cat "$TMP/lora/adapter/adapter_config.json")"

# qtitan export --model BASE --adapter DIR writes the run's merged export, byte for byte (the
# same merge, in fp32), with the adapter folder's tokenizer files; in bf16 too.
"$QT" export --model "$base" --adapter "$TMP/lora/adapter" --out "$TMP/exported" 2>"$TMP/err" ||
  fail "export --adapter: $(cat "$TMP/err")"
cmp "$TMP/exported/model.safetensors" "$TMP/lora/merged/model.safetensors" ||
  fail "export --model --adapter differs from the LoRA run's merged export"
for f in config.json tokenizer.json; do
  [ -f "$TMP/exported/$f" ] || fail "export --adapter wrote no $f: $(ls "$TMP/exported")"
done
"$QT" export --model "$base" --adapter "$TMP/lora/adapter" --out "$TMP/exported16" --dtype bfloat16 \
  2>"$TMP/err" || fail "export --adapter --dtype bfloat16: $(cat "$TMP/err")"
grep -q '"torch_dtype": "bfloat16"' "$TMP/exported16/config.json" ||
  fail "bf16 export's config: $(cat "$TMP/exported16/config.json")"
expect_error export "give --checkpoint STEP_DIR, or --model HFDIR with --adapter DIR" --model "$base" --out "$TMP/x"
echo "export --model --adapter: the LoRA run's merged export, byte for byte"

printf 'The quick\nA cafe and the\nhello\n' >"$TMP/prompts.txt"
gen() { # out, dtype, model args...
  local out=$1 dtype=$2
  shift 2
  "$QT" generate "$@" --prompt-file "$TMP/prompts.txt" --temperature 0 --max-new-tokens 24 \
    --dtype "$dtype" --json >"$TMP/$out" 2>"$TMP/$out.err" || fail "generate $*: $(cat "$TMP/$out.err")"
  [ "$(wc -l <"$TMP/$out")" -eq 3 ] || fail "generate $*: $(cat "$TMP/$out")"
}
for dtype in float32 bfloat16; do
  gen "adapter-$dtype" "$dtype" --model "$base" --adapter "$TMP/lora/adapter"
  gen "merged-$dtype" "$dtype" --model "$TMP/lora/merged"
  gen "base-$dtype" "$dtype" --model "$base"
  cmp -s "$TMP/adapter-$dtype" "$TMP/merged-$dtype" ||
    fail "$dtype: base + adapter differs from the merged export: $(diff "$TMP/adapter-$dtype" "$TMP/merged-$dtype")"
  ! cmp -s "$TMP/adapter-$dtype" "$TMP/base-$dtype" || fail "$dtype: the adapter changed nothing"
  echo "$dtype: base + adapter = merged export, ids and log-probs of 3 prompts x 24 tokens"
done

# The LoRA run's last samples (greedy, the same prompts) are the adapter's generation.
ids() { grep -o '"ids":\[[0-9,]*\]' "$1"; }
[ "$(ids "$TMP/adapter-float32")" = "$(grep '^{"step":3,' "$TMP/lora/samples.jsonl" | ids /dev/stdin)" ] ||
  fail "the LoRA run's samples $(cat "$TMP/lora/samples.jsonl") are not generate --adapter's $(ids "$TMP/adapter-float32")"
echo "the LoRA run's step-3 samples = generate --adapter"

ev() { "$QT" eval "$@" --dataset "$FIX/docs.jsonl" --seq-len 16 2>/dev/null | sed -n 's/^loss: //p'; }
a=$(ev --model "$base" --adapter "$TMP/lora/adapter")
m=$(ev --model "$TMP/lora/merged")
[ -n "$a" ] && [ "$a" = "$m" ] || fail "eval --dataset: base + adapter $a, merged $m"
echo "eval --dataset: base + adapter = merged ($a)"

expect_error_in_log generate "$TMP/none" --model "$base" --adapter "$TMP/none" --prompt "The" \
  --max-new-tokens 2
expect_error_in_log generate "adapter" --model "$FIX" --adapter "$TMP/lora/adapter" --prompt "The" \
  --max-new-tokens 2
echo "e2e_generate_adapter: ok"
