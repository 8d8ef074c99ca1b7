#!/usr/bin/env bash
# qtitan train end to end with a tiny mixture-of-experts model on the C4 sample: every step
# logs the MoE load figures to metrics.jsonl, checkpoints hold each layer's expert_bias, and a
# run resumed from its step-2 checkpoint ends with bitwise the same losses, parameters
# (expert_bias included) and optimizer state as a run that never stopped. qtitan eval loads the
# run's HF export. With debug.moe_force_load_balance every expert of every layer gets the same
# tokens in every step.
# shellcheck source=tests/c4_lib.sh
. "$(dirname "$0")/c4_lib.sh"
train() {
  "$QT_BINARY" train --config "$QT_SOURCE_DIR/configs/qwen3_moe_debug.toml" \
    --model.tokenizer_path="$tok" --training.dataset_path="$data" \
    --model.vocab_size=151936 --model.dim=32 --model.n_layers=2 --model.n_heads=4 \
    --model.n_kv_heads=2 --model.head_dim=8 --model.num_experts=4 --model.top_k=2 \
    --model.moe_hidden_dim=16 --model.load_balance_coeff=0.01 \
    --training.seq_len=32 --training.local_batch_size=2 --training.steps=4 \
    --checkpoint.enable=true --checkpoint.interval=2 --metrics.peak_tflops=1 \
    --job.dump_folder="$1" "${@:2}" 2>&1
}
train "$tmp/a" >"$tmp/a.log"
[ "$(grep -c '^step: ' "$tmp/a.log")" = 4 ] || { cat "$tmp/a.log"; echo "FAIL: expected 4 step lines"; exit 1; }
[ "$(grep -c '"moe_imbalance":' "$tmp/a/metrics.jsonl")" = 4 ] \
  || { cat "$tmp/a/metrics.jsonl"; echo "FAIL: metrics.jsonl lacks moe_imbalance"; exit 1; }
grep -q '"moe_tokens_max":' "$tmp/a/metrics.jsonl" || { echo "FAIL: no moe_tokens_max"; exit 1; }
grep -aq 'layers.1.moe.expert_bias' "$tmp/a/checkpoint/step-4/model.safetensors" \
  || { echo "FAIL: the checkpoint lacks expert_bias"; exit 1; }
# qtitan eval takes the MoE export as it takes a dense one (its --help says so).
"$QT_BINARY" export --checkpoint "$tmp/a/checkpoint" --out "$tmp/hf" >/dev/null 2>&1
echo "1 2 3 4 5 6 7 8" >"$tmp/ids"
"$QT_BINARY" eval --model "$tmp/hf" --tokens "$tmp/ids" 2>/dev/null | grep -q '^loss: [0-9]' \
  || { echo "FAIL: qtitan eval of the MoE export"; exit 1; }

# Forced balance: 2 rows x 32 tokens x top-2 over 4 experts is 32 tokens each, every step; the
# run above (by score) is not that even.
train "$tmp/rr" --debug.moe_force_load_balance=true --training.steps=3 >"$tmp/rr.log"
grep -q 'routers assign experts round-robin' "$tmp/rr.log" || { cat "$tmp/rr.log"; echo "FAIL: no notice"; exit 1; }
[ "$(grep -c '"moe_tokens_min":32.0,"moe_tokens_max":32.0,"moe_imbalance":1.0[,}]' "$tmp/rr/metrics.jsonl")" = 3 ] \
  || { cat "$tmp/rr/metrics.jsonl"; echo "FAIL: forced balance is not even"; exit 1; }
! grep -q '"moe_imbalance":1.0[,}]' "$tmp/a/metrics.jsonl" \
  || { echo "FAIL: routing by score came out perfectly even: the check above proves nothing"; exit 1; }

train "$tmp/b" >"$tmp/b1.log"
rm -rf "$tmp/b/checkpoint/step-4"
train "$tmp/b" >"$tmp/b2.log"
grep -q 'resumed from .*step-2' "$tmp/b2.log" || { cat "$tmp/b2.log"; echo "FAIL: no resume"; exit 1; }
for f in model.safetensors optim.safetensors; do
  cmp "$tmp/a/checkpoint/step-4/$f" "$tmp/b/checkpoint/step-4/$f" \
    || { echo "FAIL: $f after a resume differs from the uninterrupted run"; exit 1; }
done
# Two finite losses each, so that a format change (no match in either file) cannot pass as equal.
losses() { grep -o '"step":[34],"loss":[0-9][^,]*' "$1" || true; }
la=$(losses "$tmp/a/metrics.jsonl"); lb=$(losses "$tmp/b/metrics.jsonl" | tail -2)
[ "$(grep -c . <<<"$la")" = 2 ] || { cat "$tmp/a/metrics.jsonl"; echo "FAIL: no losses of steps 3-4"; exit 1; }
[ "$la" = "$lb" ] || { echo "FAIL: resumed losses differ"; exit 1; }
echo "e2e_train_moe: ok"
