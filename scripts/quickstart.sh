#!/usr/bin/env bash
# The newcomer's command: install what is missing, build, run the built-in demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
bash scripts/demo.sh
