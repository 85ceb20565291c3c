#!/usr/bin/env bash
# Bad input to the diffusion transformer (loom train --family dit, loom sample): one clear
# error line naming the flag or file and what was expected, exit code 2, never a crash.
# Usage: test_dit_bad_input.sh PATH_TO_LOOM
set -u
LOOM=${1:?usage: test_dit_bad_input.sh PATH_TO_LOOM}
source "$(dirname "$0")/check_lib.sh" # $TMP, expect, finish

# Image shards written here in loom's format (docs/data.md): 12x12 gray, 3 classes.
/usr/bin/python3 - "$TMP" <<'PY'
import os, struct, sys, random
d = sys.argv[1]
rng = random.Random(7)
def shard(path, n=16, f=1, c=1, h=12, w=12, k=3, labels=None, cut=0):
    labels = labels if labels is not None else [rng.randrange(k) for _ in range(n)]
    head = struct.pack("<256i", 20261202, 1, n, f, c, h, w, k, *([0] * 248))
    body = struct.pack(f"<{n}i", *labels) + bytes(rng.randrange(256) for _ in range(n * f * c * h * w))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = head + body
    open(path, "wb").write(data[:len(data) - cut] if cut else data)
shard(f"{d}/ok/train_000000.bin")
shard(f"{d}/big/train_000000.bin", h=16, w=16)
shard(f"{d}/labels/train_000000.bin", labels=[0] * 15 + [5])
shard(f"{d}/cut/train_000000.bin", cut=100)
PY
BASE=(train --family dit --n-layer 1 --n-head 2 --d-model 32 --d-ff 64 --height 12 --width 12
      --channels 1 --patch 4 --n-classes 3 --micro-batch 2 --global-batch 2 --steps 1 --threads 1)

expect "image size differs" "--data '$TMP/big/train_*.bin': samples are 1 x 1 x 16 x 16" -- \
    "${BASE[@]}" --data "$TMP/big/train_*.bin"
expect "label out of range" "$TMP/labels/train_000000.bin" -- \
    "${BASE[@]}" --data "$TMP/labels/train_*.bin"
expect "corrupt (truncated) shard" "$TMP/cut/train_000000.bin" -- \
    "${BASE[@]}" --data "$TMP/cut/train_*.bin"
expect "no shard" "--data" -- "${BASE[@]}" --data "$TMP/none/train_*.bin"
expect "patch does not divide" "--patch 5: must divide the image size 12 x 12" -- \
    "${BASE[@]}" --data "$TMP/ok/train_*.bin" --patch 5
expect "patch-t does not divide" "--patch-t 2: must divide --frames 1" -- \
    "${BASE[@]}" --data "$TMP/ok/train_*.bin" --patch-t 2
expect "d-model for 2-D positions" "--d-model 30: must be a multiple of 4" -- \
    "${BASE[@]}" --data "$TMP/ok/train_*.bin" --d-model 30 --n-head 2
expect "t-sampling" "--t-sampling 'cosine': expected logit-normal or uniform" -- \
    "${BASE[@]}" --data "$TMP/ok/train_*.bin" --t-sampling cosine
expect "class dropout" "--class-dropout 1.5: expected in [0, 1)" -- \
    "${BASE[@]}" --data "$TMP/ok/train_*.bin" --class-dropout 1.5
expect "ema decay" "--ema-decay 1: expected in [0, 1)" -- \
    "${BASE[@]}" --data "$TMP/ok/train_*.bin" --ema-decay 1
expect "save-ema without ema" "--save-ema $TMP/e.safetensors: needs --ema-decay > 0" -- \
    "${BASE[@]}" --data "$TMP/ok/train_*.bin" --save-ema "$TMP/e.safetensors"
expect "gqa" "--n-kv-head 1: the dit family has no grouped-query attention" -- \
    "${BASE[@]}" --data "$TMP/ok/train_*.bin" --n-kv-head 1

# A conditional and an unconditional model, trained one step each, for loom sample.
"$LOOM" "${BASE[@]}" --data "$TMP/ok/train_*.bin" --save-weights "$TMP/cond.safetensors" \
    >/dev/null 2>&1 || { echo "FAIL: could not train the conditional model"; fail=$((fail + 1)); }
"$LOOM" "${BASE[@]}" --data "$TMP/ok/train_*.bin" --n-classes 0 \
    --save-weights "$TMP/uncond.safetensors" >/dev/null 2>&1 ||
    { echo "FAIL: could not train the unconditional model"; fail=$((fail + 1)); }
expect "cfg without classes" "--cfg" -- sample --weights "$TMP/uncond.safetensors" --cfg 3 \
    -o "$TMP/g.png"
expect "class out of range" "--class 7" -- sample --weights "$TMP/cond.safetensors" --class 7 \
    -o "$TMP/g.png"
expect "steps 0" "--steps" -- sample --weights "$TMP/cond.safetensors" --steps 0 -o "$TMP/g.png"
expect "negative cfg" "--cfg" -- sample --weights "$TMP/cond.safetensors" --cfg -1 -o "$TMP/g.png"
expect "unknown solver" "--solver" -- sample --weights "$TMP/cond.safetensors" --solver rk4 \
    -o "$TMP/g.png"
expect "missing weights" "$TMP/nothing.safetensors" -- sample --weights "$TMP/nothing.safetensors" \
    -o "$TMP/g.png"
# a language model's weights are not a dit
"$LOOM" data bytes --input "$TMP/ok/train_000000.bin" --out "$TMP/tok" --val-fraction 0 2>/dev/null
"$LOOM" train --model gpt2-tiny --vocab-size 256 --seq-len 16 --n-layer 1 --d-model 32 --n-head 2 \
    --d-ff 64 --steps 1 --micro-batch 2 --global-batch 2 --data "$TMP/tok/train_*.bin" \
    --save-weights "$TMP/lm.safetensors" >/dev/null 2>&1
expect "language model weights" "loom sample needs a dit model" -- sample --weights \
    "$TMP/lm.safetensors" -o "$TMP/g.png"
# a checkpoint's moving average: exported by loom ckpt export --ema, the same file as
# --save-ema; a checkpoint saved without one says so
"$LOOM" "${BASE[@]}" --data "$TMP/ok/train_*.bin" --steps 2 --ema-decay 0.9 \
    --save-ema "$TMP/ema.safetensors" --ckpt-dir "$TMP/ck" >/dev/null 2>&1
"$LOOM" ckpt export "$TMP/ck/step_00000002" --format safetensors --ema -o "$TMP/ema2.safetensors" \
    2>/dev/null && cmp -s "$TMP/ema.safetensors" "$TMP/ema2.safetensors" && pass=$((pass + 1)) ||
    { echo "FAIL: loom ckpt export --ema differs from --save-ema"; fail=$((fail + 1)); }
"$LOOM" "${BASE[@]}" --data "$TMP/ok/train_*.bin" --ckpt-dir "$TMP/ck0" >/dev/null 2>&1
expect "export --ema without one" "checkpoint has no tensor 'ema/" -- ckpt export \
    "$TMP/ck0/step_00000001" --format safetensors --ema -o "$TMP/e3.safetensors"

# and the good cases work: an unconditional grid, a guided one
"$LOOM" sample --weights "$TMP/uncond.safetensors" --n 2 --steps 2 -o "$TMP/u.png" 2>/dev/null &&
    [ -s "$TMP/u.png" ] && pass=$((pass + 1)) ||
    { echo "FAIL: unconditional sampling"; fail=$((fail + 1)); }
"$LOOM" sample --weights "$TMP/cond.safetensors" --n 2 --steps 2 --cfg 2 -o "$TMP/c.png" \
    2>/dev/null && [ -s "$TMP/c.png" ] && pass=$((pass + 1)) ||
    { echo "FAIL: guided sampling"; fail=$((fail + 1)); }

finish test_dit_bad_input
