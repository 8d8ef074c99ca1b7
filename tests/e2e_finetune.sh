#!/usr/bin/env bash
# Fine-tuning from HF (docs/hf.md) end to end on a tiny HF directory: flavor = "hf" takes the architecture
# from its config.json, initial_load_in_hf loads its weights, last_save_in_hf writes the result
# back. With lr = 0 the written directory must equal the one loaded, byte for byte (config.json
# and weights); with a real lr it trains. HF weights that do not fit config.json (missing,
# unexpected, misshaped keys) are one error listing them all.
set -euo pipefail
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export QT_CACHE_DIR=$tmp/cache
q=$QT_BINARY
awk -v docs=300 -v seed=3 -f "$QT_SOURCE_DIR/scripts/gen_corpus.awk" >"$tmp/corpus.jsonl"
"$q" tokenizer-train --input "$tmp/corpus.jsonl" --vocab-size 300 --output "$tmp/tok" 2>/dev/null
common=(--training.dataset_path="$tmp/corpus.jsonl" --training.seq_len=32
        --training.local_batch_size=2 --metrics.peak_tflops=1 --checkpoint.enable=true
        --checkpoint.last_save_in_hf=true --lr_scheduler.warmup_steps=0)

# The tiny HF directory: a from-scratch model saved by last_save_in_hf.
"$q" train --config "$QT_SOURCE_DIR/configs/debug.toml" "${common[@]}" \
  --model.tokenizer_path="$tmp/tok" --model.vocab_size=320 --model.dim=32 --model.n_layers=2 \
  --model.n_heads=4 --model.n_kv_heads=2 --model.head_dim=8 --model.hidden_dim=64 \
  --training.steps=2 --job.dump_folder="$tmp/src" >"$tmp/src.log" 2>&1 \
  || { cat "$tmp/src.log"; echo "FAIL: source run"; exit 1; }
hf=$tmp/src/checkpoint/step-2/hf
[ -f "$hf/config.json" ] && [ -f "$hf/tokenizer.json" ] || { ls -R "$tmp/src"; echo "FAIL: no export"; exit 1; }

cat >"$tmp/ft.toml" <<TOML
[job]
dump_folder = "$tmp/ft"
[model]
name = "qwen3"
flavor = "hf"
hf_assets_path = "$hf"
[optimizer]
lr = 0.0
[training]
steps = 1
[checkpoint]
initial_load_path = "$hf"
initial_load_in_hf = true
TOML
"$q" train --config "$tmp/ft.toml" "${common[@]}" >"$tmp/ft.log" 2>&1 \
  || { cat "$tmp/ft.log"; echo "FAIL: route-1 run"; exit 1; }
grep -q "loaded initial weights from $hf" "$tmp/ft.log" || { cat "$tmp/ft.log"; echo "FAIL: not loaded"; exit 1; }
for f in config.json model.safetensors tokenizer.json; do
  cmp "$hf/$f" "$tmp/ft/checkpoint/step-1/hf/$f" \
    || { echo "FAIL: $f after a zero-lr step differs from the directory loaded"; exit 1; }
done

"$q" train --config "$tmp/ft.toml" "${common[@]}" --optimizer.lr=1e-3 --training.steps=3 \
  --job.dump_folder="$tmp/ft2" >"$tmp/ft2.log" 2>&1 || { cat "$tmp/ft2.log"; echo "FAIL: route-1 training"; exit 1; }
[ "$(grep -c '^step: ' "$tmp/ft2.log")" = 3 ] || { cat "$tmp/ft2.log"; echo "FAIL: 3 steps"; exit 1; }
cmp -s "$hf/model.safetensors" "$tmp/ft2/checkpoint/step-3/hf/model.safetensors" \
  && { echo "FAIL: training with lr 1e-3 left the weights unchanged"; exit 1; }

# Weights that do not fit: config.json edited under them.
bad() { # name, sed expression, then the texts the error must contain
  local d=$tmp/$1; cp -r "$hf" "$d"; sed -i "$2" "$d/config.json"; shift 2
  if "$q" train --config "$tmp/ft.toml" "${common[@]}" --model.hf_assets_path="$d" \
       --checkpoint.initial_load_path="$d" --job.dump_folder="$d.out" >"$d.log" 2>&1; then
    echo "FAIL: $d loaded"; exit 1
  fi
  for want in "$@"; do
    grep -qF -- "$want" "$d.log" || { cat "$d.log"; echo "FAIL: no \"$want\" in the error"; exit 1; }
  done
  [ "$(grep -c '^error' "$d.log")" = 1 ] || { cat "$d.log"; echo "FAIL: one error line expected"; exit 1; }
}
bad missing 's/"num_hidden_layers": 2/"num_hidden_layers": 3/' "11 missing (" \
  "model.layers.2.input_layernorm.weight (expected [32])" "model.layers.2.mlp.down_proj.weight"
bad unexpected_misshaped \
  's/"num_hidden_layers": 2/"num_hidden_layers": 1/; s/"intermediate_size": 64/"intermediate_size": 48/' \
  "11 unexpected (" "model.layers.1.self_attn.q_proj.weight [32, 32]" "3 misshaped (" \
  "model.layers.0.mlp.up_proj.weight: shape [64, 32], expected [48, 32]"
grep -h "^error" "$tmp"/missing.log "$tmp"/unexpected_misshaped.log
echo "e2e_finetune: ok"
