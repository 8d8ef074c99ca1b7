#!/usr/bin/env bash
# Builds the libFuzzer targets with clang into build-fuzz/ and runs each for N seconds
# (default 60) from the seed corpus in fuzz/seeds/<target>/. A crashing input is written to
# build-fuzz/<target>-crash-<hash>; add it to the seeds as a regression case once fixed.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
targets=(fuzz/fuzz_*.c)
[ -e "${targets[0]}" ] || { echo "fuzz: no targets"; exit 0; }
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DQTITAN_FUZZ=ON -DQTITAN_WITH_MPI=OFF >/dev/null
cmake --build build-fuzz -j"$(nproc)"
for src in "${targets[@]}"; do
  name=$(basename "$src" .c)
  corpus=build-fuzz/corpus-$name
  mkdir -p "$corpus"
  seeds=fuzz/seeds/$name
  [ -d "$seeds" ] || seeds=
  echo "fuzz: $name for ${secs}s"
  ./build-fuzz/$name -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=0 \
      -artifact_prefix="build-fuzz/$name-" "$corpus" $seeds 2>build-fuzz/$name.log ||
      { tail -40 build-fuzz/$name.log; exit 1; }
done
echo "fuzz: all targets ran clean"
