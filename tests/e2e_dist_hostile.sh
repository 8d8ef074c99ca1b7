#!/usr/bin/env bash
# Multi-process runs that a careless launch or a stalled rank would break (issue 18):
#   - ranks started in different working directories with the same relative job.dump_folder
#     stop at start-up with a sentence naming the folder that is not rank 0's (it lacks rank 0's
#     lock), instead of splitting checkpoints between two folders; with one relative dataset
#     path naming different files they stop, naming the data's content hashes; copies of the
#     same data under different paths train; the same for validation data and for chat data
#     (training.data_format = "messages"), compared by the content of the rendered
#     conversations;
#   - one relative model.hf_assets_path naming different config.json files stops at start-up,
#     and so does one relative checkpoint.initial_load_path naming weights that differ in one
#     value (compared by a fingerprint of what each rank opened), or one relative
#     lora.adapter_path naming different adapters; the same weights under two paths train;
#   - a LoRA run's DUMP/merged holding a file of the user's, or holding checkpoint.folder,
#     stops at start-up, not after training;
#   - a sharded checkpoint's latest.json with a flipped byte, an edited steps list or mesh, or
#     truncated fails its own checksum, and the resume takes the newest step complete on every
#     rank, recovered from the step directories with a warning, as is a missing one (deleted,
#     a link to nothing) beside step directories; one written before the checksum is read as it
#     is, with a notice;
#   - a rank-N folder copied from another rank's stops the resume (layout.json records the
#     rank that wrote it); a step listed in latest.json but broken on one rank since is skipped
#     with a warning, and the step before it resumed;
#   - a sharded checkpoint resumed into another model stops before allocating, naming the
#     layout.json and the tensor;
#   - MPI_Init under comm.init_timeout_seconds: a second "rank" that never joins ends rank 0
#     with a sentence within the timeout;
#   - the collective timeout (comm.init_timeout_seconds / comm.train_timeout_seconds): rank 1
#     of a 2-rank run is stopped (SIGSTOP) mid-training; rank 0, waiting for it in a
#     collective, must stop the whole job within the timeout (5 s here) plus the 2 s liveness
#     round, with one sentence naming rank 1 as the rank that stopped answering, instead of
#     spinning forever; both ranks suspended together for longer than the timeout train on.
set -uo pipefail
# shellcheck source=tests/dist_lib.sh
. "$(dirname "$0")/dist_lib.sh"
dist_data "$TMP/data.jsonl"
ARGS=(--config "$SRC/configs/debug.toml" --model.tokenizer_path="$SRC/tests/fixtures/tokenizer/tiny_gpt2"
  --training.dataset_path="$TMP/data.jsonl" --model.vocab_size=640 --model.dim=32 --model.n_layers=1
  --model.n_heads=4 --model.n_kv_heads=2 --model.head_dim=8 --model.hidden_dim=64
  --training.seq_len=32 --training.local_batch_size=2 --training.steps=1000000
  --metrics.peak_tflops=1 --metrics.log_freq=1000000 --comm.init_timeout_seconds=20 --comm.train_timeout_seconds=5)
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
mkdir -p "$TMP/a" "$TMP/b"
RT=$(cd "$TMP" && pwd -P) # what realpath gives
timeout 120 mpirun --hostfile "$TMP/hostfile" --oversubscribe -np 1 --wdir "$TMP/a" "$BIN" train \
  "${ARGS[@]}" --training.steps=2 --job.dump_folder=run : -np 1 --wdir "$TMP/b" "$BIN" train \
  "${ARGS[@]}" --training.steps=2 --job.dump_folder=run >"$TMP/wdir.log" 2>&1
rc=$?
if [ $rc -eq 0 ] || [ $rc -eq 124 ] ||
   ! grep -q "job.dump_folder run ($RT/b/run on this rank) is not the folder rank 0 locked: its .qtitan.lock is missing" "$TMP/wdir.log"; then
  echo "FAIL: ranks in different directories (rc=$rc; 124 means a hang)"; cat "$TMP/wdir.log"; exit 1
fi
echo "ok: ranks that resolve job.dump_folder apart stop at start-up"
# An absolute checkpoint.folder is locked and compared the same way: rank 1 sees another
# directory at the same path (a bind mount in a mount namespace of its own, as a host with its
# own disk would), and the job stops at start-up instead of resuming each rank from a
# different checkpoint. Needs unshare -m (root); skipped elsewhere.
if unshare -m true 2>/dev/null; then
  mkdir -p "$TMP/ck_shared" "$TMP/ck_other"
  # shellcheck disable=SC2016 # the inner sh expands its own arguments
  timeout 120 mpirun --hostfile "$TMP/hostfile" --oversubscribe -np 1 "$BIN" train "${ARGS[@]}" \
    --training.steps=2 --checkpoint.enable=true --checkpoint.folder="$TMP/ck_shared" \
    --job.dump_folder="$TMP/run_ck" : -np 1 unshare -m sh -c 'mount --bind "$1" "$2" && shift 2 && exec "$@"' \
    sh "$TMP/ck_other" "$TMP/ck_shared" "$BIN" train "${ARGS[@]}" --training.steps=2 \
    --checkpoint.enable=true --checkpoint.folder="$TMP/ck_shared" --job.dump_folder="$TMP/run_ck" >"$TMP/ck.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ] || [ $rc -eq 124 ] ||
     ! grep -q "rank 1: checkpoint.folder $TMP/ck_shared ($RT/ck_shared on this rank) is not the folder rank 0 locked: its .qtitan.lock is missing" "$TMP/ck.log"; then
    echo "FAIL: ranks that see different folders at one absolute checkpoint.folder (rc=$rc)"; cat "$TMP/ck.log"; exit 1
  fi
  echo "ok: ranks agree on an absolute checkpoint.folder by identity"
else
  echo "skipped: an absolute checkpoint.folder seen differently by two ranks (no unshare -m)"
fi
# The data by content: one relative dataset path naming different files on the two ranks stops
# at start-up; copies with the same content under different paths train.
cp "$TMP/data.jsonl" "$TMP/a/data.jsonl"
head -n 40 "$TMP/data.jsonl" >"$TMP/b/data.jsonl"
two_dirs() { # log name, then extra arguments for both ranks
  local log=$1
  shift
  timeout 120 mpirun --hostfile "$TMP/hostfile" --oversubscribe -np 1 --wdir "$TMP/a" "$BIN" train \
    "${ARGS[@]}" --training.steps=2 --training.dataset_path=data.jsonl "$@" : -np 1 --wdir "$TMP/b" \
    "$BIN" train "${ARGS[@]}" --training.steps=2 --training.dataset_path=data.jsonl "$@" >"$TMP/$log" 2>&1
}
two_dirs data.log --job.dump_folder="$TMP/run_data"
rc=$?
if [ $rc -eq 0 ] || [ $rc -eq 124 ] || ! grep -q "the training data this rank tokenized (content hash [0-9a-f]*) differs from rank 0's" "$TMP/data.log"; then
  echo "FAIL: ranks reading different data (rc=$rc)"; cat "$TMP/data.log"; exit 1
fi
cp "$TMP/data.jsonl" "$TMP/b/data.jsonl"
two_dirs same.log --job.dump_folder="$TMP/run_same" --checkpoint.enable=true ||
  { echo "FAIL: the same data under two paths should train"; cat "$TMP/same.log"; exit 1; }
# Validation data the same way (validation shares its rows across the ranks).
cp "$TMP/data.jsonl" "$TMP/a/val.jsonl"
head -n 40 "$TMP/data.jsonl" >"$TMP/b/val.jsonl"
two_dirs val.log --job.dump_folder="$TMP/run_val" --validation.enable=true \
  --validation.dataset_path=val.jsonl --validation.freq=1
rc=$?
if [ $rc -eq 0 ] || [ $rc -eq 124 ] || ! grep -q "rank 1: the validation data this rank tokenized (content hash [0-9a-f]*) differs from rank 0's" "$TMP/val.log"; then
  echo "FAIL: ranks reading different validation data (rc=$rc)"; cat "$TMP/val.log"; exit 1
fi
echo "ok: ranks compare the data they opened by content, not by path"
# The same config text naming different models: a relative model.hf_assets_path whose
# config.json differs between the two directories (rope_theta here) stops at start-up.
mkdir -p "$TMP/a/hfm" "$TMP/b/hfm"
cp "$SRC/tests/fixtures/hf_tiny/dense_tied/config.json" "$TMP/a/hfm/config.json"
sed 's/"rope_theta": 1000000.0/"rope_theta": 10000.0/' "$TMP/a/hfm/config.json" >"$TMP/b/hfm/config.json"
two_dirs model.log --job.dump_folder="$TMP/run_model" --training.dataset_path="$TMP/data.jsonl" \
  --model.flavor=hf --model.hf_assets_path=hfm
rc=$?
if [ $rc -eq 0 ] || [ $rc -eq 124 ] || ! grep -q "rank 1: the model this rank built (its HF config.json text hashes to [0-9a-f]*) differs from rank 0's" "$TMP/model.log"; then
  echo "FAIL: ranks building different models from one relative hf_assets_path (rc=$rc)"; cat "$TMP/model.log"; exit 1
fi
echo "ok: ranks compare the model they built, not only the config text"
# Flips the sign bit of a safetensors file's last value (its last byte, little endian): the
# value stays finite and the file valid.
flip_last_sign() {
  local at byte
  at=$(($(stat -c %s "$1") - 1))
  byte=$(od -An -tu1 -j "$at" -N1 "$1" | tr -d ' ')
  printf '%b' "\\0$(printf %o $((byte ^ 128)))" | dd of="$1" bs=1 seek="$at" conv=notrunc status=none
}
# The same config text naming different initial weights: one relative
# checkpoint.initial_load_path whose safetensors differ in one value (the sign of the last
# element of the file, which stays finite) stops at start-up; the same bytes under two paths
# train. The weights are this model's, exported by a one-step run.
timeout 120 "$BIN" train "${ARGS[@]}" --training.steps=1 --checkpoint.enable=true \
  --checkpoint.last_save_in_hf=true --job.dump_folder="$TMP/hfsrc" >"$TMP/hfsrc.log" 2>&1 ||
  { echo "FAIL: the run making the initial weights"; cat "$TMP/hfsrc.log"; exit 1; }
cp -r "$TMP/hfsrc/checkpoint/step-1/hf" "$TMP/a/hfw"
cp -r "$TMP/hfsrc/checkpoint/step-1/hf" "$TMP/b/hfw"
st="$TMP/b/hfw/model.safetensors"
flip_last_sign "$st"
cmp -s "$TMP/a/hfw/model.safetensors" "$st" && { echo "FAIL: the weights were not changed"; exit 1; }
weights=(--job.dump_folder="$TMP/run_w" --training.dataset_path="$TMP/data.jsonl"
  --checkpoint.initial_load_in_hf=true --checkpoint.initial_load_path=hfw)
two_dirs weights.log "${weights[@]}"
rc=$?
if [ $rc -eq 0 ] || [ $rc -eq 124 ] || ! grep -q "rank 1: the initial weights this rank opened (checkpoint.initial_load_path hfw, $RT/b/hfw on this rank; fingerprint [0-9a-f]*) differ from rank 0's ([0-9a-f]*)" "$TMP/weights.log"; then
  echo "FAIL: ranks starting from different initial weights (rc=$rc)"; cat "$TMP/weights.log"; exit 1
fi
cp "$TMP/a/hfw/model.safetensors" "$st"
two_dirs weights_same.log "${weights[@]}" --job.dump_folder="$TMP/run_w_same" ||
  { echo "FAIL: the same initial weights under two paths should train"; cat "$TMP/weights_same.log"; exit 1; }
echo "ok: ranks compare the initial weights they opened, not only the path"
# The same for LoRA adapters (lora.adapter_path, peft's format, written by a one-step run):
# every rank loads them whole before it takes its share, so they are compared whole.
lora=(--lora.rank=4 --lora.alpha=8)
timeout 120 "$BIN" train "${ARGS[@]}" "${lora[@]}" --training.steps=1 --job.dump_folder="$TMP/lorasrc" \
  >"$TMP/lorasrc.log" 2>&1 || { echo "FAIL: the run making the adapters"; cat "$TMP/lorasrc.log"; exit 1; }
cp -r "$TMP/lorasrc/adapter" "$TMP/a/ad"
cp -r "$TMP/lorasrc/adapter" "$TMP/b/ad"
st="$TMP/b/ad/adapter_model.safetensors"
flip_last_sign "$st"
two_dirs lora.log --job.dump_folder="$TMP/run_lora" --training.dataset_path="$TMP/data.jsonl" \
  "${lora[@]}" --lora.adapter_path=ad
rc=$?
if [ $rc -eq 0 ] || [ $rc -eq 124 ] || ! grep -q "rank 1: the LoRA adapters this rank opened (lora.adapter_path ad, $RT/b/ad on this rank; fingerprint [0-9a-f]*) differ from rank 0's" "$TMP/lora.log"; then
  echo "FAIL: ranks starting from different LoRA adapters (rc=$rc)"; cat "$TMP/lora.log"; exit 1
fi
echo "ok: ranks compare the LoRA adapters they loaded"
# A merged export's directory that the export would refuse (a file of the user's in
# DUMP/merged) stops the job at start-up, not after training, and the file stays.
mkdir -p "$TMP/run_merged/merged"
echo mine >"$TMP/run_merged/merged/notes.txt"
timeout 120 mpirun --hostfile "$TMP/hostfile" --oversubscribe -np 2 "$BIN" train "${ARGS[@]}" \
  "${lora[@]}" --training.steps=2 --training.dataset_path="$TMP/data.jsonl" --checkpoint.enable=true \
  --checkpoint.last_save_in_hf=true --job.dump_folder="$TMP/run_merged" >"$TMP/merged.log" 2>&1
rc=$?
if [ $rc -eq 0 ] || [ $rc -eq 124 ] || grep -q "step:" "$TMP/merged.log" || [ "$(cat "$TMP/run_merged/merged/notes.txt")" != mine ] ||
   ! grep -q "checkpoint.last_save_in_hf (the merged LoRA model, written to job.dump_folder/merged after training): $TMP/run_merged/merged holds notes.txt, which an export does not write" "$TMP/merged.log"; then
  echo "FAIL: a foreign file in DUMP/merged should stop a LoRA run at start-up (rc=$rc)"; cat "$TMP/merged.log"; exit 1
fi
# So is a checkpoint.folder inside DUMP/merged, which the export would find full of steps.
timeout 120 "$BIN" train "${ARGS[@]}" "${lora[@]}" --training.steps=2 --training.dataset_path="$TMP/data.jsonl" \
  --checkpoint.enable=true --checkpoint.last_save_in_hf=true --checkpoint.folder=./merged/ck \
  --job.dump_folder="$TMP/run_merged_ck" >"$TMP/merged_ck.log" 2>&1
rc=$?
if [ $rc -eq 0 ] || [ $rc -eq 124 ] || grep -q "step:" "$TMP/merged_ck.log" ||
   ! grep -qF "checkpoint.folder = \"./merged/ck\" lies in $TMP/run_merged_ck/merged, which the merged export replaces whole" "$TMP/merged_ck.log"; then
  echo "FAIL: a checkpoint.folder inside DUMP/merged should stop a LoRA run at start-up (rc=$rc)"; cat "$TMP/merged_ck.log"; exit 1
fi
echo "ok: DUMP/merged is checked before training"
# latest.json, the sharded checkpoint's commit marker, carries its own checksum: a flipped
# byte, an edited steps list (the newest step dropped: it would resume from step 2 and lose
# step 3) or mesh, and a truncation are caught, and the newest step complete on every rank is
# recovered from the step directories with a warning. So is a missing marker (deleted, or a
# link to nothing) while the step directories are there: a fresh start would overwrite them.
# A marker written before the checksum (no version, no checksum) is read as it is, with a
# notice.
mk=(--training.dataset_path="$TMP/data.jsonl" --checkpoint.enable=true --checkpoint.interval=1)
timeout 120 mpirun --hostfile "$TMP/hostfile" --oversubscribe -np 2 "$BIN" train "${ARGS[@]}" \
  "${mk[@]}" --training.steps=3 --job.dump_folder="$TMP/mk" >"$TMP/mk.log" 2>&1 ||
  { echo "FAIL: the run writing a sharded checkpoint"; cat "$TMP/mk.log"; exit 1; }
marker() { # case, then the command that damages DIR/latest.json ($1 in it)
  local c=$1
  rm -rf "$TMP/mk_$c"
  cp -r "$TMP/mk" "$TMP/mk_$c"
  (cd "$TMP/mk_$c/checkpoint" && eval "$2" && [ -s latest.json ] || [ "$c" = missing ] || [ "$c" = dangling ]) ||
    { echo "FAIL: marker case $c could not be made"; exit 1; }
  timeout 120 mpirun --hostfile "$TMP/hostfile" --oversubscribe -np 2 "$BIN" train "${ARGS[@]}" \
    "${mk[@]}" --training.steps=4 --job.dump_folder="$TMP/mk_$c" >"$TMP/mk_$c.log" 2>&1
}
jqw() { jq "$1" latest.json >m.tmp && mv m.tmp latest.json; }
for c in flip steps mesh truncated missing dangling; do
  case $c in
  flip) damage='printf "\\x01" | dd of=latest.json bs=1 seek=30 conv=notrunc status=none' ;;
  steps) damage='jqw ".steps = [1, 2] | .step = 2"' ;;
  mesh) damage='jqw ".mesh = [2, 1, 1, 1]"' ;;
  truncated) damage='head -c 60 latest.json >m.tmp && mv m.tmp latest.json' ;;
  missing) damage='rm latest.json' ;;
  dangling) damage='rm latest.json && ln -s gone.json latest.json' ;;
  esac
  marker $c "$damage"
  rc=$?
  if [ $rc -ne 0 ] || ! grep -q "warning: \[checkpoint\] $TMP/mk_$c/checkpoint/latest.json.*; recovered from the step directories instead: step 3 of 2 ranks is the newest complete one" "$TMP/mk_$c.log" ||
     ! grep -q "resumed from .*rank-0/step-3 (step 3)" "$TMP/mk_$c.log"; then
    echo "FAIL: latest.json damaged ($c) should resume from step 3 with a warning (rc=$rc)"; cat "$TMP/mk_$c.log"; exit 1
  fi
done
marker legacy 'jqw "del(.version, .state_checksum) | .steps = [1, 2] | .step = 2"'
rc=$?
if [ $rc -ne 0 ] || ! grep -q "latest.json has no state_checksum (written before latest.json carried one); read as it is" "$TMP/mk_legacy.log" ||
   ! grep -q "resumed from .*rank-0/step-2 (step 2)" "$TMP/mk_legacy.log"; then
  echo "FAIL: a latest.json without a checksum should be read as it is (rc=$rc)"; cat "$TMP/mk_legacy.log"; exit 1
fi
echo "ok: a damaged latest.json is caught by its checksum and recovered from the step directories"
# A rank folder copied from another (a copy script, a hand repair) holds that rank's shard:
# layout.json records which rank wrote it, so the resume stops instead of loading rank 0's
# slices on rank 1.
marker copied 'rm -rf rank-1 && cp -r rank-0 rank-1'
rc=$?
if [ $rc -eq 0 ] || [ $rc -eq 124 ] || ! grep -q "rank-1/step-3/layout.json records the shard of rank 0, not of rank 1 whose folder holds it" "$TMP/mk_copied.log"; then
  echo "FAIL: a rank folder copied from another should stop the resume (rc=$rc)"; cat "$TMP/mk_copied.log"; exit 1
fi
echo "ok: a rank folder copied from another is refused"
# The marker lists a step once every rank had written it; one rank's folder of the newest step
# broken since (its train_state.json removed) makes the resume skip that step with a warning
# naming the file and take the one before, as one process skips a broken step; its step 4
# equals that of the legacy case above, which resumed from step 2 too.
marker rank_broken 'rm rank-1/step-3/train_state.json'
rc=$?
loss4() { grep -o '"step":4,"loss":[^,]*' "$TMP/mk_$1/metrics.jsonl"; }
if [ $rc -ne 0 ] || ! grep -q "warning: \[checkpoint\] skipping sharded step 3: rank 1: cannot open $TMP/mk_rank_broken/checkpoint/rank-1/step-3/train_state.json" "$TMP/mk_rank_broken.log" ||
   ! grep -q "resumed from .*rank-0/step-2 (step 2)" "$TMP/mk_rank_broken.log" ||
   [ -z "$(loss4 legacy)" ] || [ "$(loss4 legacy)" != "$(loss4 rank_broken)" ]; then
  echo "FAIL: a step broken on rank 1 should be skipped for step 2 (rc=$rc)"; cat "$TMP/mk_rank_broken.log"; exit 1
fi
echo "ok: a step broken on one rank is skipped"
# Resuming that sharded checkpoint into another model stops before the model is allocated, on
# two ranks and on one (resharding), with the layout file and the tensor that differs.
layout="$TMP/run_same/checkpoint/rank-0/step-2/layout.json"
want="the checkpoint to resume, $layout, holds tok_embeddings.weight with shape (640, 32) but the job's model has (640, 48)"
other=(--training.dataset_path="$TMP/data.jsonl" --job.dump_folder="$TMP/run_same"
       --checkpoint.enable=true --model.dim=48 --training.steps=4)
[ -f "$layout" ] || { echo "FAIL: no $layout"; ls -R "$TMP/run_same"; exit 1; }
timeout 120 mpirun --hostfile "$TMP/hostfile" --oversubscribe -np 2 "$BIN" train "${ARGS[@]}" \
  "${other[@]}" >"$TMP/reshape2.log" 2>&1
rc=$?
if [ $rc -eq 0 ] || [ $rc -eq 124 ] || ! grep -qF "$want" "$TMP/reshape2.log"; then
  echo "FAIL: a sharded checkpoint resumed into another model on 2 ranks (rc=$rc)"; cat "$TMP/reshape2.log"; exit 1
fi
timeout 120 "$BIN" train "${ARGS[@]}" "${other[@]}" >"$TMP/reshape1.log" 2>&1
rc=$?
if [ $rc -eq 0 ] || [ $rc -eq 124 ] || ! grep -qF "$want" "$TMP/reshape1.log"; then
  echo "FAIL: a sharded checkpoint resumed into another model on 1 process (rc=$rc)"; cat "$TMP/reshape1.log"; exit 1
fi
echo "ok: a sharded checkpoint's shapes are checked from its layouts before allocation"
# Chat data the same way (rendered with the Qwen3 tokenizer's template, from ../shared).
tok=${QT_SHARED_DIR:-}/tokenizers/qwen3
if [ -f "$tok/tokenizer_config.json" ]; then
  for i in $(seq 1 12); do
    printf '{"messages": [{"role": "user", "content": "What is %d plus %d?"}, {"role": "assistant", "content": "%d."}]}\n' $i $((i * 3)) $((i * 4))
  done >"$TMP/a/chat.jsonl"
  sed 's/plus/and/' "$TMP/a/chat.jsonl" >"$TMP/b/chat.jsonl"
  chat=(--training.dataset_path=chat.jsonl --training.data_format=messages
        --model.tokenizer_path="$tok" --model.vocab_size=151669)
  two_dirs chat.log --job.dump_folder="$TMP/run_chat" "${chat[@]}"
  rc=$?
  if [ $rc -eq 0 ] || [ $rc -eq 124 ] || ! grep -q "rank 1: the chat data this rank rendered and tokenized (content hash [0-9a-f]*) differs from rank 0's" "$TMP/chat.log"; then
    echo "FAIL: ranks reading different chat data (rc=$rc)"; cat "$TMP/chat.log"; exit 1
  fi
  cp "$TMP/a/chat.jsonl" "$TMP/b/chat.jsonl"
  two_dirs chat_same.log --job.dump_folder="$TMP/run_chat_same" "${chat[@]}" ||
    { echo "FAIL: the same chat data under two paths should train"; cat "$TMP/chat_same.log"; exit 1; }
  echo "ok: ranks compare the chat data they opened by content"
elif [ -n "${QT_SHARED_DIR:-}" ] && [ -d "$QT_SHARED_DIR" ]; then
  echo "FAIL: $QT_SHARED_DIR lacks the Qwen3 tokenizer"; exit 1
else
  echo "skipped: chat data by content (no ../shared, as in a user's clone)"
fi
# MPI_Init, which has no timeout of its own, under comm.init_timeout_seconds: the second
# "rank" is a program that never joins, so rank 0's MPI_Init would wait for it forever.
start=$SECONDS
timeout 60 mpirun --hostfile "$TMP/hostfile" --oversubscribe -np 1 "$BIN" train "${ARGS[@]}" \
  --comm.init_timeout_seconds=3 --job.dump_folder="$TMP/run_init" : -np 1 sleep 30 >"$TMP/init.log" 2>&1
rc=$?
if [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ $((SECONDS - start)) -gt 20 ] ||
   ! grep -q "^\[rank 0\] error: MPI_Init did not finish within 3 s (comm.init_timeout_seconds)" "$TMP/init.log"; then
  echo "FAIL: a rank that never joins MPI_Init (rc=$rc, $((SECONDS - start)) s)"; cat "$TMP/init.log"; exit 1
fi
echo "ok: MPI_Init is watched by comm.init_timeout_seconds"

mpirun --hostfile "$TMP/hostfile" --oversubscribe -np 2 "$BIN" train "${ARGS[@]}" \
  --job.dump_folder="$TMP/run" >"$TMP/run.log" 2>&1 &
launcher=$!
stopped=
cleanup_ranks() { [ -z "$stopped" ] || kill -KILL "$stopped" 2>/dev/null; }
trap 'cleanup_ranks; rm -rf "$TMP"' EXIT
# Rank 1 is the child of mpirun whose environment says so; stop it once training runs (past
# the first step, so the train timeout applies).
for _ in $(seq 600); do
  grep -q 'step: *1[ /]' "$TMP/run.log" 2>/dev/null && break
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.1
done
sleep 1
ranks=()
# grep -z reads the NUL-separated environment itself: `tr | grep -q` under pipefail failed when
# grep quit on its match before tr's last write (SIGPIPE), a race a loaded machine lost.
for p in $(pgrep -P "$launcher"); do
  if grep -qzx 'OMPI_COMM_WORLD_RANK=1' "/proc/$p/environ" 2>/dev/null; then stopped=$p; fi
  grep -qz '^OMPI_COMM_WORLD_RANK=' "/proc/$p/environ" 2>/dev/null && ranks+=("$p")
done
if [ -z "$stopped" ] || [ "${#ranks[@]}" != 2 ]; then
  echo "FAIL: no rank 1 process under mpirun (pid $launcher) once training ran"; cat "$TMP/run.log"
  kill "$launcher" 2>/dev/null; exit 1
fi
# Both ranks suspended together for longer than the timeout (a paused VM, a host that slept):
# time a rank did not run is not waiting, so after SIGCONT the job trains on instead of both
# ranks timing out at once.
kill -STOP "${ranks[@]}"
sleep 7
kill -CONT "${ranks[@]}"
sleep 3
if ! kill -0 "$launcher" 2>/dev/null || grep -q 'error' "$TMP/run.log"; then
  echo "FAIL: a job whose ranks were all suspended for 7 s (timeout 5 s) should train on"; tail -20 "$TMP/run.log"; exit 1
fi
echo "ok: a suspension of every rank is not taken for a stalled collective"
kill -STOP "$stopped"
t0=$SECONDS
for _ in $(seq 600); do
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.1
done
took=$((SECONDS - t0))
if kill -0 "$launcher" 2>/dev/null; then
  echo "FAIL: the job still runs 60 s after rank 1 stopped (no collective timeout)"
  kill -KILL "$launcher"; cat "$TMP/run.log" | tail -20; exit 1
fi
wait "$launcher"
rc=$?
if [ "$rc" -eq 0 ] || [ "$took" -gt 20 ] ||
   ! grep -q 'error: .*rank 1 stopped answering: .* waited more than 5 s (comm.train_timeout_seconds)' "$TMP/run.log"; then
  echo "FAIL: rc=$rc after ${took} s; expected a non-zero exit within 20 s naming rank 1"
  tail -20 "$TMP/run.log"; exit 1
fi
echo "e2e_dist_hostile: ok (the job ended ${took} s after rank 1 stopped, naming it)"
