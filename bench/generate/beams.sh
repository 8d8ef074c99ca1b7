#!/usr/bin/env bash
# Beam search: `qtitan generate --num-beams K` against transformers' generate(num_beams=K,
# do_sample=False) on the same random Qwen3-0.6B-shaped model (bf16 weights, bench/generate/
# make_model.py, with the Qwen3 tokenizer of ../shared), prompt, thread count and K, in
# alternating rounds: the seconds from the prompt to the last step (qtitan's stderr line,
# transformers' generate() call) and the steps per second. Both stop at max_new_tokens (the
# model has no EOS). PROMPTS=P (default 1) runs P prompts of the same length as a prompt file
# (qtitan searches them side by side; transformers gets them as one batch); QTITAN=BINARY
# times another build. Usage (from the repository root, after scripts/build.sh):
#   bash bench/generate/beams.sh [THREADS] [BEAMS] [NEW]
set -euo pipefail
threads=${1:-$(nproc)}
beams=${2:-4}
new=${3:-32}
model=${QT_BENCH_MODEL:-/tmp/qtitan_bench_qwen3_0.6b}
tok=${QT_SHARED_DIR:-../shared}/tokenizers/qwen3
[ -f "$model/config.json" ] || python3 bench/generate/make_model.py "$model"
[ -f "$model/tokenizer.json" ] || cp "$tok/tokenizer.json" "$model/"
prompt="The history of the river begins in the mountains, where snow melts in spring and"
qt=${QTITAN:-build/qtitan}
nprompts=${PROMPTS:-1}
words=(red blue green gray pink gold dark pale)
file=$(mktemp /tmp/qt_beams_XXXXXX)
trap 'rm -f "$file"' EXIT
for i in $(seq 0 $((nprompts - 1))); do echo "${words[$((i % 8))]} ${prompt#The }" >>"$file"; done
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $nprompts prompts, $beams beams, $new new tokens, $threads threads; $qt"
for round in $(seq "${ROUNDS:-2}"); do
  echo "round $round qtitan: load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u)"
  OMP_NUM_THREADS=$threads "$qt" generate --model "$model" --prompt-file "$file" \
    --num-beams "$beams" --temperature 0 --max-new-tokens "$new" --dtype bfloat16 --json \
    2>&1 >/dev/null | grep '^generate:' |
    sed -E 's/.*prompt ([0-9]+) tokens in ([0-9.]+) s.*generation ([0-9]+) tokens in ([0-9.]+) s.*/\1 \2 \3 \4/' |
    awk -v k="$beams" -v p="$nprompts" '{ printf "qtitan: prompts %d tokens in all, %.3f s to the last step, %.2f steps/s\n", $1, $2 + $4, $3 / k / p / $4 }'
  echo "round $round transformers: load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u)"
  python3 - "$model" "$threads" "$beams" "$new" "$file" <<'PY' 2>/dev/null
import sys, time, torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
d, threads, k, new, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
torch.set_num_threads(threads)
model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).eval()
tok = PreTrainedTokenizerFast(tokenizer_file=d + "/tokenizer.json", pad_token="<|endoftext|>",
                              padding_side="left")
enc = tok([l.rstrip("\n") for l in open(path)], return_tensors="pt", padding=True)
with torch.inference_mode():
    t0 = time.perf_counter()
    out = model.generate(**enc, num_beams=k, do_sample=False, max_new_tokens=new,
                         min_new_tokens=new, eos_token_id=None, pad_token_id=tok.pad_token_id)
    dt = time.perf_counter() - t0
steps = out.shape[1] - enc["input_ids"].shape[1]
print(f"transformers {torch.__version__}: prompts {enc['input_ids'].shape[1]} tokens each, "
      f"{dt:.3f} s to the last step, {steps / dt:.2f} steps/s")
PY
done
