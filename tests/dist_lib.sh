# Shared by the multi-process end-to-end tests (tests/e2e_dist_*.sh), sourced after `set -uo
# pipefail`: skips (exit 77) without mpirun or an MPI build, sets the Open MPI environment for
# root and containers, one OpenMP thread per rank, a temporary folder $TMP (removed on exit)
# with a localhost hostfile, fail=0, and:
#   dist_data FILE          300 documents of 20-80 words from a fixed word list (a fixed LCG,
#                           no awk rand()), one JSONL line each;
#   dist_run NP NAME ARGS   `qtitan train ARGS` into $TMP/NAME, log $TMP/NAME.log; NP = 0 runs
#                           one process without mpirun, else mpirun -np NP (120 s limit);
#   dist_table DIR          "step loss grad_norm" per line of DIR/metrics.jsonl;
#   dist_rewind NAME RANKS STEP [MESH]
#                           rewrites $TMP/NAME's sharded checkpoint marker to list STEP alone
#                           (MESH as "1, 1, 2"), as a crash before the next commit leaves it;
#   dist_resumed_same A B RANKS STEP LAST LABEL
#                           run B, resumed from STEP, ended at LAST with run A's per-rank model
#                           and optimizer files and last losses, bitwise; else fail=1.
#   dist_export_same REF CKPT LABEL
#                           `qtitan export --checkpoint CKPT` (one process, no MPI) writes a
#                           directory byte-identical to the one of the file REF (weights,
#                           config.json, tokenizer files), and `qtitan generate --checkpoint
#                           CKPT` (the pieces joined as read) gives that directory's greedy ids
#                           and log-probs; else fail=1.
#   dist_step NAME N        "loss grad_norm" of step N of run NAME;
#   dist_close A B LABEL STEPS...
#                           each step's loss and grad norm of run B within 1e-6 relative of
#                           run A's (sets fail=1 and says which step otherwise);
#   dist_fork SRC DST       run DST starts from a copy of run SRC's checkpoint folder;
#   dist_bf16_path NAME     "widen", "onednn" or "amx": how run NAME multiplied its bf16 products (its
#                           gemm line). Each fresh job picks that by timing (ops/gemm.h) and
#                           attention's precision follows it (docs/training.md), so a bf16 run
#                           compared with NAME's pins it: QT_GEMM_BF16=$(dist_bf16_path NAME).
command -v mpirun >/dev/null || { echo "skip: mpirun not found"; exit 77; }
BIN="${QT_BINARY:-build/qtitan}"
SRC="${QT_SOURCE_DIR:-.}"
[ -x "$(dirname "$BIN")/mpi_comm" ] || { echo "skip: built without MPI"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
export QT_CACHE_DIR="$TMP/cache"
printf 'localhost slots=4\n' >"$TMP/hostfile"
fail=0

dist_data() {
  awk 'BEGIN {
    n = split("the quick brown fox jumps over a lazy dog and then runs far away from home " \
              "while small birds sing in green trees near the old river bank at dawn", w, " ");
    s = 12345;
    for (d = 0; d < 300; d++) {
      s = (s * 1103515245 + 12345) % 2147483648; len = 20 + s % 61; line = "";
      for (i = 0; i < len; i++) {
        s = (s * 1103515245 + 12345) % 2147483648;
        line = line (i ? " " : "") w[1 + int(s / 65536) % n];
      }
      printf "{\"text\": \"%s\"}\n", line;
    }
  }' >"$1"
}

# Each run is bounded, so a hang fails the test instead of stalling it; the bound is loose
# because 4 ranks oversubscribed on 2 cores take minutes on a loaded machine. A run that hits
# it says so, so that no caller's failure is silent.
dist_run() {
  local np=$1 name=$2 rc
  shift 2
  if [ "$np" = 0 ]; then
    timeout 300 "$BIN" train "$@" --job.dump_folder="$TMP/$name" >"$TMP/$name.log" 2>&1
  else
    timeout 300 mpirun --hostfile "$TMP/hostfile" --oversubscribe -np "$np" "$BIN" train \
      "$@" --job.dump_folder="$TMP/$name" >"$TMP/$name.log" 2>&1
  fi
  rc=$?
  [ $rc -eq 124 ] && echo "FAIL: run $name ($np ranks) did not end within 300 s"
  return $rc
}

dist_table() { sed -E 's/.*"step":([0-9]+),"loss":([^,]+),"grad_norm":([^,]+),.*/\1 \2 \3/' "$1/metrics.jsonl"; }

dist_rewind() {
  local mesh=""
  [ -z "${4:-}" ] || mesh=", \"mesh\": [$4]"
  printf '{"format": "qtitan-sharded-checkpoint", "ranks": %s%s, "step": %s, "steps": [%s]}\n' \
    "$2" "$mesh" "$3" "$3" >"$TMP/$1/checkpoint/latest.json"
}

dist_resumed_same() {
  local a=$1 b=$2 ranks=$3 step=$4 last=$5 label=$6 ok=1 r f
  grep -q "resumed from .*rank-0/step-$step" "$TMP/$b.log" ||
    { echo "FAIL: $label did not resume from step $step"; cat "$TMP/$b.log"; ok=0; }
  for ((r = 0; r < ranks; r++)); do
    for f in model.safetensors optim.safetensors; do
      cmp -s "$TMP/$a/checkpoint/rank-$r/step-$last/$f" "$TMP/$b/checkpoint/rank-$r/step-$last/$f" ||
        { echo "FAIL: $label: rank $r $f after the resume differs (or is missing)"; ok=0; }
    done
  done
  [ "$(dist_table "$TMP/$a" | tail -n $((last - step)))" = "$(dist_table "$TMP/$b" | tail -n $((last - step)))" ] ||
    { echo "FAIL: $label: resumed losses differ"; ok=0; }
  if [ $ok = 1 ]; then
    echo "ok: $label resumed from its step-$step checkpoint is bitwise the uninterrupted one"
  else
    fail=1
  fi
}

dist_export_same() {
  rm -rf "$TMP/export"
  if "$BIN" export --checkpoint "$2" --out "$TMP/export" >"$TMP/export.log" 2>&1 &&
    diff -r "$(dirname "$1")" "$TMP/export" >/dev/null; then
    echo "ok: qtitan export --checkpoint $3 writes one process's export, tokenizer included"
  else
    echo "FAIL: qtitan export --checkpoint $3"; cat "$TMP/export.log"; fail=1
  fi
  local g=(generate --prompt "1 2 3" --max-new-tokens 3 --temperature 0 --json) want got
  want=$("$BIN" "${g[@]}" --model "$(dirname "$1")" 2>"$TMP/gen.err") &&
    got=$("$BIN" "${g[@]}" --checkpoint "$2" 2>"$TMP/gen.err") && [ -n "$want" ] && [ "$got" = "$want" ] &&
    echo "ok: qtitan generate --checkpoint $3 generates as one process's export" ||
    { echo "FAIL: qtitan generate --checkpoint $3: '$got' vs '$want'"; cat "$TMP/gen.err"; fail=1; }
}
dist_step() { dist_table "$TMP/$1" | awk -v s="$2" '$1 == s { print $2, $3 }' | tail -1; }

dist_close() {
  local a=$1 b=$2 label=$3 s x y
  shift 3
  for s in "$@"; do
    x=$(dist_step "$a" "$s") y=$(dist_step "$b" "$s")
    if [ -z "$x" ] || [ -z "$y" ] || ! awk -v x="$x" -v y="$y" 'BEGIN { split(x, p); split(y, q)
        for (i = 1; i <= 2; i++) { d = p[i] - q[i]; if (d < 0) d = -d; m = p[i] < 0 ? -p[i] : p[i]
          if (d > 1e-6 * m) exit 1 } }'; then
      echo "FAIL: $label, step $s: '$x' vs '$y'"; fail=1; return 1
    fi
  done
  echo "ok: $label (steps $*)"
}

dist_fork() { mkdir -p "$TMP/$2" && cp -r "$TMP/$1/checkpoint" "$TMP/$2/"; }

dist_bf16_path() {
  if grep -q 'gemm: .*bf16 as dnnl_sgemm on widened' "$TMP/$1.log"; then echo widen
  elif grep -q "gemm: .*bf16 via qtitan's AMX tiles" "$TMP/$1.log"; then echo amx
  elif grep -q 'gemm: .*bf16 via ' "$TMP/$1.log"; then echo onednn
  else echo auto; fi
}
