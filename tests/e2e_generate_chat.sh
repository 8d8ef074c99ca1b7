#!/usr/bin/env bash
# qtitan generate --chat: the prompt ids it renders (with --system, --no-thinking and --tools) equal
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
  --metrics.peak_tflops=1 --sample.freq=1 --sample.chat=true --sample.system="You are terse." \
  --sample.enable_thinking=false --sample.temperature=0 --sample.max_new_tokens=6 \
  "--sample.prompts=What is 2+2?" >"$TMP/train.log" 2>&1 || fail "train: $(tail -3 "$TMP/train.log")"

# The cases of chat_ids.json, in its order: system ("" = none), prompt, thinking, tools
# (chat_tools.json).
systems=("You are terse." "You are terse." "" "" "You are terse." "")
prompts=("What is 2+2?" "Name a colour." "Hello there" $'caf\u00e9 \u2615?' "Weather in Oslo?"
  $'Weather in Z\u00fcrich?')
thinking=(1 0 1 0 1 0)
tools=(0 0 0 0 1 1)
for i in 0 1 2 3 4 5; do
    args=(--checkpoint "$TMP/run/checkpoint" --chat --prompt "${prompts[$i]}" --max-new-tokens 1 --json)
    [ -z "${systems[$i]}" ] || args+=(--system "${systems[$i]}")
    [ "${thinking[$i]}" = 1 ] || args+=(--no-thinking)
    [ "${tools[$i]}" = 0 ] || args+=(--tools "$FIX/../chat_tools.json")
    got=$("$QT" generate "${args[@]}" 2>"$TMP/err") || fail "case $i: $(cat "$TMP/err")"
    got=$(echo "$got" | sed -n 's/.*"prompt_ids":\[\([0-9,]*\)\].*/\1/p')
    want=$(sed -n "$((i + 1))p" "$FIX/../chat_ids.json" | tr -d ' ' | sed -n 's/.*"ids":\[\([0-9,]*\)\].*/\1/p')
    [ -n "$want" ] && [ "$got" = "$want" ] || fail "case $i: ids $got, transformers $want"
    echo "case $i: $(echo "$got" | tr ',' ' ' | wc -w) ids equal apply_chat_template's"
done

# The run's chat samples (sample.chat, a system turn, thinking off, greedy) are generate --chat's
# for the same prompt and checkpoint.
want=$("$QT" generate --checkpoint "$TMP/run/checkpoint" --chat --system "You are terse." \
  --no-thinking --prompt "What is 2+2?" --temperature 0 --max-new-tokens 6 --json 2>"$TMP/err") ||
  fail "generate: $(cat "$TMP/err")"
want=$(echo "$want" | grep -o '"prompt_ids":\[[0-9,]*\],"ids":\[[0-9,]*\]')
got=$(grep '^{"step":1,' "$TMP/run/samples.jsonl" | grep -o '"prompt_ids":\[[0-9,]*\].*"ids":\[[0-9,]*\]' |
  sed 's/\],"text":.*,"ids"/],"ids"/')
[ -n "$want" ] && [ "$got" = "$want" ] || fail "chat samples $got, generate --chat $want"
echo "sample.chat: the step-1 samples' prompt ids and ids are generate --chat's"
if "$QT" train --config "$SRC/configs/demo.toml" --job.dump_folder="$TMP/nochat" \
  --model.vocab_size=151936 --model.dim=16 --model.n_layers=1 --model.n_heads=2 \
  --model.n_kv_heads=1 --model.head_dim=8 --model.hidden_dim=32 --model.tokenizer_path="$TOK" \
  --training.dataset_path="$FIX/docs.jsonl" --training.seq_len=16 --sample.freq=1 \
  --sample.prompts=hi --sample.system=terse >"$TMP/nochat.log" 2>&1; then
  fail "sample.system without sample.chat was accepted"
fi
grep -q "sample.system and sample.enable_thinking = false need sample.chat = true" "$TMP/nochat.log" ||
  fail "sample.system without sample.chat: $(tail -3 "$TMP/nochat.log")"

# The 2507 templates, held in chat_template.jinja as transformers 5 saves a tokenizer: a run's
# checkpoint keeps the file (it wins over tokenizer_config.json's template), and generate --chat
# from it gives transformers' ids (cases 7 and 8 of chat_ids.json); they have no thinking switch,
# so --no-thinking and sample.enable_thinking = false are refused.
for c in "6:qwen3_2507_instruct" "7:qwen3_2507_thinking"; do
  i=${c%%:*} t=${c#*:}
  mkdir -p "$TMP/tok_$t"
  cp "$TOK/tokenizer.json" "$TOK/tokenizer_config.json" "$TMP/tok_$t/"
  cp "$SRC/tests/fixtures/chat/templates/$t.jinja" "$TMP/tok_$t/chat_template.jinja"
  run=("$QT" train --config "$SRC/configs/demo.toml" --job.dump_folder="$TMP/run_$t"
    --model.vocab_size=151936 --model.dim=16 --model.n_layers=1 --model.n_heads=2
    --model.n_kv_heads=1 --model.head_dim=8 --model.hidden_dim=32
    --model.tokenizer_path="$TMP/tok_$t" --training.dataset_path="$FIX/docs.jsonl"
    --training.seq_len=16 --training.local_batch_size=1 --training.steps=1
    --checkpoint.last_save_in_hf=false --metrics.peak_tflops=1 --sample.freq=1 --sample.chat=true
    --sample.temperature=0 --sample.max_new_tokens=2 "--sample.prompts=Hi")
  if "${run[@]}" --sample.enable_thinking=false >"$TMP/t.log" 2>&1; then
    fail "$t: sample.enable_thinking = false was accepted"
  fi
  grep -q "chat_template.jinja) has no thinking switch" "$TMP/t.log" || fail "$t: $(tail -3 "$TMP/t.log")"
  "${run[@]}" >"$TMP/t.log" 2>&1 || fail "train $t: $(tail -3 "$TMP/t.log")"
  cmp "$TMP/tok_$t/chat_template.jinja" "$TMP/run_$t/checkpoint/step-1/chat_template.jinja" ||
    fail "$t: the checkpoint lost chat_template.jinja"
  args=(--checkpoint "$TMP/run_$t/checkpoint" --chat --prompt "${prompts[$((i == 6 ? 0 : 4))]}"
    --max-new-tokens 1 --json)
  [ "$i" = 7 ] && args+=(--tools "$FIX/../chat_tools.json") || args+=(--system "You are terse.")
  got=$("$QT" generate "${args[@]}" 2>"$TMP/err") || fail "$t: $(cat "$TMP/err")"
  got=$(echo "$got" | sed -n 's/.*"prompt_ids":\[\([0-9,]*\)\].*/\1/p')
  want=$(sed -n "$((i + 1))p" "$FIX/../chat_ids.json" | tr -d ' ' | sed -n 's/.*"ids":\[\([0-9,]*\)\].*/\1/p')
  [ -n "$want" ] && [ "$got" = "$want" ] || fail "$t: ids $got, transformers $want"
  if "$QT" generate "${args[@]}" --no-thinking >/dev/null 2>"$TMP/err"; then
    fail "$t: --no-thinking was accepted"
  fi
  grep -q "has no thinking switch" "$TMP/err" || fail "$t --no-thinking: $(cat "$TMP/err")"
  # --chat-template: the first checkpoint (the first Qwen3 template) rendering with this one.
  args[1]=$TMP/run/checkpoint
  got=$("$QT" generate "${args[@]}" --chat-template "$SRC/tests/fixtures/chat/templates/$t.jinja" 2>"$TMP/err") ||
    fail "$t --chat-template: $(cat "$TMP/err")"
  got=$(echo "$got" | sed -n 's/.*"prompt_ids":\[\([0-9,]*\)\].*/\1/p')
  [ "$got" = "$want" ] || fail "$t --chat-template: ids $got, transformers $want"
  echo "$t: the checkpoint keeps chat_template.jinja; generate --chat ids equal apply_chat_template's, and with --chat-template"
done

# --messages: conversations continued as they are (a system turn, an earlier answer with its
# reasoning, a tool call with null content and its result, a line's own tools), batched; the
# prompt ids equal apply_chat_template(..., add_generation_prompt=True) (chat_messages.jsonl,
# rendered with the string-content template, whose generation prompt and body the 2507 Instruct
# checkpoint above shares). The first Qwen3 template refuses the null content with the line.
msgs=$FIX/../chat_messages.jsonl
got=$("$QT" generate --checkpoint "$TMP/run_qwen3_2507_instruct/checkpoint" --messages "$msgs" \
  --max-new-tokens 1 --json 2>"$TMP/err") || fail "--messages: $(cat "$TMP/err")"
[ "$(echo "$got" | wc -l)" = "$(wc -l <"$msgs")" ] || fail "--messages: $(echo "$got" | wc -l) results"
for i in 1 2 3; do
  g=$(echo "$got" | sed -n "${i}p" | sed -n 's/.*"prompt_ids":\[\([0-9,]*\)\].*/\1/p')
  w=$(sed -n "${i}p" "$msgs" | jq -c '.ids' | tr -d '[]')
  [ -n "$w" ] && [ "$g" = "$w" ] || fail "--messages line $i: ids $g, transformers $w"
done
if "$QT" generate --checkpoint "$TMP/run/checkpoint" --messages "$msgs" --max-new-tokens 1 \
  >/dev/null 2>"$TMP/err"; then fail "null content accepted by the first Qwen3 template"; fi
grep -q "chat_messages.jsonl:2: messages\[1\].content is null, which Qwen3's hybrid-thinking template as first released" "$TMP/err" ||
  fail "--messages, null content: $(cat "$TMP/err")"
if "$QT" generate --checkpoint "$TMP/run/checkpoint" --messages "$msgs" --system hi >/dev/null 2>"$TMP/err"; then
  fail "--messages with --system was accepted"
fi
grep -q "a conversation gives its own system turn" "$TMP/err" || fail "--messages --system: $(cat "$TMP/err")"
printf '\n  \n' >"$TMP/empty.jsonl"
if "$QT" generate --checkpoint "$TMP/run/checkpoint" --messages "$TMP/empty.jsonl" >/dev/null 2>"$TMP/err"; then
  fail "an empty --messages file was accepted"
fi
grep -q "empty.jsonl holds no conversation" "$TMP/err" || fail "--messages empty: $(cat "$TMP/err")"
echo "--messages: 3 conversations' prompt ids equal apply_chat_template's; bad input refused"

# --interactive: stdin's lines are user turns of one conversation; turn 1 is generate --chat's,
# turn 2 continues the conversation with turn 1's answer as --messages would; /reset starts
# over (the system turn kept).
ia=(--checkpoint "$TMP/run/checkpoint" --system "You are terse." --temperature 0 --max-new-tokens 6 --json)
printf 'What is 2+2?\nAnd 3+3?\n/reset\nWhat is 2+2?\n/exit\nignored\n' |
  "$QT" generate "${ia[@]}" --interactive >"$TMP/i.out" 2>"$TMP/err" || fail "--interactive: $(cat "$TMP/err")"
[ "$(wc -l <"$TMP/i.out")" = 3 ] || fail "--interactive: $(cat "$TMP/i.out")"
turn() { sed -n "$1p" "$TMP/i.out" | jq -c '[.prompt_ids, .ids]'; }
one=$("$QT" generate "${ia[@]}" --chat --prompt "What is 2+2?" 2>/dev/null | jq -c '[.prompt_ids, .ids]')
[ "$(turn 1)" = "$one" ] && [ "$(turn 3)" = "$one" ] || fail "--interactive turn 1 $(turn 1), /reset $(turn 3), --chat $one"
jq -c '{messages: [{role: "system", content: "You are terse."}, {role: "user", content: "What is 2+2?"},
  {role: "assistant", content: .text}, {role: "user", content: "And 3+3?"}]}' <(sed -n 1p "$TMP/i.out") >"$TMP/conv.jsonl"
two=$("$QT" generate --checkpoint "$TMP/run/checkpoint" --messages "$TMP/conv.jsonl" --temperature 0 \
  --max-new-tokens 6 --json 2>/dev/null | jq -c '[.prompt_ids, .ids]')
[ "$(turn 2)" = "$two" ] || fail "--interactive turn 2 $(turn 2), --messages $two"
# Turn 2 runs only what the cache does not hold: the system and first user turns are kept.
held=$(sed -n 2p <(grep '^generate: prompt' "$TMP/err") | sed -n 's/.*(and \([0-9]*\) held in the cache).*/\1/p')
[ -n "$held" ] && [ "$held" -ge "$(sed -n 1p "$TMP/i.out" | jq '.prompt_ids | length')" ] ||
  fail "--interactive turn 2 did not reuse turn 1's cache: $(grep '^generate: prompt' "$TMP/err")"
if "$QT" generate --checkpoint "$TMP/run/checkpoint" --interactive --prompt hi </dev/null >/dev/null 2>"$TMP/err"; then
  fail "--interactive with --prompt was accepted"
fi
grep -q "give one of --prompt TEXT, --prompt-file F, --messages F or --interactive" "$TMP/err" ||
  fail "--interactive --prompt: $(cat "$TMP/err")"
echo "--interactive: turn 1 is --chat's, turn 2 --messages' with turn 1's answer ($held positions from the cache), /reset starts over"

# --tools: a file that is not an array of tool definitions, and --tools without --chat.
printf '{"name": "f"}\n' >"$TMP/tools_obj.json"
printf '[{"name": "f"},\n "g"]\n' >"$TMP/tools_str.json"
printf '[{"name": "f"}' >"$TMP/tools_cut.json"
for bad in "tools_obj.json:tools must be an array of tool definitions, found an object" \
  "tools_str.json:tools\[1\] must be an object (a JSON schema), found a string" \
  "tools_cut.json:invalid JSON"; do
  f=${bad%%:*} want=${bad#*:}
  if "$QT" generate --checkpoint "$TMP/run/checkpoint" --chat --tools "$TMP/$f" --prompt hi \
    --max-new-tokens 1 >/dev/null 2>"$TMP/err"; then fail "--tools $f was accepted"; fi
  grep -q "error: $TMP/$f.*$want" "$TMP/err" || fail "--tools $f: $(cat "$TMP/err")"
done
if "$QT" generate --checkpoint "$TMP/run/checkpoint" --tools "$FIX/../chat_tools.json" --prompt hi \
  >/dev/null 2>"$TMP/err"; then fail "--tools without --chat was accepted"; fi
grep -q "need --chat" "$TMP/err" || fail "--tools without --chat: $(cat "$TMP/err")"
echo "--tools: bad files and --tools without --chat fail with a sentence"
echo "e2e_generate_chat: ok"
