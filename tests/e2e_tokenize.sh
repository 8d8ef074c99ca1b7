#!/usr/bin/env bash
# qtitan tokenize end to end: ids for a small JSONL with the tiny fixture tokenizer match the
# HF ids in tests/fixtures/tokenizer/tiny_edge.jsonl, --decode gives the text back, --threads
# does not change the output, and bad input gets an error naming file:line. With ../shared,
# the C4 sample is tokenized with 1 and 2 threads and must give the same 800 lines.
set -euo pipefail
bin=${QT_BINARY:-build/qtitan}
src=${QT_SOURCE_DIR:-.}
tok=$src/tests/fixtures/tokenizer/tiny_gpt2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# Inputs and the ids HF gave for them (the first cases of tiny_edge.jsonl, copied by hand).
grep -m1 '"text": "hello world"' "$src/tests/fixtures/tokenizer/tiny_edge.jsonl" >/dev/null ||
  fail "fixture lacks the hello world case"
want=$(grep -m1 '"text": "hello world"' "$src/tests/fixtures/tokenizer/tiny_edge.jsonl" |
  sed 's/.*"ids": \[\([^]]*\)\].*/\1/; s/,//g')
printf '{"text": "hello world"}\n\n{"text": "it'"'"'s <mask> [SEP] x", "url": "u"}\n' >"$tmp/in.jsonl"
"$bin" tokenize --tokenizer "$tok" --input "$tmp/in.jsonl" --output "$tmp/ids.txt"
[ "$(wc -l <"$tmp/ids.txt")" -eq 2 ] || fail "expected 2 id lines (blank line skipped)"
[ "$(head -1 "$tmp/ids.txt")" = "$want" ] || fail "ids $(head -1 "$tmp/ids.txt") != HF $want"

# Decode gives JSONL text back (lstrip/rstrip tokens drop spaces, so check the first line).
"$bin" tokenize --tokenizer "$tok" --decode --input "$tmp/ids.txt" >"$tmp/dec.jsonl"
[ "$(head -1 "$tmp/dec.jsonl")" = '{"text":"hello world"}' ] || fail "decode: $(head -1 "$tmp/dec.jsonl")"

# Threads: same output.
for i in $(seq 1 300); do printf '{"text": "doc %d: the quick brown fox, it'"'"'s %d!\\n"}\n' "$i" "$((i * 7919))"; done >"$tmp/many.jsonl"
"$bin" tokenize --tokenizer "$tok" --input "$tmp/many.jsonl" --threads 1 >"$tmp/t1.txt"
"$bin" tokenize --tokenizer "$tok" --input "$tmp/many.jsonl" --threads 3 >"$tmp/t3.txt"
cmp -s "$tmp/t1.txt" "$tmp/t3.txt" || fail "--threads 3 output differs"
"$bin" tokenize --tokenizer "$tok" --decode --input "$tmp/t1.txt" --threads 2 >"$tmp/back.jsonl"
sed 's/^{"text": /{"text":/' "$tmp/many.jsonl" | cmp -s - "$tmp/back.jsonl" || fail "round trip differs"

# A UTF-8 byte order mark before line 1 is skipped, as training's dataset reader does: same ids
# as without it, and tokenizer-train reads the file too.
printf '\357\273\277' | cat - "$tmp/in.jsonl" >"$tmp/bom.jsonl"
"$bin" tokenize --tokenizer "$tok" --input "$tmp/bom.jsonl" --output "$tmp/bom_ids.txt" ||
  fail "a byte order mark before line 1 was rejected"
cmp -s "$tmp/ids.txt" "$tmp/bom_ids.txt" || fail "a byte order mark changed the ids"
"$bin" tokenizer-train --input "$tmp/bom.jsonl" --vocab-size 300 --output "$tmp/bom_tok" 2>"$tmp/err" ||
  fail "tokenizer-train rejected a byte order mark: $(cat "$tmp/err")"

# Errors name file:line and exit non-zero.
printf '{"text": "ok"}\nnot json\n' >"$tmp/bad1.jsonl"
if "$bin" tokenize --tokenizer "$tok" --input "$tmp/bad1.jsonl" >/dev/null 2>"$tmp/err"; then fail "bad JSON accepted"; fi
grep -q "bad1.jsonl:2" "$tmp/err" || fail "no file:line in: $(cat "$tmp/err")"
printf '{"text": "ok"}\n{"txt": "x"}\n' >"$tmp/bad2.jsonl"
if "$bin" tokenize --tokenizer "$tok" --input "$tmp/bad2.jsonl" >/dev/null 2>"$tmp/err"; then fail "missing text accepted"; fi
grep -q 'bad2.jsonl:2: the object has no "text" field' "$tmp/err" || fail "missing text: $(cat "$tmp/err")"
printf '1 2 x\n' >"$tmp/bad3.txt"
if "$bin" tokenize --tokenizer "$tok" --decode --input "$tmp/bad3.txt" >/dev/null 2>"$tmp/err"; then fail "bad ids accepted"; fi
grep -q "bad3.txt:1" "$tmp/err" || fail "bad ids: $(cat "$tmp/err")"
echo '{' >"$tmp/tokenizer.json"
if "$bin" tokenize --tokenizer "$tmp" <"$tmp/in.jsonl" >/dev/null 2>"$tmp/err"; then fail "bad tokenizer accepted"; fi
grep -q "$tmp/tokenizer.json" "$tmp/err" || fail "bad tokenizer: $(cat "$tmp/err")"

# Only without ../shared (a user's clone) is this part left out; CI has it.
c4=${QT_SHARED_DIR:-../shared}/data/c4_sample/c4_sample.jsonl
qwen=${QT_SHARED_DIR:-../shared}/tokenizers/qwen3
if [ -d "${QT_SHARED_DIR:-../shared}" ]; then
  [ -f "$c4" ] && [ -f "$qwen/tokenizer.json" ] || fail "../shared lacks the Qwen3 tokenizer or the C4 sample"
  "$bin" tokenize --tokenizer "$qwen" --input "$c4" --threads 1 >"$tmp/c1.txt"
  "$bin" tokenize --tokenizer "$qwen" --input "$c4" --threads 2 >"$tmp/c2.txt"
  cmp -s "$tmp/c1.txt" "$tmp/c2.txt" || fail "C4: --threads 2 differs"
  [ "$(wc -l <"$tmp/c1.txt")" -eq 800 ] || fail "C4: expected 800 lines"
fi
echo "e2e_tokenize: ok"
