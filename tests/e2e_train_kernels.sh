#!/usr/bin/env bash
# qtitan train with the kernel library swapped in by [[override]] (configs/debug_kernels.toml)
# against the same job on the references: one "[override] ..." line per replaced instance and
# "applied N override(s)", losses equal within the kernels' tolerance at every step, and the
# checkpoint holds the same tensor names (so checkpoints and exports do not depend on kernels).
# A config whose override breaks a supports() rule stops before training starts.
# shellcheck source=tests/c4_lib.sh
. "$(dirname "$0")/c4_lib.sh"
train() { # config dump_folder [extra args]
  local cfg=$1 out=$2; shift 2
  "$QT_BINARY" train --config "$QT_SOURCE_DIR/configs/$cfg" \
    --model.tokenizer_path="$tok" --training.dataset_path="$data" \
    --model.vocab_size=151936 --model.dim=32 --model.n_layers=2 --model.n_heads=4 \
    --model.n_kv_heads=2 --model.head_dim=8 --model.hidden_dim=64 \
    --training.seq_len=64 --training.local_batch_size=2 --training.steps=6 \
    --training.document_mask=false --checkpoint.enable=true --checkpoint.interval=6 \
    --metrics.peak_tflops=1 --job.dump_folder="$out" "$@" 2>&1
}
train debug.toml "$tmp/ref" >"$tmp/ref.log"
train debug_kernels.toml "$tmp/ker" >"$tmp/ker.log"
grep -q '^\[override\] layers.1.attention.sdpa: sdpa -> flash' "$tmp/ker.log" \
  || { cat "$tmp/ker.log"; echo "FAIL: no override log line"; exit 1; }
grep -q '^\[override\] loss: lm_head_loss -> loss_chunked' "$tmp/ker.log" \
  || { echo "FAIL: no loss_chunked line"; exit 1; }
# 2 layers x (sdpa, rope, feed_forward, 4 norms) + loss (the final norm is not under layers.*)
grep -q '^applied 15 override(s)' "$tmp/ker.log" || { echo "FAIL: expected 15 overrides"; exit 1; }
if grep -q '^\[override\]' "$tmp/ref.log"; then echo "FAIL: the reference run replaced kernels"; exit 1; fi

grep -o '^step: *[0-9/]* *loss: *[0-9.]*' "$tmp/ref.log" | awk '{print $4}' >"$tmp/ref.loss"
grep -o '^step: *[0-9/]* *loss: *[0-9.]*' "$tmp/ker.log" | awk '{print $4}' >"$tmp/ker.loss"
[ "$(wc -l <"$tmp/ref.loss")" = 6 ] || { cat "$tmp/ref.log"; echo "FAIL: expected 6 steps"; exit 1; }
paste "$tmp/ref.loss" "$tmp/ker.loss" | awk '
  { d = $1 - $2; if (d < 0) d = -d; printf "step %d: reference %s, kernels %s\n", NR, $1, $2
    if (d > 2e-4 * $1 + 2e-5) bad = 1 }
  END { exit bad }' || { echo "FAIL: losses differ beyond tolerance"; exit 1; }

keys() { head -c 200000 "$1" | grep -ao '"[A-Za-z0-9_.]*":{"dtype"' | sort; }
keys "$tmp/ref/checkpoint/step-6/model.safetensors" >"$tmp/ref.keys"
keys "$tmp/ker/checkpoint/step-6/model.safetensors" >"$tmp/ker.keys"
[ -s "$tmp/ref.keys" ] || { echo "FAIL: no tensor names read from the checkpoint"; exit 1; }
cmp "$tmp/ref.keys" "$tmp/ker.keys" || { diff "$tmp/ref.keys" "$tmp/ker.keys"; echo "FAIL: checkpoint keys differ"; exit 1; }

if train debug_kernels.toml "$tmp/bad" --training.seq_len=48 >"$tmp/bad.log"; then
  echo "FAIL: seq_len 48 with flash should be refused"; exit 1
fi
grep -q 'flash cannot run layers.0.attention.sdpa: seq_len must be a multiple of 64' "$tmp/bad.log" \
  || { cat "$tmp/bad.log"; echo "FAIL: no supports() error"; exit 1; }
echo "ok: $(wc -l <"$tmp/ref.keys") checkpoint keys equal, 6 losses within tolerance"
