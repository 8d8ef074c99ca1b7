#!/usr/bin/env bash
# Formatting is checked by the test command: every C file under src/, tests/, fuzz/ and bench/
# must be what clang-format makes of it with the repo's .clang-format (scripts/setup.sh
# installs clang-format). Lists the files that differ; `clang-format -i FILE` fixes one.
set -uo pipefail
cd "${QT_SOURCE_DIR:-.}" || exit 1
if ! command -v clang-format >/dev/null 2>&1; then
    echo "FAIL: clang-format is not installed (scripts/setup.sh installs it)"
    exit 1
fi
bad=()
n=0
while IFS= read -r f; do
    n=$((n + 1))
    clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done < <(find src tests fuzz bench -name '*.[ch]' | sort)
if [ ${#bad[@]} -ne 0 ]; then
    echo "FAIL: ${#bad[@]} of $n C files differ from clang-format:"
    printf '  %s\n' "${bad[@]}"
    exit 1
fi
echo "ok: $n C files match clang-format ($(clang-format --version))"
