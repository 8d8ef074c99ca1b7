#!/usr/bin/env bash
# The MoE debug model (tests/dist_ep_lib.sh) on 16 processes, oversubscribed on the machine's
# cores, against one process with the same global batch of 16 rows (16 tokens each, so the
# 16-process runs stay short):
#   - EP 4 on HSDP 4 x 4 (each EP group one dp_shard group, four expert replicas) and the
#     experts FSDP-sharded without EP on HSDP 2 x 8 match one process's losses and grad norms
#     to 1e-5 over 10 steps with identical routing figures;
#   - at lr = 0 EP 2 on FSDP 16 (eight expert replicas) writes an HF export byte-identical to
#     one process's.
# (8 processes: tests/e2e_dist_ep_tp.sh.)
set -uo pipefail
# shellcheck source=tests/dist_lib.sh
. "$(dirname "$0")/dist_lib.sh"
# shellcheck source=tests/dist_ep_lib.sh
. "$(dirname "$0")/dist_ep_lib.sh"
B16=(--training.seq_len=16 --training.local_batch_size=1 --training.global_batch_size=16)
REP=--parallelism.data_parallel_replicate_degree
SHARD=--parallelism.data_parallel_shard_degree

if run 0 one "${B16[@]}"; then
  run 16 ep4-hsdp4x4 "${B16[@]}" $EP=4 $REP=4 $SHARD=4 && same one ep4-hsdp4x4
  grep -q 'mesh \[dp_replicate 4, dp_shard 4, tp 1, ep 4\] on 16 processes' "$TMP/ep4-hsdp4x4.log" ||
    { echo "FAIL: the EP 4 run's mesh line"; grep -m1 mesh "$TMP/ep4-hsdp4x4.log"; fail=1; }
  run 16 hsdp2x8 "${B16[@]}" $REP=2 $SHARD=8 && same one hsdp2x8
else
  fail=1
fi

# One step at lr = 0: every mesh exports the initial values.
HF=("${B16[@]}" --checkpoint.enable=true --checkpoint.interval=1 --checkpoint.last_save_in_hf=true
  --optimizer.lr=0 --training.steps=1)
hf_file() { echo "$TMP/$1/checkpoint/step-1/hf/model.safetensors"; }
run 0 hf1 "${HF[@]}" && run 16 hf-ep2-fsdp16 "${HF[@]}" $EP=2 &&
  cmp -s "$(hf_file hf1)" "$(hf_file hf-ep2-fsdp16)" &&
  echo "ok: EP 2 x FSDP 16's HF export is byte-identical to one process's" ||
  { echo "FAIL: EP 2 x FSDP 16's HF export differs from one process's"; fail=1; }
exit $fail
