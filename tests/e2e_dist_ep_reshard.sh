#!/usr/bin/env bash
# Resharding an expert-parallel checkpoint (tests/dist_ep_lib.sh's MoE model): EP 4 on 4
# processes writes steps 2, 4 and 6; its step 4 resumed on EP 2 (2 processes, each now holding
# four experts instead of two, and two micro-batches instead of one) matches EP 4's own steps
# 5 and 6 to 1e-6 relative in loss and grad norm with identical routing figures, and logs the
# mesh keys it changed without a warning; resumed at lr = 0 its parameters export (HF) byte
# for byte as `qtitan export` writes EP 4's step 4.
set -uo pipefail
# shellcheck source=tests/dist_lib.sh
. "$(dirname "$0")/dist_lib.sh"
# shellcheck source=tests/dist_ep_lib.sh
. "$(dirname "$0")/dist_ep_lib.sh"
CK=(--checkpoint.enable=true --checkpoint.interval=2 --checkpoint.keep_latest_k=0 --training.steps=6)
# routing STEP NAME: the step's routing figures.
routing() { sed -n "s/.*\"step\":$1,.*\\(\"moe_tokens_min\":[^,]*,\"moe_tokens_max\":[^,]*,\"moe_imbalance\":[^,}]*\\).*/\\1/p" "$TMP/$2/metrics.jsonl"; }

run 4 ep4 "${CK[@]}" $EP=4 || exit 1
dist_fork ep4 ep4to2 && run 2 ep4to2 "${CK[@]}" $EP=2 --checkpoint.load_step=4 &&
  dist_close ep4 ep4to2 "EP 4 -> EP 2 matches EP 4 going on" 5 6 || fail=1
for s in 5 6; do
  [ -n "$(routing $s ep4)" ] && [ "$(routing $s ep4)" = "$(routing $s ep4to2)" ] &&
    echo "ok: step $s routes as on EP 4: $(routing $s ep4)" ||
    { echo "FAIL: step $s routing: $(routing $s ep4) vs $(routing $s ep4to2)"; fail=1; }
done
grep -q 'step 4 was written on another mesh: parallelism.expert_parallel_degree = 4 (now 2)$' "$TMP/ep4to2.log" &&
  ! grep -q warning "$TMP/ep4to2.log" && echo "ok: EP 4 -> EP 2 names the one mesh key it changed" ||
  { echo "FAIL: EP 4 -> EP 2's config lines"; grep -h 'checkpoint\]' "$TMP/ep4to2.log"; fail=1; }

if "$BIN" export --checkpoint "$TMP/ep4/checkpoint/rank-0/step-4" --out "$TMP/ep4-hf" >"$TMP/export.log" 2>&1 &&
  dist_fork ep4 ep4lr0 && run 2 ep4lr0 "${CK[@]}" $EP=2 --checkpoint.load_step=4 --training.steps=5 \
    --optimizer.lr=0 --checkpoint.last_save_in_hf=true &&
  cmp -s "$TMP/ep4-hf/model.safetensors" "$TMP/ep4lr0/checkpoint/step-5/hf/model.safetensors"; then
  echo "ok: EP 4's step 4 resumed on EP 2 holds bitwise its parameters"
else
  echo "FAIL: the parameters resumed from EP 4 on EP 2 differ from the checkpoint's"; cat "$TMP/export.log"; fail=1
fi
exit $fail
