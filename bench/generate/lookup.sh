#!/usr/bin/env bash
# Prompt lookup decoding: `qtitan generate --prompt-lookup K` against plain greedy decoding, and
# transformers' generate(prompt_lookup_num_tokens=K) against its plain greedy decoding, on the
# same random Qwen3-0.6B-shaped model (bf16 weights, bench/generate/make_model.py, with the Qwen3
# tokenizer of ../shared), prompt, thread count and NEW tokens, in alternating rounds. Both stop at
# max_new_tokens (the model has no EOS); every run prints the seconds from the prompt to the last
# token and the decode tokens per second, qtitan's also how many candidates it kept. The ids
# with and without lookup are compared (they must be the same). Usage (from the repository root,
# after scripts/build.sh): bash bench/generate/lookup.sh [THREADS] [K] [NEW]
set -euo pipefail
threads=${1:-$(nproc)}
k=${2:-10}
new=${3:-64}
model=${QT_BENCH_MODEL:-/tmp/qtitan_bench_qwen3_0.6b}
tok=${QT_SHARED_DIR:-../shared}/tokenizers/qwen3
[ -f "$model/config.json" ] || python3 bench/generate/make_model.py "$model"
[ -f "$model/tokenizer.json" ] || cp "$tok/tokenizer.json" "$model/"
prompt=${PROMPT:-"The history of the river begins in the mountains, where snow melts in spring and"}
qt=${QTITAN:-build/qtitan}
out=$(mktemp -d /tmp/qt_lookup_XXXXXX)
trap 'rm -rf "$out"' EXIT
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); K $k, $new new tokens, $threads threads; $qt"
# The new ids of two runs: the same, or where they first differ (a near tie that a pass of
# many rows rounds otherwise than a single row, as bf16 can).
same() {
  paste <(jq '.ids[]' "$2") <(jq '.ids[]' "$3") |
    awk -v who="$1" '$1 != $2 && !d { d = NR } END { print who ": ids " (d ? "first differ at new token " d : "the same") " with lookup" }'
}
for round in $(seq "${ROUNDS:-2}"); do
  for look in 0 "$k"; do
    echo "round $round qtitan lookup $look: load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u)"
    OMP_NUM_THREADS=$threads "$qt" generate --model "$model" --prompt "$prompt" --temperature 0 \
      --max-new-tokens "$new" --dtype bfloat16 --json --prompt-lookup "$look" \
      >"$out/qt$look.json" 2>"$out/err"
    grep '^generate:' "$out/err" |
      sed -E 's/.*prompt [0-9]+ tokens in ([0-9.]+) s.*generation ([0-9]+) tokens in ([0-9.]+) s.*bfloat16(.*)/\1 \2 \3|\4/' |
      awk -F'|' '{ split($1, v, " "); printf "qtitan: %.3f s to the last token, %.2f tokens/s%s\n", v[1] + v[3], v[2] / v[3], $2 }'
  done
  same qtitan "$out/qt0.json" "$out/qt$k.json"
  for look in 0 "$k"; do
    echo "round $round transformers lookup $look: load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u)"
    python3 - "$model" "$threads" "$look" "$new" "$prompt" "$out/hf$look.json" <<'PY' 2>/dev/null
import json, sys, time, torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
d, threads, k, new, prompt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
torch.set_num_threads(threads)
model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).eval()
tok = PreTrainedTokenizerFast(tokenizer_file=d + "/tokenizer.json")
enc = tok([prompt], return_tensors="pt")
kw = dict(prompt_lookup_num_tokens=k) if k else {}
with torch.inference_mode():
    t0 = time.perf_counter()
    out = model.generate(**enc, do_sample=False, max_new_tokens=new, min_new_tokens=new,
                         eos_token_id=None, pad_token_id=0, **kw)
    dt = time.perf_counter() - t0
n = out.shape[1] - enc["input_ids"].shape[1]
print(f"transformers {torch.__version__}: {dt:.3f} s to the last token, {n / dt:.2f} tokens/s")
json.dump({"ids": out[0, enc["input_ids"].shape[1]:].tolist()}, open(sys.argv[6], "w"))
PY
  done
  same transformers "$out/hf0.json" "$out/hf$k.json"
done
