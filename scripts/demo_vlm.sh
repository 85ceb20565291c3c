#!/usr/bin/env bash
# The multimodal journey (bash scripts/demo.sh vlm, docs/vlm.md): 2 x 2 grids of
# Fashion-MNIST items (Debian's dataset-fashion-mnist) with their captions packed into vlm
# shards, vlm-tiny trained on 2 ranks with configs/vlm.ini, then greedy captions of
# held-out grids (from t10k) parsed back into position -> class and scored, against the
# same model shown a black image. Extra arguments go to `loom train` (e.g. --steps 300).
# VLM_EVAL_GRIDS (default 1000, the issue's count) held-out grids are scored.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '\n== %s\n' "$*"; }

say "1/4 install what is missing and build"
bash scripts/setup.sh
LOOM_SKIP_CUDA=1 bash scripts/build.sh >/dev/null # the demo runs on the CPU
LOOM=./build/loom

say "2/4 pack 20,000 training grids (training images) and 1,000 held-out grids (t10k)"
$LOOM data vlm --input fashion-mnist --out data/vlm --grid 2 --samples 20000 --val-samples 1000

say "3/4 train vlm-tiny (configs/vlm.ini: a 2-block ViT, a GELU projector, a 2-block Llama)
on 2 ranks under loom run"
rm -rf runs/vlm/run
mkdir -p runs/vlm
$LOOM run -n 2 --run-dir runs/vlm/run -- --config configs/vlm.ini --dp 2 "$@"
$LOOM plot runs/vlm/metrics.jsonl -o runs/vlm/loss.png --title "loom: vlm-tiny on Fashion-MNIST grids"

say "4/4 caption held-out grids (greedy) and score the positions named correctly"
/usr/bin/python3 scripts/vlm_eval.py --loom $LOOM --weights runs/vlm/weights.safetensors \
    --shard data/vlm/val_000000.bin --n "${VLM_EVAL_GRIDS:-1000}" --out runs/vlm/heldout

cat <<'DONE'

== where things are
  runs/vlm/heldout.txt           each held-out grid's caption, the model's text and its text
                                 for a black image
  runs/vlm/heldout.png           the first 16 held-out grids with the model's text under each
  runs/vlm/loss.png              training and validation loss
  runs/vlm/weights.safetensors   the trained weights; caption any 56 x 56 gray PNG with
                                 ./build/loom generate --weights runs/vlm/weights.safetensors --image FILE.png
  data/vlm/                      the image-text shards (docs/vlm.md)
DONE
