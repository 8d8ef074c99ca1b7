# shellcheck shell=bash disable=SC2154
# Shared checks for tests/e2e_cli.sh and tests/e2e_bad_input.sh (sourced, not a test itself).
#
# The rule for every failing command: it exits non-zero (2 for a usage error: unknown option,
# missing option or value; 1 or 2 for bad input) and stderr is exactly one line that starts
# with "error: " and names the culprit (option, file, key, line or byte offset). It never
# exits by a signal (status >= 128), never runs past 20 s, and never prints a sanitizer
# report. The one exception is `qtitan` with no arguments, which prints the command list to
# stderr with status 2.
#
# The caller sets $bin (the qtitan binary) and $tmp (a scratch directory); failures are
# counted in $fails and the caller ends with qa_finish NAME.

fails=0
# Sanitized binaries: report leaks nowhere (as the CI's unit tests) and stop on the first UB.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

qa_fail() {
    echo "FAIL $1: $2"
    [ -f "$tmp/$1.err" ] && sed 's/^/    stderr: /' "$tmp/$1.err" | head -20
    fails=$((fails + 1))
}

# qa_run NAME WANT ARGS...: runs "$bin" ARGS under a 20 s timeout, stdout and stderr to
# $tmp/NAME.out and $tmp/NAME.err. WANT is an exit status, or "fail" for 1 or 2. Sets $rc.
# Returns 1 (after counting a failure) when the status or stderr break the rule's basics.
qa_run() {
    local name=$1 want=$2
    shift 2
    timeout 20 "$bin" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" </dev/null
    rc=$?
    if grep -qE 'AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|runtime error:' \
        "$tmp/$name.err"; then
        qa_fail "$name" "sanitizer report (exit $rc)"
        return 1
    fi
    if [ "$rc" -eq 124 ]; then
        qa_fail "$name" "still running after 20 s"
        return 1
    fi
    if [ "$rc" -ge 128 ]; then
        qa_fail "$name" "killed by signal $((rc - 128))"
        return 1
    fi
    if [ "$want" = fail ]; then
        if [ "$rc" -ne 1 ] && [ "$rc" -ne 2 ]; then
            qa_fail "$name" "exit $rc, expected 1 or 2"
            return 1
        fi
    elif [ "$rc" -ne "$want" ]; then
        qa_fail "$name" "exit $rc, expected $want"
        return 1
    fi
    return 0
}

# qa_error NAME TEXT...: stderr of run NAME is one line starting with "error: " that contains
# every TEXT (fixed strings).
qa_error() {
    local name=$1
    shift
    if [ "$(wc -l <"$tmp/$name.err")" -ne 1 ] || ! grep -q '^error: ' "$tmp/$name.err"; then
        qa_fail "$name" "stderr is not exactly one line starting with 'error: '"
        return 1
    fi
    local t
    for t in "$@"; do
        if ! grep -qF -- "$t" "$tmp/$name.err"; then
            qa_fail "$name" "the error does not name '$t'"
            return 1
        fi
    done
    return 0
}

# qa_expect_error NAME WANT TEXTS ARGS...: qa_run NAME WANT ARGS, then qa_error NAME with the
# |-separated TEXTS ("" for none).
qa_expect_error() {
    local name=$1 want=$2 texts=$3
    shift 3
    qa_run "$name" "$want" "$@" || return 1
    local -a list=()
    [ -z "$texts" ] || IFS='|' read -ra list <<<"$texts"
    qa_error "$name" "${list[@]}"
}

qa_finish() {
    if [ "$fails" -ne 0 ]; then
        echo "$1: $fails failure(s)"
        exit 1
    fi
    echo "$1: all cases passed"
    exit 0
}
