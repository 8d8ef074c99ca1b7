#!/usr/bin/env bash
# Parquet datasets (src/text/parquet.c; fixtures by tools/make_parquet_fixtures.py with pyarrow):
# training on each fixture's "text" column (Snappy + dictionary pages, Zstandard data pages v2
# with nulls, gzip with a dictionary that falls back to PLAIN, uncompressed non-nullable, DELTA
# strings) runs
# the same steps, bitwise, as training on JSON Lines of the same texts; a directory of them is
# read; tokenizer-train learns the same tokenizer from the Parquet file as from the JSON Lines and
# tokenize gives the same ids;
# and what qtitan cannot read (the LZ4 codec, a column of integers, no "text"
# column, a list column, a compressed .parquet.gz) stops with one sentence naming the file.
# Conversations in a "messages" column (with reasoning fields and tool calls) train as the same
# conversations in JSON Lines do.
set -euo pipefail
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fx=$QT_SOURCE_DIR/tests/fixtures/parquet
tok=$QT_SOURCE_DIR/tests/fixtures/tokenizer/tiny_gpt2
export QT_CACHE_DIR=$tmp/cache
fail() { echo "FAIL: $*"; exit 1; }
command -v jq >/dev/null || fail "jq is missing (scripts/setup.sh installs it)"
train() { # dump, dataset, extra args...
  local dump=$1 data=$2
  shift 2
  "$QT_BINARY" train --config "$QT_SOURCE_DIR/configs/debug.toml" --model.tokenizer_path="$tok" \
    --model.vocab_size=640 --model.dim=32 --model.n_layers=1 --model.n_heads=2 \
    --model.n_kv_heads=1 --model.head_dim=16 --model.hidden_dim=64 --training.seq_len=32 \
    --training.local_batch_size=2 --training.steps=4 --metrics.peak_tflops=1 \
    --training.dataset_path="$data" --job.dump_folder="$tmp/$dump" "$@" 2>&1
}
losses() { grep '^step:' "$1" | awk '{print $4}'; }

for f in snappy_dict zstd_v2 gzip_fallback plain_required delta_prefix delta_length lz4 brotli; do
  jq -c --arg f "$f.parquet" '.[$f][] | {text: .}' "$fx/expected.json" >"$tmp/$f.jsonl"
  train "p-$f" "$fx/$f.parquet" >"$tmp/p-$f.log" || { cat "$tmp/p-$f.log"; fail "train on $f.parquet"; }
  train "j-$f" "$tmp/$f.jsonl" >"$tmp/j-$f.log" || { cat "$tmp/j-$f.log"; fail "train on $f.jsonl"; }
  [ "$(losses "$tmp/p-$f.log" | wc -l)" = 4 ] && [ "$(losses "$tmp/p-$f.log")" = "$(losses "$tmp/j-$f.log")" ] ||
    fail "$f: Parquet losses $(losses "$tmp/p-$f.log" | tr '\n' ' ') vs JSON Lines $(losses "$tmp/j-$f.log" | tr '\n' ' ')"
  echo "$f.parquet: the 4 losses of its JSON Lines"
done

# training.dataset_text_field: the text from another column / field.
jq -c '{text: "other", content: .text}' "$tmp/zstd_v2.jsonl" >"$tmp/content.jsonl"
for f in "$fx/content.parquet" "$tmp/content.jsonl"; do
  train field "$f" --training.dataset_text_field=content >"$tmp/field.log" || { cat "$tmp/field.log"; fail "dataset_text_field on $f"; }
  [ "$(losses "$tmp/field.log")" = "$(losses "$tmp/j-zstd_v2.log")" ] || fail "$f: dataset_text_field = content reads another text"
  echo "$(basename "$f") with dataset_text_field = content: the losses of zstd_v2's texts"
done
if train field "$tmp/zstd_v2.jsonl" --training.dataset_text_field=body >"$tmp/field.log"; then
  fail "a missing text field was accepted"
fi
grep -q 'zstd_v2.jsonl:1: the object has no "body" field' "$tmp/field.log" || { cat "$tmp/field.log"; fail "missing field: no sentence"; }

# A directory of Parquet files, read in name order as JSON Lines files are.
mkdir "$tmp/dir"
cp "$fx/snappy_dict.parquet" "$tmp/dir/a.parquet"
cp "$fx/zstd_v2.parquet" "$tmp/dir/b.parquet"
cat "$tmp/snappy_dict.jsonl" "$tmp/zstd_v2.jsonl" >"$tmp/ab.jsonl"
train dir "$tmp/dir" >"$tmp/dir.log" || { cat "$tmp/dir.log"; fail "train on a directory of Parquet files"; }
train ab "$tmp/ab.jsonl" >"$tmp/ab.log" || fail "train on ab.jsonl"
[ "$(losses "$tmp/dir.log")" = "$(losses "$tmp/ab.log")" ] || fail "a directory of Parquet files"
echo "a directory of two Parquet files: the losses of their JSON Lines"

"$QT_BINARY" tokenizer-train --input "$fx/gzip_fallback.parquet" --vocab-size 300 --output "$tmp/tp" \
  >/dev/null 2>&1 || fail "tokenizer-train on Parquet"
"$QT_BINARY" tokenizer-train --input "$tmp/gzip_fallback.jsonl" --vocab-size 300 --output "$tmp/tj" \
  >/dev/null 2>&1 || fail "tokenizer-train on JSON Lines"
cmp -s "$tmp/tp/tokenizer.json" "$tmp/tj/tokenizer.json" || fail "tokenizer-train learns another tokenizer from Parquet"
echo "tokenizer-train: the same tokenizer from Parquet as from JSON Lines"
"$QT_BINARY" tokenizer-train --input "$fx/zstd_v2.parquet" --vocab-size 300 --output "$tmp/tz" \
  >/dev/null 2>&1 || fail "tokenizer-train on zstd_v2.parquet"
for f in "$fx/content.parquet" "$tmp/content.jsonl"; do
  rm -rf "$tmp/tc"
  "$QT_BINARY" tokenizer-train --input "$f" --text-field content --vocab-size 300 --output "$tmp/tc" \
    >/dev/null 2>&1 || fail "tokenizer-train --text-field content on $f"
  cmp -s "$tmp/tc/tokenizer.json" "$tmp/tz/tokenizer.json" || fail "tokenizer-train --text-field content on $f"
done
echo "tokenizer-train --text-field content: the tokenizer of zstd_v2's texts"

# qtitan tokenize: a Parquet file's ids are those of its JSON Lines (any thread count); its
# --text-field reads another column; --decode does not take Parquet.
for f in snappy_dict zstd_v2 gzip_fallback plain_required delta_prefix delta_length lz4 brotli; do
  "$QT_BINARY" tokenize --tokenizer "$tok" --input "$fx/$f.parquet" --threads 2 >"$tmp/tk-p.txt" \
    2>"$tmp/tk.err" || fail "tokenize $f.parquet: $(cat "$tmp/tk.err")"
  "$QT_BINARY" tokenize --tokenizer "$tok" --input "$tmp/$f.jsonl" >"$tmp/tk-j.txt"
  [ -s "$tmp/tk-p.txt" ] && cmp -s "$tmp/tk-p.txt" "$tmp/tk-j.txt" || fail "tokenize $f.parquet: not the ids of its JSON Lines"
done
# many.parquet: 6,000 values ("row 0" .. "row 5999"), more than one batch of documents.
seq 0 5999 | jq -Rc '{text: ("row " + .)}' >"$tmp/many.jsonl"
"$QT_BINARY" tokenize --tokenizer "$tok" --input "$fx/many.parquet" --threads 2 >"$tmp/tk-p.txt"
"$QT_BINARY" tokenize --tokenizer "$tok" --input "$tmp/many.jsonl" >"$tmp/tk-j.txt"
[ "$(wc -l <"$tmp/tk-p.txt")" = 6000 ] && cmp -s "$tmp/tk-p.txt" "$tmp/tk-j.txt" || fail "tokenize many.parquet"
for f in "$fx/content.parquet" "$tmp/content.jsonl"; do
  "$QT_BINARY" tokenize --tokenizer "$tok" --input "$f" --text-field content >"$tmp/tk-c.txt" ||
    fail "tokenize --text-field content $f"
  "$QT_BINARY" tokenize --tokenizer "$tok" --input "$tmp/zstd_v2.jsonl" >"$tmp/tk-z.txt"
  cmp -s "$tmp/tk-c.txt" "$tmp/tk-z.txt" || fail "tokenize --text-field content $f: not zstd_v2's ids"
done
"$QT_BINARY" tokenize --tokenizer "$tok" --decode --text-field content --input "$tmp/tk-c.txt" |
  jq -c '{text: .content}' >"$tmp/tk-back.jsonl"
"$QT_BINARY" tokenize --tokenizer "$tok" --decode --input "$tmp/tk-c.txt" | jq -c . >"$tmp/tk-back0.jsonl"
[ "$(wc -l <"$tmp/tk-back.jsonl")" -gt 2 ] && cmp -s "$tmp/tk-back.jsonl" "$tmp/tk-back0.jsonl" ||
  fail "tokenize --decode --text-field content: not the texts under \"content\""
if "$QT_BINARY" tokenize --tokenizer "$tok" --input "$fx/zstd_v2.parquet" --text-field body \
  >/dev/null 2>"$tmp/tk.err"; then fail "tokenize took a missing column"; fi
grep -q "zstd_v2.parquet.*body" "$tmp/tk.err" || fail "tokenize, missing column: $(cat "$tmp/tk.err")"
if "$QT_BINARY" tokenize --tokenizer "$tok" --decode --input "$fx/zstd_v2.parquet" >/dev/null 2>"$tmp/tk.err"; then
  fail "tokenize --decode took a Parquet file"
fi
grep -q "zstd_v2.parquet: --decode reads lines of token ids, not a Parquet file" "$tmp/tk.err" ||
  fail "tokenize --decode of Parquet: $(cat "$tmp/tk.err")"
echo "tokenize: each Parquet file gives the ids of its JSON Lines; --text-field; --decode refuses Parquet"

refuse() { # file, expected text
  if train "bad" "$1" >"$tmp/bad.log"; then fail "$1 was accepted"; fi
  grep -q "error: $1: .*$2" "$tmp/bad.log" || { cat "$tmp/bad.log"; fail "$1: expected '$2'"; }
  echo "refused: $(grep '^error:' "$tmp/bad.log" | sed "s|$fx/||")"
}
refuse "$fx/lzo.parquet" 'is compressed with LZO; qtitan reads uncompressed, SNAPPY, GZIP, ZSTD, LZ4_RAW and BROTLI'
refuse "$fx/int_text.parquet" 'column "text" holds INT64 values, not strings'
refuse "$fx/no_text.parquet" 'no column "text" in the Parquet file (its columns: content, id)'
refuse "$fx/nested_text.parquet" 'column "text" is a list or a group of fields'
gzip -c "$fx/zstd_v2.parquet" >"$tmp/z.parquet.gz"
refuse "$tmp/z.parquet.gz" 'a compressed Parquet file'
head -c 3000 "$fx/zstd_v2.parquet" >"$tmp/cut.parquet"
refuse "$tmp/cut.parquet" 'not a Parquet file'

# Conversations (training.data_format = messages) from a "messages" column of role / content
# lists: the same steps as from JSON Lines of the same conversations, with pyarrow's current
# (list/element) and older (list/item) names. Needs the Qwen3 tokenizer (../shared).
qwen=${QT_SHARED_DIR:-$QT_SOURCE_DIR/../shared}/tokenizers/qwen3
if [ -f "$qwen/tokenizer_config.json" ]; then
  chat() { # dump, data, extra args (last, so they win)
    train "$1" "$2" --training.data_format=messages --model.tokenizer_path="$qwen" \
      --model.vocab_size=151669 --training.seq_len=64 "${@:3}"
  }
  chat cj "$fx/chat.jsonl" >"$tmp/cj.log" || { cat "$tmp/cj.log"; fail "chat from JSON Lines"; }
  for f in chat chat_item; do
    chat "c-$f" "$fx/$f.parquet" >"$tmp/c-$f.log" || { cat "$tmp/c-$f.log"; fail "chat from $f.parquet"; }
    grep -q '^chat data: 40 conversation(s) from 1 file(s)' "$tmp/c-$f.log" &&
      [ "$(losses "$tmp/c-$f.log" | wc -l)" = 4 ] && [ "$(losses "$tmp/c-$f.log")" = "$(losses "$tmp/cj.log")" ] ||
      { cat "$tmp/c-$f.log"; fail "$f.parquet: conversations differ from chat.jsonl's"; }
    echo "$f.parquet: 40 conversations, the 4 losses of chat.jsonl"
  done
  # ShareGPT's shape: "conversations" of {from, value} with the roles human and gpt, from
  # Parquet and from JSON Lines, train as chat.jsonl.
  jq -c '{conversations: [.messages[] | {from: ({user: "human", assistant: "gpt"}[.role] // .role), value: .content}]}' \
    "$fx/chat.jsonl" >"$tmp/sharegpt.jsonl"
  for f in "$fx/chat_sharegpt.parquet" "$tmp/sharegpt.jsonl"; do
    chat sg "$f" >"$tmp/sg.log" || { cat "$tmp/sg.log"; fail "chat from $f"; }
    grep -q '^chat data: 40 conversation(s) from 1 file(s)' "$tmp/sg.log" &&
      [ "$(losses "$tmp/sg.log")" = "$(losses "$tmp/cj.log")" ] ||
      { cat "$tmp/sg.log"; fail "$(basename "$f"): conversations differ from chat.jsonl's"; }
    echo "$(basename "$f") (ShareGPT's conversations / from / value): the 4 losses of chat.jsonl"
  done
  # Reasoning fields (reasoning_content, thinking) of the messages.
  chat rj "$fx/chat_reasoning.jsonl" >"$tmp/rj.log" || { cat "$tmp/rj.log"; fail "chat_reasoning.jsonl"; }
  chat rp "$fx/chat_reasoning.parquet" >"$tmp/rp.log" || { cat "$tmp/rp.log"; fail "chat_reasoning.parquet"; }
  [ "$(losses "$tmp/rp.log" | wc -l)" = 4 ] && [ "$(losses "$tmp/rp.log")" = "$(losses "$tmp/rj.log")" ] &&
    [ "$(grep '^chat data' "$tmp/rp.log" | sed 's/from .* file/F/')" = "$(grep '^chat data' "$tmp/rj.log" | sed 's/from .* file/F/')" ] ||
    { cat "$tmp/rp.log"; fail "chat_reasoning.parquet differs from its JSON Lines"; }
  echo "chat_reasoning.parquet: the targets and 4 losses of its JSON Lines"
  # Tool calls of the messages, in OpenAI's shape (with id and type) and bare.
  for f in chat_tool_calls chat_tool_calls_bare; do
    chat "tj-$f" "$fx/$f.jsonl" >"$tmp/tj.log" || { cat "$tmp/tj.log"; fail "$f.jsonl"; }
    chat "tp-$f" "$fx/$f.parquet" >"$tmp/tp.log" || { cat "$tmp/tp.log"; fail "$f.parquet"; }
    [ "$(losses "$tmp/tp.log" | wc -l)" = 4 ] && [ "$(losses "$tmp/tp.log")" = "$(losses "$tmp/tj.log")" ] &&
      [ "$(grep '^chat data' "$tmp/tp.log" | sed 's/from .* file/F/')" = "$(grep '^chat data' "$tmp/tj.log" | sed 's/from .* file/F/')" ] ||
      { cat "$tmp/tp.log"; fail "$f.parquet differs from its JSON Lines"; }
    echo "$f.parquet: the targets and 4 losses of its JSON Lines"
  done
  # The instruction and prompt_completion shapes from string columns.
  for f in alpaca:instruction prompts:prompt_completion; do
    name=${f%%:*} shape=${f#*:}
    chat "sj-$name" "$fx/$name.jsonl" --training.data_format="$shape" >"$tmp/sj.log" ||
      { cat "$tmp/sj.log"; fail "$name.jsonl"; }
    chat "sp-$name" "$fx/$name.parquet" --training.data_format="$shape" >"$tmp/sp.log" ||
      { cat "$tmp/sp.log"; fail "$name.parquet"; }
    grep -q '^chat data: 30 conversation(s)' "$tmp/sp.log" && [ "$(losses "$tmp/sp.log" | wc -l)" = 4 ] &&
      [ "$(losses "$tmp/sp.log")" = "$(losses "$tmp/sj.log")" ] || { cat "$tmp/sp.log"; fail "$name.parquet differs from $name.jsonl"; }
    echo "$name.parquet ($shape): 30 conversations, the 4 losses of $name.jsonl"
  done
  if chat bad "$fx/chat_extra.parquet" >"$tmp/bad.log"; then fail "chat_extra.parquet was accepted"; fi
  grep -q "chat_extra.parquet: the messages' \"tool_calls\" is not a list of calls" "$tmp/bad.log" ||
    { cat "$tmp/bad.log"; fail "chat_extra.parquet: no sentence"; }
  if chat bad "$fx/chat_tools.parquet" >"$tmp/bad.log"; then fail "chat_tools.parquet was accepted"; fi
  grep -q 'chat_tools.parquet: the conversations have a "tools" column (tool definitions), which qtitan reads from JSON Lines only' "$tmp/bad.log" ||
    { cat "$tmp/bad.log"; fail "chat_tools.parquet: no sentence"; }
  if chat bad "$fx/snappy_dict.parquet" >"$tmp/bad.log"; then fail "a text file as conversations"; fi
  grep -q 'snappy_dict.parquet: no column "messages" in the Parquet file (its columns: id, text, meta)' "$tmp/bad.log" ||
    { cat "$tmp/bad.log"; fail "snappy_dict.parquet as conversations: no sentence"; }
  if chat bad "$fx/chat.parquet" --training.data_format=instruction >"$tmp/bad.log"; then
    fail "chat.parquet as instructions was accepted"
  fi
  grep -q 'chat.parquet: no column "instruction" in the Parquet file (its columns: prompt_id, messages)' "$tmp/bad.log" ||
    { cat "$tmp/bad.log"; fail "chat.parquet as instructions: no sentence"; }
  echo "conversations: bad Parquet shapes refused with a sentence"
else
  echo "conversations: skipped (no Qwen3 tokenizer at $qwen)"
fi
echo "e2e_parquet: ok"
