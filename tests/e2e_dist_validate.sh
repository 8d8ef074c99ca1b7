#!/usr/bin/env bash
# Validation ([validation]) and samples ([sample]) during training on many processes
# (mpirun through tests/dist_lib.sh), on a small generated dataset and the tiny fixture
# tokenizer:
#   - every validation record (loss, tokens) of FSDP 2, TP 2, HSDP 2 x 2 and FSDP 2 x TP 2 with
#     sequence parallelism equals one process's within 1e-6 relative (the data-parallel ranks
#     share the validation rows; TP ranks of one group take the same ones), and so does MoE's
#     (4 experts, bias balancing) on FSDP 2 and on EP 2 x FSDP 2;
#   - samples.jsonl, written once by rank 0, is byte-identical to one process's for the same
#     seed, in fp32 on each of those meshes (EP 2: the experts gathered from the EP group) and
#     with bf16 matmuls on FSDP 2 (greedy): from a whole gathered copy on FSDP 2, HSDP and MoE
#     FSDP 2, and one FSDP unit at a time (sample.gather = "units") on TP 2, FSDP 2 x TP 2 + SP,
#     EP 2 and bf16 FSDP 2, each run logging the way it took;
#   - a validation.seq_len the sequence-parallel group cannot split stops with a sentence;
#   - the training losses of FSDP 2 (dense and MoE), TP 2, HSDP 2 x 2 and EP 2 are bitwise
#     those of the same run without validation and samples (nothing touches gradients,
#     optimizer state or the routing counts the bias update reads, and the gathers leave the
#     shards as they were).
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

MOE=(--model.num_experts=4 --model.top_k=2 --model.moe_hidden_dim=16 --model.load_balance_coeff=0.01)
BF16=(--training.mixed_precision_param=bfloat16)
FSDP=(--parallelism.data_parallel_shard_degree=2)
TP=(--parallelism.data_parallel_shard_degree=1 --parallelism.tensor_parallel_degree=2)
HSDP=(--parallelism.data_parallel_replicate_degree=2 "${FSDP[@]}" --training.local_batch_size=1)
EP=("${MOE[@]}" "${FSDP[@]}" --parallelism.expert_parallel_degree=2)
UNITS=(--sample.gather=units)
GREEDY=(--sample.temperature=0)
run 0 one "${EXTRA[@]}"
run 2 fsdp "${EXTRA[@]}" "${FSDP[@]}"
run 2 tp "${EXTRA[@]}" "${TP[@]}" "${UNITS[@]}"
run 4 hsdp "${EXTRA[@]}" "${HSDP[@]}"
run 4 fsdp_tp_sp "${EXTRA[@]}" "${FSDP[@]}" --parallelism.tensor_parallel_degree=2 \
  --parallelism.enable_sequence_parallel=true "${UNITS[@]}"
run 2 fsdp_plain "${FSDP[@]}"
run 2 tp_plain "${TP[@]}"
run 4 hsdp_plain "${HSDP[@]}"
run 0 moe_one "${EXTRA[@]}" "${MOE[@]}"
run 2 moe_fsdp "${EXTRA[@]}" "${MOE[@]}" "${FSDP[@]}"
run 2 moe_fsdp_plain "${MOE[@]}" "${FSDP[@]}"
run 2 moe_ep "${EXTRA[@]}" "${EP[@]}" "${UNITS[@]}"
run 2 moe_ep_plain "${EP[@]}"
run 0 bf16_one "${EXTRA[@]}" "${BF16[@]}" "${GREEDY[@]}"
QT_GEMM_BF16=$(dist_bf16_path bf16_one) run 2 bf16_fsdp "${EXTRA[@]}" "${BF16[@]}" "${FSDP[@]}" \
  "${UNITS[@]}" "${GREEDY[@]}"

[ "$(vals one | wc -l)" -eq 2 ] || { echo "FAIL: one process: expected validation at steps 2 and 3: $(vals one)"; fail=1; }
grep -q '^validate step: 2  loss: .*  perplexity: .*  tokens: [0-9]*  time: ' "$TMP/one.log" ||
  { echo "FAIL: no validate line"; fail=1; }
[ "$(wc -l <"$TMP/one/samples.jsonl")" -eq 4 ] || { echo "FAIL: expected 4 sample records"; fail=1; }
# same_val REF NAME: NAME's validation records are REF's (loss within 1e-6 relative).
same_val() {
  local ok
  ok=$(paste -d' ' <(vals "$1") <(vals "$2") | awk '
    function rel(a, b) { d = a - b; if (d < 0) d = -d; return d / (a < 0 ? -a : a) }
    { n++; if ($1 != $4 || $3 != $6 || rel($2, $5) > 1e-6) bad++ }
    END { print (n == 2 && !bad) ? "ok" : "bad" }')
  if [ "$ok" = ok ]; then
    echo "$2: validation = $1: $(vals "$2" | tr '\n' ';')"
  else
    echo "FAIL: $2 validation $(vals "$2" | tr '\n' ';') vs $1 $(vals "$1" | tr '\n' ';')"
    fail=1
  fi
  [ "$(grep -c '^\[rank 0\] validate step: ' "$TMP/$2.log")" -eq 2 ] &&
    ! grep -q '^\[rank [1-9]\] validate step' "$TMP/$2.log" ||
    { echo "FAIL: $2: rank 0 alone prints the two validate lines"; fail=1; }
}
# same_samples REF NAME: byte-identical samples.jsonl.
same_samples() {
  if [ -s "$TMP/$1/samples.jsonl" ] && cmp -s "$TMP/$1/samples.jsonl" "$TMP/$2/samples.jsonl"; then
    echo "$2: samples.jsonl = $1's ($(wc -l <"$TMP/$2/samples.jsonl") records)"
  else
    echo "FAIL: $2 samples differ from $1's:"; diff "$TMP/$1/samples.jsonl" "$TMP/$2/samples.jsonl"; fail=1
  fi
}
# way NAME WORDS: NAME's rank 0 logged that it sampled that way.
way() {
  grep -q "^\[rank 0\] samples: $2 on rank 0" "$TMP/$1.log" ||
    { echo "FAIL: $1 should sample from $2: $(grep -m1 'samples:' "$TMP/$1.log")"; fail=1; }
}
# same_losses A B: bitwise equal training losses.
same_losses() {
  if [ -n "$(losses "$1")" ] && [ "$(losses "$1")" = "$(losses "$2")" ]; then
    echo "$1: training losses bitwise equal with and without validation and samples"
  else
    echo "FAIL: $1 training losses differ from $2's: $(losses "$1") vs $(losses "$2")"; fail=1
  fi
}
for name in fsdp tp hsdp fsdp_tp_sp; do
  same_val one "$name"
  same_samples one "$name"
done
same_val moe_one moe_fsdp
same_samples moe_one moe_fsdp
same_val moe_one moe_ep
same_samples moe_one moe_ep
same_samples bf16_one bf16_fsdp
for name in fsdp hsdp moe_fsdp; do way "$name" "a whole copy of the model gathered"; done
for name in tp fsdp_tp_sp moe_ep bf16_fsdp; do way "$name" "the model gathered one FSDP unit at a time"; done
same_losses fsdp fsdp_plain
same_losses tp tp_plain
same_losses hsdp hsdp_plain
same_losses moe_fsdp moe_fsdp_plain
same_losses moe_ep moe_ep_plain
# A validation row that the sequence-parallel group cannot split stops every rank with a sentence.
if run_bad=$(dist_run 2 sp_bad "${ARGS[@]}" "${EXTRA[@]}" --parallelism.data_parallel_shard_degree=1 \
  --parallelism.tensor_parallel_degree=2 --parallelism.enable_sequence_parallel=true \
  --validation.seq_len=15); then
  echo "FAIL: validation.seq_len = 15 on TP 2 + SP ran: $run_bad"; fail=1
elif grep -q 'validation.seq_len = 15: sequence parallelism splits every row over the 2 tensor-parallel ranks, so it must be a multiple of 2' "$TMP/sp_bad.log"; then
  echo "ok: $(grep -m1 'validation.seq_len = 15' "$TMP/sp_bad.log")"
else
  echo "FAIL: no sentence for validation.seq_len = 15 on TP 2 + SP: $(tail -3 "$TMP/sp_bad.log")"; fail=1
fi
[ $fail -eq 0 ] && echo "e2e_dist_validate: ok"
exit $fail
