#!/usr/bin/env bash
# The built-in demo (grows with the trainer): for now, shows the binary works.
set -euo pipefail
cd "$(dirname "$0")/.."
./build/qtitan --version
./build/qtitan --help
