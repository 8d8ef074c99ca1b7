# shellcheck shell=bash disable=SC2034
# Shared set-up for the tests that train on ../shared's C4 sample with the Qwen3 tokenizer
# (tests/e2e_train*.sh, e2e_plan.sh; sourced, not a test itself): `set -euo pipefail`, $shared,
# $tok (the tokenizer folder), $data (the sample), and a temporary folder $tmp (removed on exit)
# holding the dataset cache. Skipped only without ../shared (a user's clone); CI has it, so a
# missing file fails.
set -euo pipefail
shared=${QT_SHARED_DIR:-}
tok=$shared/tokenizers/qwen3
data=$shared/data/c4_sample/c4_sample.jsonl
if [ -z "$shared" ] || [ ! -d "$shared" ]; then echo "skip: no ../shared"; exit 77; fi
[ -f "$tok/tokenizer.json" ] && [ -f "$data" ] || { echo "FAIL: $shared lacks the Qwen3 tokenizer or the C4 sample"; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export QT_CACHE_DIR=$tmp/cache
