#!/usr/bin/env bash
# qtitan eval on every HF parity fixture prints HF's loss to 7 significant digits (relative
# difference <= 1e-6 from tools/make_parity_fixtures.py's expected_loss.txt), writes logits
# on request, and bad input exits non-zero with one sentence.
# shellcheck source=tests/infer_lib.sh
. "$(dirname "$0")/infer_lib.sh"
FIX=$SRC/tests/fixtures/parity

n=0
for dir in "$FIX"/*/; do
    name=$(basename "$dir")
    out=$("$QT" eval --model "$dir" --tokens "$dir/tokens.txt" --dump-logits "$TMP/$name.safetensors")
    got=$(echo "$out" | sed -n 's/^loss: //p')
    want=$(cat "$dir/expected_loss.txt")
    [ -n "$got" ] || fail "$name: no 'loss:' line in: $out"
    awk -v a="$got" -v b="$want" 'BEGIN { d = (a - b) / b; if (d < 0) d = -d; exit !(d <= 1e-6) }' ||
        fail "$name: loss $got, HF $want"
    echo "$name: loss $got (HF $want)"
    # Only present here; test_parity compares the dumped logits with HF's.
    [ -s "$TMP/$name.safetensors" ] || fail "$name: --dump-logits wrote nothing"
    n=$((n + 1))
done
[ "$n" -ge 4 ] || fail "expected at least 4 fixtures, found $n"

# Bad input: exit status 1 and exactly one line on stderr, naming the problem.
good="$FIX/untied_mha"
printf '1 2 x3 4\n' >"$TMP/nonint.txt"
printf '1 2 3\n4 5 80\n' >"$TMP/big.txt" # untied_mha has vocab 80
printf '' >"$TMP/empty.txt"
printf '\n  \n' >"$TMP/blank.txt"
printf '1 2 -3\n' >"$TMP/neg.txt"
expect_error eval "x3" --model "$good" --tokens "$TMP/nonint.txt"
expect_error eval "nonint.txt:1:5" --model "$good" --tokens "$TMP/nonint.txt"
expect_error eval "big.txt:2:5" --model "$good" --tokens "$TMP/big.txt"
expect_error eval "no token ids" --model "$good" --tokens "$TMP/empty.txt"
expect_error eval "no token ids" --model "$good" --tokens "$TMP/blank.txt"
expect_error eval "outside the vocabulary" --model "$good" --tokens "$TMP/neg.txt"
expect_error eval "does not exist" --model "$TMP/nope" --tokens "$good/tokens.txt"
expect_error eval "$TMP/missing.txt" --model "$good" --tokens "$TMP/missing.txt"
expect_error eval "required" --model "$good"
expect_error eval "unknown option" --model "$good" --tokens "$good/tokens.txt" --bogus 1
mkdir "$TMP/noconfig"
expect_error eval "config.json" --model "$TMP/noconfig" --tokens "$good/tokens.txt"
# fp8 block-quantized weights (fixture fp8_blocks_untied) whose config.json does not say how
# to read them, or says what qtitan does not read: one sentence each, naming the key or tensor.
f8=$FIX/fp8_blocks_untied
bad8() { # name, sed expression on config.json: prints the edited copy's path
    cp -r "$f8" "$TMP/f8_$1"
    sed -i "$2" "$TMP/f8_$1/config.json"
    echo "$TMP/f8_$1"
}
expect_error eval 'has no quantization_config with quant_method "fp8"' \
  --model "$(bad8 none '/"quantization_config"/,/^  },/d')" --tokens "$f8/tokens.txt"
expect_error eval 'quantization_config.quant_method "gptq" is not read' \
  --model "$(bad8 gptq 's/"fp8"/"gptq"/')" --tokens "$f8/tokens.txt"
expect_error eval 'quantization_config.activation_scheme "static" is not read' \
  --model "$(bad8 static 's/"dynamic"/"static"/')" --tokens "$f8/tokens.txt"
expect_error eval 'quantization_config.fmt "e5m2" is not read' \
  --model "$(bad8 e5m2 's/"e4m3"/"e5m2"/')" --tokens "$f8/tokens.txt"
expect_error eval 'weight_block_size must be a list of two positive integers' \
  --model "$(bad8 zero 's/^      16,/      0,/')" --tokens "$f8/tokens.txt"
expect_error eval '"model.layers.0.mlp.down_proj.weight_scale_inv" has shape \[4, 3\], expected \[8, 3\]' \
  --model "$(bad8 block 's/^      16,/      8,/')" --tokens "$f8/tokens.txt"
echo "e2e_eval: all checks passed"
