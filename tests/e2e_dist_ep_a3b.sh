#!/usr/bin/env bash
# A reduced Qwen3-30B-A3B (its 64 experts and top 4, 2 layers, small dims) under EP 2 and EP 4
# matches one process (tests/dist_ep_lib.sh: 1e-5, identical routing figures).
set -uo pipefail
# shellcheck source=tests/dist_lib.sh
. "$(dirname "$0")/dist_lib.sh"
# shellcheck source=tests/dist_ep_lib.sh
. "$(dirname "$0")/dist_ep_lib.sh"

A3B=(--model.flavor=30B-A3B --model.n_layers=2 --model.num_experts=64 --model.top_k=4
  --model.n_heads=4 --model.n_kv_heads=2 --model.head_dim=8 --model.moe_hidden_dim=16)
if run 0 a3b-one "${A3B[@]}"; then
  run 2 a3b-ep2 "${A3B[@]}" $EP=2 && same a3b-one a3b-ep2
  run 4 a3b-ep4 "${A3B[@]}" $EP=4 && same a3b-one a3b-ep4
else
  fail=1
fi
exit $fail
