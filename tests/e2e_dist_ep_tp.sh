#!/usr/bin/env bash
# MoE with tensor parallelism: the experts split over the tp ranks (expert_parallel_degree a
# multiple of tensor_parallel_degree), attention split as for dense models. EP 2 x TP 2 on 2
# processes and with FSDP 2 on 4, and 8 processes (EP 4 x TP 2, FSDP 4; oversubscribed) match
# one process (tests/dist_ep_lib.sh: 1e-5, identical routing figures).
set -uo pipefail
# shellcheck source=tests/dist_lib.sh
. "$(dirname "$0")/dist_lib.sh"
# shellcheck source=tests/dist_ep_lib.sh
. "$(dirname "$0")/dist_ep_lib.sh"

if run 0 one; then
  run 2 ep2-tp2 $EP=2 --parallelism.tensor_parallel_degree=2 && same one ep2-tp2
  run 4 ep2-tp2-fsdp2 $EP=2 --parallelism.tensor_parallel_degree=2 && same one ep2-tp2-fsdp2
  run 8 ep4-tp2-fsdp4 $EP=4 --parallelism.tensor_parallel_degree=2 && same one ep4-tp2-fsdp4
  grep -q 'mesh \[dp_replicate 1, dp_shard 4, tp 2, ep 4\] on 8 processes' "$TMP/ep4-tp2-fsdp4.log" ||
    { echo "FAIL: the 8-process mesh line"; fail=1; }
else
  fail=1
fi
exit $fail
