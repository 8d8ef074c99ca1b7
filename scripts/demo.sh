#!/usr/bin/env bash
# The built-in demo, end to end on this machine with nothing downloaded:
#   1. generate a corpus of simple English (scripts/gen_corpus.awk) and a held-out set from
#      another seed (documents that also occur in the training set are dropped),
#   2. train a 512-token BPE tokenizer on it (qtitan tokenizer-train),
#   3. train a small Qwen3 from scratch (configs/demo.toml), with checkpoints and an HF export
#      of the last step (checkpoint.last_save_in_hf),
#   4. reload the export with qtitan eval on the held-out documents and check that its loss is
#      close to the final training loss (within DEMO_TOLERANCE, 10% by default, relative) and
#      far below ln(512) = 6.24, the loss of a uniform guess.
# Environment: DEMO_STEPS (default: the config's 120), DEMO_DIR (default runs/demo),
# QT_BINARY (default build/qtitan). A rerun starts over in DEMO_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${QT_BINARY:-build/qtitan}
dir=${DEMO_DIR:-runs/demo}
tol=${DEMO_TOLERANCE:-0.10}
steps_arg=()
[ -n "${DEMO_STEPS:-}" ] && steps_arg=(--training.steps="$DEMO_STEPS")
[ -x "$bin" ] || { echo "demo: $bin not found; run scripts/build.sh first" >&2; exit 1; }
t0=$(date +%s.%N)
elapsed() { awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f s", b - a }'; }

rm -rf "$dir"
mkdir -p "$dir/data"
echo "== 1. corpus: scripts/gen_corpus.awk -> $dir/data"
awk -v docs=3000 -v seed=1 -f scripts/gen_corpus.awk >"$dir/data/train.jsonl"
awk -v docs=200 -v seed=7 -f scripts/gen_corpus.awk | grep -vxF -f "$dir/data/train.jsonl" |
  head -n 100 >"$dir/data/heldout.jsonl" || true
echo "   $(wc -l <"$dir/data/train.jsonl") training documents, $(wc -l <"$dir/data/heldout.jsonl") held-out"

echo "== 2. tokenizer: 512-token BPE -> $dir/tokenizer"
"$bin" tokenizer-train --input "$dir/data/train.jsonl" --vocab-size 512 --output "$dir/tokenizer"

echo "== 3. train: configs/demo.toml -> $dir"
"$bin" train --config configs/demo.toml --job.dump_folder="$dir" \
  --model.tokenizer_path="$dir/tokenizer" --training.dataset_path="$dir/data/train.jsonl" \
  ${steps_arg[@]+"${steps_arg[@]}"} 2>&1 | tee "$dir/train.log"
last=$(ls -d "$dir"/checkpoint/step-* | sed 's/.*step-//' | sort -n | tail -1)
hf="$dir/checkpoint/step-$last/hf"
[ -f "$hf/config.json" ] || { echo "demo: no HF export at $hf" >&2; exit 1; }
train_loss=$(tail -n 1 "$dir/metrics.jsonl" | sed 's/.*"loss":\([^,]*\).*/\1/')
first_loss=$(head -n 1 "$dir/metrics.jsonl" | sed 's/.*"loss":\([^,]*\).*/\1/')

echo "== 4. reload the HF export and evaluate on held-out documents"
"$bin" tokenize --tokenizer "$dir/tokenizer" --input "$dir/data/heldout.jsonl" \
  --output "$dir/data/heldout.tokens"
eval_loss=$("$bin" eval --model "$hf" --tokens "$dir/data/heldout.tokens" 2>/dev/null |
  sed -n 's/^loss: //p')
verdict=$(awk -v t="$train_loss" -v e="$eval_loss" -v f="$first_loss" -v tol="$tol" 'BEGIN {
  rel = (e - t) / t; if (rel < 0) rel = -rel
  ok = rel <= tol && e < 0.5 * log(512) && t < f
  printf "%s: held-out loss %.4f vs final training loss %.4f (%.1f%% apart, tolerance %.0f%%); " \
         "first step %.4f; ln(512) = %.4f\n", ok ? "ok" : "FAIL", e, t, 100 * rel, 100 * tol, f,
         log(512)
}')
"$bin" plot "$dir" --out "$dir/loss.svg" --metric loss,grad_norm >/dev/null
cat <<SUMMARY
== demo finished in $(elapsed)
   $verdict
   corpus        $dir/data/train.jsonl, held-out $dir/data/heldout.jsonl
   tokenizer     $dir/tokenizer/tokenizer.json
   log, metrics  $dir/train.log, $dir/metrics.jsonl, curves $dir/loss.svg
   checkpoints   $dir/checkpoint/step-*
   HF export     $hf (transformers.AutoModelForCausalLM.from_pretrained loads it)
   generate      $bin generate --model $hf --prompt "the small" (or --checkpoint $dir/checkpoint)
SUMMARY
echo "== 5. generate: the trained checkpoint continues two prompts (docs/generate.md)"
printf 'the small\n12 plus\n' >"$dir/data/prompts.txt"
"$bin" generate --checkpoint "$dir/checkpoint" --prompt-file "$dir/data/prompts.txt" \
  --max-new-tokens 40 --temperature 0.7 --seed 1 --stop "count:"
case $verdict in ok:*) exit 0 ;; *) exit 1 ;; esac
