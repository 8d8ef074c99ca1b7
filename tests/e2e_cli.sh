#!/usr/bin/env bash
# The command line's contract (rule in tests/qa_lib.sh): `--version`, `--help` for the program
# and for every command it lists (exit 0, usage on stdout, nothing on stderr), and for every
# command an unknown option, a missing required option, an option without its value and a
# missing input file: one "error: " line naming the option or file, exit 2 for usage errors,
# never a signal, hang or sanitizer report. QT_BINARY may point to a sanitized build.
# A command that still answers "not built yet" is skipped (listed on stdout).
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

# stub NAME: the command is not built yet (its run NAME said so).
stub() { grep -q 'not built yet' "$tmp/$1.err"; }

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
    qa_run "${n}_unknown" 2 "$c" --no-such-option
    if stub "${n}_unknown"; then
        echo "SKIP $c: not built yet"
        continue
    fi
    qa_error "${n}_unknown" "--no-such-option"
    qa_expect_error "${n}_stray" 2 "" "$c" --no-such-option=1 stray-argument
done

# case NAME WANT TEXTS ARGS...: as qa_expect_error, skipped when the command is a stub.
case_() {
    local name=$1 want=$2 texts=$3
    shift 3
    qa_run "$name" "$want" "$@"
    stub "$name" && return 0
    local -a list=()
    [ -z "$texts" ] || IFS='|' read -ra list <<<"$texts"
    qa_error "$name" "${list[@]}"
}

model=$fix/parity/untied_mha
tok=$fix/tokenizer/tiny_gpt2
printf '{"text": "hello"}\n' >"$tmp/doc.jsonl"
printf 'hello world\n' >"$tmp/corpus.txt"

# Missing required options and options without their value: usage errors.
case_ train_noval 2 "--config" train --config
case_ train_badkey 2 "no_such_key" train --training.no_such_key=1
case_ eval_notokens 2 "--tokens" eval --model "$model"
case_ eval_nomodel 2 "--model" eval --tokens "$model/tokens.txt"
case_ eval_noval 2 "--tokens" eval --model "$model" --tokens
case_ tokenize_notok 2 "--tokenizer" tokenize --input "$tmp/doc.jsonl"
case_ tokenize_noval 2 "--input" tokenize --tokenizer "$tok" --input
case_ tokenize_threads 2 "--threads" tokenize --tokenizer "$tok" --threads zero
case_ toktrain_novocab 2 "--vocab-size" tokenizer-train --input "$tmp/corpus.txt" --output "$tmp/t"
case_ toktrain_noval 2 "--output" tokenizer-train --input "$tmp/corpus.txt" --vocab-size 300 --output
case_ inspect_nopath 2 "PATH" inspect
case_ inspect_two 2 "" inspect a b
case_ export_nockpt 2 "--checkpoint" export --out "$tmp/hf"
case_ export_noval 2 "--out" export --checkpoint "$tmp" --out
case_ verify_noval 2 "--config" verify-kernels --config
case_ plan_noval 2 "--config" plan --config

# Input files that do not exist, or are directories: one sentence naming the path.
case_ train_nofile fail "$nope.toml" train --config "$nope.toml"
case_ train_dirfile fail "$tmp" train --config "$tmp"
case_ eval_nomodeldir fail "$nope" eval --model "$nope" --tokens "$model/tokens.txt"
case_ eval_notokfile fail "$nope.txt" eval --model "$model" --tokens "$nope.txt"
case_ eval_dirtokens fail "$tmp" eval --model "$model" --tokens "$tmp"
case_ tokenize_nofile fail "$nope.json" tokenize --tokenizer "$nope.json"
case_ tokenize_noinput fail "$nope.jsonl" tokenize --tokenizer "$tok" --input "$nope.jsonl"
case_ tokenize_dirinput fail "$tmp" tokenize --tokenizer "$tok" --input "$tmp"
case_ toktrain_noinput fail "$nope.txt" tokenizer-train --input "$nope.txt" --vocab-size 300 \
    --output "$tmp/t"
case_ inspect_nofile fail "$nope.safetensors" inspect "$nope.safetensors"
case_ export_nofile fail "$nope" export --checkpoint "$nope" --out "$tmp/hf"
case_ verify_nofile fail "$nope.toml" verify-kernels --config "$nope.toml"
case_ plan_nofile fail "$nope.toml" plan --config "$nope.toml"

qa_finish e2e_cli
