#!/usr/bin/env bash
# The turns of a `qtitan generate --interactive` conversation: the seconds each turn spends on
# its prompt (the stderr line's prompt time) and the prompt tokens it ran and held in the cache,
# for one or more binaries in alternating rounds, on a model of about 100M parameters (dim 512,
# 8 layers, the real Qwen3 vocabulary; trained for one step, so its answers are noise) with a
# system prompt of 400 words, four user turns, 32 greedy new tokens each.
#   bash bench/generate/interactive.sh [--rounds R] [BINARY...]   (default build/qtitan)
# Needs ../shared (the Qwen3 tokenizer). Prints, per binary and round, each turn's
# "prompt_tokens+held_tokens prompt_s", and whether every binary's answers (ids) are the same.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
rounds=2
if [ "${1:-}" = --rounds ]; then rounds=$2; shift 2; fi
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=("$root/build/qtitan")
tok=${QT_SHARED_DIR:-$root/../shared}/tokenizers/qwen3
[ -f "$tok/tokenizer.json" ] || { echo "interactive.sh: no Qwen3 tokenizer at $tok"; exit 1; }
work=$(mktemp -d /tmp/qt_interactive_XXXXXX)
trap 'rm -rf "$work"' EXIT
"${bins[0]}" train --config "$root/configs/demo.toml" --job.dump_folder="$work/run" \
  --model.vocab_size=151936 --model.dim=512 --model.n_layers=8 --model.n_heads=8 \
  --model.n_kv_heads=4 --model.head_dim=64 --model.hidden_dim=1536 --model.tokenizer_path="$tok" \
  --training.dataset_path="$root/tests/fixtures/generate/cli_tiny/docs.jsonl" \
  --training.seq_len=16 --training.local_batch_size=1 --training.steps=1 \
  --checkpoint.last_save_in_hf=false --metrics.peak_tflops=1 >"$work/train.log" 2>&1 ||
  { tail -3 "$work/train.log"; exit 1; }
words=(the of and a to in is you that it he was for on are as with his they at be this have from
  or one had by word but not what all were we when your can said there use an each which she do)
system=""
for i in $(seq 0 399); do system+="${words[$((i * 7 % ${#words[@]}))]} "; done
printf 'Tell me about rivers.\nAnd mountains?\nAnd the sea?\nAnd forests?\n' >"$work/turns"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for r in $(seq 1 "$rounds"); do
  for b in "${!bins[@]}"; do
    "${bins[$b]}" generate --checkpoint "$work/run/checkpoint" --system "$system" \
      --temperature 0 --max-new-tokens 32 --json --interactive <"$work/turns" \
      >"$work/out$b.json" 2>"$work/err" || { cat "$work/err"; exit 1; }
    turns=$(grep '^generate: prompt' "$work/err" |
      sed -E 's/^generate: prompt ([0-9]+) tokens( \(and ([0-9]+) held in the cache\))? in ([0-9.]+) s.*/\1+\3 \4/' |
      sed 's/+ /+0 /' | tr '\n' ';')
    echo "round $r, ${bins[$b]}: load $(cut -d' ' -f1 /proc/loadavg), turns (prompt+held s): $turns"
  done
done
for b in "${!bins[@]}"; do
  cmp -s <(jq -c .ids "$work/out0.json") <(jq -c .ids "$work/out$b.json") ||
    echo "binary ${bins[$b]} answers differently from ${bins[0]}"
done
echo "done"
