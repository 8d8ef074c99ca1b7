#!/usr/bin/env bash
# qtitan generate end to end on tests/fixtures/generate/cli_tiny (a one-layer model over the
# tiny_gpt2 tokenizer, made by tools/make_generate_fixtures.py): greedy --json ids equal
# transformers' generate for the same prompt text; a batch of prompts gives each prompt what
# it gives alone; --stop cuts the text; a seed reproduces a sampled completion; a training
# checkpoint step generates; bad input exits non-zero with one sentence.
# shellcheck source=tests/infer_lib.sh
. "$(dirname "$0")/infer_lib.sh"

# A JSON array under key $2 in the text $1, without spaces: "1,2,3".
arr() { echo "$1" | tr -d ' ' | sed -n "s/.*\"$2\":\[\([0-9,]*\)\].*/\1/p"; }

prompt=$(sed -n 's/.*"prompt": "\([^"]*\)".*/\1/p' "$FIX/expected.json")
want=$(cat "$FIX/expected.json")
got=$("$QT" generate --model "$FIX" --prompt "$prompt" --temperature 0 --max-new-tokens 24 \
  --json 2>"$TMP/err")
[ "$(arr "$got" prompt_ids)" = "$(arr "$want" prompt_ids)" ] ||
  fail "prompt ids $(arr "$got" prompt_ids), tokenizers $(arr "$want" prompt_ids)"
[ "$(arr "$got" ids)" = "$(arr "$want" ids)" ] ||
  fail "greedy ids $(arr "$got" ids), transformers $(arr "$want" ids)"
echo "$got" | grep -q '"finish_reason":"length"' || fail "finish_reason: $got"
grep -q 'generate: prompt 22 tokens.*tokens/s.*generation 24 tokens.*tokens/s' "$TMP/err" ||
  fail "no speed line on stderr: $(cat "$TMP/err")"
echo "greedy ids equal transformers' ($(arr "$got" ids | tr ',' ' ' | wc -w) tokens)"

# An fp8 block-quantized copy of the model (cli_tiny_fp8, stored as Qwen's -FP8 releases are):
# read dequantized, its greedy ids equal transformers' and their log-probs agree within 1e-4
# (those of the unquantized model differ by ~1e-2); bf16 weights decode from it too.
F8=$SRC/tests/fixtures/generate/cli_tiny_fp8
lp() { echo "$1" | tr -d ' ' | sed -n 's/.*"logprobs":\[\([-0-9.e,]*\)\].*/\1/p' | tr ',' '\n'; }
got=$("$QT" generate --model "$F8" --prompt "$prompt" --temperature 0 --max-new-tokens 24 --json 2>/dev/null)
want=$(cat "$F8/expected.json")
[ "$(arr "$got" ids)" = "$(arr "$want" ids)" ] || fail "fp8: greedy ids $(arr "$got" ids), transformers $(arr "$want" ids)"
paste <(lp "$got") <(lp "$want") | awk 'NF != 2 { bad = 1 } { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4) bad = 1; n++ }
  END { exit bad || n != 24 }' || fail "fp8: log-probs $(lp "$got" | tr '\n' ' ') vs transformers' $(lp "$want" | tr '\n' ' ')"
"$QT" generate --model "$F8" --prompt "$prompt" --temperature 0 --max-new-tokens 24 --dtype bfloat16 \
  --json >"$TMP/f8bf16" 2>"$TMP/err" || fail "fp8 with --dtype bfloat16: $(cat "$TMP/err")"
[ "$(arr "$(cat "$TMP/f8bf16")" ids | tr ',' ' ' | wc -w)" -eq 24 ] || fail "fp8 bf16: $(cat "$TMP/f8bf16")"
echo "fp8 block-quantized weights: greedy ids and log-probs equal transformers'"

# Streaming text of one prompt; the same prompt inside a batch gives the same completion.
text=$("$QT" generate --model "$FIX" --prompt "$prompt" --temperature 0 --max-new-tokens 24 2>/dev/null)
[ -n "$text" ] || fail "no text streamed"
printf '%s\nA\n\n  \nhello world\n' "$prompt" >"$TMP/prompts.txt"
"$QT" generate --model "$FIX" --prompt-file "$TMP/prompts.txt" --temperature 0 \
  --max-new-tokens 24 >"$TMP/batch" 2>/dev/null
[ "$(grep -c '^--- prompt ' "$TMP/batch")" -eq 3 ] || fail "batch output: $(cat "$TMP/batch")"
first=$(sed -n '2p' "$TMP/batch")
[ "$first" = "$text" ] || fail "batched completion '$first' differs from alone '$text'"
echo "batch of 3 prompts: prompt 1 as alone"

# Beam search: --num-beams 3 with the n-gram ban, the two best beams equal transformers'
# (expected_beams.jsonl: ids, sequences_scores within 1e-5, text); a generation_config.json with
# num_beams searches the same way; what beams do not take is one sentence.
beams=(--num-beams 3 --no-repeat-ngram-size 2 --temperature 0 --max-new-tokens 24)
"$QT" generate --model "$FIX" --prompt "$prompt" "${beams[@]}" --num-return-sequences 2 --json \
  >"$TMP/beams" 2>"$TMP/err" || fail "--num-beams: $(cat "$TMP/err")"
[ "$(wc -l <"$TMP/beams")" -eq 2 ] || fail "--num-beams 3 --num-return-sequences 2: $(cat "$TMP/beams")"
for r in 1 2; do
  got=$(sed -n "${r}p" "$TMP/beams") want=$(sed -n "${r}p" "$FIX/expected_beams.jsonl")
  [ "$(arr "$got" ids)" = "$(arr "$want" ids)" ] ||
    fail "beam $r: ids $(arr "$got" ids), transformers $(arr "$want" ids)"
  score() { echo "$1" | sed -n 's/.*"score": *\([-0-9.e]*\).*/\1/p'; }
  awk -v a="$(score "$got")" -v b="$(score "$want")" 'BEGIN { d = a - b; exit !(a != "" && d < 1e-5 && d > -1e-5) }' ||
    fail "beam $r: score $(score "$got"), transformers $(score "$want")"
  text() { echo "$1" | sed -n 's/.*"text": *\("[^"]*"\).*/\1/p'; }
  [ "$(text "$got")" = "$(text "$want")" ] || fail "beam $r: text $(text "$got"), transformers $(text "$want")"
  echo "$got" | grep -q "\"sequence\":$r" || fail "beam $r: no sequence number: $got"
done
grep -q 'generate: prompt 22 tokens' "$TMP/err" || fail "--num-beams: no speed line: $(cat "$TMP/err")"
# A prompt file searches its prompts side by side; each gets what it gets alone.
printf 'A\n%s\nhello world\n' "$prompt" >"$TMP/beam_prompts.txt"
"$QT" generate --model "$FIX" --prompt-file "$TMP/beam_prompts.txt" "${beams[@]}" --json \
  >"$TMP/beams3" 2>"$TMP/err" || fail "--num-beams with a prompt file: $(cat "$TMP/err")"
[ "$(wc -l <"$TMP/beams3")" -eq 3 ] || fail "--num-beams, 3 prompts: $(cat "$TMP/beams3")"
[ "$(arr "$(sed -n 2p "$TMP/beams3")" ids)" = "$(arr "$(head -1 "$FIX/expected_beams.jsonl")" ids)" ] ||
  fail "--num-beams, prompt 2 of 3: ids $(arr "$(sed -n 2p "$TMP/beams3")" ids)"
mkdir -p "$TMP/gcbeams"
cp "$FIX"/config.json "$FIX"/model.safetensors "$FIX"/tokenizer.json "$TMP/gcbeams/"
echo '{"do_sample": false, "num_beams": 3, "no_repeat_ngram_size": 2}' >"$TMP/gcbeams/generation_config.json"
got=$("$QT" generate --model "$TMP/gcbeams" --prompt "$prompt" --max-new-tokens 24 --json 2>"$TMP/err") ||
  fail "generation_config.json num_beams: $(cat "$TMP/err")"
[ "$(arr "$got" ids)" = "$(arr "$(head -1 "$FIX/expected_beams.jsonl")" ids)" ] ||
  fail "generation_config.json num_beams 3: ids $(arr "$got" ids)"
grep -q 'sampling: greedy, no-repeat-ngram-size 2, 3 beams, length-penalty 1, early-stopping false' "$TMP/err" ||
  fail "generation_config.json num_beams: stderr $(cat "$TMP/err")"
expect_error generate "give --temperature 0" --model "$FIX" --prompt "$prompt" --num-beams 2
expect_error generate "at most --num-beams (2)" --model "$FIX" --prompt "$prompt" --num-beams 2 \
  --temperature 0 --num-return-sequences 3
expect_error generate "--stop does not apply to beam search" --model "$FIX" --prompt "$prompt" \
  --num-beams 2 --temperature 0 --stop x
expect_error generate "--early-stopping soon: expected true, false or never" --model "$FIX" \
  --prompt "$prompt" --num-beams 2 --early-stopping soon
expect_error generate "--num-beams does not apply to --interactive" --model "$FIX" --interactive \
  --num-beams 2
echo "beam search: the best 2 of 3 beams equal transformers' (ids, scores, text)"

# --min-new-tokens: no EOS id before N new tokens. The model's generation_config.json makes its
# first greedy id an EOS id, so without the flag the completion ends there.
first=$(arr "$(cat "$FIX/expected.json")" ids | cut -d, -f1)
mkdir -p "$TMP/gcmin"
cp "$FIX"/config.json "$FIX"/model.safetensors "$FIX"/tokenizer.json "$TMP/gcmin/"
echo "{\"do_sample\": false, \"eos_token_id\": $first}" >"$TMP/gcmin/generation_config.json"
got=$("$QT" generate --model "$TMP/gcmin" --prompt "$prompt" --max-new-tokens 24 --json 2>/dev/null)
[ "$(arr "$got" ids)" = "$first" ] || fail "EOS $first first: ids $(arr "$got" ids)"
got=$("$QT" generate --model "$TMP/gcmin" --prompt "$prompt" --max-new-tokens 24 --min-new-tokens 4 \
  --json 2>"$TMP/err")
ids=$(arr "$got" ids)
[ "$(echo "$ids" | tr ',' '\n' | wc -l)" -ge 4 ] && [ "$(echo "$ids" | cut -d, -f1-3 | tr ',' '\n' | grep -cx "$first")" = 0 ] ||
  fail "--min-new-tokens 4 with EOS $first: ids $ids"
grep -q 'sampling: greedy, min-new-tokens 4,' "$TMP/err" || fail "--min-new-tokens: stderr $(cat "$TMP/err")"
echo "--min-new-tokens 4: no EOS in the first 4 ids ($ids)"

# generation_config.json's other processors reach the CLI: a one-id sequence_bias of +100 makes
# every greedy id that id, forced_eos_token_id makes the last one its id; a setting qtitan does
# not compute (guidance_scale) is named in a note.
mkdir -p "$TMP/gcproc"
cp "$FIX"/config.json "$FIX"/model.safetensors "$FIX"/tokenizer.json "$TMP/gcproc/"
echo '{"do_sample": false, "sequence_bias": [[[5], 100.0]], "forced_eos_token_id": 7, "guidance_scale": 1.5}' \
  >"$TMP/gcproc/generation_config.json"
got=$("$QT" generate --model "$TMP/gcproc" --prompt "$prompt" --max-new-tokens 6 --json 2>"$TMP/err") ||
  fail "generation_config.json processors: $(cat "$TMP/err")"
[ "$(arr "$got" ids)" = "5,5,5,5,5,7" ] || fail "sequence_bias and forced_eos_token_id: ids $(arr "$got" ids)"
grep -q 'sampling: greedy, 1 biased sequences, forced EOS ids at the end,' "$TMP/err" &&
  grep -q 'sets guidance_scale = 1.5, which qtitan does not apply' "$TMP/err" ||
  fail "generation_config.json processors: stderr $(cat "$TMP/err")"
echo "generation_config.json: sequence_bias and forced_eos_token_id applied, guidance_scale noted"

# --prompt-lookup: the same ids and text in fewer passes (cli_tiny's greedy text repeats one id),
# from the flag or generation_config.json's prompt_lookup_num_tokens; beams refuse it.
plain=$("$QT" generate --model "$FIX" --prompt "$prompt" --temperature 0 --max-new-tokens 24 --json 2>/dev/null)
look=$("$QT" generate --model "$FIX" --prompt "$prompt" --temperature 0 --max-new-tokens 24 --json \
  --prompt-lookup 6 2>"$TMP/err")
[ "$(echo "$look" | jq -c '[.ids, .text]')" = "$(echo "$plain" | jq -c '[.ids, .text]')" ] ||
  fail "--prompt-lookup 6: $look, without $plain"
grep -q 'prompt lookup: [1-9][0-9]* of [0-9]* candidate ids kept, [0-9]* passes after the prompts' "$TMP/err" ||
  fail "--prompt-lookup: stderr $(cat "$TMP/err")"
mkdir -p "$TMP/gclook"
cp "$FIX"/config.json "$FIX"/model.safetensors "$FIX"/tokenizer.json "$TMP/gclook/"
echo '{"do_sample": false, "prompt_lookup_num_tokens": 4, "max_matching_ngram_size": 1}' >"$TMP/gclook/generation_config.json"
look=$("$QT" generate --model "$TMP/gclook" --prompt "$prompt" --max-new-tokens 24 --json 2>"$TMP/err")
[ "$(echo "$look" | jq -c .ids)" = "$(echo "$plain" | jq -c .ids)" ] && grep -q 'prompt lookup: ' "$TMP/err" ||
  fail "generation_config.json prompt_lookup_num_tokens: $look $(cat "$TMP/err")"
kept=$(grep -o 'prompt lookup: [^,]*' "$TMP/err")
expect_error_in_log generate "prompt-lookup 4 does not apply to beam search (--num-beams 2) (it is the model's generation_config.json's)" \
  --model "$TMP/gclook" --prompt hi --num-beams 2
echo "--prompt-lookup: the same ids in fewer passes ($kept)"

# --assistant-model: the model drafting for itself keeps every draft, the same ids and text in
# fewer passes; a draft of another vocabulary, a draft beside --prompt-lookup, beams and
# --interactive are refused.
look=$("$QT" generate --model "$FIX" --prompt "$prompt" --temperature 0 --max-new-tokens 24 --json \
  --assistant-model "$FIX" --assistant-tokens 5 2>"$TMP/err") || fail "--assistant-model: $(cat "$TMP/err")"
[ "$(echo "$look" | jq -c '[.ids, .text]')" = "$(echo "$plain" | jq -c '[.ids, .text]')" ] ||
  fail "--assistant-model: $look, without $plain"
grep -q 'draft model: 18 of 18 candidate ids kept, 5 passes after the prompts' "$TMP/err" ||
  fail "--assistant-model: stderr $(cat "$TMP/err")"
expect_error generate "assistant-model $SRC/tests/fixtures/generate/dense_tied_gqa has a vocabulary of 96 ids and the model 608" \
  --model "$FIX" --prompt hi --assistant-model "$SRC/tests/fixtures/generate/dense_tied_gqa"
expect_error generate "assistant-model and --prompt-lookup 3 are two sources of candidates" \
  --model "$FIX" --prompt hi --assistant-model "$FIX" --prompt-lookup 3
expect_error generate "assistant-model does not apply to beam search" \
  --model "$FIX" --prompt hi --assistant-model "$FIX" --num-beams 2 --temperature 0
expect_error generate "assistant-model applies to --prompt, --prompt-file and --messages runs" \
  --model "$FIX" --interactive --assistant-model "$FIX"
echo "--assistant-model: the same ids, every draft of the model itself kept"

# --stop: the text ends before the stop string's first occurrence.
stop=${text:3:2}
cut=$("$QT" generate --model "$FIX" --prompt "$prompt" --temperature 0 --max-new-tokens 24 \
  --stop "$stop" --json 2>/dev/null)
echo "$cut" | grep -q '"finish_reason":"stop"' || fail "--stop '$stop': $cut"
plain=$("$QT" generate --model "$FIX" --prompt "$prompt" --temperature 0 --max-new-tokens 24 \
  --stop "$stop" 2>/dev/null)
[ "$plain" = "${text%%"$stop"*}" ] || fail "--stop '$stop' gave '$plain', want '${text%%"$stop"*}'"
echo "--stop '$stop': '$plain'"

# Seeded sampling reproduces; another seed differs somewhere over three prompts.
s1=$("$QT" generate --model "$FIX" --prompt-file "$TMP/prompts.txt" --temperature 1.2 --top-k 40 \
  --top-p 0.95 --min-p 0.01 --seed 5 --json 2>/dev/null)
s2=$("$QT" generate --model "$FIX" --prompt-file "$TMP/prompts.txt" --temperature 1.2 --top-k 40 \
  --top-p 0.95 --min-p 0.01 --seed 5 --json 2>/dev/null)
s3=$("$QT" generate --model "$FIX" --prompt-file "$TMP/prompts.txt" --temperature 1.2 --top-k 40 \
  --top-p 0.95 --min-p 0.01 --seed 6 --json 2>/dev/null)
[ "$s1" = "$s2" ] || fail "seed 5 gave two different results"
[ "$s1" != "$s3" ] || fail "seeds 5 and 6 gave the same results"
echo "seeded sampling reproduces"

# --num-return-sequences 3: each prompt's three completions, prompt by prompt, are those of the
# prompt file with each line written three times (the same batch positions, so the same
# streams), though each prompt is run once and its cache copied.
n3=$("$QT" generate --model "$FIX" --prompt-file "$TMP/prompts.txt" --temperature 1.2 --seed 5 \
  --max-new-tokens 12 --num-return-sequences 3 --json 2>"$TMP/n3.err") || fail "--num-return-sequences: $(cat "$TMP/n3.err")"
awk 'NF { for (k = 0; k < 3; k++) print }' "$TMP/prompts.txt" >"$TMP/prompts3.txt"
r3=$("$QT" generate --model "$FIX" --prompt-file "$TMP/prompts3.txt" --temperature 1.2 --seed 5 \
  --max-new-tokens 12 --json 2>"$TMP/r3.err") || fail "repeated prompts: $(cat "$TMP/r3.err")"
[ "$(echo "$n3" | wc -l)" = 9 ] && [ "$(echo "$n3" | jq -r .sequence | tr '\n' ' ')" = "1 2 3 1 2 3 1 2 3 " ] ||
  fail "--num-return-sequences 3 over 3 prompts: $n3"
[ "$(echo "$n3" | jq -c '[.prompt_ids, .ids, .logprobs]')" = "$(echo "$r3" | jq -c '[.prompt_ids, .ids, .logprobs]')" ] ||
  fail "--num-return-sequences differs from the prompts written three times"
[ "$(echo "$n3" | jq -c .ids | sort -u | wc -l)" -gt 3 ] || fail "the sampled sequences of a prompt are all alike"
p3=$(sed -n 's/^generate: prompt \([0-9]*\) tokens.*/\1/p' "$TMP/n3.err")
pr=$(sed -n 's/^generate: prompt \([0-9]*\) tokens.*/\1/p' "$TMP/r3.err")
[ -n "$p3" ] && [ "$((p3 * 3))" = "$pr" ] || fail "each prompt should run once: $p3 prompt tokens, $pr for the repeated file"
"$QT" generate --model "$FIX" --prompt "$prompt" --temperature 1 --max-new-tokens 4 --num-return-sequences 2 \
  >"$TMP/n2.txt" 2>/dev/null || fail "--num-return-sequences 2, text"
[ "$(grep -c '^--- prompt 1, sequence [12]$' "$TMP/n2.txt")" = 2 ] || fail "text output: $(cat "$TMP/n2.txt")"
expect_error generate "--num-return-sequences 2 needs sampling: greedy decoding (temperature 0) gives each prompt one completion" \
  --model "$FIX" --prompt hi --temperature 0 --num-return-sequences 2
expect_error generate "num-return-sequences 0: expected an integer >= 1" --model "$FIX" --prompt hi --num-return-sequences 0
expect_error generate "--num-return-sequences does not apply to --interactive" --model "$FIX" --interactive --num-return-sequences 2
echo "--num-return-sequences: each prompt's completions as its repeated lines', the prompt run once"

# generation_config.json gives the defaults transformers' generate() takes from it: with
# do_sample true its temperature / top_k / top_p / min_p / max_new_tokens /
# repetition_penalty are those of the explicit flags; flags win; do_sample false is greedy;
# what qtitan does not apply is noted.
cp -r "$FIX" "$TMP/gc"
printf '{"do_sample": true, "temperature": 1.2, "top_k": 40, "top_p": 0.95, "min_p": 0.01, "max_new_tokens": 9, "repetition_penalty": 1.05, "num_beams": 4}\n' \
  >"$TMP/gc/generation_config.json"
g1=$("$QT" generate --model "$TMP/gc" --prompt-file "$TMP/prompts.txt" --seed 5 --json 2>"$TMP/gc.err") ||
  fail "generate with generation_config.json: $(cat "$TMP/gc.err")"
g2=$("$QT" generate --model "$FIX" --prompt-file "$TMP/prompts.txt" --temperature 1.2 --top-k 40 \
  --top-p 0.95 --min-p 0.01 --max-new-tokens 9 --repetition-penalty 1.05 --seed 5 --json 2>/dev/null)
[ "$g1" = "$g2" ] || fail "generation_config.json's sampling is not that of the same flags"
grep -q "sampling: temperature 1.2, top-k 40, top-p 0.95, min-p 0.01, repetition-penalty 1.05, max-new-tokens 9 ($TMP/gc/generation_config.json, do_sample true" "$TMP/gc.err" ||
  fail "no sampling line: $(cat "$TMP/gc.err")"
grep -q "sets num_beams = 4, which qtitan does not apply" "$TMP/gc.err" ||
  fail "num_beams not noted: $(cat "$TMP/gc.err")"
g3=$("$QT" generate --model "$TMP/gc" --prompt-file "$TMP/prompts.txt" --temperature 0 --max-new-tokens 24 \
  --repetition-penalty 1 --json 2>/dev/null)
g4=$("$QT" generate --model "$FIX" --prompt-file "$TMP/prompts.txt" --temperature 0 --max-new-tokens 24 --json 2>/dev/null)
[ "$g3" = "$g4" ] || fail "flags do not win over generation_config.json"
printf '{"do_sample": false, "temperature": 0.7}\n' >"$TMP/gc/generation_config.json"
g5=$("$QT" generate --model "$TMP/gc" --prompt-file "$TMP/prompts.txt" --max-new-tokens 24 --json 2>/dev/null)
[ "$g5" = "$g4" ] || fail "do_sample false is not greedy"
printf '{"do_sample": "yes"}\n' >"$TMP/gc/generation_config.json"
expect_error generate "generation_config.json: \"do_sample\" must be true, false or null" --model "$TMP/gc" --prompt hi
echo "generation_config.json: its sampling defaults, flags over them, do_sample false greedy, bad values refused"

# Bad input: exit status non-zero and exactly one line on stderr, naming the problem.
long=$(for i in $(seq 300); do printf 'word '; done)
expect_error generate "exceeds the model's context of 256 positions" --model "$FIX" --prompt "$long"
printf '\n  \n\n' >"$TMP/empty.txt"
expect_error generate "empty.txt holds no prompt" --model "$FIX" --prompt-file "$TMP/empty.txt"
mkdir -p "$TMP/ckpt/step-3"
echo '{}' >"$TMP/ckpt/step-3/train_state.json"
expect_error generate "step-3 has no config.json" --checkpoint "$TMP/ckpt/step-3" --prompt hi
expect_error generate "chat" --model "$FIX" --prompt hi --chat
expect_error generate "temperature -1: must be >= 0" --model "$FIX" --prompt hi --temperature -1
expect_error generate "top-p 0: must be in (0, 1]" --model "$FIX" --prompt hi --top-p 0
expect_error generate "top-p 1.5: must be in (0, 1]" --model "$FIX" --prompt hi --top-p 1.5
expect_error generate "min-p 2: must be in \[0, 1\]" --model "$FIX" --prompt hi --min-p 2
expect_error generate "repetition-penalty 0: must be a number > 0" --model "$FIX" --prompt hi --repetition-penalty 0
expect_error generate "no-repeat-ngram-size -1: expected an integer >= 0" --model "$FIX" --prompt hi --no-repeat-ngram-size -1
expect_error generate "max-new-tokens 0: expected an integer >= 1" --model "$FIX" --prompt hi --max-new-tokens 0
expect_error generate "give one of --prompt" --model "$FIX"
expect_error generate "model directory $TMP/none does not exist" --model "$TMP/none" --prompt hi
expect_error generate "unknown option --bogus" --model "$FIX" --prompt hi --bogus 1
echo "e2e_generate: ok"
