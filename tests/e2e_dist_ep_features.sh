#!/usr/bin/env bash
# Distributed MoE keeps what one process has: under expert parallelism (x TP) full activation
# checkpointing (the all-to-alls run again in the recomputation), bf16 mixed precision (1e-5
# in the loss, 5e-4 in the grad norm, as for dense models) and [[override]] kernels (fused
# norms, the chunked loss and the reference experts op on the received rows)
# match one process with the same settings, routing figures identical (tests/dist_ep_lib.sh).
set -uo pipefail
# shellcheck source=tests/dist_lib.sh
. "$(dirname "$0")/dist_lib.sh"
# shellcheck source=tests/dist_ep_lib.sh
. "$(dirname "$0")/dist_ep_lib.sh"

AC=--activation_checkpoint.mode=full
run 0 one-ac $AC && run 4 ep2-tp2-ac $EP=2 --parallelism.tensor_parallel_degree=2 $AC && same one-ac ep2-tp2-ac
BF=--training.mixed_precision_param=bfloat16
run 0 one-bf16 $BF && QT_GEMM_BF16=$(dist_bf16_path one-bf16) run 2 ep2-bf16 $EP=2 $BF &&
  same one-bf16 ep2-bf16 1e-5 5e-4
cp "$SRC/configs/debug_moe.toml" "$TMP/kernels.toml"
for o in "layers.*.*norm rmsnorm_fused" "loss loss_chunked" "layers.*.moe.experts reference"; do
  set -- $o
  printf '\n[[override]]\ntarget = "%s"\nkernel = "%s"\n' "$1" "$2" >>"$TMP/kernels.toml"
done
ARGS[1]="$TMP/kernels.toml"
run 0 one-kernels && run 2 ep2-kernels $EP=2 --parallelism.tensor_parallel_degree=2 && same one-kernels ep2-kernels &&
  grep -q 'rmsnorm_fused' "$TMP/ep2-kernels.log" && grep -q 'reference' "$TMP/ep2-kernels.log" ||
  { echo "FAIL: kernel overrides under EP x TP"; grep -i kernel "$TMP/ep2-kernels.log" | head -5; fail=1; }
exit $fail
