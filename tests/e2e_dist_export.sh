#!/usr/bin/env bash
# HF export of tensor-parallel runs (mpirun --oversubscribe through a localhost hostfile, on a
# small generated dataset and the tiny fixture tokenizer):
#   - with lr = 0 (the parameters stay the initial ones, bitwise the same on any mesh) TP 2
#     (untied), FSDP 2 x TP 2 (tied) and HSDP 2 x TP 2 (replicas of a TP pair; untied) write
#     checkpoint.last_save_in_hf directories byte-identical to one process's export (weights,
#     config.json and the tokenizer files the run saved in its folder), and so does `qtitan
#     export` (no MPI) of their folders and of one rank's step directory;
#   - a TP 2 run trained for 10 steps exports a model that loads as the initial weights of a
#     one-process run, and whose loss on held-out lines (`qtitan eval`) is that of the export of
#     the same training on one process, to 1e-5 relative; loaded as the initial weights of
#     FSDP 2 x TP 2 (each rank reads its part of every tensor from the file; rank 0's load
#     progress counts up to its part) and saved after a zero-lr step, it is written back byte for byte.
set -uo pipefail
# shellcheck source=tests/dist_lib.sh
. "$(dirname "$0")/dist_lib.sh"
dist_data "$TMP/data.jsonl"

ARGS=(--config "$SRC/configs/debug.toml" --model.tokenizer_path="$SRC/tests/fixtures/tokenizer/tiny_gpt2"
  --training.dataset_path="$TMP/data.jsonl" --model.vocab_size=640 --model.dim=32
  --model.n_layers=3 --model.n_heads=4 --model.n_kv_heads=2 --model.head_dim=8
  --model.hidden_dim=64 --training.seq_len=32 --training.local_batch_size=2
  --training.global_batch_size=8 --metrics.peak_tflops=1)

# run NP NAME ARGS...: NP = 0 runs one process without mpirun.
run() {
  local np=$1 name=$2
  shift 2
  dist_run "$np" "$name" "${ARGS[@]}" "$@"
}
hf_file() { echo "$TMP/$1/checkpoint/step-$2/hf/model.safetensors"; }

# lr = 0: every mesh holds one process's initial parameters.
HF=(--checkpoint.enable=true --checkpoint.interval=5 --checkpoint.last_save_in_hf=true --training.steps=3
  --optimizer.lr=0)
for c in "tp2 2 false --parallelism.tensor_parallel_degree=2" \
  "fsdptp4 4 true --parallelism.tensor_parallel_degree=2" \
  "hsdptp4 4 false --parallelism.tensor_parallel_degree=2 --parallelism.data_parallel_replicate_degree=2"; do
  set -- $c
  name=$1 np=$2 tie=$3
  shift 3
  run 0 "one-$tie" "${HF[@]}" --model.tie_embeddings="$tie" &&
    run "$np" "$name" "${HF[@]}" --model.tie_embeddings="$tie" "$@" ||
    { echo "FAIL: $name or one-$tie with last_save_in_hf"; cat "$TMP/one-$tie.log" "$TMP/$name.log"; fail=1; continue; }
  if grep -q 'not built yet' "$TMP/$name.log" || ! [ -f "$(hf_file "$name" 3)" ]; then
    echo "FAIL: $name wrote no HF export"; cat "$TMP/$name.log"; fail=1; continue
  fi
  diff -r "$TMP/one-$tie/checkpoint/step-3/hf" "$TMP/$name/checkpoint/step-3/hf" &&
    cmp -s "$SRC/tests/fixtures/tokenizer/tiny_gpt2/tokenizer.json" "$TMP/$name/checkpoint/step-3/hf/tokenizer.json" &&
    echo "ok: the HF export of $name (tie_embeddings=$tie) is byte-identical to one process's, tokenizer included" ||
    { echo "FAIL: the HF export of $name differs from one process's"; fail=1; }
  for src in checkpoint "checkpoint/rank-$((np - 1))/step-3"; do
    dist_export_same "$(hf_file "one-$tie" 3)" "$TMP/$name/$src" "<$name>/$src"
  done
done

# Trained: TP 2 and one process train the same 10 steps; both exports score held-out lines.
TR=(--model.tie_embeddings=false --training.steps=10 --checkpoint.enable=true --checkpoint.interval=10
  --checkpoint.last_save_in_hf=true)
awk 'BEGIN { s = 777; for (l = 0; l < 4; l++) { line = "";
  for (i = 0; i < 24; i++) { s = (s * 1103515245 + 12345) % 2147483648; line = line (i ? " " : "") int(s / 65536) % 640 }
  print line } }' >"$TMP/heldout.txt"
loss_of() { "$BIN" eval --model "$1" --tokens "$TMP/heldout.txt" 2>&1 | sed -n 's/^loss: *//p'; }
if run 0 tr-one "${TR[@]}" && run 2 tr-tp2 "${TR[@]}" --parallelism.tensor_parallel_degree=2 &&
  [ -f "$(hf_file tr-tp2 10)" ] &&
  run 0 tr-load --model.tie_embeddings=false --training.steps=2 --checkpoint.initial_load_in_hf=true \
    --checkpoint.initial_load_path="$TMP/tr-tp2/checkpoint/step-10/hf" &&
  grep -q 'loaded initial weights' "$TMP/tr-load.log"; then
  echo "ok: the HF export of a trained TP 2 run loads as initial weights on one process"
else
  echo "FAIL: trained TP 2 export"; cat "$TMP/tr-tp2.log" "$TMP/tr-load.log"; fail=1
fi
LD=(--model.tie_embeddings=false --training.steps=1 --optimizer.lr=0 --checkpoint.enable=true
  --checkpoint.last_save_in_hf=true --checkpoint.initial_load_in_hf=true
  --checkpoint.initial_load_path="$TMP/tr-tp2/checkpoint/step-10/hf")
if (export QT_PROGRESS_SECONDS=0
  run 4 ld-tp2f2 "${LD[@]}" --parallelism.tensor_parallel_degree=2 --parallelism.data_parallel_shard_degree=2) &&
  cmp "$(hf_file tr-tp2 10)" "$(hf_file ld-tp2f2 1)" && grep -q '^loading .*: 100% ' "$TMP/ld-tp2f2.log"; then
  echo "ok: the trained export loaded by FSDP 2 x TP 2 (progress to 100% of rank 0's part) is written back byte for byte after a zero-lr step"
else
  echo "FAIL: the trained export through an FSDP 2 x TP 2 load"; cat "$TMP/ld-tp2f2.log"; fail=1
fi
a=$(loss_of "$TMP/tr-one/checkpoint/step-10/hf") b=$(loss_of "$TMP/tr-tp2/checkpoint/step-10/hf")
if [ -n "$a" ] && [ -n "$b" ] && awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * a) }'; then
  echo "ok: held-out loss of the trained exports, one process $a, TP 2 $b"
else
  echo "FAIL: held-out loss of the trained exports differs (one process '$a', TP 2 '$b')"; fail=1
fi
# A training checkpoint as the initial weights (initial_load_in_hf = false, torchtitan's model-only
# initial load), across meshes: the TP 2 run's folder into one process, and one process's step
# into FSDP 2 x TP 2; after a zero-lr step each writes back its source's export byte for byte.
IL=(--model.tie_embeddings=false --training.steps=1 --optimizer.lr=0 --checkpoint.enable=true
  --checkpoint.last_save_in_hf=true)
if run 0 il-one "${IL[@]}" --checkpoint.initial_load_path="$TMP/tr-tp2/checkpoint" &&
  grep -q 'initial weights: step 10 of the training checkpoint' "$TMP/il-one.log" &&
  cmp "$(hf_file tr-tp2 10)" "$(hf_file il-one 1)" &&
  run 4 il-f2t2 "${IL[@]}" --checkpoint.initial_load_path="$TMP/tr-one/checkpoint/step-10" \
    --parallelism.tensor_parallel_degree=2 --parallelism.data_parallel_shard_degree=2 &&
  cmp "$(hf_file tr-one 10)" "$(hf_file il-f2t2 1)"; then
  echo "ok: training checkpoints as initial weights (TP 2 into one process, one process into FSDP 2 x TP 2) are written back byte for byte"
else
  echo "FAIL: a training checkpoint as initial weights"; cat "$TMP/il-one.log" "$TMP/il-f2t2.log" 2>/dev/null | tail -20; fail=1
fi

# generate and eval read a sharded checkpoint (the folder or a rank's step), joining the pieces
# as they are read: the same greedy ids and log-probs as from its HF export (fp32 and bf16), and
# the held-out loss of that export (the tokenizer comes from the folder).
gen() { "$BIN" generate "$@" --prompt "1 2 3" --max-new-tokens 4 --temperature 0 --json 2>"$TMP/gen.err"; }
for dt in float32 bfloat16; do
  want=$(gen --model "$TMP/tr-tp2/checkpoint/step-10/hf" --dtype $dt)
  for src in checkpoint checkpoint/rank-1/step-10; do
    got=$(gen --checkpoint "$TMP/tr-tp2/$src" --dtype $dt) && [ -n "$want" ] && [ "$got" = "$want" ] &&
      echo "ok: generate --checkpoint <tp2>/$src --dtype $dt: as its HF export" ||
      { echo "FAIL: generate --checkpoint <tp2>/$src --dtype $dt: '$got' vs '$want' $(cat "$TMP/gen.err")"; fail=1; }
  done
done
ev=$("$BIN" eval --checkpoint "$TMP/tr-tp2/checkpoint" --dataset "$TMP/data.jsonl" --max-tokens 500 2>&1 | grep '^loss')
ew=$("$BIN" eval --model "$TMP/tr-tp2/checkpoint/step-10/hf" --dataset "$TMP/data.jsonl" --max-tokens 500 2>&1 | grep '^loss')
[ -n "$ev" ] && [ "$ev" = "$ew" ] && echo "ok: eval --checkpoint <tp2>/checkpoint: $ev, as its HF export" ||
  { echo "FAIL: eval --checkpoint of the sharded folder '$ev', its export '$ew'"; fail=1; }
if "$BIN" inspect "$TMP/tr-tp2/checkpoint" >/dev/null 2>"$TMP/insp.err"; then
  echo "FAIL: inspect took a sharded checkpoint for an HF directory"; fail=1
elif ! grep -q "is the checkpoint of a run on many processes" "$TMP/insp.err"; then
  echo "FAIL: inspect of a sharded checkpoint: $(cat "$TMP/insp.err")"; fail=1
fi
# Only train runs on many processes: two copies of export would write the same files at once.
if timeout 60 mpirun --hostfile "$TMP/hostfile" --oversubscribe -np 2 "$BIN" export \
  --checkpoint "$TMP/tr-tp2/checkpoint" --out "$TMP/race" >"$TMP/race.log" 2>&1; then
  echo "FAIL: qtitan export under mpirun -np 2 should refuse"; fail=1
elif ! grep -q "qtitan export runs on one process, but mpirun started 2" "$TMP/race.log" ||
  [ -e "$TMP/race" ]; then
  echo "FAIL: qtitan export under mpirun -np 2"; cat "$TMP/race.log"; fail=1
else
  echo "ok: qtitan export under mpirun -np 2 refuses before writing"
fi
[ $fail = 0 ] && echo "e2e_dist_export: ok"
exit $fail
