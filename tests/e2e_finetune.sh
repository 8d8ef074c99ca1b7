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

# A longer context with YaRN through [model] fields (rope_scaling, rope_factor,
# rope_original_max_seq_len, max_seq_len): bitwise the losses of the same directory whose
# config.json carries the setting (and not those without it); the export writes it there.
yarn=(--model.rope_scaling=yarn --model.rope_factor=4 --model.rope_original_max_seq_len=16
      --model.max_seq_len=128)
ftl() { "$q" train --config "$tmp/ft.toml" "${common[@]}" --optimizer.lr=1e-3 --training.steps=2 "$@" 2>&1; }
ftl "${yarn[@]}" --job.dump_folder="$tmp/ya" >"$tmp/ya.log" || { cat "$tmp/ya.log"; echo "FAIL: yarn fields"; exit 1; }
cp -r "$hf" "$tmp/hfy"
jq '.rope_scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    | .max_position_embeddings = 128' "$hf/config.json" >"$tmp/hfy/config.json"
ftl --model.hf_assets_path="$tmp/hfy" --checkpoint.initial_load_path="$tmp/hfy" \
  --job.dump_folder="$tmp/yb" >"$tmp/yb.log" || { cat "$tmp/yb.log"; echo "FAIL: yarn config.json"; exit 1; }
ftl --job.dump_folder="$tmp/yc" >"$tmp/yc.log" || { cat "$tmp/yc.log"; echo "FAIL: no yarn"; exit 1; }
lv() { grep '^step: ' "$1" | awk '{print $4, $6}'; }
[ "$(lv "$tmp/ya.log")" = "$(lv "$tmp/yb.log")" ] && [ "$(lv "$tmp/ya.log")" != "$(lv "$tmp/yc.log")" ] ||
  { paste <(lv "$tmp/ya.log") <(lv "$tmp/yb.log") <(lv "$tmp/yc.log"); echo "FAIL: yarn fields vs config.json"; exit 1; }
[ "$(jq -c '[.max_position_embeddings, .rope_scaling.rope_type, .rope_scaling.factor,
    .rope_scaling.original_max_position_embeddings]' "$tmp/ya/checkpoint/step-2/hf/config.json")" = '[128,"yarn",4,16]' ] ||
  { cat "$tmp/ya/checkpoint/step-2/hf/config.json"; echo "FAIL: the export lacks the yarn setting"; exit 1; }
"$q" train --config "$tmp/ft.toml" "${common[@]}" --model.rope_scaling=yarn --model.rope_factor=4 \
  --job.dump_folder="$tmp/yd" >"$tmp/yd.log" 2>&1 &&
  { echo "FAIL: yarn without rope_original_max_seq_len was accepted"; exit 1; }
grep -q "rope_original_max_seq_len = 0: rope_scaling yarn needs the context the model was trained with" "$tmp/yd.log" ||
  { cat "$tmp/yd.log"; echo "FAIL: yarn without its original context: no sentence"; exit 1; }

# A published fp8 checkpoint fine-tuned (tests/fixtures/generate/cli_tiny_fp8, stored as Qwen's
# -FP8 releases are: F8_E4M3 projections with weight_scale_inv, quantization_config): the weights
# load dequantized (torchtitan's initial_load_in_hf_quantized is accepted with a notice), a
# zero-lr step exports exactly them as an ordinary unquantized HF directory (eval gives the fp8
# directory's loss to the digit), and a real lr trains.
f8=$QT_SOURCE_DIR/tests/fixtures/generate/cli_tiny_fp8
"$q" train --config "$tmp/ft.toml" "${common[@]}" --model.hf_assets_path="$f8" \
  --checkpoint.initial_load_path="$f8" --checkpoint.initial_load_in_hf_quantized=true \
  --job.dump_folder="$tmp/f8" >"$tmp/f8.log" 2>&1 || { cat "$tmp/f8.log"; echo "FAIL: fp8 fine-tune"; exit 1; }
grep -q "loaded initial weights from $f8" "$tmp/f8.log" || { cat "$tmp/f8.log"; echo "FAIL: fp8 not loaded"; exit 1; }
grep -q "initial_load_in_hf_quantized.*read dequantized" "$tmp/f8.log" || { cat "$tmp/f8.log"; echo "FAIL: no notice"; exit 1; }
f8hf=$tmp/f8/checkpoint/step-1/hf
grep -q quantization_config "$f8hf/config.json" && { echo "FAIL: the export keeps quantization_config"; exit 1; }
"$q" inspect "$f8hf" >"$tmp/f8.inspect" || { cat "$tmp/f8.inspect"; echo "FAIL: export does not check"; exit 1; }
grep -q "F8_E4M3\|quantization" "$tmp/f8.inspect" && { cat "$tmp/f8.inspect"; echo "FAIL: export still fp8"; exit 1; }
"$q" inspect "$f8" | grep -q "quantization: fp8 (F8_E4M3 weights, one scale per 8 x 8 block), read dequantized" ||
  { echo "FAIL: inspect does not name the fp8 quantization"; exit 1; }
printf '481 547 590 274 311 87 78 275 79 88 484 440\n' >"$tmp/f8.tokens"
a=$("$q" eval --model "$f8" --tokens "$tmp/f8.tokens" 2>/dev/null | grep '^loss')
b=$("$q" eval --model "$f8hf" --tokens "$tmp/f8.tokens" 2>/dev/null | grep '^loss')
[ -n "$a" ] && [ "$a" = "$b" ] || { echo "FAIL: fp8 directory $a, its zero-lr export $b"; exit 1; }
"$q" train --config "$tmp/ft.toml" "${common[@]}" --model.hf_assets_path="$f8" \
  --checkpoint.initial_load_path="$f8" --optimizer.lr=1e-3 --training.steps=3 \
  --job.dump_folder="$tmp/f8b" >"$tmp/f8b.log" 2>&1 || { cat "$tmp/f8b.log"; echo "FAIL: fp8 training"; exit 1; }
cmp -s "$f8hf/model.safetensors" "$tmp/f8b/checkpoint/step-3/hf/model.safetensors" \
  && { echo "FAIL: training from fp8 weights with lr 1e-3 left them unchanged"; exit 1; }
# LoRA on a bf16 base read from fp8 (how a Qwen3-*-FP8 model is fine-tuned in little memory):
# each weight is dequantized in fp32 and then rounded to bf16, so the run is bitwise the run on
# the same values from the unquantized export. The bf16 products' path is pinned: the start-up
# measurement may choose another for the second run on a loaded machine (ops/gemm.c).
lora_f8() {
  QT_GEMM_BF16=widen "$q" train --config "$tmp/ft.toml" "${common[@]}" --model.hf_assets_path="$1" \
    --checkpoint.initial_load_path="$1" --optimizer.lr=1e-2 --training.steps=2 \
    --lora.rank=4 --lora.base_dtype=bfloat16 --checkpoint.last_save_in_hf=false \
    --job.dump_folder="$2" 2>&1 | grep '^step: ' | awk '{print $4}'
}
la=$(lora_f8 "$f8" "$tmp/f8l") && lb=$(lora_f8 "$f8hf" "$tmp/f8l2") &&
  [ "$(grep -c . <<<"$la")" = 2 ] && [ "$la" = "$lb" ] ||
  { echo "FAIL: LoRA on a bf16 base from fp8: losses '$la', from its export '$lb'"; exit 1; }
echo "fp8 checkpoint: loaded dequantized ($a), exported unquantized, trained; LoRA on its bf16 base as on the export's"

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

# A training checkpoint as the initial weights (initial_load_in_hf = false, as torchtitan's
# initial_load_path takes its own checkpoints, model only): the source run's folder or its step
# directory; a zero-lr step writes back the source's export byte for byte. A path that is no
# checkpoint, another model's checkpoint, and a LoRA run from it are one sentence each.
src_model=(--config "$QT_SOURCE_DIR/configs/debug.toml" "${common[@]}" --model.tokenizer_path="$tmp/tok"
  --model.vocab_size=320 --model.dim=32 --model.n_layers=2 --model.n_heads=4 --model.n_kv_heads=2
  --model.head_dim=8 --model.hidden_dim=64 --training.steps=1 --optimizer.lr=0)
for from in "$tmp/src/checkpoint" "$tmp/src/checkpoint/step-2"; do
  rm -rf "$tmp/ic"
  "$q" train "${src_model[@]}" --checkpoint.initial_load_path="$from" --job.dump_folder="$tmp/ic" >"$tmp/ic.log" 2>&1 &&
    grep -q "initial weights: step 2 of the training checkpoint $from (model only)" "$tmp/ic.log" &&
    cmp "$hf/model.safetensors" "$tmp/ic/checkpoint/step-1/hf/model.safetensors" ||
    { cat "$tmp/ic.log"; echo "FAIL: initial weights from the training checkpoint $from"; exit 1; }
done
ic_bad() { # want, then extra arguments
  local want=$1; shift
  if "$q" train "${src_model[@]}" --job.dump_folder="$tmp/icb" "$@" >"$tmp/icb.log" 2>&1; then
    echo "FAIL: $* should fail"; exit 1
  fi
  grep -qF "error: $want" "$tmp/icb.log" || { cat "$tmp/icb.log"; echo "FAIL: expected '$want'"; exit 1; }
}
ic_bad "checkpoint.initial_load_path $tmp/corpus.jsonl is not a folder" --checkpoint.initial_load_path="$tmp/corpus.jsonl"
ic_bad "checkpoint.initial_load_path $tmp/tok holds no complete training checkpoint step" --checkpoint.initial_load_path="$tmp/tok"
ic_bad "checkpoint.initial_load_path $hf is a Hugging Face model directory; set checkpoint.initial_load_in_hf = true" --checkpoint.initial_load_path="$hf"
ic_bad "the initial weights (checkpoint.initial_load_path), $tmp/src/checkpoint/step-2/model.safetensors, holds tok_embeddings.weight with shape (320, 32) but the job's model has (320, 48)" \
  --checkpoint.initial_load_path="$tmp/src/checkpoint" --model.dim=48
ic_bad "a LoRA run's base is Hugging Face weights" --checkpoint.initial_load_path="$tmp/src/checkpoint" --lora.rank=2
ic_bad "checkpoint.initial_load_model_only = false needs a training checkpoint" \
  --checkpoint.initial_load_path="$hf" --checkpoint.initial_load_in_hf=true --checkpoint.initial_load_model_only=false

# initial_load_model_only = false: every state of the other run's step 2 (step, optimizer,
# schedule, data position), so steps 3-4 in a new folder are bitwise those of the run that
# went on; run again, the job resumes from its own folder.
whole=("${src_model[@]}" --optimizer.lr=1e-3 --training.steps=4 --checkpoint.interval=2)
"$q" train "${whole[@]}" --job.dump_folder="$tmp/w1" >"$tmp/w1.log" 2>&1 || { cat "$tmp/w1.log"; echo "FAIL: w1"; exit 1; }
for i in 1 2; do
  "$q" train "${whole[@]}" --checkpoint.initial_load_path="$tmp/w1/checkpoint/step-2" \
    --checkpoint.initial_load_model_only=false --job.dump_folder="$tmp/w2" >"$tmp/w2-$i.log" 2>&1 ||
    { cat "$tmp/w2-$i.log"; echo "FAIL: w2 ($i)"; exit 1; }
done
grep -q "resumed from $tmp/w1/checkpoint/step-2 (step 2), checkpoint.initial_load_path with initial_load_model_only = false" "$tmp/w2-1.log" &&
  grep -q "resumed from $tmp/w2/checkpoint/step-4 (step 4)" "$tmp/w2-2.log" ||
  { cat "$tmp/w2-1.log" "$tmp/w2-2.log"; echo "FAIL: where initial_load_model_only = false resumed"; exit 1; }
for f in model.safetensors optim.safetensors; do
  cmp "$tmp/w1/checkpoint/step-4/$f" "$tmp/w2/checkpoint/step-4/$f" ||
    { echo "FAIL: $f of steps 3-4 from the other run's step 2 differs from that run's"; exit 1; }
done
diff <(grep '^step:  [34]' "$tmp/w1.log" | awk '{print $4}') <(grep '^step:  [34]' "$tmp/w2-1.log" | awk '{print $4}') ||
  { echo "FAIL: losses of steps 3-4"; exit 1; }
# checkpoint.load_only: a copy of w1's folder resumes at step 4 and trains step 5, writing nothing.
cp -r "$tmp/w1" "$tmp/lo"
before=$(cd "$tmp/lo/checkpoint" && find . -type f -exec cksum {} + | sort)
"$q" train "${whole[@]}" --training.steps=5 --checkpoint.load_only=true --checkpoint.last_save_in_hf=false \
  --job.dump_folder="$tmp/lo" >"$tmp/lo.log" 2>&1 &&
  grep -q "resumed from $tmp/lo/checkpoint/step-4 (step 4)" "$tmp/lo.log" && grep -q '^step:  5/5' "$tmp/lo.log" &&
  [ "$(cd "$tmp/lo/checkpoint" && find . -type f -exec cksum {} + | sort)" = "$before" ] ||
  { cat "$tmp/lo.log"; ls -R "$tmp/lo/checkpoint" | head; echo "FAIL: checkpoint.load_only"; exit 1; }
ic_bad "checkpoint.load_only = true saves nothing, so last_save_in_hf = true" --checkpoint.load_only=true

# checkpoint.enable_first_step_checkpoint: step 1 is saved too, besides the interval's and the last.
"$q" train "${src_model[@]}" --training.steps=3 --checkpoint.enable_first_step_checkpoint=true \
  --checkpoint.last_save_in_hf=false --job.dump_folder="$tmp/first" >"$tmp/first.log" 2>&1 &&
  [ "$(ls "$tmp/first/checkpoint")" = "$(printf 'step-1\nstep-3')" ] ||
  { cat "$tmp/first.log"; ls "$tmp/first/checkpoint"; echo "FAIL: enable_first_step_checkpoint"; exit 1; }
echo "e2e_finetune: ok"
