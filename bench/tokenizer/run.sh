#!/usr/bin/env bash
# Single-thread tokenizer speed on the C4 sample: qtitan, HF tokenizers, tiktoken (one command).
# Usage: bench/tokenizer/run.sh [TOKENIZER_DIR] [JSONL]   (defaults: ../shared Qwen3 + C4 sample)
# qtitan's number is the encode time inside `qtitan tokenize --stats` (JSON parsing and output
# excluded), best of 3 runs; the Python numbers are best of 3 passes over the same texts.
set -euo pipefail
cd "$(dirname "$0")/../.."
tok=${1:-../shared/tokenizers/qwen3}
data=${2:-../shared/data/c4_sample/c4_sample.jsonl}
[ -x build/qtitan ] || bash scripts/build.sh
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "data: $data ($(wc -c <"$data") bytes of JSONL)"
for i in 1 2 3; do
  ./build/qtitan tokenize --tokenizer "$tok" --input "$data" --output /dev/null --stats 2>&1
done | sort -t= -k2 -n | tail -1 | sed 's/^/qtitan: /'
# Load time (an empty input: the run is the load) and 100k-byte runs of one repeated piece,
# which a quadratic merge pass would take minutes over; best of 3 each.
: >/tmp/qt_tok_empty.jsonl
for i in 1 2 3; do
  s=$(date +%s.%N); ./build/qtitan tokenize --tokenizer "$tok" --input /tmp/qt_tok_empty.jsonl --output /dev/null
  awk -v a="$s" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f\n", b - a }'
done | sort -n | head -1 | sed 's/^/qtitan load (s): /'
for piece in a ' ' '!' 1 ' a' ab; do
  python3 -c 'import json,sys; p=sys.argv[1]; print(json.dumps({"text": p * (100000 // len(p))}))' "$piece" >/tmp/qt_tok_run.jsonl
  for i in 1 2 3; do
    ./build/qtitan tokenize --tokenizer "$tok" --input /tmp/qt_tok_run.jsonl --output /dev/null --stats 2>&1
  done | sort -t= -k2 -n | tail -1 | sed "s/^/run of \"$piece\": /"
done
rm -f /tmp/qt_tok_empty.jsonl /tmp/qt_tok_run.jsonl
tokjson=$tok
[ -d "$tok" ] && tokjson=$tok/tokenizer.json
RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false python3 bench/tokenizer/bench_py.py "$tokjson" "$data" 3
