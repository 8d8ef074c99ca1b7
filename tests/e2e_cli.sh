#!/usr/bin/env bash
# The command line's contract (rule in tests/qa_lib.sh): `--version`, `--help` for the program
# and for every command it lists (exit 0, usage on stdout, nothing on stderr), and for every
# command an unknown option, a missing required option, an option without its value and a
# missing input file: one "error: " line naming the option or file, exit 2 for usage errors,
# never a signal, hang or sanitizer report. QT_BINARY may point to a sanitized build.
# Every command the help lists must be built: one that answers "not built yet" fails here.
set -u
src=${QT_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
bin=${QT_BINARY:-$src/build/qtitan}
fix=$src/tests/fixtures
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=tests/qa_lib.sh
. "$src/tests/qa_lib.sh"
nope=$tmp/does-not-exist

# Program level.
if qa_run version 0 --version; then
    grep -qE '^qtitan [0-9]+\.[0-9]+' "$tmp/version.out" || qa_fail version "no 'qtitan X.Y' line"
fi
qa_run help 0 --help && grep -q '^usage: qtitan <command>' "$tmp/help.out" ||
    qa_fail help "no usage line on stdout"
qa_run help_h 0 -h
qa_expect_error unknown_command 2 "frobnicate" frobnicate
qa_expect_error unknown_global_option 2 "--frobnicate" --frobnicate
if qa_run no_args 2; then
    grep -q '^usage: qtitan' "$tmp/no_args.err" || qa_fail no_args "no usage on stderr"
fi

# Every command the help lists.
commands=$(sed -n '/^commands:/,/^$/p' "$tmp/help.out" | awk 'NF >= 2 {print $1}')
for want in train eval tokenize inspect export verify-kernels; do
    echo "$commands" | grep -qx -- "$want" || qa_fail help "command '$want' is not listed"
done

for c in $commands; do
    n=${c//-/_}
    if qa_run "${n}_help" 0 "$c" --help; then
        head -1 "$tmp/${n}_help.out" | grep -q "^usage: qtitan $c" ||
            qa_fail "${n}_help" "stdout does not start with 'usage: qtitan $c'"
        [ -s "$tmp/${n}_help.err" ] && qa_fail "${n}_help" "--help wrote to stderr"
        # A page the help points to is in the repository.
        for page in $(grep -oE '[A-Za-z_/]+\.md' "$tmp/${n}_help.out"); do
            [ -f "$src/$page" ] || qa_fail "${n}_help" "points to $page, which is not in the repository"
        done
    fi
    qa_run "${n}_h" 0 "$c" -h
    qa_expect_error "${n}_unknown" 2 "--no-such-option" "$c" --no-such-option
    qa_expect_error "${n}_stray" 2 "" "$c" --no-such-option=1 stray-argument
done

model=$fix/parity/untied_mha
tok=$fix/tokenizer/tiny_gpt2
printf '{"text": "hello"}\n' >"$tmp/doc.jsonl"
printf 'hello world\n' >"$tmp/corpus.txt"

# Missing required options and options without their value: usage errors.
qa_expect_error train_noval 2 "--config" train --config
qa_expect_error train_badkey 2 "no_such_key" train --training.no_such_key=1
qa_expect_error eval_notokens 2 "--tokens" eval --model "$model"
qa_expect_error eval_nomodel 2 "--model" eval --tokens "$model/tokens.txt"
qa_expect_error eval_noval 2 "--tokens" eval --model "$model" --tokens
qa_expect_error tokenize_notok 2 "--tokenizer" tokenize --input "$tmp/doc.jsonl"
qa_expect_error tokenize_noval 2 "--input" tokenize --tokenizer "$tok" --input
qa_expect_error tokenize_threads 2 "--threads" tokenize --tokenizer "$tok" --threads zero
# The output is not the input: opening it would empty the input, with exit 0.
cp "$tmp/doc.jsonl" "$tmp/same.jsonl"
qa_expect_error tokenize_same_file 2 "--output $tmp/same.jsonl is the --input file" tokenize \
    --tokenizer "$tok" --input "$tmp/same.jsonl" --output "$tmp/same.jsonl"
cmp -s "$tmp/doc.jsonl" "$tmp/same.jsonl" || qa_fail tokenize_same_file "the input was changed"
# The same when standard input is redirected from the --output file.
"$bin" tokenize --tokenizer "$tok" --output "$tmp/same.jsonl" <"$tmp/same.jsonl" \
    >/dev/null 2>"$tmp/stdin_same.err"
[ $? = 2 ] && grep -qF -- "--output $tmp/same.jsonl is the standard input file" "$tmp/stdin_same.err" ||
    qa_fail tokenize_stdin_same "expected exit 2 naming standard input: $(cat "$tmp/stdin_same.err")"
cmp -s "$tmp/doc.jsonl" "$tmp/same.jsonl" || qa_fail tokenize_stdin_same "the input was changed"
qa_expect_error toktrain_novocab 2 "--vocab-size" tokenizer-train --input "$tmp/corpus.txt" --output "$tmp/t"
qa_expect_error toktrain_noval 2 "--output" tokenizer-train --input "$tmp/corpus.txt" --vocab-size 300 --output
qa_expect_error inspect_nopath 2 "PATH" inspect
qa_expect_error inspect_two 2 "" inspect a b
qa_expect_error export_nockpt 2 "--checkpoint" export --out "$tmp/hf"
qa_expect_error export_noval 2 "--out" export --checkpoint "$tmp" --out
qa_expect_error verify_noval 2 "--config" verify-kernels --config
qa_expect_error plan_noval 2 "--config" plan --config
# The step-time model's options (plan --cluster).
dbg=$src/configs/debug.toml
qa_expect_error plan_cluster_bad 2 "--cluster 2y8|HOSTSxGPUS" plan --config "$dbg" --cluster 2y8
qa_expect_error plan_cluster_zero 2 "--cluster 0x8" plan --config "$dbg" --cluster 0x8
qa_expect_error plan_cluster_noval 2 "--cluster" plan --config "$dbg" --cluster
qa_expect_error plan_flops_nobw 2 "--intra-bw|--inter-bw" plan --config "$dbg" --cluster 1x8 --flops 989
qa_expect_error plan_flops_text 2 "--flops fast" plan --config "$dbg" --cluster 1x8 --flops fast \
    --intra-bw 450 --inter-bw 400
qa_expect_error plan_eff_range 2 "--eff 2" plan --config "$dbg" --cluster 1x2 --eff 2
qa_expect_error plan_gather_dtype 2 "--gather-dtype fp8" plan --config "$dbg" --cluster 1x2 \
    --gather-dtype fp8
qa_expect_error plan_no_cluster 2 "--cluster HOSTSxGPUS" plan --config "$dbg" --flops 10
qa_expect_error plan_cluster_mesh 1 "1 x 1 x 4 = 4 does not match the cluster's 2 ranks" plan \
    --config "$dbg" --cluster 1x2 --parallelism.tensor_parallel_degree=4 \
    --parallelism.data_parallel_shard_degree=1
qa_expect_error plot_norun 2 "no RUN_DIR" plot
qa_expect_error plot_noval 2 "--out" plot "$tmp" --out
qa_expect_error train_twoconfigs 2 "--config is given twice" train --config "$nope.toml" \
    --config="$nope.toml"
# Option values must be whole numbers in range, and special tokens distinct and non-empty.
qa_expect_error toktrain_vocab_suffix 2 "--vocab-size|300x" tokenizer-train \
    --input "$tmp/corpus.txt" --vocab-size 300x --output "$tmp/t"
qa_expect_error toktrain_vocab_zero 2 "--vocab-size|\"0\"" tokenizer-train \
    --input "$tmp/corpus.txt" --vocab-size 0 --output "$tmp/t"
qa_expect_error toktrain_minfreq 2 "--min-frequency|-1" tokenizer-train \
    --input "$tmp/corpus.txt" --vocab-size 300 --min-frequency -1 --output "$tmp/t"
qa_expect_error toktrain_empty_special 2 "--special" tokenizer-train --input "$tmp/corpus.txt" \
    --vocab-size 300 --special "" --output "$tmp/t"
qa_expect_error toktrain_dup_special 2 '--special "<a>" is given twice' tokenizer-train \
    --input "$tmp/corpus.txt" --vocab-size 300 --special "<a>" --special "<a>" --output "$tmp/t"
[ -e "$tmp/t" ] && qa_fail toktrain_rejected "a rejected tokenizer-train wrote $tmp/t"

# Input files that do not exist, or are directories: one sentence naming the path.
qa_expect_error train_nofile fail "$nope.toml" train --config "$nope.toml"
qa_expect_error train_dirfile fail "$tmp" train --config "$tmp"
qa_expect_error eval_nomodeldir fail "$nope" eval --model "$nope" --tokens "$model/tokens.txt"
qa_expect_error eval_notokfile fail "$nope.txt" eval --model "$model" --tokens "$nope.txt"
qa_expect_error eval_dirtokens fail "$tmp" eval --model "$model" --tokens "$tmp"
qa_expect_error tokenize_nofile fail "$nope.json" tokenize --tokenizer "$nope.json"
qa_expect_error tokenize_noinput fail "$nope.jsonl" tokenize --tokenizer "$tok" --input "$nope.jsonl"
qa_expect_error tokenize_dirinput fail "$tmp" tokenize --tokenizer "$tok" --input "$tmp"
qa_expect_error toktrain_noinput fail "$nope.txt" tokenizer-train --input "$nope.txt" --vocab-size 300 \
    --output "$tmp/t"
qa_expect_error inspect_nofile fail "$nope.safetensors" inspect "$nope.safetensors"
qa_expect_error export_nofile fail "$nope" export --checkpoint "$nope" --out "$tmp/hf"
# A --tokenizer directory without tokenizer.json once gave an HF directory with no tokenizer.
mkdir "$tmp/notok"
qa_expect_error export_notokjson fail "$tmp/notok|tokenizer.json" export --checkpoint "$nope" \
    --out "$tmp/hf" --tokenizer "$tmp/notok"
qa_expect_error verify_nofile fail "$nope.toml" verify-kernels --config "$nope.toml"
qa_expect_error plan_nofile fail "$nope.toml" plan --config "$nope.toml"

qa_finish e2e_cli
