#!/usr/bin/env bash
# End-to-end test of `qtitan inspect`: a safetensors file, clean HF directories written by
# transformers (tests/fixtures/hf_tiny, from tools/make_hf_tiny_fixture.py), directories whose
# config.json was edited so that keys go missing, become unexpected or change shape, and
# broken inputs that must give one error sentence and exit 1, never a crash.
set -u
src=${QT_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
bin=${QT_BINARY:-$src/build/qtitan}
fix=$src/tests/fixtures
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

# run NAME WANT_RC: runs qtitan inspect with the remaining args, keeps stdout/stderr.
run() {
    local name=$1 want=$2
    shift 2
    "$bin" inspect "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
    local rc=$?
    if [ "$rc" -ne "$want" ]; then
        echo "FAIL $name: exit $rc, expected $want"
        cat "$tmp/$name.out" "$tmp/$name.err"
        fails=$((fails + 1))
    fi
}
# expect NAME STREAM TEXT: the stream (out|err) of run NAME contains TEXT.
expect() {
    if ! grep -qF -- "$3" "$tmp/$1.$2"; then
        echo "FAIL $1: std$2 lacks '$3'"
        cat "$tmp/$1.$2"
        fails=$((fails + 1))
    fi
}
# one_sentence NAME: stderr is exactly one line starting with "error: ".
one_sentence() {
    if [ "$(wc -l <"$tmp/$1.err")" -ne 1 ] || ! grep -q '^error: ' "$tmp/$1.err"; then
        echo "FAIL $1: stderr is not one error sentence"
        cat "$tmp/$1.err"
        fails=$((fails + 1))
    fi
}
# variant NAME FIXTURE SED: a copy of a fixture directory with config.json edited.
variant() {
    cp -r "$fix/hf_tiny/$2" "$tmp/$1"
    sed -i -e "$3" "$tmp/$1/config.json"
}

run file 0 "$fix/safetensors/py_written.safetensors"
expect file out "model.embed_tokens.weight"
expect file out "BF16  [4, 3]"
expect file out "9 tensors in 1 file, 93 bytes"

run dense 0 "$fix/hf_tiny/dense_tied"
expect dense out "Qwen3ForCausalLM, dim 16, 2 layers"
expect dense out "ok: all 24 tensors"
run moe 0 "$fix/hf_tiny/moe_sharded"
expect moe out "experts 4, top_k 2"
expect moe out "(model-00003-of-00003.safetensors)"
expect moe out "ok: all 45 tensors"
# A scaled RoPE is named with what decides it (1 + 0.1 ln 4 = 1.139); plain RoPE is not.
run yarn 0 "$fix/parity/yarn_tied"
expect yarn out "rope: theta 10000, yarn, factor 4 over 8 positions, attention factor 1.139"
if grep -q "rope:" "$tmp/dense.out"; then echo "FAIL dense: plain RoPE described"; fails=$((fails + 1)); fi
# Some layers dense (decoder_sparse_step 2 over 4 layers: 1 and 3 are MoE).
run moe_sparse 0 "$fix/moe_parity/sparse_step2_nonorm"
expect moe_sparse out "dense FFN layers (2): 0 2"
expect moe_sparse out "ok: all"

expect dense out "tokenizer: none (no tokenizer.json"
# What generate and chat data will find beside the weights: the tokenizer, the chat format
# (here the Qwen3 Instruct-2507 template in chat_template.jinja) and generation_config.json.
qwen=${QT_SHARED_DIR:-$src/../shared}/tokenizers/qwen3
if [ -f "$qwen/tokenizer.json" ]; then
    cp -r "$fix/hf_tiny/dense_tied" "$tmp/chat"
    cp "$qwen/tokenizer.json" "$qwen/tokenizer_config.json" "$tmp/chat/"
    cp "$fix/chat/templates/qwen3_2507_instruct.jinja" "$tmp/chat/chat_template.jinja"
    printf '{"do_sample": true, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05, "num_beams": 2}\n' \
        >"$tmp/chat/generation_config.json"
    run chat 0 "$tmp/chat"
    expect chat out "tokenizer: 151669 tokens"
    expect chat out "chat format: qwen3-2507-instruct (no thinking switch)"
    expect chat out "generation_config.json: sampling with temperature 0.7, top-k 20, top-p 0.8, min-p 0, repetition-penalty 1.05; not applied: num_beams = 2"
    echo '{{ messages }}' >"$tmp/chat/chat_template.jinja"
    run chat_unknown 0 "$tmp/chat"
    expect chat_unknown out "chat format: none: $tmp/chat/chat_template.jinja: the chat template (15 bytes, hash"
    echo "inspect: tokenizer, chat format and generation_config.json reported"
fi

variant missing dense_tied 's/"num_hidden_layers": 2/"num_hidden_layers": 3/'
run missing 1 "$tmp/missing"
expect missing out "missing (11):"
expect missing out "model.layers.2.self_attn.q_proj.weight (expected [32, 16])"
expect missing err "11 missing, 0 unexpected, 0 wrong"
one_sentence missing

variant unexpected dense_tied 's/"num_hidden_layers": 2/"num_hidden_layers": 1/'
run unexpected 1 "$tmp/unexpected"
expect unexpected out "unexpected (11):"
expect unexpected out "model.layers.1.mlp.down_proj.weight [16, 24]"
one_sentence unexpected

variant misshaped dense_tied 's/"intermediate_size": 24/"intermediate_size": 20/'
run misshaped 1 "$tmp/misshaped"
expect misshaped out "wrong shape or dtype (6):"
expect misshaped out "model.layers.0.mlp.gate_proj.weight: shape [24, 16], expected [20, 16]"
one_sentence misshaped

variant untied dense_tied 's/"tie_word_embeddings": true/"tie_word_embeddings": false/'
run untied 1 "$tmp/untied"
expect untied out "lm_head.weight (expected [40, 16])"

# A tied config over a checkpoint that has lm_head.weight: accepted, as transformers does.
variant tied_extra moe_sharded 's/"tie_word_embeddings": false/"tie_word_embeddings": true/'
run tied_extra 0 "$tmp/tied_extra"

variant arch dense_tied 's/Qwen3ForCausalLM/LlamaForCausalLM/'
run arch 1 "$tmp/arch"
expect arch err "\"LlamaForCausalLM\" is not supported"
one_sentence arch

cp -r "$fix/hf_tiny/moe_sharded" "$tmp/noshard"
rm "$tmp/noshard/model-00002-of-00003.safetensors"
run noshard 1 "$tmp/noshard"
expect noshard err "model-00002-of-00003.safetensors"
expect noshard err "does not exist"
one_sentence noshard

cp -r "$fix/hf_tiny/moe_sharded" "$tmp/cut"
f=$tmp/cut/model-00001-of-00003.safetensors
head -c 3000 "$f" >"$f.x" && mv "$f.x" "$f"
run cut 1 "$tmp/cut"
expect cut err "model-00001-of-00003.safetensors"
one_sentence cut

mkdir "$tmp/noconfig"
run noconfig 1 "$tmp/noconfig"
expect noconfig err "no config.json"
one_sentence noconfig

head -c 4096 /dev/urandom >"$tmp/garbage.safetensors"
run garbage 1 "$tmp/garbage.safetensors"
expect garbage err "garbage.safetensors"
one_sentence garbage
printf '\x05\x00\x00\x00\x00\x00\x00\x00{"a":' >"$tmp/badjson.safetensors"
run badjson 1 "$tmp/badjson.safetensors"
expect badjson err "not valid JSON"
one_sentence badjson
: >"$tmp/empty.safetensors"
run empty 1 "$tmp/empty.safetensors"
expect empty err "too short"
run nofile 1 "$tmp/does-not-exist.safetensors"
one_sentence nofile

run usage 2
run usage2 2 a b
run badopt 2 --frobnicate x
run help 0 --help
expect help out "usage: qtitan inspect PATH"

if [ "$fails" -ne 0 ]; then
    echo "e2e_inspect: $fails failure(s)"
    exit 1
fi
echo "e2e_inspect: all cases passed"
