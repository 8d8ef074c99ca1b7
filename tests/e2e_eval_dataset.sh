#!/usr/bin/env bash
# qtitan eval --dataset on tests/fixtures/generate/cli_tiny: loss and bits per byte of
# docs.jsonl equal what tools/make_generate_fixtures.py computed with transformers and
# tokenizers (same packing: documents + EOS in rows of 16 with the document mask), for the
# whole file and for --max-tokens 40, and with --stride 6 as transformers' sliding-window
# perplexity loop computes them; bad input exits non-zero with one sentence.
# shellcheck source=tests/infer_lib.sh
. "$(dirname "$0")/infer_lib.sh"

want() { grep -o "\"$1\": [0-9.e+-]*" "$FIX/expected_eval.json" | sed -n "$2p" | sed 's/.*: //'; }
close() { awk -v a="$1" -v b="$2" 'BEGIN { d = (a - b) / b; if (d < 0) d = -d; exit !(d <= 1e-6) }'; }
check() { # label, output, index in expected_eval.json (1 all, 2 first, 3 and 4 strided)
    local loss bpb tokens
    loss=$(echo "$2" | sed -n 's/^loss: //p')
    bpb=$(echo "$2" | sed -n 's/^bits_per_byte: //p')
    tokens=$(echo "$2" | sed -n 's/^tokens: \([0-9]*\).*/\1/p')
    close "$loss" "$(want loss "$3")" || fail "$1: loss $loss, transformers $(want loss "$3")"
    close "$bpb" "$(want bits_per_byte "$3")" || fail "$1: bits/byte $bpb, want $(want bits_per_byte "$3")"
    [ "$tokens" = "$(want tokens "$3")" ] || fail "$1: $tokens tokens, want $(want tokens "$3")"
    echo "$1: loss $loss bits/byte $bpb tokens $tokens (transformers $(want loss "$3"))"
}
out=$("$QT" eval --model "$FIX" --dataset "$FIX/docs.jsonl" --seq-len 16 2>/dev/null)
check "whole file" "$out" 1
out=$("$QT" eval --model "$FIX" --dataset "$FIX/docs.jsonl" --seq-len 16 --max-tokens 40 2>/dev/null)
check "--max-tokens 40" "$out" 2
# --stride 6: transformers' sliding-window perplexity loop over the stream as one sequence.
out=$("$QT" eval --model "$FIX" --dataset "$FIX/docs.jsonl" --seq-len 16 --stride 6 2>/dev/null)
check "--stride 6" "$out" 3
echo "$out" | grep -q 'rows: 15 x 16 windows, stride 6' || fail "--stride 6: 15 windows expected: $out"
out=$("$QT" eval --model "$FIX" --dataset "$FIX/docs.jsonl" --seq-len 16 --stride 6 --max-tokens 40 2>/dev/null)
check "--stride 6 --max-tokens 40" "$out" 4

# --dtype bfloat16: the loss of the model's bf16 weights, within bf16 rounding of transformers'
# fp32 loss (2e-3 relative) but not equal to the fp32 run's; --choices the same.
out=$("$QT" eval --model "$FIX" --dataset "$FIX/docs.jsonl" --seq-len 16 --dtype bfloat16 2>/dev/null)
l16=$(echo "$out" | sed -n 's/^loss: //p') l32=$(want loss 1)
awk -v a="$l16" -v b="$l32" 'BEGIN { d = (a - b) / b; if (d < 0) d = -d; exit !(a != "" && d <= 2e-3 && d > 1e-7) }' ||
  fail "--dtype bfloat16: loss $l16, fp32 $l32"
"$QT" eval --model "$FIX" --choices "$FIX/choices.jsonl" --dtype bfloat16 >"$TMP/c16" 2>"$TMP/err" &&
  grep -q '^questions: 9  labelled: 8  choices: 24' "$TMP/c16" || fail "--choices --dtype bfloat16: $(cat "$TMP/err" "$TMP/c16")"
expect_error eval "dtype float16: expected float32 or bfloat16" --model "$FIX" --dataset "$FIX/docs.jsonl" --dtype float16
expect_error eval "stride and --dtype go with --dataset" --model "$FIX" --tokens "$FIX/docs.jsonl" --dtype bfloat16
echo "--dtype bfloat16: loss $l16 (fp32 $l32)"

# Bad input: exit status non-zero and exactly one line on stderr, naming the problem.
expect_error eval "seq-len 300 exceeds the model's context of 256" --model "$FIX" \
  --dataset "$FIX/docs.jsonl" --seq-len 300
expect_error eval "max-tokens 0: expected an integer >= 1" --model "$FIX" --dataset "$FIX/docs.jsonl" \
  --max-tokens 0
expect_error eval "stride 16: expected an integer from 1 to 15, below the sequence length 16" \
  --model "$FIX" --dataset "$FIX/docs.jsonl" --seq-len 16 --stride 16
expect_error eval "stride x: expected an integer >= 1" --model "$FIX" --dataset "$FIX/docs.jsonl" --stride x
expect_error eval "stride reads text data as one sequence" --model "$FIX" \
  --dataset "$FIX/docs.jsonl" --data-format messages --stride 2
expect_error eval "stride and --dtype go with --dataset" --model "$FIX" --tokens x --stride 2
expect_error eval "give one of --model HFDIR or --checkpoint" --dataset "$FIX/docs.jsonl"
expect_error eval "go with --dataset" --model "$FIX" --tokens x --seq-len 4
expect_error eval "data-format chats: expected text, messages, prompt_completion or instruction" \
  --model "$FIX" --dataset "$FIX/docs.jsonl" --data-format chats
expect_error eval "with --data-format messages every assistant target of the file counts" \
  --model "$FIX" --dataset "$FIX/docs.jsonl" --data-format messages --max-tokens 40
expect_error eval "has no chat template" --model "$FIX" --dataset "$FIX/docs.jsonl" \
  --data-format messages
expect_error eval "go with --dataset" --model "$FIX" --tokens x --data-format messages
mkdir -p "$TMP/ckpt/step-2"
echo '{}' >"$TMP/ckpt/step-2/train_state.json"
expect_error eval "step-2 has no config.json" --checkpoint "$TMP/ckpt/step-2" --dataset "$FIX/docs.jsonl"
echo "e2e_eval_dataset: ok"
