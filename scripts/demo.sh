#!/usr/bin/env bash
# README command 1: the whole journey on the embedded default corpus, the King James
# Bible (Debian's bible-kjv): install what is missing, build, learn a 4096-token BPE,
# tokenize into shards, train a small GPT-2 for a few minutes (progress on the terminal),
# plot the loss curves and print a generated sample. Extra arguments go to `loom train`
# (e.g. --steps 50). `bash scripts/demo.sh dit` runs the diffusion-transformer journey,
# `bash scripts/demo.sh vlm` the multimodal one,
# `bash scripts/demo.sh rl` SFT then RL (GRPO) on arithmetic.
set -euo pipefail
cd "$(dirname "$0")/.."
# `bash scripts/demo.sh dit`: the image and video journey instead (scripts/demo_dit.sh)
if [ "${1:-}" = dit ]; then
    shift
    exec bash scripts/demo_dit.sh "$@"
fi
# `bash scripts/demo.sh rl`: SFT then GRPO on verifiable arithmetic (scripts/demo_rl.sh)
if [ "${1:-}" = rl ]; then
    shift
    exec bash scripts/demo_rl.sh "$@"
fi
# `bash scripts/demo.sh vlm`: the multimodal journey (scripts/demo_vlm.sh, docs/vlm.md)
if [ "${1:-}" = vlm ]; then
    shift
    exec bash scripts/demo_vlm.sh "$@"
fi
say() { printf '\n== %s\n' "$*"; }

say "1/6 install what is missing and build"
bash scripts/setup.sh
LOOM_SKIP_CUDA=1 bash scripts/build.sh >/dev/null  # the demo runs on the CPU
LOOM=./build/loom

mkdir -p data/kjv runs/demo
if [ ! -s data/kjv/kjv.txt ]; then
    bible 'gen1:1-rev22:21' > data/kjv/kjv.txt
fi
say "2/6 learn a byte-level BPE of 4096 tokens from the Bible (data/kjv/tok)"
if [ ! -s data/kjv/tok/vocab.bpe ]; then
    $LOOM tokenizer train --input data/kjv/kjv.txt --vocab-size 4096 --out data/kjv/tok
else
    echo "data/kjv/tok already there"
fi
say "3/6 tokenize into llm.c shards: paragraphs are documents, 2% of them validation"
$LOOM data prepare --input data/kjv/kjv.txt --tokenizer data/kjv/tok --out data/kjv/bpe \
    --doc-separator blank-line --val-fraction 0.02

say "4/6 train a 4-layer GPT-2 (configs/demo.ini; a few minutes on 2 cores) on 2 ranks under
the supervisor (loom run: heartbeats, checkpoints every 100 steps, restarts on failures)"
rm -rf runs/demo/ckpt runs/demo/run
$LOOM run -n 2 --run-dir runs/demo/run -- --config configs/demo.ini \
    --ckpt-dir runs/demo/ckpt --ckpt-every 100 "$@"

say "5/6 plot the loss curves"
$LOOM plot runs/demo/metrics.jsonl -o runs/demo/loss.png --title "loom demo: GPT-2 on the KJV Bible"

say "6/6 generate from the trained model"
$LOOM generate --weights runs/demo/weights.safetensors --tokenizer data/kjv/tok \
    --prompt "And God said" --max-tokens 120 --temperature 0.8 --top-k 40 --seed 1

cat <<'DONE'

== where things are
  runs/demo/metrics.jsonl          one JSON object per step (loss, val_loss, lr, tokens/s, ...)
  runs/demo/loss.png               training and validation loss, tokens/s
  runs/demo/tensorboard/           TensorBoard event files (tensorboard --logdir runs/demo/tensorboard)
  runs/demo/weights.safetensors    the trained weights (Hugging Face names, config in metadata)
  runs/demo/run/                   loom run: per-attempt rank logs, events.jsonl, summary.json
  runs/demo/ckpt/                  checkpoints (loom ckpt inspect runs/demo/ckpt: the newest)
  data/kjv/tok/                    the BPE (encoder.json + vocab.bpe, GPT-2 format)
  data/kjv/bpe/                    the token shards (llm.c format)
More text: ./build/loom generate --weights runs/demo/weights.safetensors --tokenizer data/kjv/tok --prompt "..."
DONE
