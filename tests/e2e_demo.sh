#!/usr/bin/env bash
# The built-in demo (scripts/demo.sh) in a shortened form: corpus, tokenizer, 30 training steps,
# HF export, reload with qtitan eval on held-out documents, text from qtitan generate. demo.sh itself fails unless the
# held-out loss is within 10% of the final training loss, below ln(512) / 2 and below the first
# step's loss; here the export is also checked with qtitan inspect.
set -euo pipefail
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export QT_CACHE_DIR=$tmp/cache
DEMO_STEPS=30 DEMO_DIR=$tmp/demo bash "$QT_SOURCE_DIR/scripts/demo.sh" >"$tmp/log" 2>&1 \
  || { cat "$tmp/log"; echo "FAIL: demo.sh"; exit 1; }
grep -q '^   ok: held-out loss' "$tmp/log" || { cat "$tmp/log"; echo "FAIL: no verdict"; exit 1; }
[ "$(grep -c '^step: ' "$tmp/log")" -ge 4 ] || { cat "$tmp/log"; echo "FAIL: step lines"; exit 1; }
"$QT_BINARY" inspect "$tmp/demo/checkpoint/step-30/hf" >"$tmp/inspect" 2>&1 \
  || { cat "$tmp/inspect"; echo "FAIL: inspect of the export"; exit 1; }
grep -q '"tie_word_embeddings": true' "$tmp/demo/checkpoint/step-30/hf/config.json" \
  || { echo "FAIL: tied config"; exit 1; }
[ -f "$tmp/demo/checkpoint/step-30/hf/tokenizer.json" ] || { echo "FAIL: tokenizer not exported"; exit 1; }
grep -q '>loss</text>' "$tmp/demo/loss.svg" || { echo "FAIL: the demo's loss.svg"; exit 1; }
# The demo ends with text from the trained model: a completion under each prompt's header.
[ "$(grep -c '^--- prompt ' "$tmp/log")" -eq 2 ] || { cat "$tmp/log"; echo "FAIL: no generated text"; exit 1; }
grep -q '^generate: prompt .* tokens/s' "$tmp/log" || { cat "$tmp/log"; echo "FAIL: no generate speed line"; exit 1; }
grep '^   ok' "$tmp/log"
echo "e2e_demo: ok"
