#!/usr/bin/env bash
# Broken files through the real commands: safetensors (qtitan inspect FILE), config.json
# (qtitan inspect DIR, qtitan eval --model DIR), the job TOML (qtitan train --config),
# tokenizer.json and JSONL (qtitan tokenize) and token-id files (qtitan eval). Each must give
# one "error: " sentence naming the file and the byte offset, key or line, and a non-zero exit,
# never a signal, hang or sanitizer report (rule in tests/qa_lib.sh). The files are built here
# with printf / head / sed from the committed fixtures.
#
# QT_BINARY is the binary under test; when QT_ASAN_BINARY names an AddressSanitizer +
# UndefinedBehaviorSanitizer build, every case runs against it too.
set -u
export LC_ALL=C
src=${QT_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
fix=$src/tests/fixtures
tmp=$(mktemp -d)
[ -n "${QA_KEEP:-}" ] || trap 'rm -rf "$tmp"' EXIT
# shellcheck source=tests/qa_lib.sh
. "$src/tests/qa_lib.sh"

# le64 N: N as 8 little-endian bytes (the safetensors header length).
le64() {
    local i
    for ((i = 0; i < 8; i++)); do
        # shellcheck disable=SC2059
        printf "\\$(printf '%03o' $((($1 >> (8 * i)) & 255)))"
    done
}
# st FILE HEADER DATA_BYTES: a safetensors file with that JSON header and zeroed data.
st() {
    {
        le64 ${#2}
        printf '%s' "$2"
        head -c "$3" /dev/zero
    } >"$1"
}

# ---- safetensors, through `qtitan inspect FILE` ----
S=$tmp/st
mkdir "$S"
A='"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'
st "$S/good.safetensors" "{$A}" 8
st "$S/truncated.safetensors" "{$A}" 5
le64 4096 >"$S/hdr_past_end.safetensors"
printf '{}' >>"$S/hdr_past_end.safetensors"
le64 $((1 << 62)) >"$S/hdr_huge.safetensors"
printf '{}' >>"$S/hdr_huge.safetensors"
printf '\377\377\377\377\377\377\377\377{}' >"$S/hdr_max.safetensors"
head -c 5 "$S/good.safetensors" >"$S/short.safetensors"
st "$S/not_json.safetensors" '{"a": {"dtype": "F32", "shape": [2], ' 8
st "$S/not_object.safetensors" '[1, 2, 3]' 0
st "$S/nul.safetensors" "$(printf '{"a\\u0000b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}')" 8
st "$S/out_of_range.safetensors" '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}}' 8
st "$S/far_out.safetensors" '{"a":{"dtype":"U8","shape":[1],"data_offsets":[9223372036854775806,9223372036854775807]}}' 8
st "$S/reversed.safetensors" '{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}' 8
st "$S/negative_offset.safetensors" '{"a":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}}' 8
st "$S/overlap.safetensors" \
    '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}' 12
st "$S/unknown_dtype.safetensors" '{"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}}' 8
st "$S/span_mismatch.safetensors" '{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}' 12
st "$S/shape_overflow.safetensors" \
    '{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}' 8
st "$S/negative_dim.safetensors" '{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}' 8
st "$S/float_dim.safetensors" '{"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}' 8
st "$S/many_dims.safetensors" \
    '{"a":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}}' 1
st "$S/no_offsets.safetensors" '{"a":{"dtype":"F32","shape":[2]}}' 8
st "$S/tensor_not_object.safetensors" '{"a":[1,2]}' 0
st "$S/duplicate.safetensors" "{$A,$A}" 8
st "$S/metadata_number.safetensors" "{\"__metadata__\":{\"format\":1},$A}" 8
# A header of 100000 nested arrays: the parser must not recurse off the stack.
deep=$(printf '%*s' 100000 '' | tr ' ' '[')
st "$S/deep.safetensors" "{\"a\":$deep" 0

# Sharded checkpoints: model.safetensors.index.json next to good.safetensors.
I=$tmp/index
mkdir "$I"
cp "$S/good.safetensors" "$I/good.safetensors"
index() { printf '%s' "$2" >"$I/$1.safetensors.index.json"; }
index not_json '{"weight_map": {"a": "good.safetensors"'
index no_weight_map '{"metadata": {}}'
index entry_number '{"weight_map": {"a": 5}}'
index entry_path '{"weight_map": {"a": "../good.safetensors"}}'
index entry_dotdot '{"weight_map": {"a": ".."}}'
index missing_shard '{"weight_map": {"a": "good.safetensors", "b": "other.safetensors"}}'
index missing_tensor '{"weight_map": {"a": "good.safetensors", "zz": "good.safetensors"}}'
# 200000 distinct shard names (6 MB): once took minutes (pairwise duplicate check).
{
    printf '{"weight_map": {'
    seq 1 200000 | awk '{printf "%s\"t%d\": \"s%d.safetensors\"", (NR > 1 ? "," : ""), $1, $1}'
    printf '}}'
} >"$I/many_shards.safetensors.index.json"

bin=${QT_BINARY:-$src/build/qtitan}
qa_run st_good 0 inspect "$S/good.safetensors" || true

# bad_st NAME TEXT...: qtitan inspect $S/NAME.safetensors fails naming the file and TEXT.
bad_st() {
    local name=$1
    shift
    qa_run "st_$name" fail inspect "$S/$name.safetensors" &&
        qa_error "st_$name" "$S/$name.safetensors" "$@"
}

# bad_index NAME TEXT...: qtitan inspect $I/NAME.safetensors.index.json fails naming it and TEXT.
bad_index() {
    local name=$1
    shift
    qa_run "index_$name" fail inspect "$I/$name.safetensors.index.json" &&
        qa_error "index_$name" "$I/$name.safetensors.index.json" "$@"
}

# ---- config.json, through `qtitan inspect DIR` and `qtitan eval --model DIR` ----
C=$tmp/cfg
mkdir "$C"
printf '1 2 3 4\n' >"$tmp/tokens.txt"
printf '{"text": "hello"}\n' >"$tmp/doc.jsonl"
# cfg NAME SED [CONTENT]: a copy of the parity model directory untied_mha whose config.json is
# edited with SED, or replaced by CONTENT when SED is "-".
cfg() {
    cp -r "$fix/parity/untied_mha" "$C/$1"
    if [ "$2" = - ]; then
        printf '%s' "$3" >"$C/$1/config.json"
    else
        sed -i -e "$2" "$C/$1/config.json"
    fi
}
cfg truncated - '{"architectures": ["Qwen3ForCausalLM"], "hidden_size": '
cfg empty - ''
cfg not_object - '["Qwen3ForCausalLM"]'
cfg string_hidden 's/"hidden_size": 32/"hidden_size": "32"/'
cfg float_hidden 's/"hidden_size": 32/"hidden_size": 32.5/'
cfg zero_heads 's/"num_attention_heads": 4/"num_attention_heads": 0/'
cfg kv_not_dividing 's/"num_key_value_heads": 4/"num_key_value_heads": 3/'
cfg negative_layers 's/"num_hidden_layers": 2/"num_hidden_layers": -2/'
cfg huge_vocab 's/"vocab_size": 80/"vocab_size": 99999999999999/'
cfg huge_dims 's/"hidden_size": 32/"hidden_size": 2000000000/'
cfg arch_not_list 's/"architectures": \[/"architectures": 7, "x": [/'
cfg nan_eps 's/"rms_norm_eps": 1e-06/"rms_norm_eps": -1/'
# Weights that do not fit the config (eval only: inspect lists these on stdout by design).
cfg ffn_mismatch 's/"intermediate_size": 64/"intermediate_size": 60/'
cfg weights_cut 's/x/x/'
head -c 3000 "$fix/parity/untied_mha/model.safetensors" >"$C/weights_cut/model.safetensors"
cfg weights_foreign 's/x/x/'
cp "$S/good.safetensors" "$C/weights_foreign/model.safetensors"
# A training checkpoint step (train_state.json beside config.json) is not an HF directory.
cfg checkpoint_step 's/x/x/'
printf '{}' >"$C/checkpoint_step/train_state.json"

# (A missing key is not an error: it takes transformers' default, as Qwen3Config does.)
# bad_cfg NAME TEXT...: inspect and eval on $C/NAME both fail naming config.json and TEXT.
bad_cfg() {
    local name=$1
    shift
    qa_run "cfg_inspect_$name" fail inspect "$C/$name" &&
        qa_error "cfg_inspect_$name" "$C/$name/config.json" "$@"
    qa_run "cfg_eval_$name" fail eval --model "$C/$name" --tokens "$tmp/tokens.txt" &&
        qa_error "cfg_eval_$name" "$C/$name/config.json" "$@"
}

# ---- job TOML, through `qtitan train --config` ----
T=$tmp/toml
mkdir "$T"
toml() { printf "$2" >"$T/$1.toml"; }
toml unclosed_table '[training\nsteps = 3\n'
toml no_value '[training]\nsteps =\n'
toml two_values '[training]\nsteps = 1 2\n'
toml unterminated '[job]\ndescription = "abc\n'
toml bad_escape '[job]\ndescription = "a\\qb"\n'
toml duplicate_key '[training]\nsteps = 1\nsteps = 2\n'
toml duplicate_table '[training]\nsteps = 1\n[training]\nseed = 2\n'
toml int_overflow '[training]\nsteps = 99999999999999999999999\n'
toml nul_byte '[training]\nsteps = 1\000\n'
toml bad_utf8 '[job]\ndescription = "\377\376"\n'
toml unknown_key '[training]\nstepz = 3\n'
toml unknown_section '[trainin]\nsteps = 3\n'
toml string_for_int '[training]\nsteps = "ten"\n'
toml bool_for_float '[optimizer]\nlr = true\n'
toml float_for_int '[training]\nseq_len = 1.5\n'
toml negative_steps '[training]\nsteps = -1\n'
toml bad_enum '[lr_scheduler]\ndecay_type = "exponential"\n'
toml table_as_value 'training = 3\n'
toml empty_dump_folder '[job]\ndump_folder = ""\n'
# [model] fields that parse but make no valid model (checked when the model is built).
toml zero_dim '[model]\ndim = 0\n'
toml kv_not_dividing_heads '[model]\nn_heads = 8\nn_kv_heads = 3\n'
toml topk_over_experts '[model]\nflavor = "debugmodel_moe"\ntop_k = 65\n'
printf '[job]\ndescription = %s\n' "$(printf '%*s' 100000 '' | tr ' ' '[')" >"$T/deep_array.toml"
printf '[job]\ndescription = %s\n' "$(printf '%*s' 100000 '' | sed 's/ /{a=/g')" >"$T/deep_table.toml"

# bad_toml NAME TEXT...: train --config $T/NAME.toml fails naming the file and TEXT.
bad_toml() {
    local name=$1
    shift
    qa_run "toml_$name" fail train --config "$T/$name.toml" &&
        qa_error "toml_$name" "$T/$name.toml" "$@"
}

# ---- tokenizer.json and JSONL, through `qtitan tokenize` ----
K=$tmp/tok
mkdir "$K"
tj=$fix/tokenizer/tiny_gpt2/tokenizer.json
# tok NAME SED: tokenizer.json edited with SED.
tok() { sed -e "$2" "$tj" >"$K/$1.json"; }
head -c 7000 "$tj" >"$K/truncated.json"
printf '' >"$K/empty.json"
printf '[]' >"$K/array.json"
tok unigram '101s/"BPE"/"Unigram"/'
tok vocab_string_id '111s/"!": 1/"!": "1"/'
tok vocab_negative_id '111s/"!": 1/"!": -1/'
tok vocab_huge_id '111s/"!": 1/"!": 4294967297/'
tok merge_unknown '714s/"h e"/"h QQQ"/'
tok merge_one_part '714s/"h e"/"he"/'
tok merge_number '714s/"h e"/7/'
tok added_bad_id '0,/"id": 600/s//"id": -5/'
tok added_no_content '0,/"content": "<mask>"/s//"content": ""/'
tok no_model '101s/"type": "BPE"/"type": "BPE"}, "modelx": {"type": "BPE"/'
printf '{"text": "hello"}\n{"text": "wor\n{"text": "x"}\n' >"$K/cut_line.jsonl"
printf '{"text": "hello"}\n[1, 2]\n' >"$K/array_line.jsonl"
printf '{"text": "hello"}\n{"txt": "hello"}\n' >"$K/no_text.jsonl"
printf '{"text": "hello"}\n{"text": 5}\n' >"$K/number_text.jsonl"
printf '{"text": "a"}\n{"text": "b"}\n\377\376\n' >"$K/binary_line.jsonl"
printf '{"text": "hello"}\n%s\n' "$(printf '%*s' 100000 '' | tr ' ' '[')" >"$K/deep_line.jsonl"
printf '1 2 3\n4 x 5\n' >"$K/bad_ids.txt"
printf '1 2 3\n4 99999999999999999999 5\n' >"$K/huge_ids.txt"
printf '1 2 3\n4 16777217 5\n' >"$K/out_of_vocab_ids.txt"

# bad_tok NAME TEXT...: tokenize with $K/NAME.json fails naming it and TEXT.
bad_tok() {
    local name=$1
    shift
    qa_run "tok_$name" fail tokenize --tokenizer "$K/$name.json" --input "$tmp/doc.jsonl" &&
        qa_error "tok_$name" "$K/$name.json" "$@"
}
# bad_jsonl NAME LINE [--decode]: tokenize of $K/NAME fails naming the file and line LINE.
bad_lines() {
    local name=$1 line=$2
    shift 2
    qa_run "lines_$name" fail tokenize --tokenizer "$tj" --input "$K/$name" "$@" &&
        qa_error "lines_$name" "$K/$name:$line"
}

# ---- token-id files, through `qtitan eval` ----
E=$tmp/ids
mkdir "$E"
model=$fix/parity/untied_mha # vocab 80
printf '1 2 3\n4 80 5\n' >"$E/past_vocab.txt"
printf '1 2 3\n4 4294967296 5\n' >"$E/past_u32.txt"
printf '1 2 3\n4 99999999999999999999999 5\n' >"$E/past_i64.txt"
printf '1 2 3\n4 -1 5\n' >"$E/negative.txt"
printf '1 2 3\n4 1.5 5\n' >"$E/fraction.txt"
printf '1 2 3\n4 0x10 5\n' >"$E/hex.txt"
printf '1 2 3\n4 \377\376 5\n' >"$E/binary.txt"
printf '1 2 3\n4 5\0006\n' >"$E/nul.txt"

# bad_ids NAME TEXT...: eval on $E/NAME.txt fails naming file:line:column and TEXT.
bad_ids() {
    local name=$1
    shift
    qa_run "ids_$name" fail eval --model "$model" --tokens "$E/$name.txt" &&
        qa_error "ids_$name" "$E/$name.txt:2:" "$@"
}

run_all() {
    bad_st truncated "data_offsets [0, 8]" "data section of 5 bytes"
    bad_st hdr_past_end "header length 4096" "end of the 10-byte file"
    bad_st hdr_huge "header length"
    bad_st hdr_max "header length"
    bad_st short "too short"
    bad_st not_json "not valid JSON at byte"
    bad_st not_object "not an object"
    bad_st nul ""
    bad_st out_of_range '"a"' "data_offsets [0, 16]"
    bad_st far_out '"a"' "data_offsets"
    bad_st reversed '"a"' "begin after end"
    bad_st negative_offset '"a"' "data_offsets"
    bad_st overlap '"a"' '"b"' "overlap"
    bad_st unknown_dtype '"a"' '"Q7"'
    bad_st span_mismatch '"a"' "span 8 bytes" "needs 12"
    bad_st shape_overflow '"a"' "overflows"
    bad_st negative_dim '"a"' "shape dimension 0"
    bad_st float_dim '"a"' "shape dimension 0"
    bad_st many_dims '"a"' "dimensions"
    bad_st no_offsets '"a"' "data_offsets"
    bad_st tensor_not_object '"a"'
    bad_st duplicate "duplicate"
    bad_st metadata_number "__metadata__" "format"
    bad_st deep ""

    bad_index not_json ""
    bad_index no_weight_map "weight_map"
    bad_index entry_number '"a"'
    bad_index entry_path "../good.safetensors"
    bad_index entry_dotdot ".."
    bad_index missing_shard "other.safetensors"
    bad_index missing_tensor '"zz"'
    bad_index many_shards "s1.safetensors"

    bad_cfg truncated ":1:55"
    bad_cfg empty ""
    bad_cfg not_object "object"
    bad_cfg string_hidden "hidden_size"
    bad_cfg float_hidden "hidden_size"
    bad_cfg zero_heads "num_attention_heads"
    bad_cfg kv_not_dividing "num_key_value_heads"
    bad_cfg negative_layers "num_hidden_layers"
    bad_cfg huge_vocab "vocab_size"
    bad_cfg huge_dims "hidden_size"
    bad_cfg arch_not_list "architectures"
    bad_cfg nan_eps "rms_norm_eps"
    qa_run eval_ffn_mismatch fail eval --model "$C/ffn_mismatch" --tokens "$tmp/tokens.txt" &&
        qa_error eval_ffn_mismatch "mlp" "60"
    qa_run eval_weights_cut fail eval --model "$C/weights_cut" --tokens "$tmp/tokens.txt" &&
        qa_error eval_weights_cut "$C/weights_cut/model.safetensors"
    qa_run inspect_checkpoint_step fail inspect "$C/checkpoint_step" &&
        qa_error inspect_checkpoint_step "$C/checkpoint_step" "training checkpoint"
    qa_run eval_weights_foreign fail eval --model "$C/weights_foreign" --tokens "$tmp/tokens.txt" &&
        qa_error eval_weights_foreign "model.embed_tokens.weight"

    bad_toml unclosed_table ":1:"
    bad_toml no_value ":2:"
    bad_toml two_values ":2:"
    bad_toml unterminated ":2:"
    bad_toml bad_escape ":2:"
    bad_toml duplicate_key ":3:" "steps"
    bad_toml duplicate_table ":3:" "training"
    bad_toml int_overflow ":2:"
    bad_toml nul_byte ""
    bad_toml bad_utf8 ":2:"
    bad_toml unknown_key '"stepz"' '"steps"'
    bad_toml unknown_section "[trainin]" "[training]"
    bad_toml string_for_int "training.steps"
    bad_toml bool_for_float "optimizer.lr"
    bad_toml float_for_int "training.seq_len"
    bad_toml negative_steps "training.steps"
    bad_toml bad_enum "lr_scheduler.decay_type" "exponential"
    bad_toml table_as_value "training"
    bad_toml empty_dump_folder ":2:" "job.dump_folder"
    bad_toml zero_dim ":2:" "dim = 0"
    bad_toml kv_not_dividing_heads ":3:" "n_kv_heads = 3"
    bad_toml topk_over_experts ":3:" "top_k = 65"
    bad_toml deep_array ""
    bad_toml deep_table ""

    bad_tok truncated ""
    bad_tok empty ""
    bad_tok array ""
    bad_tok unigram "Unigram"
    bad_tok vocab_string_id '"!"'
    bad_tok vocab_negative_id '"!"'
    bad_tok vocab_huge_id '"!"'
    bad_tok merge_unknown "merges[2]"
    bad_tok merge_one_part "merges[2]"
    bad_tok merge_number "merges[2]"
    bad_tok added_bad_id "id"
    bad_tok added_no_content "content"
    bad_tok no_model "model"

    bad_lines cut_line.jsonl 2
    bad_lines array_line.jsonl 2
    bad_lines no_text.jsonl 2
    bad_lines number_text.jsonl 2
    bad_lines deep_line.jsonl 2
    bad_lines bad_ids.txt 2 --decode
    bad_lines huge_ids.txt 2 --decode
    bad_lines out_of_vocab_ids.txt 2 --decode
    # Invalid UTF-8 outside a JSON string is not JSON: an error, not a replacement.
    bad_lines binary_line.jsonl 3

    bad_ids past_vocab "80"
    bad_ids past_u32 "4294967296"
    bad_ids past_i64 ""
    bad_ids negative "-1"
    bad_ids fraction "1.5"
    bad_ids hex "0x10"
    bad_ids binary ""
    bad_ids nul ""
}

run_all
if [ -n "${QT_ASAN_BINARY:-}" ]; then
    if [ -x "$QT_ASAN_BINARY" ]; then
        echo "e2e_bad_input: again under $QT_ASAN_BINARY"
        bin=$QT_ASAN_BINARY
        run_all
    else
        qa_fail asan "QT_ASAN_BINARY=$QT_ASAN_BINARY is not an executable"
    fi
fi
qa_finish e2e_bad_input
