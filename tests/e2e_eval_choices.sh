#!/usr/bin/env bash
# qtitan eval --choices on the cli_tiny model against lm-evaluation-harness
# (tests/fixtures/generate/cli_tiny/expected_choices.json, made by tools/make_choices_fixture.py
# with lm_eval's HFLM): every choice's log-likelihood within 1e-4 and acc, acc_norm, acc_bytes
# with their standard errors as lm-eval reports them, at the model's context (the default
# --seq-len here) and cut at 12 tokens; the --json lines agree with the summary; bad questions
# and options are one sentence naming the line.
# shellcheck source=tests/infer_lib.sh
. "$(dirname "$0")/infer_lib.sh"

Q=$FIX/choices.jsonl
EXP=$FIX/expected_choices.json
for run in 0 1; do
  T=$(jq ".[$run].max_length" "$EXP")
  seq=()
  [ "$run" = 0 ] || seq=(--seq-len "$T") # run 0: the default, the model's context of 256
  "$QT" eval --model "$FIX" --choices "$Q" "${seq[@]}" --json >"$TMP/out" 2>"$TMP/err" ||
    fail "eval --choices (max_length $T): $(cat "$TMP/err")"
  paste <(grep '^{' "$TMP/out" | jq -r '.loglikelihoods[]') <(jq -r ".[$run].loglikelihoods[]" "$EXP") |
    awk 'NF != 2 { bad = 1 } { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4) bad = 1; n++ }
      END { exit bad || n != 24 }' ||
    fail "max_length $T: log-likelihoods $(grep '^{' "$TMP/out" | jq -c .loglikelihoods) vs lm-eval's $(jq -c ".[$run].loglikelihoods" "$EXP")"
  for m in acc acc_norm acc_bytes; do
    want=$(jq -r ".[$run].metrics.$m | \"\\(.value) \\(.stderr)\"" "$EXP" | awk '{ printf "%.6f  stderr %.6f", $1, $2 }')
    grep -qx "$m: $want" "$TMP/out" || fail "max_length $T: $m: $(grep "^$m:" "$TMP/out"), lm-eval $want"
    # the summary counts the --json lines' predictions
    key=pred${m#acc}
    hits=$(grep '^{' "$TMP/out" | jq -s "[.[] | select(.label != null) | select(.$key == .label)] | length")
    n=$(grep '^{' "$TMP/out" | jq -s '[.[] | select(.label != null)] | length')
    awk -v h="$hits" -v n="$n" -v w="${want%% *}" 'BEGIN { d = h / n - w; exit !(d < 1e-6 && d > -1e-6) }' ||
      fail "$m: $hits of $n --json predictions are right, the summary says $want"
  done
  grep -q "^questions: 9  labelled: 8  choices: 24  tokens: [0-9]*  passes: [0-9]*  seq-len: $T\$" "$TMP/out" ||
    fail "summary line: $(tail -1 "$TMP/out")"
  echo "max_length $T: log-likelihoods and acc / acc_norm / acc_bytes equal lm-eval's"
done

# Bad input: one sentence each.
printf '{"context": "a", "choices": ["b"], "label": 0}\n\n{"context": "a", "choices": []}\n' >"$TMP/q1.jsonl"
expect_error eval "q1.jsonl:3: \"choices\" must be a non-empty array of strings, found an empty array" \
  --model "$FIX" --choices "$TMP/q1.jsonl"
printf '{"context": "a", "choices": ["b", "c"], "label": 2}\n' >"$TMP/q2.jsonl"
expect_error eval "q2.jsonl:1: \"label\" must be the index of the right choice (0 to 1) or null" \
  --model "$FIX" --choices "$TMP/q2.jsonl"
printf '{"context": 3, "choices": ["b"]}\n' >"$TMP/q3.jsonl"
expect_error eval "q3.jsonl:1: \"context\" must be a string, found a number" --model "$FIX" --choices "$TMP/q3.jsonl"
printf '{"context": "The", "choices": [" cat"]}\n{"context": "  ", "choices": ["x"]}\n' >"$TMP/q4.jsonl"
expect_error eval "line 2, choice 0: the context is only whitespace" --model "$FIX" --choices "$TMP/q4.jsonl"
printf '{"context": "The", "choices": [" b c d e f g h i j k l m n o p"]}\n' >"$TMP/q5.jsonl"
expect_error eval "line 1, choice 0: its [0-9]* tokens do not fit the 4 positions of a row" \
  --model "$FIX" --choices "$TMP/q5.jsonl" --seq-len 4
printf '{"context": "a", "choices": ["b"]}\n' >"$TMP/q8.jsonl"
expect_error eval "line 1, choice 0: the choice adds no token after the context's" --model "$FIX" --choices "$TMP/q8.jsonl"
printf '\n  \n' >"$TMP/q6.jsonl"
expect_error eval "q6.jsonl holds no question" --model "$FIX" --choices "$TMP/q6.jsonl"
printf '{"context": "a", "choices": ["b"]\n' >"$TMP/q7.jsonl"
expect_error eval "q7.jsonl:1: not valid JSON" --model "$FIX" --choices "$TMP/q7.jsonl"
expect_error eval "--json goes with --choices" --model "$FIX" --tokens "$TMP/q1.jsonl" --json
expect_error eval "--dataset, --tokens and their options do not go with it" --model "$FIX" \
  --choices "$Q" --dataset "$Q"
echo "e2e_eval_choices: ok"
