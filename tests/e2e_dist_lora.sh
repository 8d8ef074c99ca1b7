#!/usr/bin/env bash
# LoRA on many processes (mpirun --oversubscribe through a localhost hostfile, the debug model
# cut small, the tiny fixture tokenizer, adapters with dropout on wq, wv, wo, w1 and w2, so on
# column- and row-split bases alike):
#   - FSDP 2, TP 2, HSDP 2, and FSDP 2 x TP 2 with sequence parallelism and full activation
#     checkpointing train 10 steps with every step's loss and grad norm within 1e-5 relative of
#     one process's (dropout masks included: they are drawn from the whole input's indices),
#     and rank 0 keeps its share of the adapters: its tensor-parallel blocks, 1/dp_shard of them;
#   - the TP 2 run resumed from its step-5 checkpoint repeats steps 6-10 and its checkpoint
#     files bitwise, and writes byte-identical adapter and merged files;
#   - its exports are those of its adapters: one process resuming its last checkpoint (a
#     resharding, nothing left to train) writes byte-identical adapter_model.safetensors and
#     merged model.safetensors; and the merged model scores held-out tokens as one process's
#     merged model does (1e-5 relative);
#   - with lora.base_dtype = "bfloat16" (shards held and gathered in bf16), TP 2 and FSDP 2
#     follow one process's bf16 base: steps 1-2 to 1e-5 relative, later steps within bf16
#     arithmetic's bounds (below); all sample, and their bfloat16 merged exports score
#     held-out tokens alike; one process resuming FSDP 2's last checkpoint (a resharding)
#     writes byte-identical adapters;
#   - LoRA on the MoE debug model: FSDP 2 and EP 2 follow one process (losses, grad norms,
#     routing figures, merged exports), a resume repeats its steps exactly, and one process on
#     EP 2's last checkpoint writes a byte-identical merged model.safetensors (the experts,
#     gathered one unit at a time from both ranks, written one per HF tensor);
#   - samples through the shards on TP 2, one unit at a time, are the whole merged copy's;
#   - an error in the middle of the merged export (a merged weight beyond float16's range,
#     found on rank 0 after it has asked the ranks for the first units) ends both ranks with
#     that sentence, not a hang.
set -uo pipefail
# shellcheck source=tests/dist_lib.sh
. "$(dirname "$0")/dist_lib.sh"
dist_data "$TMP/data.jsonl"

ARGS=(--config "$SRC/configs/debug.toml" --model.tokenizer_path="$SRC/tests/fixtures/tokenizer/tiny_gpt2"
  --training.dataset_path="$TMP/data.jsonl" --model.vocab_size=640 --model.dim=32
  --model.n_layers=2 --model.n_heads=4 --model.n_kv_heads=2 --model.head_dim=8
  --model.hidden_dim=64 --training.seq_len=32 --training.local_batch_size=2
  --training.global_batch_size=8 --metrics.peak_tflops=1 --training.steps=10
  --lora.rank=4 --lora.alpha=8 --lora.dropout=0.1 --optimizer.lr=1e-2
  "--lora.targets=layers.*.attention.wq,layers.*.attention.wv,layers.*.attention.wo,layers.*.feed_forward.w1,layers.*.feed_forward.w2")
SAVE=(--checkpoint.enable=true --checkpoint.interval=5 --checkpoint.last_save_in_hf=true)
TP=--parallelism.tensor_parallel_degree=2
FT=("$TP" --parallelism.enable_sequence_parallel=true --activation_checkpoint.mode=full)

# close NAME A B [LOSS NORM]: every step's loss and grad norm of runs A and B within 1e-5
# relative, or from step 3 on within LOSS and NORM relative.
close() {
  local lt=${4:-1e-5} nt=${5:-1e-5} tight=${6:-2}
  if [ "$(dist_table "$TMP/$2" | wc -l)" = 10 ] && paste -d' ' <(dist_table "$TMP/$2") <(dist_table "$TMP/$3") |
    awk -v lt="$lt" -v nt="$nt" -v tight="$tight" '{ for (k = 2; k <= 3; k++) { d = $k - $(k + 3); if (d < 0) d = -d;
      tol = $1 <= tight ? 1e-5 : k == 2 ? lt : nt; if (d > tol * ($k < 0 ? -$k : $k)) bad = 1 } }
      END { exit bad || NR != 10 }'; then
    echo "ok: $1: 10 steps' loss and grad norm within ${lt} / ${nt} of one process's"
  else
    echo "FAIL: $1 differs from one process"; paste <(dist_table "$TMP/$2") <(dist_table "$TMP/$3"); fail=1
  fi
}

# The adapters' elements, r (I + O) each (wq 32 -> 32, wv 32 -> 16, wo 32 -> 32, w1 32 -> 64,
# w2 64 -> 32), whole and as one tensor-parallel rank's blocks under TP 2 (a column-split base:
# all of A, half of B's rows; a row-split one: half of A's columns, all of B); rank 0 keeps
# 1/dp_shard of its blocks (these layers' units need no padding, so exactly that).
whole=$((2 * 4 * ((32 + 32) + (32 + 16) + (32 + 32) + (32 + 64) + (64 + 32))))
blocks=$((2 * 4 * ((32 + 16) + (32 + 8) + (16 + 32) + (32 + 32) + (32 + 32))))
declare -A held=([fsdp2]=$((whole / 2)) [tp2]=$blocks [hsdp2]=$whole [ft4]=$((blocks / 2)))
dist_run 0 one "${ARGS[@]}" "${SAVE[@]}" || { echo "FAIL: one process"; cat "$TMP/one.log"; exit 1; }
grep -q 'lora: 10 adapter(s) of rank 4' "$TMP/one.log" || { echo "FAIL: adapter line"; cat "$TMP/one.log"; exit 1; }
for c in "fsdp2 2" "tp2 2 $TP" "hsdp2 2 --parallelism.data_parallel_replicate_degree=2 --parallelism.data_parallel_shard_degree=1" \
  "ft4 4 ${FT[*]}"; do
  set -- $c
  name=$1 np=$2
  shift 2
  if dist_run "$np" "$name" "${ARGS[@]}" "${SAVE[@]}" "$@"; then
    close "$name" one "$name"
    if grep -q "lora: rank 0 holds ${held[$name]} of the $whole adapter parameters" "$TMP/$name.log"; then
      echo "ok: $name: rank 0 holds ${held[$name]} of the $whole adapter parameters"
    else
      echo "FAIL: $name: rank 0 should hold ${held[$name]} of the $whole adapter parameters"
      grep 'lora: rank 0 holds' "$TMP/$name.log"; fail=1
    fi
  else
    echo "FAIL: $name"; cat "$TMP/$name.log"; fail=1
  fi
done

# `qtitan export` of a sharded LoRA checkpoint is refused with a sentence (it holds adapters,
# not the model), not a complaint about missing base tensors.
if "$BIN" export --checkpoint "$TMP/fsdp2/checkpoint" --out "$TMP/fsdp2_export" >"$TMP/export.log" 2>&1 ||
   ! grep -q "rank-0/step-10 was written by a LoRA run (lora.rank = 4) and holds its adapters, not a model" "$TMP/export.log"; then
  echo "FAIL: qtitan export of FSDP 2's LoRA checkpoint should be refused with a sentence"; cat "$TMP/export.log"; fail=1
fi

# Resume TP 2 from step 5: the same steps, the same files. (One 4-rank run is all the test
# affords: oversubscribed on 2 shared cores it takes half a minute.)
rm -rf "$TMP/re"; mkdir -p "$TMP/re"; cp -r "$TMP/tp2/checkpoint" "$TMP/re/"
dist_rewind re 2 5 "1, 1, 2"
if dist_run 2 re "${ARGS[@]}" "${SAVE[@]}" "$TP"; then
  dist_resumed_same tp2 re 2 5 10 "TP 2 with LoRA"
  cmp -s "$TMP/tp2/adapter/adapter_model.safetensors" "$TMP/re/adapter/adapter_model.safetensors" &&
    cmp -s "$TMP/tp2/merged/model.safetensors" "$TMP/re/merged/model.safetensors" &&
    echo "ok: the resumed TP 2 run's adapter and merged exports are byte-identical" ||
    { echo "FAIL: the resumed TP 2 run's exports differ"; fail=1; }
else
  echo "FAIL: resume of TP 2"; cat "$TMP/re.log"; fail=1
fi

# One process on FSDP 2 x TP 2's last checkpoint: the exports of the same adapters.
mkdir -p "$TMP/one-ft4"; cp -r "$TMP/ft4/checkpoint" "$TMP/one-ft4/"
if dist_run 0 one-ft4 "${ARGS[@]}" "${SAVE[@]}" && grep -q 'resharding' "$TMP/one-ft4.log" &&
  cmp -s "$TMP/ft4/adapter/adapter_model.safetensors" "$TMP/one-ft4/adapter/adapter_model.safetensors" &&
  cmp -s "$TMP/ft4/adapter/adapter_config.json" "$TMP/one-ft4/adapter/adapter_config.json" &&
  cmp -s "$TMP/ft4/merged/model.safetensors" "$TMP/one-ft4/merged/model.safetensors"; then
  echo "ok: FSDP 2 x TP 2's adapter and merged exports are byte-identical to one process's of its checkpoint"
else
  echo "FAIL: exports of FSDP 2 x TP 2 against one process's of its checkpoint"; cat "$TMP/one-ft4.log"; fail=1
fi
awk 'BEGIN { s = 777; for (l = 0; l < 4; l++) { line = "";
  for (i = 0; i < 24; i++) { s = (s * 1103515245 + 12345) % 2147483648; line = line (i ? " " : "") int(s / 65536) % 640 }
  print line } }' >"$TMP/heldout.txt"
loss_of() { "$BIN" eval --model "$1" --tokens "$TMP/heldout.txt" 2>&1 | sed -n 's/^loss: *//p'; }
# The merged exports of run $1 and run $2 score the held-out tokens within relative $3.
same_merged() {
  local a b
  a=$(loss_of "$TMP/$1/merged") b=$(loss_of "$TMP/$2/merged")
  if [ -n "$a" ] && [ -n "$b" ] && awk -v a="$a" -v b="$b" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= t * a) }'; then
    echo "ok: held-out loss of the merged exports, $1 $a, $2 $b"
  else
    echo "FAIL: held-out loss of the merged exports differs ($1 '$a', $2 '$b')"; fail=1
  fi
}
for name in fsdp2 tp2 ft4; do
  same_merged one "$name" 1e-5
done

# Samples through the shards (TP 2) merge each unit's adapters as it is gathered: one unit at a
# time and the whole copy write the same text, which differs from the base's (a learning rate of
# 0.3 makes the adapters change the samples; lr 0 leaves them at B = 0, the base).
SMP=(--training.steps=3 --sample.freq=3 "--sample.prompts=the quick brown" --sample.max_new_tokens=12
  --sample.temperature=0 "$TP")
if dist_run 2 s-units "${ARGS[@]}" "${SMP[@]}" --optimizer.lr=0.3 --sample.gather=units &&
  dist_run 2 s-whole "${ARGS[@]}" "${SMP[@]}" --optimizer.lr=0.3 --sample.gather=whole &&
  dist_run 2 s-base "${ARGS[@]}" "${SMP[@]}" --optimizer.lr=0 --sample.gather=whole &&
  cmp -s "$TMP/s-units/samples.jsonl" "$TMP/s-whole/samples.jsonl" &&
  ! cmp -s "$TMP/s-whole/samples.jsonl" "$TMP/s-base/samples.jsonl"; then
  echo "ok: samples one unit at a time are the whole merged copy's, not the base's"
else
  echo "FAIL: samples through the shards"; cat "$TMP"/s-*/samples.jsonl; fail=1
fi

# A bf16 base: TP 2 against one process. Step 1 within 1e-5; after it the adapters differ in
# their last bits (gradients summed in another order) and the products' bf16 rounding of the
# activations magnifies that (measured: 3e-6 in loss, 3.2e-4 in grad norm; FSDP 2 2.4e-6 and
# 1.6e-4; where attention's products run in bf16 too, 1.1e-5 in step 2's grad norm; with
# qtitan's AMX tile kernel, whose K order differs from oneDNN's and which TP's row-split
# products run over half of K, TP 2 reached 1.6e-6 in loss and 1.05e-3 in step 10's grad norm
# on a real AMX host, step 1 still within 1e-9), so later steps get the bounds of bf16
# arithmetic: 1e-4 in loss, and in TP 2's grad norm bf16's own precision, 2^-8 = 3.9e-3.
# Both also sample from the merged whole model at step 10 (the one-process copy widens the
# bf16-only weights).
# All export the merged model in bfloat16 (bf16(W) + s B A in fp32, the mesh runs from the
# gathered bf16 shards), which score held-out tokens alike (measured: 4e-7 relative).
B16=(--lora.base_dtype=bfloat16 --checkpoint.enable=true --checkpoint.interval=5
  --checkpoint.last_save_in_hf=true --checkpoint.export_dtype=bfloat16 --sample.freq=10
  "--sample.prompts=the quick" --sample.max_new_tokens=2)
if dist_run 0 one-b16 "${ARGS[@]}" "${B16[@]}" && path=$(dist_bf16_path one-b16) &&
  QT_GEMM_BF16=$path dist_run 2 tp2-b16 "${ARGS[@]}" "${B16[@]}" "$TP" &&
  QT_GEMM_BF16=$path dist_run 2 fsdp2-b16 "${ARGS[@]}" "${B16[@]}"; then
  close "TP 2 with a bf16 base" one-b16 tp2-b16 1e-4 3.9e-3 1
  close "FSDP 2 with a bf16 base" one-b16 fsdp2-b16 1e-4 1e-3 1
  grep -q 'matmul weights and embedding in bf16, gathered in bf16' "$TMP/fsdp2-b16.log" ||
    { echo "FAIL: FSDP 2 does not hold its bf16 base in bf16"; fail=1; }
  for r in one-b16 tp2-b16 fsdp2-b16; do
    grep -q 'sample step 10' "$TMP/$r.log" || { echo "FAIL: no samples with a bf16 base ($r)"; fail=1; }
  done
  for r in tp2-b16 fsdp2-b16; do
    same_merged one-b16 "$r" 1e-4
  done
else
  echo "FAIL: bf16 base runs"; cat "$TMP/one-b16.log" "$TMP/tp2-b16.log" "$TMP/fsdp2-b16.log"; fail=1
fi
# The checkpoint holds the adapters only (the base is frozen): one process resumes FSDP 2's.
mkdir -p "$TMP/one-fsdp2-b16"; cp -r "$TMP/fsdp2-b16/checkpoint" "$TMP/one-fsdp2-b16/"
if dist_run 0 one-fsdp2-b16 "${ARGS[@]}" "${B16[@]}" && grep -q 'resharding' "$TMP/one-fsdp2-b16.log" &&
  cmp -s "$TMP/fsdp2-b16/adapter/adapter_model.safetensors" "$TMP/one-fsdp2-b16/adapter/adapter_model.safetensors"; then
  echo "ok: one process resuming FSDP 2's bf16-base checkpoint writes byte-identical adapters"
else
  echo "FAIL: resharding FSDP 2's bf16-base checkpoint"; cat "$TMP/one-fsdp2-b16.log"; fail=1
fi
# The merged export fails half-way: alpha 1e9 makes the merged wq of layer 0 (a unit after the
# embedding's) overflow float16 after two steps of training.
BIG=(--training.steps=3 --lora.alpha=1e9 --checkpoint.export_dtype=float16)
if dist_run 2 big "${ARGS[@]}" "${SAVE[@]}" "$TP" "${BIG[@]}"; then
  echo "FAIL: an export beyond float16's range succeeded"; fail=1
elif [ "$(grep -c "error: rank 0: HF export .* failed: tensor layers.0.attention.wq.weight (model.layers.0.self_attn.q_proj.weight) holds .* beyond float16's range" "$TMP/big.log")" = 2 ]; then
  echo "ok: an error half-way through the merged export ends both ranks with its sentence"
else
  echo "FAIL: the failed merged export did not end both ranks with its sentence"; cat "$TMP/big.log"; fail=1
fi
# LoRA on the MoE debug model (tests/dist_ep_lib.sh: 4 MoE layers, 8 experts): adapters on the
# attention linears of every layer (the experts are not targets; a glob naming the layers' FFN
# linears, which MoE layers lack, warns that it matches nothing), the whole base frozen, router
# and experts included. FSDP 2 and EP 2 (the experts split over the two ranks) follow one
# process: every step's loss and grad norm within 1e-5 relative, the routing figures identical;
# the merged exports (EP 2's experts gathered from both ranks) score held-out tokens alike. The
# auxiliary-loss-free expert biases stay as the base has them (a LoRA checkpoint holds the
# adapters alone, and HF files no biases), so one process resumed from step 5 repeats steps
# 6-10 exactly.
# shellcheck source=tests/dist_ep_lib.sh
. "$(dirname "$0")/dist_ep_lib.sh"
MOE_LORA=(--lora.rank=4 --lora.alpha=8 --optimizer.lr=1e-2 --checkpoint.enable=true
  --checkpoint.interval=5 --checkpoint.last_save_in_hf=true
  "--lora.targets=layers.*.attention.wq,layers.*.attention.wv,layers.*.attention.wo,layers.*.feed_forward.w1")
if run 0 moe-one "${MOE_LORA[@]}" && run 2 moe-fsdp2 "${MOE_LORA[@]}" &&
  run 2 moe-ep2 "${MOE_LORA[@]}" "$EP=2"; then
  grep -q 'lora: 12 adapter(s) of rank 4 .* 2816 trainable parameters' "$TMP/moe-one.log" &&
    [ "$(grep -c 'lora target "layers.\*.feed_forward.w1" matches no linear layer' "$TMP/moe-one.log")" = 1 ] ||
    { echo "FAIL: MoE adapters or warning"; cat "$TMP/moe-one.log"; fail=1; }
  same moe-one moe-fsdp2
  same moe-one moe-ep2
  mkdir -p "$TMP/moe-re"; cp -r "$TMP/moe-one/checkpoint" "$TMP/moe-re/"; rm -rf "$TMP/moe-re/checkpoint/step-10"
  if run 0 moe-re "${MOE_LORA[@]}" && grep -q 'resumed from .*step-5' "$TMP/moe-re.log" &&
    [ "$(dist_table "$TMP/moe-re")" = "$(dist_table "$TMP/moe-one" | tail -5)" ]; then
    echo "ok: LoRA on the MoE model resumed from step 5 repeats steps 6-10 exactly"
  else
    echo "FAIL: LoRA on the MoE model resumed from step 5"; paste <(dist_table "$TMP/moe-one" | tail -5) <(dist_table "$TMP/moe-re"); fail=1
  fi
  mkdir -p "$TMP/one-moe-ep2"; cp -r "$TMP/moe-ep2/checkpoint" "$TMP/one-moe-ep2/"
  if run 0 one-moe-ep2 "${MOE_LORA[@]}" && grep -q 'resharding' "$TMP/one-moe-ep2.log" &&
    cmp -s "$TMP/moe-ep2/merged/model.safetensors" "$TMP/one-moe-ep2/merged/model.safetensors"; then
    echo "ok: EP 2's merged export is byte-identical to one process's of its checkpoint"
  else
    echo "FAIL: EP 2's merged export against one process's of its checkpoint"; fail=1
  fi
  for name in moe-fsdp2 moe-ep2; do
    same_merged moe-one "$name" 1e-5
  done
else
  fail=1
fi
[ $fail = 0 ] && echo "e2e_dist_lora: ok"
exit $fail
