#!/usr/bin/env bash
# LoRA fine-tuning end to end with the Qwen3 tokenizer on chat data: a tiny base model is
# trained one step and exported as an HF directory, then fine-tuned with adapters from that
# directory (route 1). The run logs the adapters, trains only them (the checkpoint holds just
# A and B), resumes from its checkpoint with the same losses, writes the adapters in peft's
# format and the merged model, which `qtitan eval` loads (also from a base held in bf16); a
# target that matches nothing warns once; bad [lora] settings fail with one sentence.
# tools/check_lora_export.py checks the same outputs against peft and transformers (it needs
# torch, so it is not run here).
set -euo pipefail
shared=${QT_SHARED_DIR:-}
tok=$shared/tokenizers/qwen3
if [ -z "$shared" ] || [ ! -d "$shared" ]; then echo "skip: no ../shared"; exit 77; fi
[ -f "$tok/tokenizer_config.json" ] || { echo "FAIL: $shared lacks the Qwen3 tokenizer"; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 16); do
  printf '{"messages": [{"role": "user", "content": "What is %d plus %d?"}, {"role": "assistant", "content": "%d."}]}\n' $i $((i * 3)) $((i * 4))
done >"$tmp/chat.jsonl"
common=(--config "$QT_SOURCE_DIR/configs/debug.toml" --training.seq_len=64 --training.local_batch_size=2
        --metrics.peak_tflops=1 --training.dataset_path="$tmp/chat.jsonl" --training.data_format=messages)
"$QT_BINARY" train "${common[@]}" --model.tokenizer_path="$tok" --model.vocab_size=151669 \
  --model.dim=32 --model.n_layers=2 --model.n_heads=4 --model.n_kv_heads=2 --model.head_dim=8 \
  --model.hidden_dim=64 --training.steps=1 --checkpoint.enable=true --checkpoint.last_save_in_hf=true \
  --job.dump_folder="$tmp/base" >"$tmp/base.log" 2>&1 || { cat "$tmp/base.log"; echo "FAIL: base run"; exit 1; }
base=$tmp/base/checkpoint/step-1/hf
# Two targets that match no linear (no such module, no such layer): each run warns once per
# target, however many times the job makes its adapters (training, the resume check, the
# memory plan).
unmatched='layers.*.attention.qkv,layers.7.attention.wq'
warned_once() { # LOG: exactly one warning line for each unmatched target
  for t in 'layers.*.attention.qkv' 'layers.7.attention.wq'; do
    [ "$(grep -cF "lora target \"$t\" matches no linear layer" "$1")" = 1 ] ||
      { grep -F 'matches no' "$1"; echo "FAIL: $1 should warn once about $t"; exit 1; }
  done
}
lora=(--model.flavor=hf --model.hf_assets_path="$base" --checkpoint.initial_load_path="$base"
      --checkpoint.initial_load_in_hf=true --lora.rank=4 --lora.alpha=8 --optimizer.lr=1e-2
      "--lora.targets=layers.*.attention.wq,layers.*.attention.wv,layers.*.feed_forward.w2,$unmatched"
      --checkpoint.enable=true --checkpoint.interval=2 --checkpoint.last_save_in_hf=true --training.steps=4)
"$QT_BINARY" train "${common[@]}" "${lora[@]}" --job.dump_folder="$tmp/a" >"$tmp/a.log" 2>&1 \
  || { cat "$tmp/a.log"; echo "FAIL: LoRA run"; exit 1; }
grep -q 'lora: 6 adapter(s) of rank 4 (alpha 8, scale 2) on .*; 1664 trainable parameters' "$tmp/a.log" \
  || { cat "$tmp/a.log"; echo "FAIL: adapter log line"; exit 1; }
[ "$(grep -c '^step: ' "$tmp/a.log")" = 4 ] || { cat "$tmp/a.log"; echo "FAIL: expected 4 steps"; exit 1; }
for f in adapter/adapter_config.json adapter/adapter_model.safetensors merged/config.json merged/model.safetensors; do
  [ -f "$tmp/a/$f" ] || { ls -R "$tmp/a"; echo "FAIL: $f missing"; exit 1; }
done
grep -q '"r": 4' "$tmp/a/adapter/adapter_config.json" || { echo "FAIL: adapter_config r"; exit 1; }
# The checkpoint holds the adapters alone (12 tensors), not the frozen base.
"$QT_BINARY" inspect "$tmp/a/checkpoint/step-4/model.safetensors" >"$tmp/inspect.log" 2>&1
grep -q 'layers.1.feed_forward.w2.lora_B' "$tmp/inspect.log" && ! grep -q 'tok_embeddings' "$tmp/inspect.log" \
  || { cat "$tmp/inspect.log"; echo "FAIL: checkpoint should hold only adapters"; exit 1; }
# `qtitan export` of the LoRA checkpoint is refused with what writes the adapters and the merged
# model instead (the checkpoint has no base weights to export).
if "$QT_BINARY" export --checkpoint "$tmp/a/checkpoint" --out "$tmp/a_export" >"$tmp/export.log" 2>&1 ||
   ! grep -qF "$tmp/a/checkpoint/step-4 was written by a LoRA run (lora.rank = 4) and holds its adapters, not a model" "$tmp/export.log"; then
  cat "$tmp/export.log"; echo "FAIL: qtitan export of a LoRA checkpoint should be refused with a sentence"; exit 1
fi
# The merged model loads and evaluates.
echo "151644 872 198 16 151645 198 151644 77091 198 17 151645" >"$tmp/tokens.txt"
"$QT_BINARY" eval --model "$tmp/a/merged" --tokens "$tmp/tokens.txt" >"$tmp/eval.log" 2>&1 \
  && grep -q '^loss: [0-9]' "$tmp/eval.log" || { cat "$tmp/eval.log"; echo "FAIL: eval of the merged model"; exit 1; }

# The base with the adapter folder evaluates as the merged model does (within fp32 rounding),
# and not as the base alone.
"$QT_BINARY" eval --model "$base" --adapter "$tmp/a/adapter" --tokens "$tmp/tokens.txt" >"$tmp/eval2.log" 2>&1 \
  || { cat "$tmp/eval2.log"; echo "FAIL: eval with --adapter"; exit 1; }
"$QT_BINARY" eval --model "$base" --tokens "$tmp/tokens.txt" >"$tmp/eval3.log" 2>&1
merged=$(awk '/^loss:/ {print $2}' "$tmp/eval.log"); adapted=$(awk '/^loss:/ {print $2}' "$tmp/eval2.log")
plain=$(awk '/^loss:/ {print $2}' "$tmp/eval3.log")
awk -v m="$merged" -v a="$adapted" -v p="$plain" 'BEGIN { d = m - a; if (d < 0) d = -d; e = m - p; if (e < 0) e = -e;
  exit !(d <= 1e-6 * m && e > 100 * d) }' || { echo "FAIL: merged $merged, base + adapter $adapted, base $plain"; exit 1; }

# Resume from step 2: steps 3 and 4 repeat exactly.
rm -rf "$tmp/a/checkpoint/step-4"
cp -r "$tmp/a" "$tmp/b"
"$QT_BINARY" train "${common[@]}" "${lora[@]}" --job.dump_folder="$tmp/b" >"$tmp/b.log" 2>&1 \
  || { cat "$tmp/b.log"; echo "FAIL: resumed LoRA run"; exit 1; }
grep -q 'resumed from .*step-2' "$tmp/b.log" || { cat "$tmp/b.log"; echo "FAIL: no resume"; exit 1; }
warned_once "$tmp/a.log"
warned_once "$tmp/b.log"
diff <(grep '^step:  [34]' "$tmp/a.log" | awk '{print $4}') <(grep '^step:  [34]' "$tmp/b.log" | awk '{print $4}') \
  || { echo "FAIL: resumed losses differ"; exit 1; }

# Resuming with other adapters (another rank) stops before the model is allocated, naming the
# checkpoint file and the adapter whose shape differs.
if "$QT_BINARY" train "${common[@]}" "${lora[@]}" --lora.rank=8 --job.dump_folder="$tmp/b" \
  --training.steps=6 >"$tmp/b8.log" 2>&1 ||
  ! grep -qF "the checkpoint to resume, $tmp/b/checkpoint/step-4/model.safetensors, holds layers.0.attention.wq.lora_A with shape (4, 32) but the job's model has (8, 32)" "$tmp/b8.log" ||
  grep -q "loaded initial weights" "$tmp/b8.log"; then
  cat "$tmp/b8.log"; echo "FAIL: resuming LoRA rank 4 adapters as rank 8"; exit 1
fi

# Activation checkpointing recomputes the adapters too: the same losses.
"$QT_BINARY" train "${common[@]}" "${lora[@]}" --job.dump_folder="$tmp/c" --training.steps=2 \
  --checkpoint.enable=false --checkpoint.last_save_in_hf=false --activation_checkpoint.mode=full >"$tmp/c.log" 2>&1 \
  || { cat "$tmp/c.log"; echo "FAIL: LoRA with full activation checkpointing"; exit 1; }
diff <(grep '^step:  [12]' "$tmp/a.log" | awk '{print $4, $6}') <(grep '^step:  [12]' "$tmp/c.log" | awk '{print $4, $6}') \
  || { echo "FAIL: full activation checkpointing changed the losses"; exit 1; }

# bf16: mixed precision (bf16 products, fp32 base), and a base held in bf16 alone
# (lora.base_dtype), each within the 2% of docs/training.md of the fp32 run's first two losses;
# full activation checkpointing on the bf16 base repeats its losses exactly.
near() { # the step 1-2 losses of two logs within 2%
  paste <(grep '^step:  [12]' "$1" | awk '{print $4}') <(grep '^step:  [12]' "$2" | awk '{print $4}') |
    awk -v n="$3" '{ d = ($1 - $2) / $1; if (d < 0) d = -d; printf "%s: loss %s vs %s\n", n, $2, $1; if (d > 0.02) bad = 1 }
      END { exit bad || NR != 2 }' || { echo "FAIL: $3 losses off"; exit 1; }
}
two=(--training.steps=2 --checkpoint.enable=false --checkpoint.last_save_in_hf=false)
b16_save=--checkpoint.enable=true,--checkpoint.last_save_in_hf=true,--checkpoint.export_dtype=bfloat16
for v in mp:--training.mixed_precision_param=bfloat16 b16:--lora.base_dtype=bfloat16,$b16_save \
    b16_ac:--lora.base_dtype=bfloat16,--activation_checkpoint.mode=full; do
  IFS=, read -r -a extra <<<"${v#*:}"
  # b16_ac is compared with b16 to the printed digits below: it multiplies its bf16 products
  # as b16 did (each fresh run picks its path by timing, ops/gemm.h, and attention's precision
  # follows that path, docs/training.md), so only the checkpointing differs.
  path=
  if [ "${v%%:*}" = b16_ac ]; then
    grep -q 'gemm: .*bf16 via ' "$tmp/b16.log" && path=onednn
    grep -q "gemm: .*bf16 via qtitan's AMX tiles" "$tmp/b16.log" && path=amx
    grep -q 'gemm: .*bf16 as dnnl_sgemm on widened' "$tmp/b16.log" && path=widen
  fi
  QT_GEMM_BF16=${path:-${QT_GEMM_BF16:-auto}} "$QT_BINARY" train "${common[@]}" "${lora[@]}" "${two[@]}" "${extra[@]}" \
    --job.dump_folder="$tmp/${v%%:*}" >"$tmp/${v%%:*}.log" 2>&1 || { cat "$tmp/${v%%:*}.log"; echo "FAIL: LoRA ${v#*:}"; exit 1; }
  near "$tmp/a.log" "$tmp/${v%%:*}.log" "${v%%:*}"
done
grep -q 'the matmul weights and embedding in bf16' "$tmp/b16.log" || { cat "$tmp/b16.log"; echo "FAIL: base_dtype log"; exit 1; }
# The bf16 base's merged export (bf16(W) + s B A in fp32, written here in bfloat16; test_lora
# checks its values against peft's merge_and_unload): transformers' layout in BF16, and it
# evaluates as the base with its adapters does (measured 1.6e-8 relative, the base alone 4.6e-4
# away).
grep -q "lora: merged model written to $tmp/b16/merged (bfloat16)" "$tmp/b16.log" &&
  "$QT_BINARY" inspect "$tmp/b16/merged" >"$tmp/b16_inspect.log" 2>&1 &&
  grep -q 'model.layers.1.self_attn.q_proj.weight  *BF16  *\[32, 32\]' "$tmp/b16_inspect.log" ||
  { cat "$tmp/b16_inspect.log"; echo "FAIL: the bf16 base's merged export"; exit 1; }
merged=$("$QT_BINARY" eval --model "$tmp/b16/merged" --tokens "$tmp/tokens.txt" 2>&1 | awk '/^loss:/ {print $2}')
adapted=$("$QT_BINARY" eval --model "$base" --adapter "$tmp/b16/adapter" --tokens "$tmp/tokens.txt" 2>&1 | awk '/^loss:/ {print $2}')
awk -v m="$merged" -v a="$adapted" -v p="$plain" 'BEGIN { d = m - a; if (d < 0) d = -d; e = a - p; if (e < 0) e = -e;
  exit !(m != "" && d <= 1e-5 * m && e > 100 * d) }' ||
  { echo "FAIL: bf16 base: merged $merged, base + adapter $adapted, base $plain"; exit 1; }
diff <(grep '^step:  [12]' "$tmp/b16.log" | awk '{print $4, $6}') <(grep '^step:  [12]' "$tmp/b16_ac.log" | awk '{print $4, $6}') \
  || { echo "FAIL: full activation checkpointing changed the bf16 base's losses"; exit 1; }

# Dropout: the masks depend on the seed and the rows alone, so a second run and one that
# recomputes the layers (full activation checkpointing) give bitwise the same losses, which
# differ from the run without dropout; the peft config records it.
for v in d1: d2: d_ac:--activation_checkpoint.mode=full; do
  IFS=, read -r -a extra <<<"${v#*:}"
  "$QT_BINARY" train "${common[@]}" "${lora[@]}" "${two[@]}" --lora.dropout=0.1 "${extra[@]}" \
    --job.dump_folder="$tmp/${v%%:*}" >"$tmp/${v%%:*}.log" 2>&1 || { cat "$tmp/${v%%:*}.log"; echo "FAIL: dropout ${v#*:}"; exit 1; }
done
for d in d2 d_ac; do
  diff <(grep '^step: ' "$tmp/d1.log" | awk '{print $4, $6}') <(grep '^step: ' "$tmp/$d.log" | awk '{print $4, $6}') \
    || { echo "FAIL: dropout run $d differs from the first"; exit 1; }
done
[ "$(grep '^step:  2' "$tmp/d1.log" | awk '{print $4}')" != "$(grep '^step:  2' "$tmp/a.log" | awk '{print $4}')" ] \
  || { echo "FAIL: dropout did not change the step 2 loss"; exit 1; }
grep -q '"lora_dropout": 0.1' "$tmp/d1/adapter/adapter_config.json" || { cat "$tmp/d1/adapter/adapter_config.json"; echo "FAIL: lora_dropout in the peft config"; exit 1; }

# qtitan plan counts the adapters and gives AdamW state to them alone.
"$QT_BINARY" plan "${common[@]}" "${lora[@]}" >"$tmp/plan.log" 2>&1 || { cat "$tmp/plan.log"; echo "FAIL: plan"; exit 1; }
grep -q '^lora: 1664 trainable adapter parameters' "$tmp/plan.log" \
  && grep -q 'optimizer  *0.000 GiB  *0.0 MiB .*of the LoRA adapters' "$tmp/plan.log" \
  || { cat "$tmp/plan.log"; echo "FAIL: plan of a LoRA job"; exit 1; }
warned_once "$tmp/plan.log"

# The adapter folder holds the tokenizer files beside the adapters, as TRL saves them, with the
# template the run rendered with (training.chat_template_path); generate --adapter reads its
# chat template from there (Thinking-2507's opens the answer with <think>, the base's does not).
t2507=$QT_SOURCE_DIR/tests/fixtures/chat/templates/qwen3_2507_thinking.jinja
"$QT_BINARY" train "${common[@]}" "${lora[@]}" --training.steps=1 --checkpoint.enable=false \
  --checkpoint.last_save_in_hf=false --training.chat_template_path="$t2507" --job.dump_folder="$tmp/ct" \
  >"$tmp/ct.log" 2>&1 || { cat "$tmp/ct.log"; echo "FAIL: LoRA run with chat_template_path"; exit 1; }
cmp "$t2507" "$tmp/ct/adapter/chat_template.jinja" && cmp "$tok/tokenizer.json" "$tmp/ct/adapter/tokenizer.json" ||
  { ls "$tmp/ct/adapter"; echo "FAIL: the adapter folder lacks the run's tokenizer files"; exit 1; }
pids() { "$QT_BINARY" generate --model "$base" --chat --prompt "Hi" --max-new-tokens 1 --json "$@" 2>/dev/null |
  sed -n 's/.*"prompt_ids":\[\([0-9,]*\)\].*/\1/p'; }
p1=$(pids --adapter "$tmp/ct/adapter") p2=$(pids --chat-template "$t2507") p3=$(pids)
[ -n "$p1" ] && [ "$p1" = "$p2" ] && [ "$p1" != "$p3" ] ||
  { echo "FAIL: generate --adapter's chat template: '$p1', 2507 '$p2', base '$p3'"; exit 1; }

# Bad [lora] settings: one sentence each, non-zero exit.
bad() {
  local want=$1; shift
  if "$QT_BINARY" train "${common[@]}" "${lora[@]}" --job.dump_folder="$tmp/bad" "$@" >"$tmp/bad.log" 2>&1; then
    echo "FAIL: $* should fail"; exit 1
  fi
  grep -q "error: .*$want" "$tmp/bad.log" || { cat "$tmp/bad.log"; echo "FAIL: expected '$want'"; exit 1; }
}
# The sentence names where the value was given: here the command line.
bad 'command line: lora.targets match no linear layer' '--lora.targets=layers.*.attention.qkv'
bad 'command line: lora.rank = 40 is larger than layers.0.attention.wq (32 x 32) allows (32)' --lora.rank=40
bad 'lora.alpha = 0 is out of range' --lora.alpha=0
bad 'r = 4, lora_alpha = 8 and use_rslora = false, but \[lora\] has rank = 2' --lora.rank=2 --lora.adapter_path="$tmp/a/adapter"
echo "e2e_lora: ok"
