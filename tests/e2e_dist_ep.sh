#!/usr/bin/env bash
# Expert parallelism (parallelism.expert_parallel_degree) on many processes (mpirun
# --oversubscribe) against one process with the same global batch (tests/dist_ep_lib.sh):
# EP 2, EP 4 and EP 2 x FSDP 4 (experts on 2 ranks each, replicated twice, the rest FSDP over
# 4) match one process's losses and grad norms to 1e-5 over 10 steps with identical routing
# figures; at lr = 0 an EP 2 run's HF export is byte-identical to one process's; degrees that
# do not fit stop every rank with one sentence (tests/e2e_dist_ep_ckpt.sh: exports under
# EP x TP, resume).
set -uo pipefail
# shellcheck source=tests/dist_lib.sh
. "$(dirname "$0")/dist_lib.sh"
# shellcheck source=tests/dist_ep_lib.sh
. "$(dirname "$0")/dist_ep_lib.sh"

if run 0 one; then
  run 2 ep2 $EP=2 && same one ep2
  run 4 ep4 $EP=4 && same one ep4
  run 4 ep2-fsdp4 $EP=2 && same one ep2-fsdp4
else
  fail=1
fi
# HF export at lr = 0: byte for byte one process's.
run 0 hf1 "${HF[@]}" && run 2 hf-ep2 "${HF[@]}" $EP=2 && same_hf hf1 hf-ep2 || fail=1

# Degrees that do not fit the experts or the mesh.
dist_run 2 bad-ep "${ARGS[@]}" $EP=4
[ $? -ne 0 ] && grep -q 'parallelism.expert_parallel_degree = 4 spans 4 data_parallel_shard rank(s) per tensor-parallel rank, which does not divide data_parallel_shard_degree = 2' "$TMP/bad-ep.log" ||
  { echo "FAIL: an EP degree larger than the mesh should stop with a sentence"; cat "$TMP/bad-ep.log"; fail=1; }
dist_run 2 bad-etp "${ARGS[@]}" $EP=2 --parallelism.expert_tensor_parallel_degree=2
[ $? -ne 0 ] && grep -q 'expert_tensor_parallel_degree' "$TMP/bad-etp.log" ||
  { echo "FAIL: expert_tensor_parallel_degree = 2 should stop with a sentence"; cat "$TMP/bad-etp.log"; fail=1; }

exit $fail
