#!/usr/bin/env bash
# What a hostile or careless user does to files, end to end (issue 18): a FIFO or a device
# where a file is expected, stdout on a full disk, an output onto one of the command's own
# inputs, an export over a folder holding other files, an overlong line, a batch whose size
# overflows, a hand-edited checkpoint state, two runs on one dump folder (or on one absolute
# checkpoint folder) and a run that died holding its lock, an earlier run's metrics, and
# temporaries left by dead and live writers. Every case ends in one "error: " sentence and a
# non-zero exit (rule in tests/qa_lib.sh) with nothing lost, or in a clean result.
#
# Runs against QT_BINARY, and again against QT_ASAN_BINARY when that names a sanitized build.
set -u
export LC_ALL=C
src=${QT_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
fix=$src/tests/fixtures
tmp=$(mktemp -d)
holder=
cleanup() {
    [ -z "$holder" ] || kill "$holder" 2>/dev/null
    [ -n "${QA_KEEP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT
# shellcheck source=tests/qa_lib.sh
. "$src/tests/qa_lib.sh"
export QT_CACHE_DIR=$tmp/cache

model=$fix/parity/untied_mha # vocab 80
tj=$fix/tokenizer/tiny_gpt2/tokenizer.json
printf '1 2 3\n4 5 6 7\n' >"$tmp/tokens.txt"
printf '{"text": "hello"}\n' >"$tmp/doc.jsonl"
mkfifo "$tmp/fifo" "$tmp/fifo.jsonl.gz"

# A model directory whose config.json, weights or index is a FIFO or a device.
mkdir -p "$tmp/m_fifo_cfg" "$tmp/m_dev_cfg" "$tmp/m_fifo_st" "$tmp/m_fifo_index"
for d in m_fifo_cfg m_dev_cfg m_fifo_st m_fifo_index; do cp "$model"/* "$tmp/$d/"; done
rm "$tmp/m_fifo_cfg/config.json" "$tmp/m_dev_cfg/config.json" "$tmp/m_fifo_st/model.safetensors"
mkfifo "$tmp/m_fifo_cfg/config.json" "$tmp/m_fifo_st/model.safetensors" \
    "$tmp/m_fifo_index/model.safetensors.index.json"
ln -s /dev/zero "$tmp/m_dev_cfg/config.json"
# Tokenizers with an empty vocabulary and with an empty token: clean results, and under the
# sanitizers no memcpy from a NULL buffer.
bl='"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
"decoder": {"type": "ByteLevel", "add_prefix_space": true, "use_regex": true}'
printf '{%s, "model": {"type": "BPE", "vocab": {}, "merges": []}}' "$bl" >"$tmp/empty_vocab.json"
printf '{%s, "model": {"type": "BPE", "vocab": {"": 0, "a": 1}, "merges": []}}' "$bl" \
    >"$tmp/empty_token.json"
printf '0 0 1\n\n' >"$tmp/ids_empty.txt"
mkdir "$tmp/tok_fifo"
mkfifo "$tmp/tok_fifo/tokenizer.json"

# A tiny corpus, tokenizer and training run shared by the checkpoint, lock and metrics cases.
awk -v docs=60 -v seed=5 -f "$src/scripts/gen_corpus.awk" >"$tmp/corpus.jsonl"
"${QT_BINARY:-$src/build/qtitan}" tokenizer-train --input "$tmp/corpus.jsonl" --vocab-size 300 \
    --output "$tmp/tok" >/dev/null 2>&1
train_args() { # DUMP_FOLDER STEPS [more]
    printf '%s\n' train --config "$src/configs/debug.toml" --model.tokenizer_path="$tmp/tok" \
        --training.dataset_path="$tmp/corpus.jsonl" --model.vocab_size=320 --model.dim=32 \
        --model.n_layers=1 --model.n_heads=4 --model.n_kv_heads=2 --model.head_dim=8 \
        --model.hidden_dim=64 --training.seq_len=32 --training.local_batch_size=2 \
        --lr_scheduler.warmup_steps=1 --metrics.peak_tflops=1 --job.dump_folder="$1" \
        --training.steps="$2" "${@:3}"
}

# full NAME ARGS...: stdout on /dev/full must be an error, not exit 0 with the output lost.
full() {
    local name=$1
    shift
    timeout 20 "$bin" "$@" >/dev/full 2>"$tmp/$name.all" </dev/null
    rc=$?
    # Commands whose stdout is their result (eval, generate) log info lines to stderr: those
    # before the error are theirs; the sentence and anything after it must be one line.
    sed -n '/^error: /,$p' "$tmp/$name.all" >"$tmp/$name.err"
    if [ "$rc" -ne 1 ]; then
        qa_fail "$name" "exit $rc with stdout on /dev/full, expected 1"
        return
    fi
    qa_error "$name" "stdout"
}

# same NAME A B: files A and B hold the same bytes (an input survived).
same() { cmp -s "$2" "$3" || qa_fail "$1" "$2 was changed"; }

run_all() {
    local r=$tmp/run.$1
    # ---- special files: refused before any read can block, naming the file ----
    qa_expect_error fifo_config fail "$tmp/fifo|FIFO" train --config "$tmp/fifo"
    qa_expect_error fifo_shard fail "$tmp/fifo|FIFO" inspect "$tmp/fifo"
    qa_expect_error fifo_cfg_json fail "$tmp/m_fifo_cfg/config.json|FIFO" inspect "$tmp/m_fifo_cfg"
    qa_expect_error fifo_eval_cfg fail "$tmp/m_fifo_cfg/config.json|FIFO" \
        eval --model "$tmp/m_fifo_cfg" --tokens "$tmp/tokens.txt"
    qa_expect_error fifo_eval_st fail "$tmp/m_fifo_st/model.safetensors|FIFO" \
        eval --model "$tmp/m_fifo_st" --tokens "$tmp/tokens.txt"
    qa_expect_error fifo_index fail "model.safetensors.index.json|FIFO" inspect "$tmp/m_fifo_index"
    qa_expect_error fifo_tokens fail "$tmp/fifo|FIFO" eval --model "$model" --tokens "$tmp/fifo"
    qa_expect_error fifo_tokenizer fail "$tmp/tok_fifo/tokenizer.json|FIFO" \
        tokenize --tokenizer "$tmp/tok_fifo" --input "$tmp/doc.jsonl"
    qa_expect_error fifo_input fail "$tmp/fifo|FIFO" tokenize --tokenizer "$tj" --input "$tmp/fifo"
    # Compressed inputs are opened the same way (core/zread.c).
    qa_expect_error fifo_gz_input fail "$tmp/fifo.jsonl.gz|FIFO" \
        tokenize --tokenizer "$tj" --input "$tmp/fifo.jsonl.gz"
    qa_expect_error fifo_gz_toktrain fail "$tmp/fifo.jsonl.gz|FIFO" \
        tokenizer-train --input "$tmp/fifo.jsonl.gz" --vocab-size 300 --output "$tmp/tok_gz_out"
    qa_expect_error dev_cfg_json fail "$tmp/m_dev_cfg/config.json|device" inspect "$tmp/m_dev_cfg"
    qa_expect_error dev_tokens fail "/dev/zero|device" eval --model "$model" --tokens /dev/zero
    qa_expect_error dev_input fail "/dev/zero|device" tokenize --tokenizer "$tj" --input /dev/zero

    # ---- every write to stdout is checked ----
    full full_eval eval --model "$model" --tokens "$tmp/tokens.txt"
    full full_inspect inspect "$model"
    full full_plan plan --config "$src/configs/debug.toml" --training.dataset_path="$tmp/corpus.jsonl"
    full full_tokenize tokenize --tokenizer "$tj" --input "$tmp/doc.jsonl"

    # ---- no command writes over one of its inputs (same file under another name) ----
    local m=$tmp/model.$1
    rm -rf "$m"
    cp -r "$model" "$m"
    ln "$m/model.safetensors" "$m/alias.safetensors"
    cp "$tmp/tokens.txt" "$tmp/tokens.keep"
    qa_expect_error dump_over_weights fail "--dump-logits|$m/model.safetensors" \
        eval --model "$m" --tokens "$tmp/tokens.txt" --dump-logits "$m/alias.safetensors"
    same dump_over_weights "$model/model.safetensors" "$m/model.safetensors"
    qa_expect_error dump_over_tokens fail "--dump-logits|tokens.txt" \
        eval --model "$m" --tokens "$tmp/tokens.txt" --dump-logits "$tmp/./tokens.txt"
    same dump_over_tokens "$tmp/tokens.keep" "$tmp/tokens.txt"
    cp "$tj" "$tmp/tok.$1.json"
    qa_expect_error output_over_tokenizer fail "--output|--tokenizer" \
        tokenize --tokenizer "$tmp/tok.$1.json" --input "$tmp/doc.jsonl" --output "$tmp/tok.$1.json"
    same output_over_tokenizer "$tj" "$tmp/tok.$1.json"
    # tokenizer-train writes fixed names into --output: an input by one of them is refused.
    mkdir -p "$tmp/tt.$1"
    cp "$tmp/doc.jsonl" "$tmp/tt.$1/tokenizer.json"
    qa_expect_error toktrain_over_input fail "--output|$tmp/tt.$1/tokenizer.json|--input" \
        tokenizer-train --input "$tmp/tt.$1/tokenizer.json" --vocab-size 300 --output "$tmp/tt.$1/."
    same toktrain_over_input "$tmp/doc.jsonl" "$tmp/tt.$1/tokenizer.json"
    qa_run empty_vocab 0 tokenize --tokenizer "$tmp/empty_vocab.json" --input "$tmp/doc.jsonl"
    qa_run empty_token 0 tokenize --tokenizer "$tmp/empty_token.json" --input "$tmp/doc.jsonl"
    qa_run empty_token_decode 0 tokenize --tokenizer "$tmp/empty_token.json" --decode \
        --input "$tmp/ids_empty.txt"
    qa_expect_error line_cap fail "$tmp/long.jsonl:2|100-byte" \
        tokenize --tokenizer "$tj" --input "$tmp/long.jsonl" --max-line-bytes 100

    # ---- size arithmetic on the user's numbers ----
    qa_expect_error plan_overflow fail "training.local_batch_size|tokens per micro-batch" \
        plan --config "$src/configs/debug.toml" --training.dataset_path="$tmp/corpus.jsonl" \
        --training.local_batch_size=2147483647 --training.seq_len=16777216 \
        --model.max_seq_len=16777216

    # ---- training: a checkpoint with a hand-edited state, exports, metrics, the lock ----
    mapfile -t args < <(train_args "$r" 2 --checkpoint.enable=true --checkpoint.interval=1)
    qa_run train_first 0 "${args[@]}" || return
    local state=$r/checkpoint/step-2/train_state.json
    sed -i 's/"step": 2,/"step": 7,/' "$state"
    mapfile -t args < <(train_args "$r" 3 --checkpoint.enable=true --checkpoint.interval=1)
    qa_run train_edited_state 0 "${args[@]}" &&
        { grep -q "skipping incomplete $r/checkpoint/step-2: .*edited or corrupted" \
            "$tmp/train_edited_state.err" && grep -q "resumed from .*step-1 (step 1)" \
            "$tmp/train_edited_state.out"; } ||
        qa_fail train_edited_state "the edited step-2 was not skipped for step 1"
    # Resuming into another model is refused before the model is allocated: the 4B flavor's
    # shapes (some 64 GB with its optimizer) against this run's checkpoint.
    mapfile -t args < <(train_args "$r" 4 --checkpoint.enable=true --model.flavor=4B \
        --model.dim=2560 --model.n_layers=36 --model.hidden_dim=9728 --model.n_heads=32 \
        --model.n_kv_heads=8 --model.head_dim=128)
    qa_expect_error resume_other_model fail \
        "checkpoint to resume, $r/checkpoint/step-3/model.safetensors, holds tok_embeddings.weight with shape (320, 32) but the job's model has (320, 2560)" \
        "${args[@]}"
    # A fresh run (no checkpoint) on the same folder keeps the earlier metrics.
    cp "$r/metrics.jsonl" "$tmp/metrics.keep"
    mapfile -t args < <(train_args "$r" 1)
    qa_run train_fresh 0 "${args[@]}" && same train_fresh "$tmp/metrics.keep" "$r/metrics.1.jsonl"
    # export --out into a folder holding something else refuses and keeps it; "DIR/" works.
    mkdir -p "$tmp/out.$1"
    echo notes >"$tmp/out.$1/README.md"
    echo '{}' >"$tmp/out.$1/config.json"
    qa_expect_error export_keeps fail "README.md" \
        export --checkpoint "$r/checkpoint" --out "$tmp/out.$1"
    [ -f "$tmp/out.$1/README.md" ] || qa_fail export_keeps "README.md was deleted"
    qa_run export_slash 0 export --checkpoint "$r/checkpoint" --out "$tmp/hf.$1/" &&
        [ -f "$tmp/hf.$1/config.json" ] || qa_fail export_slash "no export in $tmp/hf.$1"
    # Temporaries of an export and of an atomic write left by a process that is gone are
    # removed by the next write of the same path; a live process's are kept (a write in
    # progress). 999999999 is above any pid_max.
    mkdir -p "$tmp/hf.$1.tmp-999999999-0" "$tmp/hf.$1.tmp-$$-7"
    echo partial >"$tmp/hf.$1.tmp-999999999-0/model.safetensors"
    qa_run export_stale 0 export --checkpoint "$r/checkpoint" --out "$tmp/hf.$1"
    [ ! -e "$tmp/hf.$1.tmp-999999999-0" ] || qa_fail export_stale "a dead process's temporary was left"
    [ -d "$tmp/hf.$1.tmp-$$-7" ] || qa_fail export_stale "a live process's temporary was removed"
    grep -q "removing $tmp/hf.$1.tmp-999999999-0, left by an interrupted write" \
        "$tmp/export_stale.err" || qa_fail export_stale "no notice naming the removed temporary"
    rmdir "$tmp/hf.$1.tmp-$$-7"
    mkdir -p "$tmp/tt.$1"
    echo '{' >"$tmp/tt.$1/tokenizer.json.tmp-999999999-3"
    qa_run write_stale 0 tokenizer-train --input "$tmp/corpus.jsonl" --vocab-size 300 \
        --output "$tmp/tt.$1"
    [ ! -e "$tmp/tt.$1/tokenizer.json.tmp-999999999-3" ] && [ -s "$tmp/tt.$1/tokenizer.json" ] ||
        qa_fail write_stale "a dead process's temporary of tokenizer.json was left"
    # A second run on a folder whose lock is held is refused; a dead holder's lock is taken.
    (
        exec 9>>"$r/.qtitan.lock"
        flock 9
        exec sleep 60
    ) &
    holder=$!
    for _ in $(seq 50); do
        flock -n "$r/.qtitan.lock" true 2>/dev/null || break
        sleep 0.1
    done
    mapfile -t args < <(train_args "$r" 4 --checkpoint.enable=true)
    qa_expect_error lock_held fail "$r|in use by another training run" "${args[@]}"
    kill "$holder"
    wait "$holder" 2>/dev/null
    holder=
    echo "pid 999999999 on elsewhere" >"$r/.qtitan.lock"
    qa_run lock_stale 0 "${args[@]}" &&
        grep -q "taking over the lock left by pid 999999999 on elsewhere" "$tmp/lock_stale.err" ||
        qa_fail lock_stale "no notice that a dead run's lock was taken over"
    [ ! -s "$r/.qtitan.lock" ] || qa_fail lock_stale "the lock file was not emptied on exit"
    # An absolute checkpoint.folder has a lock of its own: a second run with its own dump
    # folder but the same checkpoint folder is refused while the first holds it, then runs.
    local ck=$tmp/shared_ck.$1
    mkdir -p "$ck"
    (
        exec 9>>"$ck/.qtitan.lock"
        flock 9
        exec sleep 60
    ) &
    holder=$!
    for _ in $(seq 50); do
        flock -n "$ck/.qtitan.lock" true 2>/dev/null || break
        sleep 0.1
    done
    mapfile -t args < <(train_args "$r.other" 1 --checkpoint.enable=true --checkpoint.folder="$ck")
    qa_expect_error ckpt_lock_held fail "checkpoint.folder $ck is in use by another training run" \
        "${args[@]}"
    kill "$holder"
    wait "$holder" 2>/dev/null
    holder=
    qa_run ckpt_lock_free 0 "${args[@]}" && [ -d "$ck/step-1" ] && [ ! -s "$ck/.qtitan.lock" ] ||
        qa_fail ckpt_lock_free "no step-1 in $ck, or its lock file was not emptied on exit"
}

{
    printf '{"text": "short"}\n{"text": "'
    printf '%*s' 1000 '' | tr ' ' x
    printf '"}\n'
} >"$tmp/long.jsonl"

bin=${QT_BINARY:-$src/build/qtitan}
run_all plain
if [ -n "${QT_ASAN_BINARY:-}" ]; then
    if [ -x "$QT_ASAN_BINARY" ]; then
        echo "e2e_hostile: again under $QT_ASAN_BINARY"
        bin=$QT_ASAN_BINARY
        run_all asan
    else
        qa_fail asan "QT_ASAN_BINARY=$QT_ASAN_BINARY is not an executable"
    fi
fi
qa_finish e2e_hostile
