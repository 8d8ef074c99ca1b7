# Shared by tests/e2e_dist_ep*.sh (sourced after dist_lib.sh): the small MoE model's ARGS
# (configs/debug_moe.toml: 8 experts, top 2, 4 layers, auxiliary-loss-free balancing and the HF
# auxiliary loss; dims cut for speed), run NP NAME ARGS, and same REF OTHER [LOSS_TOL]
# [NORM_TOL]: 10 steps whose loss and grad norm agree to the tolerances (1e-5 relative) and
# whose routing figures (moe_tokens_min / max, moe_imbalance: counts over the global batch) are
# identical.
dist_data "$TMP/data.jsonl"

ARGS=(--config "$SRC/configs/debug_moe.toml" --model.tokenizer_path="$SRC/tests/fixtures/tokenizer/tiny_gpt2"
  --training.dataset_path="$TMP/data.jsonl" --model.vocab_size=640 --model.dim=32
  --model.n_heads=4 --model.n_kv_heads=2 --model.head_dim=8 --model.hidden_dim=64
  --model.moe_hidden_dim=16 --model.tie_embeddings=false --model.router_aux_loss_coef=0.01
  --model.load_balance_coeff=0.01 --training.seq_len=32 --training.local_batch_size=2
  --training.global_batch_size=8 --training.steps=10 --metrics.peak_tflops=1)
run() {
  local np=$1 name=$2
  shift 2
  dist_run "$np" "$name" "${ARGS[@]}" "$@" || { echo "FAIL: run $name"; tail -5 "$TMP/$name.log"; return 1; }
}
moe() { grep -o '"moe_tokens_min":[^,]*,"moe_tokens_max":[^,]*,"moe_imbalance":[^,}]*' "$TMP/$1/metrics.jsonl"; }
# same REF OTHER [LOSS_TOL] [NORM_TOL]: 10 steps, each loss and grad norm within the tolerances
# (1e-5 relative), and the routing figures identical.
same() {
  local ok
  ok=$(paste -d' ' <(dist_table "$TMP/$1") <(dist_table "$TMP/$2") | awk -v lt="${3:-1e-5}" -v nt="${4:-1e-5}" '
    function rel(a, b) { d = a - b; if (d < 0) d = -d; m = a < 0 ? -a : a; return d / (m > 1e-30 ? m : 1e-30) }
    { n++; if ($1 != $4 || rel($2, $5) > lt || rel($3, $6) > nt) bad++ }
    END { print (n == 10 && !bad) ? "ok" : "bad" }')
  if [ "$ok" = ok ] && [ "$(moe "$1" | wc -l)" = 10 ] && [ "$(moe "$1")" = "$(moe "$2")" ]; then
    echo "ok: $2 matches $1"
  else
    echo "FAIL: $2 differs from $1"; paste <(dist_table "$TMP/$1") <(dist_table "$TMP/$2"); paste <(moe "$1") <(moe "$2"); fail=1
  fi
}
EP=--parallelism.expert_parallel_degree
# HF export at lr = 0 (every mesh holds the initial values): same_hf REF OTHER checks OTHER's
# export byte for byte against REF's.
HF=(--checkpoint.enable=true --checkpoint.interval=2 --checkpoint.last_save_in_hf=true --optimizer.lr=0
  --training.steps=2)
hf_file() { echo "$TMP/$1/checkpoint/step-2/hf/model.safetensors"; }
same_hf() {
  if [ -s "$(hf_file "$1")" ] && cmp -s "$(hf_file "$1")" "$(hf_file "$2")"; then
    echo "ok: $2's HF export is byte-identical to $1's"
  else
    echo "FAIL: $2's HF export differs from $1's"; fail=1
  fi
}
