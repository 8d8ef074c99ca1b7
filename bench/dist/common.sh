# Shared set-up of the bench/dist scripts (sourced): the binary, a temporary folder removed on
# exit, Open MPI's environment for one thread per rank, and a generated corpus $tmp/data.jsonl
# (400 documents of 200 words from a fixed generator, so every run reads the same text).
bin=${QT_BINARY:-build/qtitan}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1 QT_CACHE_DIR=$tmp/cache
awk 'BEGIN { s = 7; n = split("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu " \
  "nu xi omicron pi rho sigma tau upsilon phi chi psi omega", w, " ");
  for (d = 0; d < 400; d++) { line = ""; for (i = 0; i < 200; i++) {
    s = (s * 1103515245 + 12345) % 2147483648; line = line " " w[1 + int(s / 65536) % n] }
    printf "{\"text\": \"%s\"}\n", line } }' >"$tmp/data.jsonl"
