#!/usr/bin/env bash
# Builds and runs every test through CTest. QT_SANITIZE=1 also builds build-asan/ with
# AddressSanitizer + UndefinedBehaviorSanitizer and runs the unit tests and the bad-input,
# hostile-use, allocation-failure (e2e_oom) and command-line e2e tests there.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j2 --timeout 900
if [ "${QT_SANITIZE:-0}" = 1 ]; then
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DQTITAN_SANITIZE=ON >/dev/null
  cmake --build build-asan -j"$(nproc)"
  ASAN_OPTIONS=detect_leaks=0 ctest --test-dir build-asan --output-on-failure -j2 --timeout 900 -L unit
  # Bad input, hostile use, allocation failures and the command line also end to end, through
  # the sanitized binary.
  ASAN_OPTIONS=detect_leaks=0 ctest --test-dir build-asan --output-on-failure --timeout 900 \
      -R '^e2e_(bad_input|cli|hostile|oom)$'
fi
