#!/usr/bin/env bash
# Real multi-host runs (issue 17): two hosts as network namespaces joined by veth links through
# a bridge (tests/multihost_lib.sh), mpirun across them with a hostfile over Open MPI's TCP
# transport alone (no shared memory between the hosts).
#   1. FSDP over the two hosts trains 12 steps with the losses and grad norms of one process
#      (1e-5 relative).
#   2. A long run checkpoints every 50 steps (a tiny model's steps take milliseconds: with 10,
#      the next checkpoint was sometimes written before the cut took hold, leaving no step
#      after it to compare); a few steps after the first, host 1's link is cut (ip link set
#      down). Every rank must end within 30 s (comm.train_timeout_seconds = 4
#      here, plus the liveness round) with a sentence naming the rank that stopped answering,
#      and mpirun, non-zero, within 45 s (it waits for TCP to give up on its daemon on host 1:
#      tests/multihost_lib.sh).
#   3. With the link back up, the job resumes from its last checkpoint and its next steps are
#      bitwise those the cut run logged.
# Skips with a sentence where namespaces cannot be made (not root, no ip, no netns support).
# Other multi-host tests (expert parallelism) source the same library: mh_setup, mh_run.
set -uo pipefail
# shellcheck source=tests/dist_lib.sh
. "$(dirname "$0")/dist_lib.sh"
# shellcheck source=tests/multihost_lib.sh
. "$(dirname "$0")/multihost_lib.sh"
mh_setup 2
dist_data "$TMP/data.jsonl"
ARGS=(--config "$SRC/configs/debug.toml" --model.tokenizer_path="$SRC/tests/fixtures/tokenizer/tiny_gpt2"
  --training.dataset_path="$TMP/data.jsonl" --model.vocab_size=640 --model.dim=32 --model.n_layers=2
  --model.n_heads=4 --model.n_kv_heads=2 --model.head_dim=8 --model.hidden_dim=64
  --training.seq_len=32 --training.local_batch_size=2 --training.global_batch_size=4
  --lr_scheduler.warmup_steps=2 --lr_scheduler.decay_ratio=0 --metrics.peak_tflops=1
  --parallelism.data_parallel_shard_degree=2)

# 1. FSDP across the hosts equals one process.
dist_run 0 one "${ARGS[@]}" --training.steps=12 --parallelism.data_parallel_shard_degree=1 ||
  { echo "FAIL: one-process run"; tail -5 "$TMP/one.log"; exit 1; }
mh_run fsdp "${ARGS[@]}" --training.steps=12 ||
  { echo "FAIL: FSDP 2 across two hosts"; tail -20 "$TMP/fsdp.log"; exit 1; }
grep -q "btl tcp" "$TMP/fsdp.log" && { echo "FAIL: unexpected transport notice"; exit 1; }
paste <(dist_table "$TMP/one") <(dist_table "$TMP/fsdp") | awk '
  function rel(a, b) { d = a - b; if (d < 0) d = -d; return d / (b < 0 ? -b : b) }
  { n++; if ($1 != $4 || rel($5, $2) > 1e-5 || rel($6, $3) > 1e-5) { print "FAIL: step " $1 ": one " $2 " " $3 ", two hosts " $5 " " $6; bad = 1 } }
  END { if (n != 12) { print "FAIL: " n " steps compared"; bad = 1 } exit bad }' || fail=1
[ $fail = 0 ] && echo "ok: FSDP 2 over two hosts (TCP) equals one process over 12 steps"

# 2. Cut host 1's link a few steps after a checkpoint.
ck="$TMP/cut/checkpoint"
timeout 60 "${MH_MPIRUN[@]}" -np 2 "$BIN" train "${ARGS[@]}" --training.steps=1000000 \
  --checkpoint.enable --checkpoint.interval=50 --comm.train_timeout_seconds=4 \
  --job.dump_folder="$TMP/cut" >"$TMP/cut.log" 2>&1 &
launcher=$!
saved=
for _ in $(seq 800); do
  saved=$(sed -n 's/.*"step": *\([0-9]*\).*/\1/p' "$ck/latest.json" 2>/dev/null)
  if [ -n "$saved" ] && [ "$saved" -ge 50 ] &&
     grep -q "\"step\":$((saved + 2))," "$TMP/cut/metrics.jsonl" 2>/dev/null; then break; fi
  saved=
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.05
done
if [ -z "$saved" ]; then
  echo "FAIL: the long run never logged two steps past a checkpoint"; tail -20 "$TMP/cut.log"; exit 1
fi
mh_link 1 down
t0=$SECONDS
while [ "$(mh_ranks_alive)" -gt 0 ] && [ $((SECONDS - t0)) -le 30 ]; do sleep 0.2; done
took=$((SECONDS - t0))
alive=$(mh_ranks_alive)
while kill -0 "$launcher" 2>/dev/null && [ $((SECONDS - t0)) -le 55 ]; do sleep 0.2; done
mpirun_took=$((SECONDS - t0))
wait "$launcher"
rc=$?
if [ "$alive" -gt 0 ] || [ "$rc" -eq 0 ] || [ "$mpirun_took" -gt 45 ] ||
   ! grep -q 'error: .*rank [01] stopped answering: .*waited more than 4 s (comm.train_timeout_seconds)' "$TMP/cut.log"; then
  echo "FAIL: after the link cut: $alive rank(s) still running after ${took} s, mpirun rc=$rc after ${mpirun_took} s"
  tail -20 "$TMP/cut.log"; exit 1
fi
echo "ok: cutting host 1's link ended every rank in ${took} s, mpirun in ${mpirun_took} s (rc=$rc): $(grep -m1 -o 'rank [01] stopped answering[^;]*' "$TMP/cut.log")"

# 3. Link up, resume from the last checkpoint: the next steps are the cut run's.
mh_link 1 up
last=$(sed -n 's/.*"step": *\([0-9]*\).*/\1/p' "$ck/latest.json")
logged=$(sed -n 's/.*"step":\([0-9]*\),.*/\1/p' "$TMP/cut/metrics.jsonl" | tail -1)
[ "$logged" -gt "$last" ] || { echo "FAIL: the cut run logged no step after its checkpoint $last"; exit 1; }
mkdir -p "$TMP/resume" && cp -r "$ck" "$TMP/resume/checkpoint"
mh_run resume "${ARGS[@]}" --training.steps=$((last + 2)) --checkpoint.enable \
  --checkpoint.interval=50 || { echo "FAIL: resume after the cut"; tail -20 "$TMP/resume.log"; exit 1; }
grep -q "resumed from .*(step $last)" "$TMP/resume.log" ||
  { echo "FAIL: the resumed run does not say it resumed from step $last"; grep -i resum "$TMP/resume.log"; fail=1; }
n=0
for s in $((last + 1)) $((last + 2)); do
  [ "$s" -le "$logged" ] || continue
  a=$(dist_table "$TMP/cut" | awk -v s="$s" '$1 == s')
  b=$(dist_table "$TMP/resume" | awk -v s="$s" '$1 == s')
  if [ -z "$b" ] || [ "$a" != "$b" ]; then echo "FAIL: step $s: cut run '$a', resumed '$b'"; fail=1; fi
  n=$((n + 1))
done
[ $fail = 0 ] && echo "ok: resumed from step $last over two hosts; $n step(s) bitwise those of the cut run"
[ $fail = 0 ] && echo "e2e_dist_multihost: ok"
exit $fail
