#!/usr/bin/env bash
# Allocation failures while qtitan reads a user's file end in one "error: " sentence naming the
# file and what was being read, and a non-zero exit (issue 18), in the plain build and under
# AddressSanitizer (scripts/test.sh runs this test in both; e2e_memlimit's address-space
# limits cannot work under ASan's shadow memory):
# - the test hook QT_TEST_FAIL_ALLOC=N:TEXT fails the Nth allocation made while a reader's
#   scope naming TEXT is open (src/core/err.c), for the config (TOML), tokenizer.json, a
#   safetensors header, the dataset and a checkpoint's train_state.json, at several N each;
# - under ASan, the real allocator fails too (allocator_may_return_null=1 and
#   max_allocation_size_mb=16): a 40 MB line of tokenize's input and of the training data, a
#   40 MB config and tokenizer.json, and a safetensors header holding a 40 MB string.
set -uo pipefail
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export QT_CACHE_DIR=$tmp/cache LC_ALL=C
q=$QT_BINARY
src=$QT_SOURCE_DIR
fail=0
bad() { echo "FAIL: $*"; fail=1; }
asan=0
grep -qa __asan_init "$q" && asan=1
base_asan=${ASAN_OPTIONS:-detect_leaks=0}

# expect NAME REGEX CMD...: a non-zero exit that is not a signal or a timeout, exactly one
# "error: " line, matching REGEX (grep -E), and no sanitizer report.
expect() {
  local name=$1 text=$2
  shift 2
  timeout 120 "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
  local rc=$?
  if [ "$rc" -eq 0 ] || [ "$rc" -ge 124 ]; then
    bad "$name: exit $rc, expected an error"; sed 's/^/    /' "$tmp/$name.err" | tail -5; return 1
  fi
  if grep -qE 'ERROR: AddressSanitizer|runtime error' "$tmp/$name.err" || [ "$(grep -c '^error: ' "$tmp/$name.err")" != 1 ] ||
     ! grep -E -- "^error: .*$text" "$tmp/$name.err" >/dev/null; then
    bad "$name: expected one error line matching \"$text\""; sed 's/^/    /' "$tmp/$name.err" | tail -5; return 1
  fi
  echo "$name (exit $rc): $(grep '^error: ' "$tmp/$name.err" | cut -c1-220)"
}
# hook NAME N:TEXT REGEX CMD...: expect, with QT_TEST_FAIL_ALLOC=N:TEXT.
hook() {
  local name=$1 spec=$2 text=$3
  shift 3
  QT_TEST_FAIL_ALLOC=$spec expect "$name" "$text" "$@"
}

tj=$src/tests/fixtures/tokenizer/tiny_gpt2/tokenizer.json
st=$src/tests/fixtures/safetensors/py_written.safetensors
awk -v docs=60 -v seed=5 -f "$src/scripts/gen_corpus.awk" >"$tmp/corpus.jsonl"
cp "$src/configs/debug.toml" "$tmp/job.toml"
args=(--config "$tmp/job.toml" --model.tokenizer_path="$tj" --training.dataset_path="$tmp/corpus.jsonl"
      --model.vocab_size=640 --model.dim=32 --model.n_layers=1 --model.n_heads=4 --model.n_kv_heads=2
      --model.head_dim=8 --model.hidden_dim=64 --training.seq_len=32 --training.local_batch_size=2
      --metrics.peak_tflops=1)
oom="out of memory allocating [0-9]+ bytes while"

# ---- the test hook: each reader's scope names its file ----
for n in 1 3 20; do
  hook toml_$n "$n:job.toml" "$oom reading $tmp/job.toml" "$q" plan "${args[@]}"
  hook tok_$n "$n:tokenizer" "$oom reading the tokenizer $tj" \
    "$q" tokenize --tokenizer "$tj" --input "$tmp/corpus.jsonl" --output "$tmp/ids_$n.txt"
done
for n in 1 2 3; do
  hook data_$n "$((n * n)):reading the dataset" "$oom reading the dataset $tmp/corpus.jsonl" \
    "$q" train "${args[@]}" --training.steps=1 --job.dump_folder="$tmp/run_$n"
  hook st_$n "$n:safetensors" "$oom reading the safetensors header of $st" "$q" inspect "$st"
done
"$q" train "${args[@]}" --training.steps=2 --checkpoint.enable=true --checkpoint.interval=1 \
  --job.dump_folder="$tmp/ck" >"$tmp/ck.log" 2>&1 || { cat "$tmp/ck.log"; bad "checkpointed run"; }
resume() { # NAME N:TEXT REGEX: resumes a copy of the checkpointed run under the hook
  rm -rf "$tmp/ck_$1" && cp -r "$tmp/ck" "$tmp/ck_$1"
  hook "$1" "$2" "$3" "$q" train "${args[@]}" --training.steps=3 --checkpoint.enable=true \
    --job.dump_folder="$tmp/ck_$1"
}
for n in 1 2; do
  resume state_$n "$n:train_state.json" "$oom .*reading $tmp/ck_state_$n/checkpoint/step-2/train_state.json"
done
resume ckload "1:loading the checkpoint" "$oom loading the checkpoint $tmp/ck_ckload/checkpoint/step-2"

# ---- under ASan: the allocator itself returns NULL above 16 MB ----
if [ $asan = 1 ]; then
  export ASAN_OPTIONS="$base_asan:allocator_may_return_null=1:max_allocation_size_mb=16"
  big() { head -c 40000000 /dev/zero | tr '\0' x; }
  { printf '{"text": "short"}\n{"text": "'; big; printf '"}\n'; } >"$tmp/huge.jsonl"
  expect asan_tokenize "huge.jsonl:2: out of memory reading a line" \
    "$q" tokenize --tokenizer "$tj" --input "$tmp/huge.jsonl" --max-line-bytes 100000000
  { cat "$src/configs/debug.toml"; printf '# '; big; printf '\n'; } >"$tmp/big.toml"
  expect asan_toml "out of memory reading $tmp/big.toml" "$q" plan "${args[@]/$tmp\/job.toml/$tmp/big.toml}"
  { printf '{"padding": "'; big; printf '", '; tail -c +2 "$tj"; } >"$tmp/tokenizer.json"
  expect asan_tokjson "out of memory reading $tmp/tokenizer.json" \
    "$q" tokenize --tokenizer "$tmp/tokenizer.json" --input "$tmp/corpus.jsonl"
  hdr=$( { printf '{"__metadata__": {"note": "'; big; printf '"}}'; } | wc -c)
  { printf "$(printf '\\x%02x' $((hdr & 255)) $((hdr >> 8 & 255)) $((hdr >> 16 & 255)) $((hdr >> 24 & 255)))\0\0\0\0"
    printf '{"__metadata__": {"note": "'; big; printf '"}}'; } >"$tmp/big.safetensors"
  expect asan_st "$tmp/big.safetensors.*out of memory parsing" "$q" inspect "$tmp/big.safetensors"
  cat "$tmp/corpus.jsonl" "$tmp/huge.jsonl" >"$tmp/huge_corpus.jsonl"
  expect asan_dataset "huge_corpus.jsonl:62: .*out of memory" \
    "$q" train "${args[@]}" --training.dataset_path="$tmp/huge_corpus.jsonl" --training.steps=1 \
    --job.dump_folder="$tmp/run_huge"
fi

[ $fail = 0 ] && echo "e2e_oom: ok (asan=$asan)"
exit $fail
