#!/usr/bin/env bash
# Debian's oneDNN against a PyPI build, alternating rounds on the trainer's products
# (bench/onednn/bench_onednn.c):
#   bash bench/onednn/run.sh [--rounds R] [--reps N] [--only SUBSTRING] [--pypi "PKG==VER PKG-devel==VER"]
# The PyPI packages (default onednn-cpu-gomp / onednn-devel-cpu-gomp 2023.2.0, oneDNN 3.2 on
# libgomp like Debian's) are unpacked into $QT_BENCH_WORK (default build/onednn) and the
# bench is compiled against them there; Debian's build is build/bench_onednn (CMake).
# Prints, per product and path, each version's GFLOP/s over the rounds (min-max) and the
# ratio of their medians.
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
for r in $(seq 1 "$rounds"); do
  echo "round $r/$rounds, load $(cut -d' ' -f1-3 /proc/loadavg)"
  build/bench_onednn --reps "$reps" --only "$only" >>"$work/results.txt"
  "$work/bench_onednn_pypi" --reps "$reps" --only "$only" >>"$work/results.txt"
done
# Columns: version shape product path gflops.
awk '
  { key = $2 " " $3 " " $4; v[$1] = 1; n[key, $1]++; x[key, $1, n[key, $1]] = $5
    if (!(key in seen)) { seen[key] = 1; order[++nk] = key } }
  function median(k, ver,   m, i, j, t, a) {
    m = n[k, ver]; for (i = 1; i <= m; i++) a[i] = x[k, ver, i]
    for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    lo[ver] = a[1]; hi[ver] = a[m]
    return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2 }
  END {
    nv = 0; for (ver in v) vs[++nv] = ver
    if (vs[1] > vs[2]) { t = vs[1]; vs[1] = vs[2]; vs[2] = t }
    printf "%-28s %-12s %-19s %-19s %s\n", "shape product", "path", vs[1] " GFLOP/s", vs[2] " GFLOP/s", "median ratio"
    for (i = 1; i <= nk; i++) {
      k = order[i]; split(k, f, " ")
      m1 = median(k, vs[1]); m2 = median(k, vs[2])
      printf "%-28s %-12s %7.0f-%-11.0f %7.0f-%-11.0f %.2f\n", f[1] " " f[2], f[3], lo[vs[1]], hi[vs[1]], lo[vs[2]], hi[vs[2]], m2 / m1 }
  }' "$work/results.txt"
