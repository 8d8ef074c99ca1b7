#!/usr/bin/env bash
# qtitan train on many processes (mpirun --oversubscribe through a localhost hostfile), on a
# small generated dataset and the tiny fixture tokenizer, so it needs nothing from ../shared:
#   - equivalence: with the same global batch, FSDP on 2 and 4 ranks, HSDP (2 x 2), tensor
#     parallel on 2 ranks and FSDP x TP (2 x 2) give the per-step losses and grad norms of one
#     process to 1e-5 relative over 10 fp32 steps, for tied and untied embeddings (the
#     embedding / head units differ), and with full activation checkpointing;
#   - sequence parallelism: TP 2 + SP and FSDP 2 x TP 2 + SP, tied and untied, and with full
#     and selective activation checkpointing (FSDP 2 x TP 2 + SP also layer-wise, every 2nd of
#     4 layers), and TP 4 + SP (half a row per rank) match one
#     process the same way (to 1e-6); a TP 2 + SP run resumed from its step-5 checkpoint is
#     bitwise the uninterrupted one; a seq_len that the tp group cannot split stops every rank
#     with one sentence;
#   - MoE (4 experts, top 2, auxiliary-loss-free balancing and the HF auxiliary loss): FSDP on
#     2 and 4 ranks and HSDP 2 x 2 with full AC match one process the same way, and the
#     per-step routing figures (tokens of the least / most loaded expert: counts over the
#     global batch, before the expert_bias update) are exactly one process's; a model mixing
#     dense and MoE layers (decoder_sparse_step 2) on FSDP 2 matches one process; MoE with
#     tensor parallelism but no expert parallelism stops with a sentence;
#   - sharded checkpoints: a 2-rank run resumed from its step-5 checkpoint (the step-10 commit
#     undone by rewriting latest.json, as a crash before the commit would leave it) ends with
#     bitwise the same per-rank shard files and losses as the run that never stopped, and so
#     does a run whose checkpoints are written in the background (checkpoint.async_mode);
#   - HF export (checkpoint.last_save_in_hf) of sharded runs: with lr = 0 (the parameters stay
#     the initial ones, bitwise the same on any mesh) FSDP on 2 and 4 ranks and HSDP 2 x 2,
#     whose pieces are cut at different places, export byte-identical model.safetensors, the
#     same file as one process's export, and so does `qtitan export` of the 2-rank folder or
#     of one rank's step directory; a trained MoE run's export loads as the initial weights of
#     a one-process run;
#   - checkpoints of another mesh are resharded, never ignored: 2-rank shards on 4 ranks and on
#     one process, a one-process checkpoint on 2 ranks; a resume that fails (another model)
#     leaves the folder exportable, and `qtitan export` refuses a corrupted piece; a
#     keep_latest_k past the 64 steps a sharded checkpoint lists is refused;
#   - faults: a rank that cannot read its dataset, a rank killed mid-run, ranks started with
#     different configs, and a rank that alone fails a start-up check (a config key, a missing
#     path) end every rank non-zero with the cause printed, well inside the timeout;
#   - an impossible mesh fails with one sentence on every rank.
set -uo pipefail
# shellcheck source=tests/dist_lib.sh
. "$(dirname "$0")/dist_lib.sh"
dist_data "$TMP/data.jsonl"

ARGS=(--config "$SRC/configs/debug.toml" --model.tokenizer_path="$SRC/tests/fixtures/tokenizer/tiny_gpt2"
  --training.dataset_path="$TMP/data.jsonl" --model.vocab_size=640 --model.dim=32
  --model.n_layers=3 --model.n_heads=4 --model.n_kv_heads=2 --model.head_dim=8
  --model.hidden_dim=64 --training.seq_len=32 --training.local_batch_size=2
  --training.global_batch_size=8 --training.steps=10 --metrics.peak_tflops=1)

# run NP NAME ARGS...: NP = 0 runs one process without mpirun.
run() {
  local np=$1 name=$2
  shift 2
  dist_run "$np" "$name" "${ARGS[@]}" "$@"
}
table() { dist_table "$1"; }
# same REF OTHER LABEL [TOL]: every step's loss and grad norm within TOL (1e-5) relative.
same() {
  local ok
  ok=$(paste -d' ' <(table "$TMP/$1") <(table "$TMP/$2") | awk -v tol="${4:-1e-5}" '
    function rel(a, b) { d = a - b; if (d < 0) d = -d; m = a < 0 ? -a : a; return d / (m > 1e-30 ? m : 1e-30) }
    { n++; if ($1 != $4 || rel($2, $5) > tol || rel($3, $6) > tol) bad++ }
    END { print (n == 10 && !bad) ? "ok" : "bad" }')
  if [ "$ok" = ok ]; then
    echo "ok: $3 matches one process over 10 steps (${4:-1e-5})"
  else
    echo "FAIL: $3 differs from one process (step loss grad_norm, one process | $3):"
    paste -d' ' <(table "$TMP/$1") <(table "$TMP/$2")
    cat "$TMP/$2.log"
    fail=1
  fi
}
has_metrics() { [ -s "$TMP/$1/metrics.jsonl" ] || { echo "FAIL: $1 wrote no metrics"; cat "$TMP/$1.log"; fail=1; return 1; }; }

for tie in true false; do
  run 0 "one-$tie" --model.tie_embeddings=$tie && has_metrics "one-$tie" || { fail=1; continue; }
  run 2 "fsdp2-$tie" --model.tie_embeddings=$tie && has_metrics "fsdp2-$tie" && same "one-$tie" "fsdp2-$tie" "FSDP on 2 ranks (tie_embeddings=$tie)" || fail=1
done
run 4 fsdp4-false --model.tie_embeddings=false && same one-false fsdp4-false "FSDP on 4 ranks (tie_embeddings=false)" || fail=1
run 4 hsdp4 --parallelism.data_parallel_replicate_degree=2 --model.tie_embeddings=false &&
  same one-false hsdp4 "HSDP 2 x 2 (tie_embeddings=false)" || fail=1
run 2 ac2 --activation_checkpoint.mode=full && same one-true ac2 "FSDP on 2 ranks with full AC" || fail=1
run 2 tp2 --parallelism.tensor_parallel_degree=2 --model.tie_embeddings=false &&
  same one-false tp2 "TP on 2 ranks (tie_embeddings=false)" || fail=1
run 4 fsdptp4 --parallelism.tensor_parallel_degree=2 && same one-true fsdptp4 "FSDP 2 x TP 2 (tie_embeddings=true)" || fail=1
# Sequence parallel: each tp rank keeps 1/2 of the tokens in the residual stream. Held to
# 1e-6: a norm weight gradient that missed the other rank's tokens moved the grad norm by only
# 3e-6 in the first steps, while rounding leaves about 3e-8 here.
SP=(--parallelism.tensor_parallel_degree=2 --parallelism.enable_sequence_parallel=true)
for tie in true false; do
  run 2 "tpsp2-$tie" "${SP[@]}" --model.tie_embeddings=$tie && has_metrics "tpsp2-$tie" &&
    same "one-$tie" "tpsp2-$tie" "TP 2 + SP (tie_embeddings=$tie)" 1e-6 || fail=1
  run 4 "fsdptpsp4-$tie" "${SP[@]}" --model.tie_embeddings=$tie && has_metrics "fsdptpsp4-$tie" &&
    same "one-$tie" "fsdptpsp4-$tie" "FSDP 2 x TP 2 + SP (tie_embeddings=$tie)" 1e-6 || fail=1
done
grep -q 'tp 2 + sequence parallel\]' "$TMP/tpsp2-true.log" || { echo "FAIL: the mesh line should say sequence parallel"; fail=1; }
run 2 tpsp2-full "${SP[@]}" --activation_checkpoint.mode=full && has_metrics tpsp2-full &&
  same one-true tpsp2-full "TP 2 + SP with full AC" 1e-6 || fail=1
run 4 fsdptpsp4-sel "${SP[@]}" --activation_checkpoint.mode=selective --model.tie_embeddings=false &&
  has_metrics fsdptpsp4-sel && same one-false fsdptpsp4-sel "FSDP 2 x TP 2 + SP with selective AC" 1e-6 || fail=1
# torchtitan's layer-wise mode on 4 layers: layers 2 and 4 checkpointed, 2 recomputed (with its
# TP gathers and sums) under FSDP 2 x TP 2 + SP.
run 0 one-l4 --model.n_layers=4 && has_metrics one-l4 &&
  run 4 fsdptpsp4-lw "${SP[@]}" --model.n_layers=4 --activation_checkpoint.mode=selective \
    --activation_checkpoint.selective_ac_option=2 && has_metrics fsdptpsp4-lw &&
  same one-l4 fsdptpsp4-lw "FSDP 2 x TP 2 + SP with every 2nd layer checkpointed" 1e-6 || fail=1
# TP 4 + SP: each rank holds half a row (2 x 32 tokens over 4 ranks), so attention only sees
# whole rows through the gather. 4 kv heads, so that tp 4 divides them.
run 0 one-kv4 --model.n_kv_heads=4 && has_metrics one-kv4 &&
  run 4 tpsp4 --model.n_kv_heads=4 --parallelism.tensor_parallel_degree=4 --parallelism.enable_sequence_parallel=true &&
  has_metrics tpsp4 && same one-kv4 tpsp4 "TP 4 + SP (half a row per rank)" 1e-6 || fail=1
run 2 tpsp2-odd "${SP[@]}" --training.seq_len=31
rc=$?
n=$(grep -c 'error: training.seq_len (with parallelism.enable_sequence_parallel) = 31 is not divisible by parallelism.tensor_parallel_degree = 2' "$TMP/tpsp2-odd.log")
if [ $rc -ne 0 ] && [ "$n" = 2 ] && [ "$(grep -c 'error:' "$TMP/tpsp2-odd.log")" = 2 ]; then
  echo "ok: a seq_len the tp group cannot split stops both ranks with one sentence"
else
  echo "FAIL: seq_len 31 with TP 2 + SP should stop both ranks with one sentence"; cat "$TMP/tpsp2-odd.log"; fail=1
fi
grep -q '^\[rank 0\] step:  1/[0-9]*  loss' "$TMP/fsdp2-true.log" && ! grep -q '^\[rank 1\] step' "$TMP/fsdp2-true.log" ||
  { echo "FAIL: the step lines should come from rank 0 only"; fail=1; }
grep -q '"comm_s":' "$TMP/fsdp2-true/metrics.jsonl" || { echo "FAIL: no comm_s in metrics.jsonl"; fail=1; }

# MoE: routing counts are summed over the data-parallel ranks before the bias update.
MOE=(--model.tie_embeddings=false --model.num_experts=4 --model.top_k=2 --model.moe_hidden_dim=16
  --model.load_balance_coeff=0.01 --model.router_aux_loss_coef=0.01)
moe_counts() { grep -o '"moe_tokens_min":[^,]*,"moe_tokens_max":[^,]*' "$TMP/$1/metrics.jsonl"; }
if run 0 moe-one "${MOE[@]}" && has_metrics moe-one && [ "$(moe_counts moe-one | wc -l)" = 10 ]; then
  for c in "2 moe-fsdp2" "4 moe-fsdp4" "4 moe-hsdp4 --parallelism.data_parallel_replicate_degree=2 --activation_checkpoint.mode=full"; do
    set -- $c
    np=$1 name=$2
    shift 2
    run "$np" "$name" "${MOE[@]}" "$@" && has_metrics "$name" && same moe-one "$name" "MoE $name" || { fail=1; continue; }
    [ "$(moe_counts moe-one)" = "$(moe_counts "$name")" ] ||
      { echo "FAIL: MoE $name routing counts differ from one process"; paste <(moe_counts moe-one) <(moe_counts "$name"); fail=1; }
  done
else
  echo "FAIL: one-process MoE run"; cat "$TMP/moe-one.log"; fail=1
fi
# MoE with tensor parallelism splits the experts over the tp ranks: it needs an
# expert_parallel_degree that the tp degree divides (tests/e2e_dist_ep.sh trains it).
run 2 moe-tp2 "${MOE[@]}" --parallelism.tensor_parallel_degree=2
if [ $? -ne 0 ] && grep -q 'parallelism.expert_parallel_degree = 1 is not a multiple of parallelism.tensor_parallel_degree = 2' "$TMP/moe-tp2.log"; then
  echo "ok: MoE with tensor parallelism and no expert parallelism stops with a sentence"
else
  echo "FAIL: MoE with tensor parallelism and expert_parallel_degree = 1 should stop with a sentence"; cat "$TMP/moe-tp2.log"; fail=1
fi

# Dense and MoE blocks mixed (decoder_sparse_step = 2: layer 1 alone is MoE, and the largest
# layer is in the second workspace).
run 0 moe-mixed-one "${MOE[@]}" --model.decoder_sparse_step=2 && run 2 moe-mixed-fsdp2 "${MOE[@]}" --model.decoder_sparse_step=2 &&
  same moe-mixed-one moe-mixed-fsdp2 "MoE with dense layers on FSDP 2" || { echo "FAIL: MoE with dense layers on FSDP 2"; cat "$TMP/moe-mixed-fsdp2.log"; fail=1; }

# Sharded checkpoints: run a straight through; run b the same, with the step-10 commit undone.
CK=(--checkpoint.enable=true --checkpoint.interval=5 --checkpoint.keep_latest_k=2)
run 2 ck-a "${CK[@]}" && run 2 ck-b "${CK[@]}" || { echo "FAIL: checkpointed runs"; cat "$TMP/ck-a.log"; fail=1; }
for r in 0 1; do
  [ -f "$TMP/ck-a/checkpoint/rank-$r/step-10/model.safetensors" ] || { echo "FAIL: no rank-$r shard"; ls -R "$TMP/ck-a"; fail=1; }
done
dist_rewind ck-b 2 5
run 2 ck-b "${CK[@]}"
dist_resumed_same ck-a ck-b 2 5 10 "a 2-rank run"
# checkpoint.async_mode = "async": each rank writes step 5 in a thread and the commit follows
# at the first step every rank's write has ended; the shards and latest.json are ck-a's, bitwise.
same_files() { # A B FILES...: each file of checkpoint folder A equals B's
  local a=$1 b=$2 f; shift 2
  for f in "$@"; do cmp "$TMP/$a/checkpoint/$f" "$TMP/$b/checkpoint/$f" || return 1; done
}
run 2 ck-async "${CK[@]}" --checkpoint.async_mode=async &&
  grep -q '\[checkpoint\] saved step 5 in .* s, in the background$' "$TMP/ck-async.log" &&
  same_files ck-a ck-async latest.json rank-0/step-5/model.safetensors rank-1/step-5/optim.safetensors \
    rank-1/step-10/model.safetensors ||
  { echo "FAIL: async sharded checkpoints should equal synchronous ones"; cat "$TMP/ck-async.log"; fail=1; }
# The same for TP 2 + SP (mesh [1, 1, 2]).
run 2 cksp-a "${CK[@]}" "${SP[@]}" && run 2 cksp-b "${CK[@]}" "${SP[@]}" || { echo "FAIL: checkpointed TP + SP runs"; cat "$TMP/cksp-a.log"; fail=1; }
dist_rewind cksp-b 2 5 "1, 1, 2"
run 2 cksp-b "${CK[@]}" "${SP[@]}"
dist_resumed_same cksp-a cksp-b 2 5 10 "a TP 2 + SP run"
# Another mesh, or one process, reshards the 2-rank shards (tests/e2e_dist_reshard.sh checks
# the values) rather than ignoring them and training from scratch beside them.
run 4 ck-b "${CK[@]}" && grep -q 'resharding it for this job.s 4 processes' "$TMP/ck-b.log" ||
  { echo "FAIL: 2-rank shards on 4 ranks should be resharded"; cat "$TMP/ck-b.log"; fail=1; }
run 0 ck-b "${CK[@]}" && grep -q 'resharding it for this job.s 1 process' "$TMP/ck-b.log" ||
  { echo "FAIL: 2-rank shards on one process should be resharded"; cat "$TMP/ck-b.log"; fail=1; }
# A resume that fails on another model leaves the folder's config.json, so it still exports.
run 2 ck-b "${CK[@]}" --model.dim=48
if [ $? -ne 0 ] && "$BIN" export --checkpoint "$TMP/ck-b/checkpoint" --out "$TMP/ck-b-export" >"$TMP/ck-b-export.log" 2>&1; then
  echo "ok: a failed resume (another model, one process) leaves the sharded checkpoint as it was"
else
  echo "FAIL: after a failed resume on another model the checkpoint no longer exports"; cat "$TMP/ck-b.log" "$TMP/ck-b-export.log"; fail=1
fi

# keep_latest_k past the 64 steps the marker lists used to prune the steps past 64.
run 2 ck-k "${CK[@]}" --checkpoint.keep_latest_k=65
[ $? -ne 0 ] && [ "$(grep -c 'error: checkpoint.keep_latest_k = 65: a sharded checkpoint keeps at most 64 steps' "$TMP/ck-k.log")" = 2 ] ||
  { echo "FAIL: keep_latest_k = 65 on 2 ranks should stop with a sentence"; cat "$TMP/ck-k.log"; fail=1; }

# HF export at the end of sharded runs: rank 0 pulls each tensor from the rank files.
HF=(--checkpoint.enable=true --checkpoint.interval=5 --checkpoint.last_save_in_hf=true --training.steps=3
  --optimizer.lr=0)
hf_file() { echo "$TMP/$1/checkpoint/step-3/hf/model.safetensors"; }
run 2 hf2 "${HF[@]}" && run 4 hf4 "${HF[@]}" && run 4 hfh4 "${HF[@]}" --parallelism.data_parallel_replicate_degree=2 &&
  run 0 hf1 "${HF[@]}" || { echo "FAIL: runs with last_save_in_hf"; cat "$TMP"/hf*.log; fail=1; }
if [ -f "$(hf_file hf2)" ] && [ -f "$TMP/hf2/checkpoint/step-3/hf/config.json" ] && [ -f "$TMP/hf2/checkpoint/config.json" ] &&
  cmp -s "$(hf_file hf2)" "$(hf_file hf4)" && cmp -s "$(hf_file hf2)" "$(hf_file hfh4)"; then
  echo "ok: HF exports of FSDP 2, FSDP 4 and HSDP 2 x 2 shards are byte-identical"
else
  echo "FAIL: HF exports of sharded runs are missing or differ"; ls -R "$TMP/hf2/checkpoint"; cat "$TMP/hf2.log"; fail=1
fi
cmp -s "$(hf_file hf1)" "$(hf_file hf2)" && echo "ok: the 2-rank HF export is byte-identical to one process's" ||
  { echo "FAIL: the 2-rank HF export differs from one process's (or is missing)"; ls -R "$TMP/hf1/checkpoint"; fail=1; }
# qtitan export of the folder (newest step) and of a rank's step directory, without MPI.
for src in checkpoint checkpoint/rank-1/step-3; do
  dist_export_same "$(hf_file hf1)" "$TMP/hf2/$src" "<2-rank run>/$src"
done
# A piece whose bytes changed after it was written (its checksum no longer matches) is
# refused, not exported as wrong weights.
cp -r "$TMP/hf2/checkpoint" "$TMP/hf2-bad"
bad="$TMP/hf2-bad/rank-1/step-3/model.safetensors"
printf 'XXXX' | dd of="$bad" bs=1 seek=$(($(stat -c %s "$bad") - 8)) conv=notrunc 2>/dev/null
if ! "$BIN" export --checkpoint "$TMP/hf2-bad" --out "$TMP/hf2-bad-export" >"$TMP/hf2-bad-export.log" 2>&1 &&
  grep -q 'rank-1/step-3/model.safetensors has checksum .*(corrupted)' "$TMP/hf2-bad-export.log"; then
  echo "ok: qtitan export refuses a corrupted piece of a sharded checkpoint"
else
  echo "FAIL: qtitan export of a corrupted piece should stop with a sentence"; cat "$TMP/hf2-bad-export.log"; fail=1
fi
# A one-process checkpoint is resharded, not silently ignored, by a job on 2 processes.
run 2 hf1 "${HF[@]}" && grep -q 'saved by one process; resharding it' "$TMP/hf1.log" ||
  { echo "FAIL: a one-process checkpoint on 2 ranks should be resharded"; cat "$TMP/hf1.log"; fail=1; }
MOEHF=(--checkpoint.enable=true --checkpoint.interval=10 --checkpoint.last_save_in_hf=true)
if run 2 hfmoe "${MOE[@]}" "${MOEHF[@]}" && [ -f "$TMP/hfmoe/checkpoint/step-10/hf/model.safetensors" ] &&
  run 0 hfmoe-load "${MOE[@]}" --training.steps=2 --checkpoint.initial_load_in_hf=true \
    --checkpoint.initial_load_path="$TMP/hfmoe/checkpoint/step-10/hf" &&
  grep -q 'loaded initial weights' "$TMP/hfmoe-load.log"; then
  echo "ok: the HF export of a 2-rank MoE run loads as initial weights on one process"
else
  echo "FAIL: HF export of a 2-rank MoE run"; cat "$TMP/hfmoe.log" "$TMP/hfmoe-load.log"; fail=1
fi

# Faults. Rank 1 of an MPMD launch reads a dataset that does not exist.
start=$SECONDS
timeout 60 mpirun --hostfile "$TMP/hostfile" --oversubscribe \
  -np 1 "$BIN" train "${ARGS[@]}" --job.dump_folder="$TMP/f1" : \
  -np 1 "$BIN" train "${ARGS[@]}" --job.dump_folder="$TMP/f1" --training.dataset_path="$TMP/missing.jsonl" \
  >"$TMP/f1.log" 2>&1
rc=$?
if [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ "$(grep -c 'error: rank 1: .*missing.jsonl' "$TMP/f1.log")" != 2 ]; then
  echo "FAIL: a rank without its dataset (rc=$rc; 124 means a hang)"; cat "$TMP/f1.log"; fail=1
else
  echo "ok: a rank without its dataset stopped both ranks (rc=$rc) in $((SECONDS - start)) s"
fi
# Rank 1 is killed (SIGKILL) while training.
start=$SECONDS
timeout 60 mpirun --hostfile "$TMP/hostfile" --oversubscribe \
  -np 1 "$BIN" train "${ARGS[@]}" --job.dump_folder="$TMP/f2" --training.steps=100000 : \
  -np 1 sh -c '"$0" "$@" & p=$!; sleep 3; kill -9 $p; wait $p' "$BIN" train "${ARGS[@]}" \
  --job.dump_folder="$TMP/f2" --training.steps=100000 >"$TMP/f2.log" 2>&1
rc=$?
if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then
  echo "FAIL: a killed rank (rc=$rc; 124 means a hang)"; cat "$TMP/f2.log"; fail=1
else
  echo "ok: a killed rank ended the job (rc=$rc) in $((SECONDS - start)) s"
fi
# Ranks started with different configs (here training.steps) stop at start-up; rank 0 used
# to finish while rank 1 waited forever in its 11th step.
timeout 60 mpirun --hostfile "$TMP/hostfile" --oversubscribe \
  -np 1 "$BIN" train "${ARGS[@]}" --job.dump_folder="$TMP/f4" : \
  -np 1 "$BIN" train "${ARGS[@]}" --job.dump_folder="$TMP/f4" --training.steps=11 >"$TMP/f4.log" 2>&1
rc=$?
if [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ "$(grep -c 'error: rank 1: the resolved config .* differs from rank 0' "$TMP/f4.log")" != 2 ]; then
  echo "FAIL: ranks with different configs (rc=$rc; 124 means a hang)"; cat "$TMP/f4.log"; fail=1
else
  echo "ok: ranks with different configs stopped at start-up with one sentence"
fi
# A rank that fails its own start-up checks (a config key, a path missing on its host) stops
# the other too: before, rank 0 waited forever in the mesh's first collective.
for bad in --training.bogus=1 "--checkpoint.initial_load_in_hf=true --checkpoint.initial_load_path=$TMP/missing"; do
  # shellcheck disable=SC2086 # $bad is one or two arguments
  timeout 60 mpirun --hostfile "$TMP/hostfile" --oversubscribe \
    -np 1 "$BIN" train "${ARGS[@]}" --job.dump_folder="$TMP/f5" : \
    -np 1 "$BIN" train "${ARGS[@]}" --job.dump_folder="$TMP/f5" $bad >"$TMP/f5.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ] || [ $rc -eq 124 ] || ! grep -q '^\[rank 0\] error: rank 1: ' "$TMP/f5.log"; then
    echo "FAIL: rank 1 alone failing start-up ($bad; rc=$rc; 124 means a hang)"; cat "$TMP/f5.log"; fail=1
  else
    echo "ok: rank 1 alone failing start-up ($bad) stopped both ranks"
  fi
done
# An impossible mesh: one sentence on every rank, before training.
timeout 60 mpirun --hostfile "$TMP/hostfile" --oversubscribe -np 3 "$BIN" train "${ARGS[@]}" \
  --job.dump_folder="$TMP/f3" --parallelism.data_parallel_replicate_degree=2 >"$TMP/f3.log" 2>&1
rc=$?
n=$(grep -c 'error: parallelism.data_parallel_shard_degree = -1 cannot fill 3 processes' "$TMP/f3.log")
if [ $rc -eq 0 ] || [ "$n" != 3 ]; then
  echo "FAIL: an impossible mesh (rc=$rc, $n of 3 ranks said why)"; cat "$TMP/f3.log"; fail=1
else
  echo "ok: an impossible mesh stopped all 3 ranks with one sentence"
fi

col() { table "$TMP/$1" | cut -d' ' -f2; }
echo "losses (step, 1 process, FSDP 2, FSDP 4, HSDP 2x2, TP 2; untied):"
paste -d' ' <(table "$TMP/one-false") <(col fsdp2-false) <(col fsdp4-false) <(col hsdp4) <(col tp2) |
  awk '{ printf "  %2d  %.9f  %.9f  %.9f  %.9f  %.9f\n", $1, $2, $4, $5, $6, $7 }'
echo "losses (step, 1 process, FSDP 2, FSDP 2 x TP 2; tied):"
paste -d' ' <(table "$TMP/one-true") <(col fsdp2-true) <(col fsdptp4) |
  awk '{ printf "  %2d  %.9f  %.9f  %.9f\n", $1, $2, $4, $5 }'
for tie in true false; do
  echo "losses (step, 1 process, TP 2 + SP, FSDP 2 x TP 2 + SP; tie_embeddings=$tie):"
  paste -d' ' <(table "$TMP/one-$tie") <(col "tpsp2-$tie") <(col "fsdptpsp4-$tie") |
    awk '{ printf "  %2d  %.9f  %.9f  %.9f\n", $1, $2, $4, $5 }'
done
[ $fail = 0 ] && echo "e2e_dist_train: ok"
exit $fail
