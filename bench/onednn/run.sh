#!/usr/bin/env bash
# Debian's oneDNN against a PyPI build, alternating rounds on the trainer's products
# (bench/onednn/bench_onednn.c):
#   bash bench/onednn/run.sh [--rounds R] [--reps N] [--only SUBSTRING] [--pypi "PKG==VER PKG-devel==VER"]
# The PyPI packages (default onednn-cpu-gomp / onednn-devel-cpu-gomp 2023.2.0, oneDNN 3.2 on
# libgomp like Debian's) are unpacked into $QT_BENCH_WORK (default build/onednn) and the
# bench is compiled against them there; Debian's build is build/bench_onednn (CMake).
# Each product is timed by the wall clock and by the process's CPU time (OMP_WAIT_POLICY=passive,
# so threads waiting at a barrier sleep instead of spinning): on a machine shared with other jobs
# the wall clock mostly measures the queue for the cores, the CPU time the work. Within a round
# the two versions run one after the other on each product, in an order that alternates from
# product to product and round to round, so a change of load hits both. Prints, per product and
# path, each version's GFLOP/s (wall) and GFLOP per CPU-second over the rounds (min-max) and the
# ratios of their medians (newer / older).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
rounds=3 reps=3 only="" pypi="onednn-cpu-gomp==2023.2.0 onednn-devel-cpu-gomp==2023.2.0"
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --pypi) pypi=$2; shift 2 ;;
    *) echo "run.sh: unknown option $1 (expected --rounds, --reps, --only or --pypi)"; exit 2 ;;
  esac
done
[ -x build/bench_onednn ] || bash scripts/build.sh
work=${QT_BENCH_WORK:-$root/build/onednn}
mkdir -p "$work"
# The wheels keep their libraries and headers as wheel data, which `pip install --target`
# drops, so they are downloaded and unpacked instead.
rm -rf "$work/wheels" "$work/pypi"
# shellcheck disable=SC2086
python3 -m pip download --quiet --no-deps -d "$work/wheels" $pypi
for w in "$work"/wheels/*.whl; do python3 -m zipfile -e "$w" "$work/pypi"; done
inc=$(dirname "$(dirname "$(find "$work/pypi" -path '*include/oneapi/dnnl/dnnl.h' | head -1)")")
inc=$(dirname "$inc")
lib=$(dirname "$(find "$work/pypi" -name 'libdnnl.so' | head -1)")
gcc -O2 -std=c11 -D_GNU_SOURCE -I"$inc" bench/onednn/bench_onednn.c -o "$work/bench_onednn_pypi" \
  -L"$lib" -ldnnl -Wl,-rpath,"$lib"
: >"$work/results.txt"
export OMP_WAIT_POLICY=passive
mapfile -t products < <(build/bench_onednn --list --only "$only")
i=0
for r in $(seq 1 "$rounds"); do
  echo "round $r/$rounds, load $(cut -d' ' -f1-3 /proc/loadavg)"
  for p in "${products[@]}"; do
    i=$((i + 1))
    if [ $((i % 2)) -eq 0 ]; then
      build/bench_onednn --reps "$reps" --only "$p" >>"$work/results.txt"
      "$work/bench_onednn_pypi" --reps "$reps" --only "$p" >>"$work/results.txt"
    else
      "$work/bench_onednn_pypi" --reps "$reps" --only "$p" >>"$work/results.txt"
      build/bench_onednn --reps "$reps" --only "$p" >>"$work/results.txt"
    fi
  done
  # An odd product count would keep each product's order from round to round.
  [ $((${#products[@]} % 2)) -eq 0 ] && i=$((i + 1))
done
echo "done, load $(cut -d' ' -f1-3 /proc/loadavg)"
# Columns: version shape product path gflops_wall gflop_per_cpu_s.
awk '
  { key = $2 " " $3 " " $4; v[$1] = 1; n[key, $1]++; x[key, $1, n[key, $1]] = $5
    c[key, $1, n[key, $1]] = $6
    if (!(key in seen)) { seen[key] = 1; order[++nk] = key } }
  function median(k, ver, col,   m, i, j, t, a) {
    m = n[k, ver]
    for (i = 1; i <= m; i++) a[i] = col == 5 ? x[k, ver, i] : c[k, ver, i]
    for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    lo[ver] = a[1]; hi[ver] = a[m]
    return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2 }
  END {
    nv = 0; for (ver in v) vs[++nv] = ver
    if (vs[1] > vs[2]) { t = vs[1]; vs[1] = vs[2]; vs[2] = t }
    printf "%-24s %-19s %-11s %-11s %-6s %-11s %-11s %s\n", "shape product", "path", vs[1] " wall", vs[2] " wall", "ratio", vs[1] " cpu", vs[2] " cpu", "ratio"
    for (i = 1; i <= nk; i++) {
      k = order[i]; split(k, f, " ")
      w1 = median(k, vs[1], 5); l1 = lo[vs[1]]; h1 = hi[vs[1]]
      w2 = median(k, vs[2], 5); l2 = lo[vs[2]]; h2 = hi[vs[2]]
      c1 = median(k, vs[1], 6); m1 = lo[vs[1]]; n1 = hi[vs[1]]
      c2 = median(k, vs[2], 6); m2 = lo[vs[2]]; n2 = hi[vs[2]]
      printf "%-24s %-19s %4.0f-%-6.0f %4.0f-%-6.0f %-6.2f %4.0f-%-6.0f %4.0f-%-6.0f %.2f\n", f[1] " " f[2], f[3], l1, h1, l2, h2, w2 / w1, m1, n1, m2, n2, c2 / c1 }
  }' "$work/results.txt"
