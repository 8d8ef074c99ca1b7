#!/usr/bin/env bash
# Installs the Debian packages qtitan builds against. As root it runs apt-get, as another user
# `sudo apt-get` (which asks for the password) when sudo exists; otherwise it prints the exact
# apt-get line to run and exits non-zero when something is missing.
set -euo pipefail

PACKAGES=(build-essential cmake pkg-config libjansson-dev libpcre2-dev libutf8proc-dev
          libdnnl-dev libopenmpi-dev openmpi-bin libcmocka-dev clang clang-format libclang-rt-14-dev
          libomp-14-dev zlib1g-dev libzstd-dev libsnappy-dev liblz4-dev libbrotli-dev libprotobuf-c-dev protobuf-c-compiler
          librsvg2-bin librsvg2-dev libcairo2-dev netpbm libxml2-utils jq)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all build packages present"
  exit 0
fi
as_root=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "setup: missing packages; run as root:" >&2
    echo "  apt-get update && apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  as_root=(sudo)
fi
echo "setup: installing ${missing[*]}"
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
