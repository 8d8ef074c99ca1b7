#!/usr/bin/env bash
# qtitan train on chat data end to end with the Qwen3 tokenizer and a tiny model: the messages
# and instruction shapes, packing and one conversation a row, the counts in the log, a resume
# from a checkpoint that continues with the same losses, training.chat_template_path (a
# template from elsewhere, kept by checkpoints and exports), and the error sentences of a
# tokenizer without a chat template and of a malformed line.
set -euo pipefail
shared=${QT_SHARED_DIR:-}
tok=$shared/tokenizers/qwen3
# Skipped only without ../shared (a user's clone); CI has it, so a missing file fails.
if [ -z "$shared" ] || [ ! -d "$shared" ]; then echo "skip: no ../shared"; exit 77; fi
[ -f "$tok/tokenizer_config.json" ] || { echo "FAIL: $shared lacks the Qwen3 tokenizer"; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 24); do
  a=$((i * 7 % 50)); b=$((i * 13 % 40))
  printf '{"messages": [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "What is %d plus %d?"}, {"role": "assistant", "content": "%d plus %d is %d."}]}\n' $a $b $a $b $((a + b))
  printf '{"instruction": "Add %d and %d.", "input": "", "output": "%d"}\n' $a $b $((a + b)) >>"$tmp/alpaca.jsonl"
done >"$tmp/chat.jsonl"
# One long conversation for the truncation count.
printf '{"messages": [{"role": "user", "content": "%s"}, {"role": "assistant", "content": "ok"}]}\n' \
  "$(printf 'word %.0s' $(seq 1 80))" >>"$tmp/chat.jsonl"
train() {
  "$QT_BINARY" train --config "$QT_SOURCE_DIR/configs/debug.toml" --model.tokenizer_path="$tok" \
    --model.vocab_size=151669 --model.dim=32 --model.n_layers=1 --model.n_heads=4 \
    --model.n_kv_heads=2 --model.head_dim=8 --model.hidden_dim=64 \
    --training.seq_len=64 --training.local_batch_size=2 --training.steps=4 \
    --metrics.peak_tflops=1 --job.dump_folder="$@" 2>&1
}
train "$tmp/a" --training.dataset_path="$tmp/chat.jsonl" --training.data_format=messages \
  --checkpoint.enable=true --checkpoint.interval=2 >"$tmp/a.log"
grep -q 'chat data: 24 conversation(s) from 1 file(s) in the qwen3 format, .* targets (assistant output only); longer than seq_len 64: 0 truncated, 1 dropped' "$tmp/a.log" \
  || { cat "$tmp/a.log"; echo "FAIL: chat data counts (the long one is cut inside its user turn, so dropped)"; exit 1; }
[ "$(grep -c '^step: ' "$tmp/a.log")" = 4 ] || { cat "$tmp/a.log"; echo "FAIL: expected 4 steps"; exit 1; }

# Resumed from step 2: steps 3 and 4 have the same losses as the run that never stopped.
rm -rf "$tmp/a/checkpoint/step-4"
cp -r "$tmp/a" "$tmp/b"
train "$tmp/b" --training.dataset_path="$tmp/chat.jsonl" --training.data_format=messages \
  --checkpoint.enable=true --checkpoint.interval=2 >"$tmp/b.log"
grep -q 'resumed from .*step-2' "$tmp/b.log" || { cat "$tmp/b.log"; echo "FAIL: no resume"; exit 1; }
diff <(grep '^step:  [34]' "$tmp/a.log" | awk '{print $4}') <(grep '^step:  [34]' "$tmp/b.log" | awk '{print $4}') \
  || { echo "FAIL: resumed losses differ"; exit 1; }

# Instruction rows, one a row, every token a target, long ones truncated.
train "$tmp/c" --training.dataset_path="$tmp/alpaca.jsonl" --training.data_format=instruction \
  --training.packing=false --training.train_on_all_tokens=true --training.seq_len=24 >"$tmp/c.log"
grep -q 'chat data: 24 conversation(s) .* (every token); longer than seq_len 24: 17 truncated, 0 dropped' "$tmp/c.log" \
  || { cat "$tmp/c.log"; echo "FAIL: instruction data counts"; exit 1; }

# A resume with other data is refused.
head -n 20 "$tmp/chat.jsonl" >"$tmp/fewer.jsonl"
if train "$tmp/b" --training.dataset_path="$tmp/fewer.jsonl" --training.data_format=messages \
  --checkpoint.enable=true --checkpoint.interval=2 --training.steps=6 >"$tmp/d.log"; then
  echo "FAIL: resume on changed data should fail"; exit 1
fi
grep -q 'the chat data changed since the checkpoint' "$tmp/d.log" || { cat "$tmp/d.log"; echo "FAIL: changed data sentence"; exit 1; }

# Validation on chat data: held-out conversations are rendered, packed and masked as training's
# are. With lr 0 and every conversation in the one step, the validation loss is the step's
# training loss, and its tokens are the targets the chat data line counts; packed or not, and
# whatever validation's batch.
for packing in false true; do
  train "$tmp/v$packing" --training.dataset_path="$tmp/chat.jsonl" --training.data_format=messages \
    --training.local_batch_size=24 --training.packing=$packing --training.steps=1 --optimizer.lr=0 \
    --validation.enable=true --validation.dataset_path="$tmp/chat.jsonl" \
    --validation.local_batch_size=5 --checkpoint.enable=true \
    >"$tmp/v.log" || { cat "$tmp/v.log"; echo "FAIL: chat validation"; exit 1; }
  step=$(sed -n 's/^step: *1\/1 *loss: *\([0-9.]*\).*/\1/p' "$tmp/v.log")
  val=$(sed -n 's/.*validate step: 1  loss: \([0-9.]*\) .*/\1/p' "$tmp/v.log")
  vtok=$(sed -n 's/.*validate step: 1 .* tokens: \([0-9]*\) .*/\1/p' "$tmp/v.log")
  targets=$(sed -n 's/^chat data: .* tokens, \([0-9]*\) targets.*/\1/p' "$tmp/v.log")
  grep -q '^validation chat data: 24 conversation(s)' "$tmp/v.log" &&
    awk -v a="$step" -v b="$val" 'BEGIN { exit !(a != "" && b != "" && (a - b < 2e-5 && b - a < 2e-5)) }' &&
    [ -n "$vtok" ] && [ "$vtok" = "$targets" ] ||
    { cat "$tmp/v.log"; echo "FAIL: packing $packing: validation loss $val tokens $vtok, step loss $step targets $targets"; exit 1; }
  echo "packing $packing: validation loss $val = step loss $step over $vtok targets"
done
# qtitan eval --data-format messages of that checkpoint: the same loss over the same targets.
"$QT_BINARY" eval --checkpoint "$tmp/vtrue/checkpoint" --dataset "$tmp/chat.jsonl" \
  --data-format messages --seq-len 64 >"$tmp/ev.out" 2>"$tmp/ev.err" ||
  { cat "$tmp/ev.err"; echo "FAIL: eval --data-format messages"; exit 1; }
eloss=$(sed -n 's/^loss: //p' "$tmp/ev.out")
awk -v a="$eloss" -v b="$val" 'BEGIN { exit !(a != "" && (a - b < 2e-5 && b - a < 2e-5)) }' &&
  grep -q "^tokens: $vtok  bytes: [0-9]*  rows: .* conversations: 24$" "$tmp/ev.out" ||
  { cat "$tmp/ev.out" "$tmp/ev.err"; echo "FAIL: eval --data-format messages: $eloss vs validation $val"; exit 1; }
# Bits per byte: the targets stand for each conversation's final assistant turn as rendered, an
# empty think block and the answer (<|im_end|> stands for no text); the long last line is dropped.
want=$(head -24 "$tmp/chat.jsonl" | jq -s '[.[] | .messages[-1].content | "<think>\n\n</think>\n\n" + . | utf8bytelength] | add')
bytes=$(sed -n 's/^tokens: .*  bytes: \([0-9]*\)  .*/\1/p' "$tmp/ev.out")
bpb=$(sed -n 's/^bits_per_byte: //p' "$tmp/ev.out")
[ "$bytes" = "$want" ] && awk -v l="$eloss" -v n="$vtok" -v b="$bytes" -v p="$bpb" \
  'BEGIN { q = l * n / log(2) / b; exit !(p != "" && (q - p) < 2e-6 * q && (p - q) < 2e-6 * q) }' ||
  { cat "$tmp/ev.out"; echo "FAIL: eval --data-format messages: bytes $bytes (want $want), bits per byte $bpb"; exit 1; }
echo "eval --data-format messages: loss $eloss over $vtok targets, as validation; $bytes bytes, $bpb bits per byte"

# Tool use: conversations that offer a tool, call it and read its result train like any other
# (the system turn with the definitions, the call, the result; ids as transformers renders
# them: test_chat_template).
for i in $(seq 1 8); do
  printf '{"tools": [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}], "messages": [{"role": "user", "content": "Add %d and %d."}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": %d, "b": %d}}}]}, {"role": "tool", "content": "%d"}, {"role": "assistant", "content": "It is %d."}]}\n' \
    "$i" $((i * 3)) "$i" $((i * 3)) $((i * 4)) $((i * 4))
done >"$tmp/tools.jsonl"
train "$tmp/t" --training.dataset_path="$tmp/tools.jsonl" --training.data_format=messages \
  --training.seq_len=256 >"$tmp/t.log" || { cat "$tmp/t.log"; echo "FAIL: tool conversations"; exit 1; }
grep -q 'chat data: 8 conversation(s) from 1 file(s) in the qwen3 format, .* 0 truncated, 0 dropped' "$tmp/t.log" &&
  [ "$(grep -c '^step: ' "$tmp/t.log")" = 4 ] || { cat "$tmp/t.log"; echo "FAIL: tool conversations"; exit 1; }

# Bad input: a tokenizer folder without tokenizer_config.json, a bad role on line 3.
mkdir "$tmp/notemplate"; cp "$tok/tokenizer.json" "$tmp/notemplate/"
if "$QT_BINARY" train --config "$QT_SOURCE_DIR/configs/debug.toml" --model.tokenizer_path="$tmp/notemplate" \
  --model.vocab_size=151669 --training.dataset_path="$tmp/chat.jsonl" --training.data_format=messages \
  --job.dump_folder="$tmp/e" >"$tmp/e.log" 2>&1; then echo "FAIL: no chat template should fail"; exit 1; fi
grep -q "error: $tmp/notemplate/tokenizer_config.json: not found" "$tmp/e.log" || { cat "$tmp/e.log"; echo "FAIL: no-template sentence"; exit 1; }
sed '3s/"system"/"robot"/' "$tmp/chat.jsonl" >"$tmp/badrole.jsonl"
if train "$tmp/f" --training.dataset_path="$tmp/badrole.jsonl" --training.data_format=messages >"$tmp/f.log"; then
  echo "FAIL: a bad role should fail"; exit 1
fi
grep -q "error: $tmp/badrole.jsonl:3: messages\[0\].role \"robot\" is not" "$tmp/f.log" || { cat "$tmp/f.log"; echo "FAIL: bad-role sentence"; exit 1; }

# training.chat_template_path: the template from a folder or a tokenizer_config.json trains
# exactly as the tokenizer folder's own (a folder with tokenizer.json alone has none); a .jinja
# file of another format renders in that format, and checkpoints and the HF export keep it as
# chat_template.jinja, which generation then reads.
for where in "$tok" "$tok/tokenizer_config.json"; do
  "$QT_BINARY" train --config "$QT_SOURCE_DIR/configs/debug.toml" --model.tokenizer_path="$tmp/notemplate" \
    --model.vocab_size=151669 --model.dim=32 --model.n_layers=1 --model.n_heads=4 \
    --model.n_kv_heads=2 --model.head_dim=8 --model.hidden_dim=64 \
    --training.seq_len=64 --training.local_batch_size=2 --training.steps=4 --metrics.peak_tflops=1 \
    --training.dataset_path="$tmp/chat.jsonl" --training.data_format=messages \
    --training.chat_template_path="$where" --job.dump_folder="$tmp/ct" >"$tmp/ct.log" 2>&1 ||
    { cat "$tmp/ct.log"; echo "FAIL: chat_template_path $where"; exit 1; }
  diff <(grep '^step: ' "$tmp/a.log" | awk '{print $4}') <(grep '^step: ' "$tmp/ct.log" | awk '{print $4}') ||
    { echo "FAIL: chat_template_path $where trains otherwise than the tokenizer folder's template"; exit 1; }
  rm -rf "$tmp/ct"
done
t2507=$QT_SOURCE_DIR/tests/fixtures/chat/templates/qwen3_2507_instruct.jinja
train "$tmp/g" --training.dataset_path="$tmp/chat.jsonl" --training.data_format=messages \
  --training.chat_template_path="$t2507" --training.steps=2 --checkpoint.enable=true \
  --checkpoint.last_save_in_hf=true >"$tmp/g.log" || { cat "$tmp/g.log"; echo "FAIL: 2507 template"; exit 1; }
grep -q 'chat data: 24 conversation(s) from 1 file(s) in the qwen3-2507-instruct format' "$tmp/g.log" ||
  { cat "$tmp/g.log"; echo "FAIL: the run did not render with chat_template_path's format"; exit 1; }
cmp "$t2507" "$tmp/g/checkpoint/step-2/chat_template.jinja" && cmp "$t2507" "$tmp/g/checkpoint/step-2/hf/chat_template.jinja" ||
  { ls "$tmp/g/checkpoint/step-2" "$tmp/g/checkpoint/step-2/hf"; echo "FAIL: the template is not kept"; exit 1; }
"$QT_BINARY" export --checkpoint "$tmp/g/checkpoint" --out "$tmp/g_hf" >/dev/null 2>&1 && cmp "$t2507" "$tmp/g_hf/chat_template.jinja" ||
  { echo "FAIL: qtitan export does not keep the template"; exit 1; }
"$QT_BINARY" inspect "$tmp/g_hf" 2>&1 | grep -q 'chat format: qwen3-2507-instruct' ||
  { "$QT_BINARY" inspect "$tmp/g_hf"; echo "FAIL: the export's chat format"; exit 1; }
# eval --chat-template: the export without its chat_template.jinja evaluates with the 2507 one
# as the export itself does (the known formats render training turns alike, so the file is
# shown read by a template it cannot render).
cp -r "$tmp/g_hf" "$tmp/g_hf2" && rm "$tmp/g_hf2/chat_template.jinja"
ev() { "$QT_BINARY" eval --model "$@" --dataset "$tmp/chat.jsonl" --data-format messages --seq-len 64 2>"$tmp/ev.err" | grep -E '^(loss|tokens):'; }
e1=$(ev "$tmp/g_hf") && e2=$(ev "$tmp/g_hf2" --chat-template "$t2507") && [ -n "$e1" ] && [ "$e1" = "$e2" ] ||
  { echo "FAIL: eval --chat-template: '$e1' / '$e2'"; exit 1; }
printf '{{ messages }}' >"$tmp/other.jinja"
! ev "$tmp/g_hf" --chat-template "$tmp/other.jinja" >/dev/null && grep -qF "$tmp/other.jinja: the chat template (14 bytes" "$tmp/ev.err" ||
  { cat "$tmp/ev.err"; echo "FAIL: eval --chat-template of an unknown template"; exit 1; }
# A path that is not there, and a template qtitan does not render, even for text data (it would
# be kept by the checkpoints).
for bad in "$tmp/none.jinja|$tmp/none.jinja: not found (expected a chat template" \
           "$tmp/other.jinja|$tmp/other.jinja: the chat template (14 bytes, hash"; do
  if train "$tmp/h" --training.dataset_path="$tmp/chat.jsonl" --training.data_format=messages \
    --training.chat_template_path="${bad%%|*}" >"$tmp/h.log"; then echo "FAIL: ${bad%%|*} should fail"; exit 1; fi
  grep -qF "error: ${bad#*|}" "$tmp/h.log" || { cat "$tmp/h.log"; echo "FAIL: sentence for ${bad%%|*}"; exit 1; }
done
printf '{"text": "plain text to train on"}\n%.0s' $(seq 1 40) >"$tmp/text.jsonl"
if train "$tmp/h" --training.dataset_path="$tmp/text.jsonl" --training.chat_template_path="$tmp/other.jinja" >"$tmp/h.log"; then
  echo "FAIL: an unknown template with text data should fail"; exit 1
fi
grep -qF "error: $tmp/other.jinja: the chat template" "$tmp/h.log" || { cat "$tmp/h.log"; echo "FAIL: text-data template sentence"; exit 1; }
echo "e2e_sft: ok"
