#!/usr/bin/env bash
# qtitan generate --chat: the prompt ids it renders (with --system and --no-thinking) equal
# transformers' apply_chat_template(..., add_generation_prompt=True) for the same messages
# (tests/fixtures/generate/chat_ids.json, tools/make_generate_fixtures.py), through a training
# checkpoint of a tiny model over the real Qwen3 tokenizer (../shared; skipped without it).
# shellcheck source=tests/infer_lib.sh
. "$(dirname "$0")/infer_lib.sh"
TOK=${QT_SHARED_DIR:-$SRC/../shared}/tokenizers/qwen3
[ -f "$TOK/tokenizer_config.json" ] || { echo "skipped: no Qwen3 tokenizer at $TOK"; exit 77; }

"$QT" train --config "$SRC/configs/demo.toml" --job.dump_folder="$TMP/run" \
  --model.vocab_size=151936 --model.dim=16 --model.n_layers=1 --model.n_heads=2 \
  --model.n_kv_heads=1 --model.head_dim=8 --model.hidden_dim=32 --model.tokenizer_path="$TOK" \
  --training.dataset_path="$FIX/docs.jsonl" --training.seq_len=16 \
  --training.local_batch_size=1 --training.steps=1 --checkpoint.last_save_in_hf=false \
  --metrics.peak_tflops=1 >"$TMP/train.log" 2>&1 || fail "train: $(tail -3 "$TMP/train.log")"

# The cases of chat_ids.json, in its order: system ("" = none), prompt, thinking.
systems=("You are terse." "You are terse." "" "")
prompts=("What is 2+2?" "Name a colour." "Hello there" $'caf\u00e9 \u2615?')
thinking=(1 0 1 0)
for i in 0 1 2 3; do
    args=(--checkpoint "$TMP/run/checkpoint" --chat --prompt "${prompts[$i]}" --max-new-tokens 1 --json)
    [ -z "${systems[$i]}" ] || args+=(--system "${systems[$i]}")
    [ "${thinking[$i]}" = 1 ] || args+=(--no-thinking)
    got=$("$QT" generate "${args[@]}" 2>"$TMP/err") || fail "case $i: $(cat "$TMP/err")"
    got=$(echo "$got" | sed -n 's/.*"prompt_ids":\[\([0-9,]*\)\].*/\1/p')
    want=$(sed -n "$((i + 1))p" "$FIX/../chat_ids.json" | tr -d ' ' | sed -n 's/.*"ids":\[\([0-9,]*\)\].*/\1/p')
    [ -n "$want" ] && [ "$got" = "$want" ] || fail "case $i: ids $got, transformers $want"
    echo "case $i: $(echo "$got" | tr ',' ' ' | wc -w) ids equal apply_chat_template's"
done
echo "e2e_generate_chat: ok"
