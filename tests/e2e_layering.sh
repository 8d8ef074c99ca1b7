#!/usr/bin/env bash
# The include layering of src/: a directory may include only itself and the directories of lower
# layers, and no module may reach itself through #include (so no cycle between directories or
# modules). Layers, lowest first (docs/architecture.md, "The device seam", says why kernels sit
# below model):
#   0 core   1 ops io text dist   2 kernels   3 model   4 infer   5 train   6 cli   7 src/main.c
# (infer: inference on a model, which training's validation and samples use)
set -euo pipefail
cd "${QT_SOURCE_DIR:-$(dirname "$0")/..}/src"

rank() {
    case "$1" in
    core) echo 0 ;;
    ops | io | text | dist) echo 1 ;;
    kernels) echo 2 ;;
    model) echo 3 ;;
    infer) echo 4 ;;
    train) echo 5 ;;
    cli) echo 6 ;;
    .) echo 7 ;;
    *) echo "e2e_layering: directory src/$1 has no layer; add it to tests/e2e_layering.sh" >&2
       return 1 ;;
    esac
}

fail=0
edges=$(mktemp)
trap 'rm -f "$edges"' EXIT
for f in $(find . -name '*.[ch]' | sed 's#^\./##' | sort); do
    dir=$(dirname "$f")
    from=$(rank "$dir")
    while IFS= read -r inc; do
        [ -f "$inc" ] || continue # a system or generated header
        [ "${f%.*}" = "${inc%.*}" ] || echo "${f%.*} ${inc%.*}" >>"$edges"
        to_dir=$(dirname "$inc")
        [ "$to_dir" = "$dir" ] && continue
        to=$(rank "$to_dir")
        if [ "$to" -ge "$from" ]; then
            echo "FAIL: src/$f includes $inc: src/$dir (layer $from) may include only lower layers, but src/$to_dir is layer $to"
            fail=1
        fi
    done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
done
if ! out=$(tsort "$edges" 2>&1 >/dev/null) || [ -n "$out" ]; then
    echo "FAIL: an #include cycle between modules (a .c with its .h):"
    echo "$out"
    fail=1
fi
[ "$fail" = 0 ] && echo "e2e_layering: $(wc -l <"$edges") includes between src/ modules, layering and acyclicity hold"
exit "$fail"
