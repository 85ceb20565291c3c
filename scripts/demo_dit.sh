#!/usr/bin/env bash
# The image and video journey (bash scripts/demo.sh dit): Fashion-MNIST from Debian
# (dataset-fashion-mnist) packed into image shards, a class-conditional DiT trained with
# flow matching on 2 ranks under the supervisor for a few minutes, a grid of samples (one
# row per class), and a short generated clip from a small video DiT trained on moving
# Fashion-MNIST. Extra arguments go to the image model's `loom train` (e.g. --steps 200).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '\n== %s\n' "$*"; }

say "1/6 install what is missing and build"
bash scripts/setup.sh
LOOM_SKIP_CUDA=1 bash scripts/build.sh >/dev/null # the demo runs on the CPU
LOOM=./build/loom

say "2/6 pack Fashion-MNIST (60,000 + 10,000 gray 28 x 28 images, 10 classes) into shards,
and 2,000 moving-object clips of 8 frames made from its images"
$LOOM data images --input fashion-mnist --out data/fmnist
$LOOM data video --from-images 'data/fmnist/train_*.bin' --out data/fmnist-clips --frames 8 \
    --size 32 --objects 1 --clips 2000 --seed 1

say "3/6 train a class-conditional DiT (configs/dit.ini: 4 blocks, 49 patch tokens, flow
matching, EMA of the weights) on 2 ranks under loom run (checkpoints every 200 steps)"
rm -rf runs/dit/ckpt runs/dit/run
mkdir -p runs/dit
$LOOM run -n 2 --run-dir runs/dit/run -- --config configs/dit.ini --dp 2 \
    --ckpt-dir runs/dit/ckpt --ckpt-every 200 "$@"
$LOOM plot runs/dit/metrics.jsonl -o runs/dit/loss.png --title "loom: DiT on Fashion-MNIST"

say "4/6 sample 8 images of every class from the moving average of the weights
(Euler, 50 steps, classifier-free guidance 3)"
$LOOM sample --weights runs/dit/ema.safetensors --n 8 --steps 50 --cfg 3 --seed 1 \
    -o runs/dit/samples.png --raw runs/dit/samples.safetensors

say "5/6 train a small video DiT on the clips (configs/dit_video.ini, 256 tokens of
2 frames x 4 x 4 pixels) on 2 ranks"
rm -rf runs/dit-video/run
mkdir -p runs/dit-video
$LOOM run -n 2 --run-dir runs/dit-video/run -- --config configs/dit_video.ini --dp 2

say "6/6 generate a clip of every class (an animated GIF and the frames as a strip)"
$LOOM sample --weights runs/dit-video/ema.safetensors --n 1 --steps 30 --cfg 3 --seed 1 \
    -o runs/dit-video/clips.gif
$LOOM sample --weights runs/dit-video/ema.safetensors --n 1 --steps 30 --cfg 3 --seed 1 \
    -o runs/dit-video/clips.png

cat <<'DONE'

== where things are
  runs/dit/samples.png             8 samples of every class, one row per class (T-shirt/top,
                                   trouser, pullover, dress, coat, sandal, shirt, sneaker,
                                   bag, ankle boot)
  runs/dit/samples.safetensors     the same samples as a tensor [N, F, C, H, W] with labels
  runs/dit/loss.png                training and validation loss
  runs/dit/metrics.jsonl           one JSON object per step
  runs/dit/weights.safetensors     the trained weights (DiT's tensor names, config in metadata)
  runs/dit/ema.safetensors         their moving average (what the samples come from)
  runs/dit-video/clips.gif         generated clips (animated), clips.png the frames as a strip
  data/fmnist/, data/fmnist-clips/ the image and clip shards (docs/data.md)
Judge the samples: /usr/bin/python3 bench/dit_quality.py --cache runs/fmnist_cnn.pt --samples runs/dit/samples.safetensors
DONE
