#!/usr/bin/env bash
# generate --adapter and eval --adapter with the peft LoRA variants qtitan merges into the
# weights (tests/fixtures/peft_variants, tools/make_peft_variants_fixture.py): DoRA on every
# linear; rank_pattern and alpha_pattern with modules_to_save (lm_head, the final norm) and
# trainable token rows on an untied model; DoRA with rsLoRA and trainable tokens (a list) on a
# tied one. Each gives HF peft's greedy ids with log-probs within 1e-4 and its loss within 1e-5
# relative; bf16 weights decode from the merge too, and `export --model --adapter` writes a
# model whose loss is the merge's. Configs that do not fit their tensors, and a
# variant qtitan does not implement, fail with one sentence.
source "$(dirname "$0")/infer_lib.sh"
PV=$SRC/tests/fixtures/peft_variants
want=$(cat "$PV/expected.json")
for case in dora patterns tied_tokens; do
  base=$(echo "$want" | jq -r ".$case.base")
  m=$TMP/model-$case
  mkdir -p "$m"
  if [ "$base" = cli_tiny ]; then src=$FIX; else src=$PV/$base; fi
  cp "$src/config.json" "$src/model.safetensors" "$m/"
  cp "$FIX/tokenizer.json" "$m/"
  prompt=$(echo "$want" | jq -r ".$case.prompt")
  got=$("$QT" generate --model "$m" --adapter "$PV/$case" --prompt "$prompt" --temperature 0 \
    --max-new-tokens 12 --json 2>"$TMP/err") || fail "$case: $(cat "$TMP/err")"
  [ "$(echo "$got" | jq -c '[.prompt_ids, .ids]')" = "$(echo "$want" | jq -c ".$case | [.prompt_ids, .ids]")" ] ||
    fail "$case: ids $(echo "$got" | jq -c .ids), peft $(echo "$want" | jq -c ".$case.ids")"
  paste <(echo "$got" | jq '.logprobs[]') <(echo "$want" | jq ".$case.logprobs[]") |
    awk 'NF != 2 { bad = 1 } { d = $1 - $2; if (d < 0) d = -d; if (d > w) w = d; if (d > 1e-4) bad = 1; n++ }
      END { printf "max |log-prob diff| %.3g\n", w > "/dev/stderr"; exit bad || n != 12 }' ||
    fail "$case: log-probs $(echo "$got" | jq -c .logprobs) vs peft's $(echo "$want" | jq -c ".$case.logprobs")"
  echo "$want" | jq -r ".$case.tokens | map(tostring) | join(\" \")" >"$TMP/tokens.txt"
  loss=$("$QT" eval --model "$m" --adapter "$PV/$case" --tokens "$TMP/tokens.txt" 2>"$TMP/err" |
    awk '/^loss:/ {print $2}') || fail "$case eval: $(cat "$TMP/err")"
  ref=$(echo "$want" | jq ".$case.loss")
  awk -v a="$loss" -v b="$ref" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 1e-5 * b) }' ||
    fail "$case: eval --adapter loss $loss, peft $ref"
  "$QT" generate --model "$m" --adapter "$PV/$case" --prompt "$prompt" --temperature 0 \
    --max-new-tokens 12 --dtype bfloat16 --json >"$TMP/b16" 2>"$TMP/err" ||
    fail "$case bf16: $(cat "$TMP/err")"
  [ "$(jq '.ids | length' "$TMP/b16")" -eq 12 ] || fail "$case bf16: $(cat "$TMP/b16")"
  # export --model --adapter writes the merged model: its loss is the merge's.
  "$QT" export --model "$m" --adapter "$PV/$case" --out "$TMP/merged-$case" 2>"$TMP/err" ||
    fail "$case export: $(cat "$TMP/err")"
  exported=$("$QT" eval --model "$TMP/merged-$case" --tokens "$TMP/tokens.txt" 2>/dev/null | awk '/^loss:/ {print $2}')
  [ "$exported" = "$loss" ] || fail "$case: the exported merge's loss $exported, eval --adapter's $loss"
  echo "$case: greedy ids and log-probs equal peft's, loss $loss (peft $ref), the export's the same"
done

# Configs that do not fit the tensors, and variants qtitan does not implement.
bad() { # name, source case, jq filter for its adapter_config.json
  mkdir -p "$TMP/$1"
  cp "$PV/$2/adapter_model.safetensors" "$TMP/$1/"
  jq "$3" "$PV/$2/adapter_config.json" >"$TMP/$1/adapter_config.json"
}
bad bias dora '.lora_bias = true'
expect_error generate '"lora_bias" is set (a bias on lora_B), a LoRA variant qtitan does not implement' \
  --model "$TMP/model-dora" --adapter "$TMP/bias" --prompt hi
bad nodora dora '.use_dora = false'
expect_error generate 'lora_magnitude_vector, but .*nodora/adapter_config.json does not set use_dora' \
  --model "$TMP/model-dora" --adapter "$TMP/nodora" --prompt hi
bad rank patterns '.rank_pattern = {"v_proj": 2}'
expect_error generate 'layers.0.self_attn.v_proj.lora_A.weight is misshaped (expected \[2, 16\], rank 2)' \
  --model "$TMP/model-patterns" --adapter "$TMP/rank" --prompt hi
bad nosave patterns 'del(.modules_to_save)'
expect_error generate 'tensor base_model.model.lm_head.weight is no LoRA factor, magnitude or trainable token of this model, and adapter_config.json sets no modules_to_save' \
  --model "$TMP/model-patterns" --adapter "$TMP/nosave" --prompt hi
bad notokens tied_tokens 'del(.trainable_token_indices)'
expect_error eval 'names no token ids for it' \
  --model "$TMP/model-tied_tokens" --adapter "$TMP/notokens" --tokens "$TMP/tokens.txt"
bad untie patterns '.'
expect_error generate 'replaces lm_head.weight alone (modules_to_save), which would untie' \
  --model "$TMP/model-tied_tokens" --adapter "$TMP/untie" --prompt hi
echo "peft variants: misfit configs and unimplemented variants refused with one sentence"
