#!/usr/bin/env bash
# Under a real memory limit (ulimit -v, the address-space limit `prlimit --as` and batch systems
# set), every command ends in one "error: " sentence naming what it was doing and a non-zero
# exit, never a crash, a hang or exit 0 with part of its output (issue 18):
# - tokenize on a file with a 64 MB line, at limits where reading, parsing and tokenizing the
#   line each run out: the sentence names the file and line;
# - train with a limit below its plan stops before allocating, with the plan's figure (the
#   same as `qtitan plan` prints); a plan beyond this machine's physical memory stops the same
#   way (the 235B-A22B flavor, some 3.5 TB);
# - eval with a limit below the model's size names the arena it could not allocate, and a limit
#   that leaves too little for threads and oneDNN (which abort inside their own threads when an
#   allocation fails) names that, at every limit tried up to one where eval runs.
# Not under the sanitizers: their shadow memory needs terabytes of address space.
set -uo pipefail
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export QT_CACHE_DIR=$tmp/cache LC_ALL=C
q=$QT_BINARY
src=$QT_SOURCE_DIR
fail=0
bad() { echo "FAIL: $*"; fail=1; }

# limited KB NAME ARGS...: runs qtitan under ulimit -v KB; sets rc, out in $tmp/NAME.{out,err}.
limited() {
  local kb=$1 name=$2
  shift 2
  (ulimit -v "$kb" && exec timeout 120 "$q" "$@") >"$tmp/$name.out" 2>"$tmp/$name.err"
  rc=$?
}
# one_error NAME REGEX: a non-zero exit that is not a signal or a timeout, and one "error: "
# line matching REGEX (grep -E).
one_error() {
  local name=$1 text=$2
  if [ "$rc" -eq 0 ] || [ "$rc" -ge 124 ]; then
    bad "$name: exit $rc, expected an error (not 0, a timeout or a signal)"
    sed 's/^/    /' "$tmp/$name.err" | head -5
    return 1
  fi
  [ "$(grep -c '^error: ' "$tmp/$name.err")" = 1 ] && grep -q '^error: ' "$tmp/$name.err" ||
    { bad "$name: not one error line"; sed 's/^/    /' "$tmp/$name.err" | head -5; return 1; }
  grep -qE -- "$text" "$tmp/$name.err" ||
    { bad "$name: no \"$text\""; sed 's/^/    /' "$tmp/$name.err" | head -5; return 1; }
  echo "$name (ulimit -v, exit $rc): $(grep '^error: ' "$tmp/$name.err" | cut -c1-200)"
}

# ---- tokenize: a 64 MB line ----
tj=$src/tests/fixtures/tokenizer/tiny_gpt2/tokenizer.json
{
  printf '{"text": "short"}\n{"text": "'
  head -c 64000000 /dev/zero | tr '\0' x
  printf '"}\n{"text": "after"}\n'
} >"$tmp/huge.jsonl"
declare -A seen=()
for kb in 200000 300000 450000 700000; do
  limited $kb tok_$kb tokenize --tokenizer "$tj" --input "$tmp/huge.jsonl" --max-line-bytes 100000000
  one_error tok_$kb "huge.jsonl:2" || continue
  grep -q "reading" "$tmp/tok_$kb.err" && seen[read]=1
  grep -q "parsing .* bytes of JSON" "$tmp/tok_$kb.err" && seen[parse]=1
  grep -q "while tokenizing" "$tmp/tok_$kb.err" && seen[tokenize]=1
done
for stage in read parse tokenize; do
  [ -n "${seen[$stage]:-}" ] || bad "tokenize: no limit ran out while the line was at the $stage stage"
done

# ---- train: a limit below the plan; a plan beyond physical memory ----
awk -v docs=300 -v seed=5 -f "$src/scripts/gen_corpus.awk" >"$tmp/corpus.jsonl"
"$q" tokenizer-train --input "$tmp/corpus.jsonl" --vocab-size 300 --output "$tmp/tok" 2>/dev/null
args=(--config "$src/configs/debug.toml" --model.tokenizer_path="$tmp/tok"
      --training.dataset_path="$tmp/corpus.jsonl" --model.vocab_size=320 --model.dim=512
      --model.n_layers=8 --model.n_heads=8 --model.n_kv_heads=2 --model.head_dim=64
      --model.hidden_dim=2048 --training.seq_len=64 --training.local_batch_size=2
      --training.steps=1 --metrics.peak_tflops=1)
plan=$("$q" plan "${args[@]}" 2>/dev/null | sed -n 's/^plan: total_gib=\([0-9.]*\) .*/\1/p')
[ -n "$plan" ] || bad "qtitan plan printed no total"
want=$(printf '%.2f' "$plan")
limited 350000 train_limit train "${args[@]}" --job.dump_folder="$tmp/run"
one_error train_limit "the job needs about $want GiB per process" &&
  { grep -q "address-space limit (ulimit -v) allows 0.33 GiB" "$tmp/train_limit.err" ||
      bad "train_limit: the sentence does not name the limit"; }
[ ! -e "$tmp/run/metrics.jsonl" ] || bad "train_limit: a run below its plan wrote metrics"
# The same job with room trains (the check refuses only what cannot fit).
"$q" train "${args[@]}" --job.dump_folder="$tmp/run_ok" --checkpoint.enable \
  --checkpoint.last_save_in_hf >"$tmp/train_ok.log" 2>&1 || { cat "$tmp/train_ok.log"; bad "train without a limit"; }
# The flavor's own sizes: no machine this runs on holds them, so nothing is ever allocated.
big_args=(--config "$src/configs/debug.toml" --model.flavor=235B-A22B --model.tokenizer_path="$tmp/tok"
          --training.dataset_path="$tmp/corpus.jsonl" --training.seq_len=64
          --training.local_batch_size=1 --training.steps=1)
big=$("$q" plan "${big_args[@]}" 2>/dev/null | sed -n 's/^plan: total_gib=\([0-9.]*\) .*/\1/p')
rc=0
timeout 60 "$q" train "${big_args[@]}" --job.dump_folder="$tmp/big" \
  >"$tmp/train_big.out" 2>"$tmp/train_big.err" || rc=$?
one_error train_big "the job needs about $(printf '%.2f' "$big") GiB per process" &&
  { grep -q "but this machine has" "$tmp/train_big.err" || bad "train_big: does not name physical memory"; }

# ---- eval: below the model's size, and every limit up to one that runs ----
hf=$tmp/run_ok/checkpoint/step-1/hf
printf '1 2 3 4 5 6 7 8\n' >"$tmp/tokens.txt"
limited 300000 eval_small eval --model "$hf" --tokens "$tmp/tokens.txt"
one_error eval_small "cannot allocate"
ran=0
for kb in 340000 380000 460000 540000 620000 700000 800000; do
  limited $kb eval_$kb eval --model "$hf" --tokens "$tmp/tokens.txt"
  if [ "$rc" = 0 ]; then
    grep -q '^loss: ' "$tmp/eval_$kb.out" || bad "eval_$kb: exit 0 without a loss"
    ran=1
    continue
  fi
  one_error eval_$kb "cannot allocate|ulimit -v"
done
[ $ran = 1 ] || bad "eval ran at none of the limits"

[ $fail = 0 ] && echo "e2e_memlimit: ok"
exit $fail
