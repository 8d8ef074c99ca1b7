#!/usr/bin/env bash
# Sharded checkpoints of expert-parallel runs (tests/dist_ep_lib.sh's MoE model): each rank's
# layout describes its expert tensors as its run of experts (a box along dimension 0), so
#   - at lr = 0 (every mesh holds the initial values) EP 2 x TP 2 x FSDP 2 and EP 2 x FSDP 4
#     (expert replicas) write step-N/hf files byte-identical to one process's export, and so
#     does `qtitan export` of the EP x TP folder;
#   - an EP 2 x TP 2 run resumed from its step-3 checkpoint ends (step 6) with bitwise the
#     per-rank shard files and losses of the run that never stopped;
#   - EP 2 on 4 processes keeps half of its experts per rank (FSDP over the 2 ranks holding the
#     same experts): resumed from its step-3 checkpoint it is bitwise the run that never
#     stopped, and resumed on EP 4 (every rank's experts whole: resharded) its steps 4-6 match
#     EP 2 going on to 1e-6 relative.
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
  dist_rewind ck-b 2 3 "1, 1, 2, 2"
  run 2 ck-b "${CK[@]}"
  dist_resumed_same ck-a ck-b 2 3 6 "an EP 2 x TP 2 run"
else
  fail=1
fi

# Experts sharded over their replicas: EP 2 on 4 processes.
X2=(--checkpoint.enable=true --checkpoint.interval=3 --checkpoint.keep_latest_k=0 --training.steps=6 $EP=2)
if run 4 x2-a "${X2[@]}" && mkdir -p "$TMP/x2-b" "$TMP/x2-4" &&
  cp -r "$TMP/x2-a/checkpoint" "$TMP/x2-b/" && cp -r "$TMP/x2-a/checkpoint" "$TMP/x2-4/"; then
  for d in x2-b x2-4; do
    rm -rf "$TMP/$d/checkpoint/rank-"*/step-6
    dist_rewind "$d" 4 3 "1, 4, 1, 2"
  done
  run 4 x2-b "${X2[@]}" && run 4 x2-4 "${X2[@]}" $EP=4
  dist_resumed_same x2-a x2-b 4 3 6 "EP 2 on 4 processes (each rank keeping half of its experts)"
  grep -q 'resharding it' "$TMP/x2-4.log" || { echo "FAIL: EP 2 -> EP 4 did not reshard"; fail=1; }
  paste -d' ' <(dist_table "$TMP/x2-a" | tail -3) <(dist_table "$TMP/x2-4" | tail -3) | awk '
    function rel(a, b) { d = a - b; if (d < 0) d = -d; m = a < 0 ? -a : a; return d / (m > 1e-30 ? m : 1e-30) }
    { n++; if ($1 != $4 || rel($2, $5) > 1e-6 || rel($3, $6) > 1e-6) bad++ }
    END { exit (n == 3 && !bad) ? 0 : 1 }' &&
    echo "ok: EP 2 -> EP 4 resharded matches EP 2 going on (steps 4-6, 1e-6)" ||
    { echo "FAIL: EP 2 -> EP 4"; paste <(dist_table "$TMP/x2-a") <(dist_table "$TMP/x2-4"); fail=1; }
else
  fail=1
fi
exit $fail
