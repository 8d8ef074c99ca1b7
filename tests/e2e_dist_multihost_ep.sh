#!/usr/bin/env bash
# Expert parallelism across real hosts' networking (issue 17): two hosts as network namespaces
# (tests/multihost_lib.sh), mpirun across them over Open MPI's TCP transport alone, one rank
# per host. EP 2 over the two hosts (each holds half the experts; every MoE layer's dispatch
# and combine all-to-alls cross the veth links) trains the MoE model of tests/dist_ep_lib.sh
# for 10 steps with one process's losses and grad norms (1e-5 relative) and identical routing
# figures. Skips with a sentence where namespaces cannot be made.
set -uo pipefail
# shellcheck source=tests/dist_lib.sh
. "$(dirname "$0")/dist_lib.sh"
# shellcheck source=tests/multihost_lib.sh
. "$(dirname "$0")/multihost_lib.sh"
mh_setup 2
# shellcheck source=tests/dist_ep_lib.sh
. "$(dirname "$0")/dist_ep_lib.sh"

run 0 one || exit 1
mh_run ep2 "${ARGS[@]}" $EP=2 || { echo "FAIL: EP 2 across two hosts"; tail -20 "$TMP/ep2.log"; exit 1; }
grep -q 'mesh \[dp_replicate 1, dp_shard 2, tp 1, ep 2\] on 2 processes' "$TMP/ep2.log" ||
  { echo "FAIL: the two-host run's mesh line"; grep -m1 mesh "$TMP/ep2.log"; fail=1; }
same one ep2
[ $fail = 0 ] && echo "ok: EP 2 over two hosts (TCP) equals one process over 10 steps"
exit $fail
