#!/usr/bin/env bash
# torchtitan's four Qwen3 recipes (copies written for this test in tests/fixtures/torchtitan/,
# same keys and values) run unchanged through `qtitan plan`, with one notice per key that has no
# effect here and no error; the MoE debug recipe trains with only steps, seq_len, batch,
# n_layers, tokenizer and dataset overridden, also with optimizer.name = "Adam". Values qtitan
# cannot honour stop with a sentence.
set -euo pipefail
shared=${QT_SHARED_DIR:-}
data=$shared/data/c4_sample/c4_sample.jsonl
fx=$QT_SOURCE_DIR/tests/fixtures/torchtitan
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export QT_CACHE_DIR=$tmp/cache # a fresh cache, so the corpus is tokenized (with progress) here
cd "$tmp"
fail() { echo "FAIL: $*"; exit 1; }

for r in qwen3_0.6b qwen3_1.7b qwen3_32b qwen3_moe_debug; do
  "$QT_BINARY" plan --config "$fx/$r.toml" >"$r.plan" 2>&1 || { cat "$r.plan"; fail "plan $r"; }
  grep -q '^plan: total_gib=' "$r.plan" || { cat "$r.plan"; fail "plan $r printed no total"; }
  # The recipe's keys without effect here, each named once with its file line and value.
  for k in 'compile.components = \["model", "loss"\]' 'quantize.linear.float8.filter_fqns = \["output"\]'; do
    [ "$(grep -c "^notice: $fx/$r.toml:[0-9]*: $k has no effect here: " "$r.plan")" = 1 ] ||
      { cat "$r.plan"; fail "$r: expected one notice for $k"; }
  done
  [ "$(grep -c '^notice:' "$r.plan")" = 2 ] || { cat "$r.plan"; fail "$r: expected exactly 2 notices"; }
done
grep -q 'model: 32B, 64 layers' qwen3_32b.plan || fail "32B plan names another model"
grep -q 'activation checkpointing: full' qwen3_32b.plan || fail "32B plan ignores mode = full"

# Values that ask for what qtitan cannot do.
refuse() { # expected text, then arguments
  local want=$1; shift
  set +e; "$QT_BINARY" plan --config "$fx/qwen3_0.6b.toml" "$@" >refuse.log 2>&1; local rc=$?; set -e
  [ $rc -ne 0 ] && grep -qF "$want" refuse.log || { cat refuse.log; fail "$* should be refused with: $want"; }
}
refuse 'command line: parallelism.pipeline_parallel_degree = 4 is not available: qtitan has no pipeline parallelism' \
  --parallelism.pipeline_parallel_degree=4
refuse 'command line: model.converters = ["float8"] is not available: qtitan trains in float32 or bfloat16' \
  --model.converters=float8

if [ -z "$shared" ] || [ ! -f "$data" ]; then echo "skip: no ../shared C4 sample to train on"; exit 77; fi
# training.dataset = "c4" without a path: one sentence saying where C4 comes from.
set +e
"$QT_BINARY" train --config "$fx/qwen3_0.6b.toml" --training.steps=1 \
  --model.tokenizer_path="$shared/tokenizers/qwen3" >c4.log 2>&1; rc=$?
set -e
[ $rc -ne 0 ] && grep -q 'training.dataset = "c4" reads C4 from files you give: set training.dataset_path' c4.log ||
  { cat c4.log; fail "c4 without dataset_path should stop with a sentence"; }

# debugmodel_moe has a 2048-token vocabulary: a tokenizer of that size from the sample.
"$QT_BINARY" tokenizer-train --input "$data" --vocab-size 2048 --output tok >/dev/null 2>&1
# A short run of the MoE debug recipe into DIR (DIR.log), with more arguments.
moe_run() {
  local dir=$1; shift
  "$QT_BINARY" train --config "$fx/qwen3_moe_debug.toml" --training.steps=2 --training.seq_len=32 \
    --training.local_batch_size=2 --model.n_layers=2 --model.tokenizer_path=tok \
    --training.dataset_path="$data" --job.dump_folder="$dir" "$@" >"$dir.log" 2>&1 ||
    { cat "$dir.log"; fail "train qwen3_moe_debug into $dir"; }
}
QT_PROGRESS_SECONDS=0 moe_run moe
# The step line carries the total and the time left (not on the last step: nothing is left).
grep -Eq '^step:  1/2  loss: .*  eta: [0-9]+m[0-9]{2}s$' moe.log && grep -Eq '^step:  2/2  loss: .*%$' moe.log ||
  { cat moe.log; fail "step lines should read step: N/2 ... eta: XmYYs"; }
# Tokenizing the corpus into the cache reports progress: with stderr not a terminal, plain
# lines (one per update with QT_PROGRESS_SECONDS=0), never a carriage return.
grep -Eq "^tokenizing $data: +[0-9]+%  [0-9.]+/[0-9.]+ MB" moe.log && ! grep -q $'\r' moe.log ||
  { cat moe.log; fail "no plain progress lines for tokenizing"; }
m=moe/metrics.jsonl
[ "$(grep -c '"step":' "$m")" = 2 ] || { cat moe.log "$m"; fail "expected 2 step records"; }
grep -q '"loss":[0-9]' "$m" || { cat "$m"; fail "no finite loss"; }

# torchtitan's LoRA recipe (model.converters = ["lora"] with [lora]; on Qwen3's debug model)
# trains adapters of rank 8 on every linear of the layers, says once what torchtitan's converter
# does beyond that, and gives bitwise the losses of the same file written with qtitan's own keys.
lr=$fx/lora_debug_model.toml
short=(--training.steps=2 --training.seq_len=32 --training.local_batch_size=2 --model.n_layers=2
       --model.tokenizer_path=tok --training.dataset_path="$data")
"$QT_BINARY" train --config "$lr" "${short[@]}" --job.dump_folder=lora_tt >lora_tt.log 2>&1 ||
  { cat lora_tt.log; fail "train the LoRA recipe"; }
grep -q '^lora: 14 adapter(s) of rank 8 (alpha 16, scale 2) on all-linear; ' lora_tt.log &&
  [ "$(grep -c 'torchtitan.s converter also puts them on the output projection' lora_tt.log)" = 1 ] &&
  [ -f lora_tt/adapter/adapter_model.safetensors ] ||
  { cat lora_tt.log; fail "the LoRA recipe should train rank-8 adapters on all 14 linears"; }
grep -v -e '^converters = ' -e '^apply_to_all_linears = ' "$lr" >lora_own.toml
"$QT_BINARY" train --config lora_own.toml "${short[@]}" --lora.targets=all-linear \
  --job.dump_folder=lora_own >lora_own.log 2>&1 || { cat lora_own.log; fail "train qtitan's LoRA keys"; }
steps() { grep '^step: ' "$1" | sed 's/  memory: .*//'; }
[ "$(steps lora_tt.log)" = "$(steps lora_own.log)" ] && [ "$(steps lora_tt.log | wc -l)" = 2 ] ||
  { diff <(steps lora_tt.log) <(steps lora_own.log); fail "converter and qtitan's keys should train alike"; }
# optimizer.name = "Adam" (torchtitan's other optimizer, torch.optim.Adam: its weight decay is
# added to the gradient): the step after the first trains otherwise than AdamW's with weight
# decay, and like it without.
moe_run adam --optimizer.name=Adam
moe_run adamw0 --optimizer.weight_decay=0
moe_run adam0 --optimizer.name=Adam --optimizer.weight_decay=0
step2() { grep '^step:  2/2' "$1" | sed 's/  memory: .*//'; }
[ -n "$(step2 moe.log)" ] && [ "$(step2 adam.log)" != "$(step2 moe.log)" ] ||
  { step2 moe.log; step2 adam.log; fail "Adam with weight decay should train otherwise than AdamW"; }
[ -n "$(step2 adam0.log)" ] && [ "$(step2 adam0.log)" = "$(step2 adamw0.log)" ] ||
  { step2 adam0.log; step2 adamw0.log; fail "Adam and AdamW without weight decay should agree"; }
# selective_ac_option = "2" (torchtitan's layer-wise mode): of 4 layers, layers 2 and 4 are
# checkpointed whole (2 recomputed in backward) and the others keep everything; the plan says
# so, its memory lies between none and full, and training gives bitwise the losses of none.
for o in none full lw; do
  a=(--activation_checkpoint.mode=$o); [ $o = lw ] && a=(--activation_checkpoint.selective_ac_option=2)
  "$QT_BINARY" plan --config "$fx/qwen3_moe_debug.toml" --model.n_layers=4 "${a[@]}" >"ac-$o.plan" 2>&1 ||
    { cat "ac-$o.plan"; fail "plan with ${a[*]}"; }
done
gib() { sed -n 's/^plan: total_gib=\([0-9.]*\) .*/\1/p' "ac-$1.plan"; }
grep -q 'activation checkpointing: every 2nd layer;' ac-lw.plan &&
  awk -v n="$(gib none)" -v l="$(gib lw)" -v f="$(gib full)" 'BEGIN { exit !(f < l && l < n) }' ||
  { cat ac-lw.plan; fail "layer-wise plan: $(gib full) < $(gib lw) < $(gib none) GiB expected"; }
moe_run lw --model.n_layers=4 --activation_checkpoint.selective_ac_option=2
moe_run lw-none --model.n_layers=4 --activation_checkpoint.mode=none
[ "$(steps lw.log | wc -l)" = 2 ] && [ "$(steps lw.log)" = "$(steps lw-none.log)" ] ||
  { diff <(steps lw.log) <(steps lw-none.log); fail "layer-wise checkpointing should train as none"; }
# lr_scheduler.total_steps: a 2-step run follows a 4-step schedule (warmup 1, linear decay):
# step 2 at 3/4 of optimizer.lr, not the 1/2 its own 2 steps would give.
moe_run sched --lr_scheduler.warmup_steps=1 --lr_scheduler.total_steps=4
lrs=$(grep -o '"lr":[0-9.e-]*' sched/metrics.jsonl | cut -d: -f2 | tr '\n' ' ')
awk -v l="$lrs" 'BEGIN { split(l, a, " "); exit !(a[1] == 0.00015 && a[2] == 0.000225) }' ||
  { cat sched/metrics.jsonl; fail "total_steps = 4: step lrs $lrs, expected 0.00015 0.000225"; }
echo "e2e_torchtitan_recipes: ok"
