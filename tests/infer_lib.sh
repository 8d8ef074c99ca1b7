# shellcheck shell=bash disable=SC2034
# Shared set-up for the tests that run models made by tools/make_generate_fixtures.py
# (tests/e2e_eval*.sh, e2e_generate*.sh, e2e_validate.sh; sourced, not a test itself):
# `set -euo pipefail`, $QT (the binary), $SRC (the source tree), $FIX (the cli_tiny model over
# the tiny_gpt2 tokenizer), a temporary folder $TMP (removed on exit) holding the tokenizer
# cache, one OpenMP thread, and:
#   fail MESSAGE                     prints FAIL: MESSAGE on stderr and exits 1;
#   expect_error CMD PATTERN ARGS    `qtitan CMD ARGS` exits non-zero and stderr is exactly
#                                    one line, which contains PATTERN;
#   expect_error_in_log CMD PATTERN ARGS
#                                    the same where stderr may hold more (a training log).
set -euo pipefail
QT=${QT_BINARY:-build/qtitan}
SRC=${QT_SOURCE_DIR:-.}
FIX=$SRC/tests/fixtures/generate/cli_tiny
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=1 QT_CACHE_DIR=$TMP/cache

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

expect_failure_() { # one|log, cmd, pattern, args...
    local lines=$1 cmd=$2 pattern=$3 rc=0
    shift 3
    "$QT" "$cmd" "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
    [ "$rc" -ne 0 ] || fail "exit 0 for: $cmd $*"
    [ "$lines" = log ] || [ "$(wc -l <"$TMP/err")" -eq 1 ] ||
        fail "not one line of error for: $cmd $* -> $(cat "$TMP/err")"
    grep -q -- "$pattern" "$TMP/err" || fail "error for $cmd $* lacks '$pattern': $(cat "$TMP/err")"
    echo "ok ($rc): $(grep -- "$pattern" "$TMP/err")"
}
expect_error() { expect_failure_ one "$@"; }
expect_error_in_log() { expect_failure_ log "$@"; }
