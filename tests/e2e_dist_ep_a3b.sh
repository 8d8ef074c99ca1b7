#!/usr/bin/env bash
# A reduced Qwen3-30B-A3B (its 64 experts and top 4, 2 layers, small dims) under EP 2, EP 4,
# EP 2 x FSDP 2 (4 ranks) and EP 2 x TP 2 matches one process (tests/dist_ep_lib.sh: 1e-5,
# identical routing figures), and each mesh's HF export (at lr = 0) is byte for byte one
# process's.
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
  run 4 a3b-ep2-fsdp4 "${A3B[@]}" $EP=2 && same a3b-one a3b-ep2-fsdp4
  run 2 a3b-ep2-tp2 "${A3B[@]}" $EP=2 --parallelism.tensor_parallel_degree=2 && same a3b-one a3b-ep2-tp2
else
  fail=1
fi
if run 0 a3b-hf1 "${A3B[@]}" "${HF[@]}"; then
  for c in "a3b-hf-ep2 2 $EP=2" "a3b-hf-ep4 4 $EP=4" "a3b-hf-ep2-fsdp4 4 $EP=2" \
    "a3b-hf-ep2-tp2 2 $EP=2 --parallelism.tensor_parallel_degree=2"; do
    set -- $c
    name=$1 np=$2
    shift 2
    run "$np" "$name" "${A3B[@]}" "${HF[@]}" "$@" && same_hf a3b-hf1 "$name" || fail=1
  done
else
  fail=1
fi
exit $fail
