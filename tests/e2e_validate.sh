#!/usr/bin/env bash
# Validation and samples during training ([validation], [sample]) on tiny models (dense; MoE
# with bias balancing) over the tiny_gpt2 tokenizer: the training losses are bitwise those of the same run without them;
# the last validation loss equals `qtitan eval --dataset` on that step's checkpoint (1e-6
# relative); validation and sample records land in metrics.jsonl and samples.jsonl; samples
# of a model whose vocabulary is padded past the tokenizer's decode; bad settings stop with
# one sentence.
# shellcheck source=tests/infer_lib.sh
. "$(dirname "$0")/infer_lib.sh"

common=(--config "$SRC/configs/demo.toml" --model.vocab_size=608 --model.dim=32
  --model.n_layers=2 --model.n_heads=2 --model.n_kv_heads=1 --model.head_dim=16
  --model.hidden_dim=64 --model.tokenizer_path="$FIX" --training.dataset_path="$FIX/docs.jsonl"
  --training.seq_len=16 --training.local_batch_size=2 --training.steps=4 --metrics.log_freq=1
  --lr_scheduler.warmup_steps=1 --checkpoint.interval=2 --metrics.peak_tflops=1)
losses() { grep -o '"step":[0-9]*,"loss":[^,]*' "$1/metrics.jsonl"; }
run_pair() { # name, extra args: the same run without and with validation and samples
    local name=$1
    shift
    "$QT" train "${common[@]}" "$@" --job.dump_folder="$TMP/$name-a" >"$TMP/$name-a.log" 2>&1 ||
        fail "$name a: $(tail -3 "$TMP/$name-a.log")"
    "$QT" train "${common[@]}" "$@" --job.dump_folder="$TMP/$name-b" --validation.enable=true \
        --validation.dataset_path="$FIX/docs.jsonl" --validation.freq=2 \
        --validation.local_batch_size=3 --sample.freq=1 --sample.prompts="The quick
A cafe" --sample.max_new_tokens=5 >"$TMP/$name-b.log" 2>&1 || fail "$name b: $(tail -3 "$TMP/$name-b.log")"
    [ "$(losses "$TMP/$name-a")" = "$(losses "$TMP/$name-b")" ] ||
        fail "$name: training losses differ with validation: $(losses "$TMP/$name-a") vs $(losses "$TMP/$name-b")"
    [ "$(losses "$TMP/$name-a" | wc -l)" -eq 4 ] || fail "$name: expected 4 step records"
    echo "$name: training losses bitwise equal with and without validation and samples"
}
# MoE with the auxiliary-loss-free balancing: validation's routing must not reach the bias.
run_pair moe --model.num_experts=4 --model.top_k=2 --model.moe_hidden_dim=16 \
    --model.load_balance_coeff=0.01 --checkpoint.enable=false --checkpoint.last_save_in_hf=false
run_pair dense
mv "$TMP/dense-b" "$TMP/b"
mv "$TMP/dense-b.log" "$TMP/b.log"

grep -q '^validate step: 2  loss: .*perplexity: .*tokens: 95  time: ' "$TMP/b.log" ||
  fail "no validate line for step 2: $(grep validate "$TMP/b.log")"
[ "$(grep -c '"validation_loss"' "$TMP/b/metrics.jsonl")" -eq 2 ] ||
  fail "expected validation records for steps 2 and 4"
val=$(grep '"step":4,"validation_loss"' "$TMP/b/metrics.jsonl" | sed 's/.*"validation_loss":\([^,]*\).*/\1/')
ev=$("$QT" eval --checkpoint "$TMP/b/checkpoint/step-4" --dataset "$FIX/docs.jsonl" --seq-len 16 \
  2>/dev/null | sed -n 's/^loss: //p')
awk -v a="$val" -v b="$ev" 'BEGIN { d = (a - b) / b; if (d < 0) d = -d; exit !(d <= 1e-6) }' ||
  fail "validation loss $val, qtitan eval on the step's checkpoint $ev"
echo "validation loss $val = eval on step-4 checkpoint $ev"

[ "$(wc -l <"$TMP/b/samples.jsonl")" -eq 8 ] || fail "samples.jsonl: $(cat "$TMP/b/samples.jsonl")"
grep -q '^{"step":4,"prompt":"A cafe","prompt_ids":\[[0-9,]*\],"text":' "$TMP/b/samples.jsonl" || fail "no sample record"
grep -q '^sample step 4 \[2\]: A cafe|' "$TMP/b.log" || fail "no sample line in the log"
echo "samples: $(wc -l <"$TMP/b/samples.jsonl") records"

# [sample]'s sampling keys (temperature, top_k, top_p, min_p, repetition_penalty,
# no_repeat_ngram_size, seed): the step-2 samples are generate's with the same flags on that
# step's checkpoint, and the penalties change them.
"$QT" train "${common[@]}" --training.steps=2 --job.dump_folder="$TMP/rp" --sample.freq=2 \
  --sample.prompts="The quick" --sample.temperature=0.9 --sample.top_k=20 --sample.top_p=0.9 \
  --sample.min_p=0.01 --sample.repetition_penalty=3 --sample.no_repeat_ngram_size=2 --sample.seed=3 \
  --sample.max_new_tokens=12 >"$TMP/rp.log" 2>&1 || fail "sampling keys run: $(tail -3 "$TMP/rp.log")"
gen_ids() { "$QT" generate --checkpoint "$TMP/rp/checkpoint/step-2" --prompt "The quick" --temperature 0.9 \
  --top-k 20 --top-p 0.9 --min-p 0.01 --seed 3 --max-new-tokens 12 --json "$@" 2>/dev/null |
  grep -o '"ids":\[[0-9,]*\]' | head -1; }
got=$(grep -o '"ids":\[[0-9,]*\]' "$TMP/rp/samples.jsonl" | tail -1)
[ -n "$got" ] && [ "$got" = "$(gen_ids --repetition-penalty 3 --no-repeat-ngram-size 2)" ] &&
  [ "$got" != "$(gen_ids)" ] ||
  fail "sample $got; generate: $(gen_ids --repetition-penalty 3 --no-repeat-ngram-size 2), without penalties: $(gen_ids)"
echo "[sample] top_k / top_p / min_p / repetition_penalty / no_repeat_ngram_size: generate's with the same flags"

# A vocabulary padded past the tokenizer's 607 tokens: a sample may choose an id without a
# token (near-uniform at this temperature), which decodes to no text instead of stopping the run.
"$QT" train "${common[@]}" --model.vocab_size=4096 --training.steps=1 --job.dump_folder="$TMP/pad" \
  --sample.freq=1 --sample.prompts="The quick" --sample.temperature=1000 --sample.max_new_tokens=16 \
  >"$TMP/pad.log" 2>&1 || fail "padded vocabulary: $(tail -3 "$TMP/pad.log")"
grep -o '"ids":\[[0-9,]*\]' "$TMP/pad/samples.jsonl" | tr -c '0-9' '\n' | awk '$1 >= 607 { n++ } END { exit !n }' ||
  fail "no id past the tokenizer was sampled: $(cat "$TMP/pad/samples.jsonl")"
echo "padded vocabulary: ids past the tokenizer sampled and decoded to no text"

# bf16 training whose validation rows are shaped otherwise within the same tokens (32 rows of 1
# token against training's 2 x 16): attention's bf16 entries cast the keys into the model's
# scratch, sized for the training rows; rows that need more there compute attention in fp32.
# QT_GEMM_BF16=onednn takes the bf16 attention where the CPU has AVX512_BF16 (with widened
# products attention stays fp32). With lr 0 the validation loss must then equal, bit for bit,
# that of the same run with the reference sdpa (fp32 only), while the training losses show that
# the bf16 attention ran there. Without that check the run cast past the scratch.
cp "$SRC/configs/demo.toml" "$TMP/ref_sdpa.toml"
printf '\n[[override]]\ntarget = "layers.*.attention.sdpa"\nkernel = "reference"\n' >>"$TMP/ref_sdpa.toml"
for v in cpu ref; do
  cfg=$SRC/configs/demo.toml
  [ "$v" = ref ] && cfg=$TMP/ref_sdpa.toml
  QT_GEMM_BF16=onednn "$QT" train --config "$cfg" "${common[@]:2}" --training.mixed_precision_param=bfloat16 \
    --training.steps=2 --optimizer.lr=0 --checkpoint.enable=false --checkpoint.last_save_in_hf=false \
    --job.dump_folder="$TMP/v1-$v" --validation.enable=true --validation.dataset_path="$FIX/docs.jsonl" \
    --validation.freq=2 --validation.local_batch_size=32 --validation.seq_len=1 >"$TMP/v1-$v.log" 2>&1 ||
    fail "bf16, validation rows of 1 ($v): $(tail -3 "$TMP/v1-$v.log")"
done
vl() { grep -o '"validation_loss":[^,}]*' "$1/metrics.jsonl"; }
[ -n "$(vl "$TMP/v1-cpu")" ] && [ "$(vl "$TMP/v1-cpu")" = "$(vl "$TMP/v1-ref")" ] ||
  fail "bf16, validation rows of 1: $(vl "$TMP/v1-cpu") vs the reference sdpa's $(vl "$TMP/v1-ref")"
echo "bf16 training, validation rows of 1 token: attention in fp32 within its scratch"

bad_setting() { # pattern, args...
    expect_error_in_log train "$1" "${common[@]}" --job.dump_folder="$TMP/c" "${@:2}"
}
bad_setting "validation.freq" --validation.freq=0
bad_setting "sample.freq = 1: sample.prompts holds no prompt" --sample.freq=1
bad_setting "validation.seq_len = 64 is longer than the 32 tokens" --validation.enable=true \
  --validation.dataset_path="$FIX/docs.jsonl" --validation.seq_len=64
echo "e2e_validate: ok"
