#!/usr/bin/env bash
# The MFU denominator is the machine's best measured peak (core/peak_record.h): a run without
# metrics.peak_tflops measures, keeps the larger of its measurement and the record in the
# cache folder, and says which it used; a better record is used as is, a malformed one is
# named in a warning and replaced, and metrics.peak_tflops leaves the record alone. The bf16
# path's probe (ops/gemm.c) keeps its two rates the same way, and the path follows the records.
# shellcheck source=tests/c4_lib.sh
. "$(dirname "$0")/c4_lib.sh"
train() {
  "$QT_BINARY" train --config "$QT_SOURCE_DIR/configs/debug.toml" \
    --model.tokenizer_path="$tok" --training.dataset_path="$data" \
    --model.vocab_size=151936 --model.dim=64 --model.n_layers=1 --model.n_heads=2 \
    --model.n_kv_heads=1 --model.head_dim=32 --model.hidden_dim=96 \
    --training.seq_len=32 --training.local_batch_size=2 --training.steps=2 \
    --checkpoint.enable=false --job.dump_folder="$tmp/run" "$@" 2>&1
}
fail() { echo "FAIL: $1"; cat "$tmp/log"; exit 1; }
train >"$tmp/log" || fail "first run"
line=$(grep '^measured peak: ' "$tmp/log") || fail "no measured peak line"
record=$(ls "$QT_CACHE_DIR"/peak-*.txt) || fail "no record in $QT_CACHE_DIR"
[ "$(wc -l <<<"$record")" = 1 ] || fail "one record expected: $record"
echo "$line" | grep -q "the best of 1 run(s) on this machine, this run .* kept in $record" ||
  fail "the line should name the record"
grep -qx 'runs 1' "$record" || fail "the record should count one run"
# A better record than any measurement: used, and the MFU follows it.
sed -i 's/^tflops .*/tflops 999/' "$record"
train >"$tmp/log" || fail "second run"
grep -q '^measured peak: 999.00 TFLOP/s fp32 (fp32 fma; the best of 2 run(s)' "$tmp/log" ||
  fail "the record's 999 TFLOP/s should be the peak"
grep -qx 'runs 2' "$record" && grep -qx 'tflops 999' "$record" || fail "record after the second run"
# mfu (in %) is the step's tflops over the record's 999, whatever this host's speed (a bound on
# mfu alone failed on a fast host: 0.0105% at 0.10 TFLOP/s).
read -r mfu tflops < <(jq -rs '.[-1] | "\(.mfu) \(.tflops)"' "$tmp/run/metrics.jsonl")
awk -v m="$mfu" -v t="$tflops" 'BEGIN { e = 100 * t / 999; exit !(t > 0 && m > 0 && (m - e) ^ 2 < (1e-6 * e) ^ 2) }' ||
  fail "MFU should be 100 x tflops / 999 (the record's peak), got $mfu at $tflops TFLOP/s"
# metrics.peak_tflops: the record is neither read nor written.
train --metrics.peak_tflops=1 >"$tmp/log" || fail "run with metrics.peak_tflops"
grep -q '^measured peak' "$tmp/log" && fail "no measurement expected with metrics.peak_tflops"
grep -qx 'runs 2' "$record" || fail "metrics.peak_tflops should leave the record alone"
# A malformed record: one warning naming the file and line, the run goes on, the record is new.
printf 'qtitan peak record 1\ntflops lots\n' >"$record"
train >"$tmp/log" || fail "run over a malformed record"
grep -q "warning: $record: line 2: tflops: expected a finite TFLOP/s above 0; replacing it" "$tmp/log" ||
  fail "the malformed record should be named"
grep -q 'the best of 1 run(s)' "$tmp/log" && grep -qx 'runs 1' "$record" || fail "the record should restart"

# The bf16 probe: where it is timed (no AMX, a oneDNN bf16 matmul), its sgemm and bf16 matmul
# rates go to records of their own, and the path follows the best rates, not this run's: a
# record of sgemm far above the bf16 matmul picks the widened route, then a bf16 record far
# above that picks oneDNN's, whatever this run measures.
bf16() { QT_GEMM_BF16= train --training.mixed_precision_param=bfloat16 --metrics.peak_tflops=1; }
bf16 >"$tmp/log" || fail "bf16 run"
if grep -Eq 'gemm: .*(AMX, taken without timing|no oneDNN bf16 on this CPU)' "$tmp/log"; then
  echo "PASS (the bf16 path is not timed on this CPU)"
  exit 0
fi
f32rec=$(ls "$QT_CACHE_DIR"/peak-gemm_probe_sgemm-*.txt) &&
  b16rec=$(ls "$QT_CACHE_DIR"/peak-gemm_probe_bf16_matmul-*.txt) || fail "no records of the bf16 probe"
grep -q 'gemm: .*(no AMX; on 512^3 sgemm [0-9]* GFLOP/s, bf16 matmul [0-9]*: the best of 1 run(s) on this machine' \
  "$tmp/log" || fail "the gemm line should give the probe's rates and their records"
sed -i 's/^tflops .*/tflops 999/' "$f32rec"
bf16 >"$tmp/log" || fail "bf16 run over a fast sgemm record"
grep -q 'gemm: .*bf16 as dnnl_sgemm on widened operands (no AMX; on 512^3 sgemm 999000 GFLOP/s, bf16 matmul [0-9]*: the best of 2 run(s)' \
  "$tmp/log" || fail "a record of sgemm at 999 TFLOP/s should pick the widened route"
sed -i 's/^tflops .*/tflops 9999/' "$b16rec"
bf16 >"$tmp/log" || fail "bf16 run over a faster bf16 record"
grep -q 'gemm: .*bf16 via .* (no AMX; on 512^3 sgemm 999000 GFLOP/s, bf16 matmul 9999000: the best of 3 run(s)' \
  "$tmp/log" || fail "a record of the bf16 matmul at 9999 TFLOP/s should pick oneDNN's bf16"
echo "PASS"
