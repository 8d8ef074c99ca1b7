#!/usr/bin/env bash
# qtitan plot: two runs' metrics.jsonl (written here: 60 steps, a null loss, a validation key
# on some steps) become one SVG that is valid XML, that rsvg-convert renders to a picture which
# is not blank and holds both runs' colours, and whose text has the axis labels and legend;
# --out FILE.png writes that picture itself (decoded with netpbm's pngtopnm, same checks).
# Bad records and options are one sentence each.
set -euo pipefail
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fail() { echo "FAIL: $*"; exit 1; }
mkdir -p runA runB
for s in $(seq 1 60); do
  awk -v s=$s 'BEGIN { printf "{\"step\":%d,\"loss\":%.6f,\"grad_norm\":%.4f,\"lr\":0.001", s, 8 * exp(-s / 20) + 2, 1 + 1 / s
    if (s % 10 == 0) printf ",\"validation/loss\":%.5f", 8 * exp(-s / 22) + 2.2
    print "}" }' >>runA/metrics.jsonl
  if [ "$s" = 30 ]; then echo '{"step":30,"loss":null,"grad_norm":null}' >>runB/metrics.jsonl; continue; fi
  awk -v s=$s 'BEGIN { printf "{\"step\":%d,\"loss\":%.6f,\"grad_norm\":%.4f}\n", s, 9 * exp(-s / 15) + 2.5, 2 / sqrt(s) }' >>runB/metrics.jsonl
done
"$QT_BINARY" plot runA runB --out both.svg --smooth 3 >plot.log || { cat plot.log; fail "plot"; }
grep -q 'plot: both.svg (3 metric(s), 2 run(s))' plot.log || { cat plot.log; fail "plot summary line"; }
if command -v xmllint >/dev/null; then xmllint --noout both.svg || fail "not well-formed XML"; fi
for label in '>step</text>' '>loss</text>' '>grad_norm</text>' '>validation/loss</text>' '>runA</text>' '>runB</text>'; do
  grep -qF "$label" both.svg || fail "no text $label in the SVG"
done
# The default output: plot.svg in the first run's folder.
"$QT_BINARY" plot runA >/dev/null && [ -s runA/plot.svg ] || fail "default --out"
# --out naming a run's records file (plot takes one by any name) is refused, and it stays.
cp runA/metrics.jsonl rec.svg && cp rec.svg keep.jsonl
if "$QT_BINARY" plot rec.svg --out ./rec.svg 2>err.txt; then fail "plot over its input"; fi
grep -qF "error: --out ./rec.svg is the records file of run rec.svg; writing it would destroy them" \
  err.txt || { cat err.txt; fail "plot over its input: sentence"; }
cmp -s keep.jsonl rec.svg || fail "plot over its input changed the records"

command -v rsvg-convert >/dev/null && command -v pngtopnm >/dev/null ||
  { echo "skip: rendering needs rsvg-convert (librsvg2-bin) and pngtopnm (netpbm)"; exit 77; }
# Pixels: all, not white, runA's blue (31,119,180), runB's red (214,39,40).
check_png() { # PNG file, what drew it
  head -c 8 "$1" | od -An -tx1 | tr -d ' \n' | grep -qx 89504e470d0a1a0a || fail "$2: $1 is not a PNG"
  pngtopnm -plain "$1" >"$1.ppm" || fail "$2: $1 does not decode"
  read -r total ink blue red < <(awk 'NR == 2 { w = $1; h = $2 } NR > 3 { for (i = 1; i <= NF; i++) v[n++] = $i }
    END { for (k = 0; k + 2 < n; k += 3) { t++; r = v[k]; g = v[k + 1]; b = v[k + 2]
            if (r < 250 || g < 250 || b < 250) ink++
            if (r == 31 && g == 119 && b == 180) blue++
            if (r == 214 && g == 39 && b == 40) red++ }
          print t, ink + 0, blue + 0, red + 0 }' "$1.ppm")
  echo "$2: $total pixels, $ink not white, $blue runA blue, $red runB red"
  [ "$total" -gt 100000 ] && [ "$ink" -gt 5000 ] && [ "$blue" -gt 200 ] && [ "$red" -gt 200 ] ||
    fail "$2: the rendered plot is blank or lacks a run's curve"
}
rsvg-convert -o both.png both.svg || fail "rsvg-convert cannot render the SVG"
check_png both.png "the SVG rendered by rsvg-convert"
# --out FILE.png: the same picture, rendered by qtitan itself (librsvg and cairo).
"$QT_BINARY" plot runA runB --out direct.png --smooth 3 >plot.log || { cat plot.log; fail "plot --out .png"; }
grep -q 'plot: direct.png (3 metric(s), 2 run(s))' plot.log || { cat plot.log; fail "plot .png summary line"; }
check_png direct.png "qtitan plot --out direct.png"
[ "$(head -2 direct.png.ppm | tail -1)" = "$(head -2 both.png.ppm | tail -1)" ] ||
  fail "the PNG's size differs from the SVG's"

# Bad input: one sentence, non-zero exit.
bad() { # expected text, then arguments
  local want=$1; shift
  set +e; "$QT_BINARY" plot "$@" >/dev/null 2>err.txt; local rc=$?; set -e
  [ $rc -ne 0 ] && grep -qF "$want" err.txt || { cat err.txt; fail "plot $* should fail with: $want"; }
}
mkdir -p broken && printf '{"step":1,"loss":3}\n{"step":2,"loss":\n' >broken/metrics.jsonl
bad "error: broken/metrics.jsonl:2: not a JSON object" broken
bad 'error: metric "perplexity" is in none of the runs'"'"' records' runA --metric perplexity
bad "plot writes SVG or PNG (a name ending in .svg or .png)" runA --out x.jpg
bad "error: missing_dir does not exist; expected a run's dump folder" missing_dir
bad "error: --smooth 0: expected an integer >= 1" runA --smooth 0
echo "e2e_plot: ok"
