#!/usr/bin/env bash
# qtitan vs PyTorch training throughput and memory on CPU (bench/compare_pytorch/compare.py):
#   bash bench/compare_pytorch/run.sh [--quick] [--threads N] [--rounds R] [--only NAME] [--peak-tflops P] [--full06b] [--ac none|full|N]
# Builds qtitan when build/qtitan is missing, pip-installs torch and transformers when they
# are missing, and keeps its data and outputs in $QT_BENCH_WORK (default build/compare_pytorch).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
[ -x build/qtitan ] || bash scripts/build.sh
python3 -c "import torch, transformers" 2>/dev/null || python3 -m pip install torch transformers
[ -x /usr/bin/time ] || { echo "run.sh: needs /usr/bin/time (Debian package 'time')"; exit 1; }
shared=${QT_SHARED_DIR:-$root/../shared}
[ -f "$shared/data/c4_sample/c4_sample.jsonl" ] || { echo "run.sh: no C4 sample under $shared"; exit 1; }
exec python3 bench/compare_pytorch/compare.py --qtitan "$root/build/qtitan" \
  --work "${QT_BENCH_WORK:-$root/build/compare_pytorch}" --shared "$shared" "$@"
