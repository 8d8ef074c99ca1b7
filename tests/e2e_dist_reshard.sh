#!/usr/bin/env bash
# Resharding on resume (mpirun --oversubscribe through a localhost hostfile, a small generated
# dataset, the tiny fixture tokenizer, 3-layer model): a checkpoint written on one mesh resumes
# on another, parameters, AdamW state and step, data position and RNG carried over:
#   - FSDP 4 -> FSDP 2 -> 1 process, TP 2 -> FSDP 2, HSDP 2 x 2 -> FSDP 2 and 1 process ->
#     FSDP 2: the steps after the resume match continuing on the mesh that wrote the checkpoint
#     to 1e-6 relative (loss and grad norm; the gradient sums run in another order, so not
#     bitwise);
#   - FSDP 2 -> HSDP 2 x 1 with one micro-batch per rank, where both meshes sum a gradient as
#     rank 0's + rank 1's: the losses after the resume and the final parameters (HF export)
#     are bitwise those of FSDP 2 going on (not the logged grad norm, which differs in its
#     last digits: its double sum of squares runs over two slices on FSDP 2 and one whole
#     gradient on HSDP; it is held to 1e-6 like the rest);
#   - a resume says which config keys changed since the checkpoint: the mesh keys of a reshard
#     in an info line, any other key (training.steps here) in a warning naming it;
#   - the resumed parameters are bitwise the saved ones: with lr = 0 a run resumed on another
#     mesh exports (last_save_in_hf) the file `qtitan export` writes from the checkpoint;
#   - checkpoint.load_step resumes an older step; exclude_from_loading = ["optimizer"] starts
#     from fresh AdamW moments (the first step's loss is the same, the next differs),
#     ["dataloader"] restarts the data at its first row;
#   - loading, resharded or on the same mesh, shows plain progress lines when stderr is not a
#     terminal.
set -uo pipefail
# shellcheck source=tests/dist_lib.sh
. "$(dirname "$0")/dist_lib.sh"
dist_data "$TMP/data.jsonl"

ARGS=(--config "$SRC/configs/debug.toml" --model.tokenizer_path="$SRC/tests/fixtures/tokenizer/tiny_gpt2"
  --training.dataset_path="$TMP/data.jsonl" --model.vocab_size=640 --model.dim=32
  --model.n_layers=3 --model.n_heads=4 --model.n_kv_heads=2 --model.head_dim=8
  --model.hidden_dim=64 --training.seq_len=32 --training.local_batch_size=2
  --training.global_batch_size=8 --metrics.peak_tflops=1 --model.tie_embeddings=false
  --checkpoint.enable=true --checkpoint.interval=2 --checkpoint.keep_latest_k=0)
FSDP4=(--parallelism.data_parallel_shard_degree=4)
FSDP2=(--parallelism.data_parallel_shard_degree=2)
TP2=(--parallelism.tensor_parallel_degree=2)

run() {
  local np=$1 name=$2
  shift 2
  dist_run "$np" "$name" "${ARGS[@]}" "$@" || { echo "FAIL: run $name"; tail -5 "$TMP/$name.log"; fail=1; return 1; }
}
# FSDP 4 writes steps 2 and 4; FSDP 2 resumes step 4 and runs to 6 (writing 6 with 2 ranks);
# one process resumes that and runs to 8. Each is compared with the mesh that wrote it going on.
run 4 f4 "${FSDP4[@]}" --training.steps=4 &&
  dist_fork f4 f4to2 && QT_PROGRESS_SECONDS=0 run 2 f4to2 "${FSDP2[@]}" --training.steps=6 &&
  dist_fork f4 f4go && QT_PROGRESS_SECONDS=0 run 4 f4go "${FSDP4[@]}" --training.steps=6 &&
  dist_close f4go f4to2 "FSDP 4 -> FSDP 2 matches FSDP 4 going on" 5 6
grep -q 'resharding it' "$TMP/f4to2.log" || { echo "FAIL: f4to2 did not reshard"; fail=1; }
for l in f4to2 f4go; do # resharded, and on the mesh that wrote it
  grep -Eq '^loading checkpoint step 4: +[0-9]+%  [0-9.]+/[0-9.]+ MB' "$TMP/$l.log" && ! grep -q $'\r' "$TMP/$l.log" &&
    echo "ok: loading a checkpoint ($l) shows plain progress lines off a terminal" ||
    { echo "FAIL: no plain progress lines while loading ($l)"; fail=1; }
done
dist_fork f4to2 f2to1 && run 0 f2to1 --training.steps=8 &&
  dist_fork f4to2 f2go && run 2 f2go "${FSDP2[@]}" --training.steps=8 &&
  dist_close f2go f2to1 "FSDP 2 -> 1 process matches FSDP 2 going on" 7 8

# TP 2 -> FSDP 2.
run 2 tp2 "${TP2[@]}" --training.steps=2 &&
  dist_fork tp2 tp2to2 && run 2 tp2to2 "${FSDP2[@]}" --training.steps=4 &&
  run 2 tp2go "${TP2[@]}" --training.steps=4 &&
  dist_close tp2go tp2to2 "TP 2 -> FSDP 2 matches TP 2 going on" 3 4

# 1 process -> FSDP 2, and the same step resumed with the optimizer state left out.
run 0 one --training.steps=2 &&
  dist_fork one one2 && run 2 one2 "${FSDP2[@]}" --training.steps=4 &&
  run 0 onego --training.steps=4 &&
  dist_close onego one2 "1 process -> FSDP 2 matches one process going on" 3 4

# HSDP 2 x 2 -> FSDP 2: a plain reshard (only the mesh and load_step differ) names the mesh
# keys and warns about nothing, while FSDP 4 -> FSDP 2 above also raised training.steps.
HSDP22=(--parallelism.data_parallel_replicate_degree=2 --parallelism.data_parallel_shard_degree=2)
run 4 h22 "${HSDP22[@]}" --training.steps=4 &&
  dist_fork h22 h22to2 && run 2 h22to2 "${FSDP2[@]}" --training.steps=4 --checkpoint.load_step=2 &&
  dist_close h22 h22to2 "HSDP 2 x 2 -> FSDP 2 matches HSDP 2 x 2 going on" 3 4
if grep -q 'step 2 was written on another mesh: parallelism.data_parallel_replicate_degree = 2 (now 1)$' "$TMP/h22to2.log" &&
   ! grep -q 'warning' "$TMP/h22to2.log" &&
   grep -q 'step 4 was written on another mesh: parallelism.data_parallel_shard_degree = 4 (now 2)$' "$TMP/f4to2.log" &&
   grep -q 'warning: \[checkpoint\] .*step-4 was written under another config: training.steps = 4 (now 6)$' "$TMP/f4to2.log"; then
  echo "ok: a reshard names the mesh keys it changed; another key (training.steps) still warns"
else
  echo "FAIL: the config lines of a resume"; grep -h 'checkpoint\]' "$TMP/h22to2.log" "$TMP/f4to2.log"; fail=1
fi

# FSDP 2 -> HSDP 2 x 1, one micro-batch per rank (global batch 4): bitwise.
ONE_MB=(--training.global_batch_size=4 --checkpoint.last_save_in_hf=true --training.steps=4)
run 2 bf2 "${FSDP2[@]}" "${ONE_MB[@]}" &&
  dist_fork bf2 bh2 && run 2 bh2 "${ONE_MB[@]}" --checkpoint.load_step=2 \
  --parallelism.data_parallel_replicate_degree=2 --parallelism.data_parallel_shard_degree=1 && {
  if [ "$(dist_table "$TMP/bf2" | awk '$1 > 2 { print $1, $2 }')" = "$(dist_table "$TMP/bh2" | awk '{ print $1, $2 }')" ] &&
     [ "$(dist_table "$TMP/bh2" | wc -l)" = 2 ] &&
     cmp -s "$TMP/bf2/checkpoint/step-4/hf/model.safetensors" "$TMP/bh2/checkpoint/step-4/hf/model.safetensors"; then
    dist_close bf2 bh2 "FSDP 2 -> HSDP 2 x 1 continues bitwise (losses, parameters)" 3 4
  else
    echo "FAIL: FSDP 2 -> HSDP 2 x 1 is not bitwise FSDP 2 going on"; paste <(dist_table "$TMP/bf2") <(dist_table "$TMP/bh2"); fail=1
  fi
}

# The resumed parameters are the saved ones, bit for bit: lr = 0 leaves them as loaded, and
# the HF export of the next step is the export of the checkpoint.
if "$BIN" export --checkpoint "$TMP/f4/checkpoint" --out "$TMP/f4-hf" >"$TMP/export.log" 2>&1 &&
  dist_fork f4 f4lr0 && run 0 f4lr0 --training.steps=5 --optimizer.lr=0 --checkpoint.last_save_in_hf=true &&
  cmp -s "$TMP/f4-hf/model.safetensors" "$TMP/f4lr0/checkpoint/step-5/hf/model.safetensors"; then
  echo "ok: FSDP 4's step 4 resumed on one process holds bitwise its parameters"
else
  echo "FAIL: the parameters resumed from FSDP 4 on one process differ from the checkpoint's"; cat "$TMP/export.log"; fail=1
fi

# load_step: step 2 of FSDP 4's folder (4 is newer) resumed on FSDP 2 matches FSDP 4's step 3.
dist_fork f4 ls && run 2 ls "${FSDP2[@]}" --training.steps=3 --checkpoint.load_step=2 &&
  grep -q 'resumed from .*step-2 (step 2)' "$TMP/ls.log" &&
  dist_close f4 ls "checkpoint.load_step = 2 resumes step 2, not the newest" 3
dist_fork f4 lsbad && dist_run 2 lsbad "${ARGS[@]}" "${FSDP2[@]}" --training.steps=3 --checkpoint.load_step=3 &&
  { echo "FAIL: a load_step that is not there was accepted"; fail=1; }
grep -q 'checkpoint.load_step = 3: .* holds no complete step 3' "$TMP/lsbad.log" &&
  echo "ok: a load_step that is not there is one sentence" || { echo "FAIL: load_step 3"; cat "$TMP/lsbad.log"; fail=1; }

# exclude_from_loading: without the optimizer state step 3 sees the same parameters (same
# loss) but takes another update, so step 4 differs; without the data position step 3 reads
# step 1's rows.
dist_fork f4 exo && run 2 exo "${FSDP2[@]}" --training.steps=4 --checkpoint.load_step=2 \
  --checkpoint.exclude_from_loading=optimizer && {
  a=$(dist_step f4 3) b=$(dist_step exo 3) c=$(dist_step f4 4) d=$(dist_step exo 4)
  [ "${a%% *}" = "${b%% *}" ] && [ -n "$c" ] && [ "${c%% *}" != "${d%% *}" ] &&
    echo "ok: exclude_from_loading = [\"optimizer\"] keeps the weights, not the AdamW state" ||
    { echo "FAIL: exclude optimizer: step 3 '$a' '$b', step 4 '$c' '$d'"; fail=1; }
}
dist_fork one exd && run 0 exd --training.steps=3 --checkpoint.exclude_from_loading=dataloader,lr_scheduler &&
  grep -q 'data from its first row' "$TMP/exd.log" && grep -q 'lr schedule restarted' "$TMP/exd.log" &&
  echo "ok: exclude_from_loading = [\"dataloader\", \"lr_scheduler\"] is honoured" ||
  { echo "FAIL: exclude dataloader"; fail=1; }
dist_run 0 exbad "${ARGS[@]}" --checkpoint.exclude_from_loading=weights &&
  { echo "FAIL: exclude_from_loading = weights accepted"; fail=1; }
grep -q '"weights" is not one of' "$TMP/exbad.log" && echo "ok: an unknown exclude_from_loading name is one sentence" ||
  { echo "FAIL: exclude weights"; cat "$TMP/exbad.log"; fail=1; }
exit $fail
