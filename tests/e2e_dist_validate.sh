#!/usr/bin/env bash
# Validation ([validation]) and samples ([sample]) during training on many processes
# (mpirun through tests/dist_lib.sh), on a small generated dataset and the tiny fixture
# tokenizer:
#   - every validation record (loss, tokens) of FSDP 2, TP 2 and FSDP 2 x TP 2 with sequence
#     parallelism equals one process's within 1e-6 relative (the data-parallel ranks share
#     the validation rows; TP ranks of one group take the same ones);
#   - samples.jsonl, written once by rank 0 from the gathered whole model, is byte-identical to
#     one process's for the same seed (greedy and sampled prompts);
#   - FSDP 2's training losses are bitwise those of the same run without validation and
#     samples (nothing touches gradients or optimizer state, and the gathers leave the shards
#     as they were).
set -uo pipefail
# shellcheck source=tests/dist_lib.sh
. "$(dirname "$0")/dist_lib.sh"
dist_data "$TMP/data.jsonl"
head -n 40 "$TMP/data.jsonl" >"$TMP/val.jsonl"

ARGS=(--config "$SRC/configs/debug.toml" --model.tokenizer_path="$SRC/tests/fixtures/tokenizer/tiny_gpt2"
  --training.dataset_path="$TMP/data.jsonl" --model.vocab_size=640 --model.dim=32
  --model.n_layers=2 --model.n_heads=4 --model.n_kv_heads=2 --model.head_dim=8
  --model.hidden_dim=64 --training.seq_len=32 --training.local_batch_size=2
  --training.global_batch_size=4 --training.steps=3 --metrics.peak_tflops=1)
EXTRA=(--validation.enable=true --validation.dataset_path="$TMP/val.jsonl" --validation.freq=2
  --validation.local_batch_size=3 --sample.freq=2 --sample.max_new_tokens=12 --sample.seed=7
  "--sample.prompts=the quick brown
a lazy dog runs")

run() {
  local np=$1 name=$2
  shift 2
  dist_run "$np" "$name" "${ARGS[@]}" "$@" || { tail -5 "$TMP/$name.log"; echo "FAIL: run $name"; fail=1; }
}
vals() { grep -o '"step":[0-9]*,"validation_loss":[^,]*,"validation_perplexity":[^,]*,"validation_tokens":[0-9]*' "$TMP/$1/metrics.jsonl" | sed -E 's/"step":([0-9]+),"validation_loss":([^,]+),.*"validation_tokens":([0-9]+)/\1 \2 \3/'; }
losses() { grep -o '"step":[0-9]*,"loss":[^,]*' "$TMP/$1/metrics.jsonl"; }

run 0 one "${EXTRA[@]}"
run 2 fsdp "${EXTRA[@]}" --parallelism.data_parallel_shard_degree=2
run 2 tp "${EXTRA[@]}" --parallelism.data_parallel_shard_degree=1 --parallelism.tensor_parallel_degree=2
run 4 fsdp_tp_sp "${EXTRA[@]}" --parallelism.data_parallel_shard_degree=2 \
  --parallelism.tensor_parallel_degree=2 --parallelism.enable_sequence_parallel=true
run 2 fsdp_plain --parallelism.data_parallel_shard_degree=2

[ "$(vals one | wc -l)" -eq 2 ] || { echo "FAIL: one process: expected validation at steps 2 and 3: $(vals one)"; fail=1; }
grep -q '^validate step: 2  loss: .*  perplexity: .*  tokens: [0-9]*  time: ' "$TMP/one.log" ||
  { echo "FAIL: no validate line"; fail=1; }
for name in fsdp tp fsdp_tp_sp; do
  ok=$(paste -d' ' <(vals one) <(vals "$name") | awk '
    function rel(a, b) { d = a - b; if (d < 0) d = -d; return d / (a < 0 ? -a : a) }
    { n++; if ($1 != $4 || $3 != $6 || rel($2, $5) > 1e-6) bad++ }
    END { print (n == 2 && !bad) ? "ok" : "bad" }')
  if [ "$ok" = ok ]; then
    echo "$name: validation = one process: $(vals "$name" | tr '\n' ';')"
  else
    echo "FAIL: $name validation $(vals "$name" | tr '\n' ';') vs one process $(vals one | tr '\n' ';')"
    fail=1
  fi
  [ "$(grep -c '^\[rank 0\] validate step: ' "$TMP/$name.log")" -eq 2 ] &&
    ! grep -q '^\[rank [1-9]\] validate step' "$TMP/$name.log" ||
    { echo "FAIL: $name: rank 0 alone prints the two validate lines"; fail=1; }
  if [ -s "$TMP/one/samples.jsonl" ] && cmp -s "$TMP/one/samples.jsonl" "$TMP/$name/samples.jsonl"; then
    echo "$name: samples.jsonl = one process's ($(wc -l <"$TMP/$name/samples.jsonl") records)"
  else
    echo "FAIL: $name samples differ:"; diff "$TMP/one/samples.jsonl" "$TMP/$name/samples.jsonl"; fail=1
  fi
done
[ "$(wc -l <"$TMP/one/samples.jsonl")" -eq 4 ] || { echo "FAIL: expected 4 sample records"; fail=1; }
if [ -n "$(losses fsdp)" ] && [ "$(losses fsdp)" = "$(losses fsdp_plain)" ]; then
  echo "fsdp: training losses bitwise equal with and without validation and samples"
else
  echo "FAIL: FSDP training losses differ with validation: $(losses fsdp) vs $(losses fsdp_plain)"; fail=1
fi
[ $fail -eq 0 ] && echo "e2e_dist_validate: ok"
exit $fail
