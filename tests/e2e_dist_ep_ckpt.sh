#!/usr/bin/env bash
# Sharded checkpoints of expert-parallel runs (tests/dist_ep_lib.sh's MoE model): each rank's
# layout describes its expert tensors as its run of experts (a box along dimension 0), so
#   - at lr = 0 (every mesh holds the initial values) EP 2 x TP 2 x FSDP 2 and EP 2 x FSDP 4
#     (expert replicas) write step-N/hf files byte-identical to one process's export, and so
#     does `qtitan export` of the EP x TP folder;
#   - an EP 2 x TP 2 run resumed from its step-3 checkpoint ends (step 6) with bitwise the
#     per-rank shard files and losses of the run that never stopped.
set -uo pipefail
# shellcheck source=tests/dist_lib.sh
. "$(dirname "$0")/dist_lib.sh"
# shellcheck source=tests/dist_ep_lib.sh
. "$(dirname "$0")/dist_ep_lib.sh"
TP=--parallelism.tensor_parallel_degree

# Two steps are enough: at lr = 0 the export is of the initial values.
HF=(--checkpoint.enable=true --checkpoint.interval=2 --checkpoint.last_save_in_hf=true --optimizer.lr=0
  --training.steps=2)
hf_file() { echo "$TMP/$1/checkpoint/step-2/hf/model.safetensors"; }
if run 0 hf1 "${HF[@]}"; then
  for c in "hf-ep2-tp2-fsdp2 $EP=2 $TP=2" "hf-ep2-fsdp4 $EP=2"; do
    set -- $c
    name=$1
    shift
    run 4 "$name" "${HF[@]}" "$@" && cmp -s "$(hf_file hf1)" "$(hf_file "$name")" &&
      echo "ok: $name's HF export is byte-identical to one process's" ||
      { echo "FAIL: $name's HF export differs from one process's"; fail=1; }
  done
  dist_export_same "$(hf_file hf1)" "$TMP/hf-ep2-tp2-fsdp2/checkpoint" "<EP 2 x TP 2 x FSDP 2 run>/checkpoint"
else
  fail=1
fi

# Resume: run a straight through; run b the same, with the step-6 commit undone.
CK=(--checkpoint.enable=true --checkpoint.interval=3 --checkpoint.keep_latest_k=2 --training.steps=6 $EP=2 $TP=2)
if run 2 ck-a "${CK[@]}" && run 2 ck-b "${CK[@]}"; then
  dist_rewind ck-b 2 3 "1, 1, 2"
  run 2 ck-b "${CK[@]}"
  dist_resumed_same ck-a ck-b 2 3 6 "an EP 2 x TP 2 run"
else
  fail=1
fi
exit $fail
