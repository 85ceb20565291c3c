#!/usr/bin/env bash
# README command 1: install what is missing, build, and train the demo model on the
# byte-level King James Bible (Debian's bible-kjv), printing progress.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
if [ ! -f data/kjv/train_000000.bin ]; then
    bible 'gen1:1-rev22:21' | ./build/loom data bytes --input - --out data/kjv
fi
mkdir -p runs/demo
./build/loom train --config configs/demo.ini "$@"
echo "demo: metrics in runs/demo/metrics.jsonl"
