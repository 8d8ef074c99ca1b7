#!/usr/bin/env bash
# Compressed corpora through the commands: `tokenize` gives the same ids for .jsonl, .jsonl.gz
# and .jsonl.zst (compressed here with gzip and zstd themselves), `tokenizer-train` learns the
# same tokenizer from either, and a truncated or corrupt file is one sentence naming the file
# and the byte offset, with a non-zero exit.
set -euo pipefail
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fail() { echo "FAIL: $*"; exit 1; }
command -v gzip >/dev/null && command -v zstd >/dev/null || { echo "skip: no gzip or zstd"; exit 77; }
for i in $(seq 1 400); do
  printf '{"text": "document %d: the quick brown fox %d jumps over the lazy dog, caf\\u00e9 %d\\n"}\n' $i $((i * 7)) $((i % 13))
done >c.jsonl
gzip -c c.jsonl >c.jsonl.gz
zstd -q -c c.jsonl >c.jsonl.zst
cp c.jsonl.gz c4-train.00000-of-01024.json.gz
"$QT_BINARY" tokenizer-train --input c.jsonl --vocab-size 300 --output tok >/dev/null 2>&1 || fail "tokenizer-train"
"$QT_BINARY" tokenizer-train --input c4-train.00000-of-01024.json.gz --vocab-size 300 --output tokz \
  >/dev/null 2>&1 || fail "tokenizer-train on .json.gz"
cmp tok/tokenizer.json tokz/tokenizer.json || fail "tokenizer-train learns another tokenizer from .json.gz"
"$QT_BINARY" tokenize --tokenizer tok --input c.jsonl --output plain.ids
for f in c.jsonl.gz c.jsonl.zst; do
  "$QT_BINARY" tokenize --tokenizer tok --input $f --output $f.ids || fail "tokenize $f"
  cmp plain.ids $f.ids || fail "tokenize $f gives other ids than the plain file"
done
[ "$(wc -l <plain.ids)" = 400 ] || fail "expected 400 documents"

size=$(stat -c %s c.jsonl.zst)
head -c $((size - 50)) c.jsonl.zst >cut.jsonl.zst
set +e; "$QT_BINARY" tokenize --tokenizer tok --input cut.jsonl.zst --output cut.ids 2>err.txt; rc=$?; set -e
[ $rc -ne 0 ] && grep -qF "error: cut.jsonl.zst: truncated zstd data: the file ends at byte $((size - 50)) inside a frame" err.txt ||
  { cat err.txt; fail "truncated .zst: rc $rc"; }
printf 'not gzip at all\n' >fake.jsonl.gz
set +e; "$QT_BINARY" tokenize --tokenizer tok --input fake.jsonl.gz 2>err.txt >/dev/null; rc=$?; set -e
[ $rc -ne 0 ] && grep -qF "error: fake.jsonl.gz: corrupt gzip data near compressed byte" err.txt ||
  { cat err.txt; fail "corrupt .gz: rc $rc"; }
echo "e2e_compressed: ok"
