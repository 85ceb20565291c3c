#!/usr/bin/env bash
# loom sample --precision bf16 (docs/precision.md): a tiny class-conditional DiT trained 3
# steps is sampled in fp32 and twice in bf16 (guidance on, so a model call holds 2x the
# batch, and a padded last batch): the bf16 run names its GEMMs at start-up (oneDNN, or
# widened to fp32 on a CPU without bf16 instructions, also pretended), runs every GEMM
# prepared (0 calls unprepared), is bitwise the same twice, starts from the same noise as
# fp32 and ends close to fp32's samples but not equal: the samples' displacement from the
# noise (what the model contributed) differs by a relative 2-norm in (0, 0.05] (bf16 keeps
# 8 significant bits, u = 2^-8 = 3.9e-3, at the inputs of every linear layer, over 8
# Euler steps; the value measured is printed). Bad values: one line, exit 2.
# Usage: test_sample_bf16.sh PATH_TO_LOOM
set -u
LOOM=${1:?usage: test_sample_bf16.sh PATH_TO_LOOM}
source "$(dirname "$0")/check_lib.sh" # $TMP, check, expect, finish

/usr/bin/python3 - "$TMP" <<'PY'
import struct, sys, random
rng = random.Random(3)
n, f, c, h, w, k = 16, 1, 1, 8, 8, 3
head = struct.pack("<256i", 20261202, 1, n, f, c, h, w, k, *([0] * 248))
labels = struct.pack(f"<{n}i", *[rng.randrange(k) for _ in range(n)])
open(f"{sys.argv[1]}/train_000000.bin", "wb").write(
    head + labels + bytes(rng.randrange(256) for _ in range(n * f * c * h * w)))
PY
"$LOOM" train --family dit --n-layer 2 --n-head 2 --d-model 32 --d-ff 64 --height 8 --width 8 \
    --channels 1 --patch 2 --n-classes 3 --micro-batch 4 --global-batch 4 --steps 3 \
    --threads 1 --lr 1e-3 --data "$TMP/train_*.bin" --log-every 0 \
    --save-weights "$TMP/dit.safetensors" >/dev/null 2>"$TMP/train_err"
check "train the dit" test $? -eq 0

S=(sample --weights "$TMP/dit.safetensors" --class 1 --n 3 --batch 2 --steps 8 --cfg 2
   --seed 5 --threads 1)
"$LOOM" "${S[@]}" -o "$TMP/f.png" --raw "$TMP/f.safetensors" >/dev/null 2>"$TMP/ef"
check "fp32 sample exits 0" test $? -eq 0
check "fp32 is the default (no bf16 line)" test -z "$(grep 'precision bf16' "$TMP/ef")"
expect "fp16 is not supported" "--precision 'fp16': expected fp32 or bf16" -- "${S[@]}" \
    --precision fp16 -o "$TMP/x.png"
LOOM_BF16_PRETEND_NO_CPU=1 "$LOOM" "${S[@]}" --precision bf16 -o "$TMP/x.png" >/dev/null \
    2>"$TMP/ep"
check "a CPU without AVX512-BF16 (pretended) samples in bf16, GEMMs widened" \
    test $? -eq 0 -a -n "$(grep 'precision bf16: bf16 matmul widened to fp32' "$TMP/ep")"
for k in 1 2; do
    "$LOOM" "${S[@]}" --precision bf16 -o "$TMP/b$k.png" --raw "$TMP/b$k.safetensors" \
        >/dev/null 2>"$TMP/eb$k"
    check "bf16 sample $k exits 0" test $? -eq 0
done
check "start-up line names the GEMMs' implementation" \
    grep -qE "^loom: precision bf16: (oneDNN [0-9.]+ bf16 matmul [a-z_:0-9]+|bf16 matmul widened to fp32[^,]*), [0-9]+ shapes" "$TMP/eb1"
check "no GEMM ran unprepared" grep -q "precision bf16 at the end: .*, 0 calls unprepared" "$TMP/eb1"
check "bf16 twice: the same samples, bitwise" cmp -s "$TMP/b1.safetensors" "$TMP/b2.safetensors"
check "bf16 twice: the same picture" cmp -s "$TMP/b1.png" "$TMP/b2.png"

cmp_out=$(/usr/bin/python3 - "$TMP" "$(dirname "$0")/../reference" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
import numpy as np
import safetensors_io
f = safetensors_io.load(f"{sys.argv[1]}/f.safetensors")
b = safetensors_io.load(f"{sys.argv[1]}/b1.safetensors")
same_start = np.array_equal(f["noise"], b["noise"]) and np.array_equal(f["labels"], b["labels"])
# what the model moved the noise by (a few steps of training: small velocities)
x = f["samples"].astype(np.float64) - f["noise"]
y = b["samples"].astype(np.float64) - b["noise"]
rel = np.linalg.norm(y - x) / np.linalg.norm(x)
ok = same_start and np.isfinite(y).all() and 0 < rel <= 0.05
print(f"{'ok' if ok else 'bad'} same noise and labels {same_start}, displacement from the "
      f"noise |bf16 - fp32| / |fp32| = {rel:.2e}")
PY
)
echo "  $cmp_out"
check "bf16 samples close to fp32's, not equal ($cmp_out)" test "${cmp_out%% *}" = ok

finish test_sample_bf16
