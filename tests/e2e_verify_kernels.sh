#!/usr/bin/env bash
# qtitan verify-kernels: every registered kernel against its reference (exit 0, a row per
# kernel), a config's overrides at the config's dims, and the failures that must exit non-zero
# (a config whose override names an unknown kernel or breaks a supports() rule).
set -uo pipefail
BIN="${QT_BINARY:-build/qtitan}"
SRC="${QT_SOURCE_DIR:-.}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
fail=0
check() { if eval "$2"; then echo "ok: $1"; else echo "FAIL: $1"; fail=1; fi; }

"$BIN" verify-kernels >"$TMP/all.txt" 2>&1
rc=$?
cat "$TMP/all.txt"
check "all kernels pass" "[ $rc -eq 0 ]"
for k in flash rope_nogather swiglu_fused rmsnorm_fused loss_chunked; do
    check "$k checked" "grep -q '^$k ' '$TMP/all.txt'"
done
check "no FAIL rows" "! grep -q FAIL '$TMP/all.txt'"

"$BIN" verify-kernels --config "$SRC/configs/debug_kernels.toml" >"$TMP/cfg.txt" 2>&1
rc=$?
cat "$TMP/cfg.txt"
check "config kernels pass" "[ $rc -eq 0 ]"
check "config run says tokens are reduced" "grep -q 'tokens reduced' '$TMP/cfg.txt'"
check "config checks flash at head_dim 128" "grep -q '^flash .*E128' '$TMP/cfg.txt'"

# flavor = "hf": the same config -> model path as train and plan, dims from config.json, and a
# [model] replacement on top (its file:line named when it breaks the model).
cat >"$TMP/hf.toml" <<TOML
[model]
flavor = "hf"
hf_assets_path = "$SRC/tests/fixtures/hf_tiny/dense_tied"
hidden_dim = 32
[training]
seq_len = 16
TOML
"$BIN" verify-kernels --config "$TMP/hf.toml" >"$TMP/hf.txt" 2>&1
rc=$?
cat "$TMP/hf.txt"
check "flavor = hf config passes" "[ $rc -eq 0 ]"
check "flavor = hf reads config.json and the [model] field" \
    "grep -q 'dim 16, heads 4/2, head_dim 8, ffn 32' '$TMP/hf.txt'"
sed -i 's/hidden_dim = 32/n_kv_heads = 3/' "$TMP/hf.toml"
"$BIN" verify-kernels --config "$TMP/hf.toml" >"$TMP/hf_bad.txt" 2>&1
rc=$?
cat "$TMP/hf_bad.txt"
check "invalid [model] field exits non-zero" "[ $rc -ne 0 ]"
check "invalid [model] field names its line" "grep -q 'hf.toml:4' '$TMP/hf_bad.txt'"

cat >"$TMP/bad.toml" <<'TOML'
[model]
flavor = "debugmodel"
[training]
seq_len = 100
[[override]]
target = "layers.*.attention.sdpa"
kernel = "flash"
TOML
"$BIN" verify-kernels --config "$TMP/bad.toml" >"$TMP/bad.txt" 2>&1
rc=$?
cat "$TMP/bad.txt"
check "failed supports exits non-zero" "[ $rc -ne 0 ]"
check "failed supports names the rule" "grep -q 'multiple of 64' '$TMP/bad.txt'"

sed -i 's/kernel = "flash"/kernel = "flsh"/; s/seq_len = 100/seq_len = 128/' "$TMP/bad.toml"
"$BIN" verify-kernels --config "$TMP/bad.toml" >"$TMP/bad2.txt" 2>&1
rc=$?
cat "$TMP/bad2.txt"
check "unknown kernel exits non-zero" "[ $rc -ne 0 ]"
check "unknown kernel lists valid names" "grep -q 'reference, flash' '$TMP/bad2.txt'"
exit $fail
