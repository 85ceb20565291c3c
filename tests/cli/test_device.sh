#!/usr/bin/env bash
# loom train --device: bad values and what the device path does not run yet exit 2 with one
# line naming the flag; a build without CUDA says so (exit 2); a CUDA build without a GPU
# says "--device cuda: no CUDA device: ..." (exit 1). With a GPU (loom gpu-info exits 0)
# it trains for real: a GPT-2 and a Llama, 6 steps each, on cuda and on cpu, and checks
# (1) the cuda run is bitwise repeatable (losses, grad norms and the saved weights file
# equal byte for byte over two runs: invariant 2; every CUDA reduction has a fixed order),
# (2) its losses match the CPU's to 1e-4 relative (fp32 sums in another order; over six
# AdamW steps such differences stay near 1e-6; the per-tensor comparison against float64
# PyTorch is tests/reference/test_vs_torch.py --device cuda).
# Usage: test_device.sh LOOM   (random data each run; the seed is printed)
set -uo pipefail
loom=$1
work=$(mktemp -d /tmp/loom_device_XXXXXX)
trap 'rm -rf "$work"' EXIT
seed=${LOOM_TEST_SEED:-$((RANDOM * 32768 + RANDOM))}
echo "test_device: seed $seed"
fails=0
py=/usr/bin/python3 # Debian's, with numpy; elsewhere (a GPU machine's venv) the PATH's
"$py" -c 'import numpy' 2>/dev/null || py=python3
fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
}
"$py" - "$work/train.bin" "$seed" <<'EOF' || { echo "FAIL: cannot write the shard"; exit 1; }
import sys, numpy as np
toks = np.random.default_rng(int(sys.argv[2])).integers(0, 256, 40000).astype("<u2")
h = np.zeros(256, dtype="<i4"); h[:3] = [20240520, 1, len(toks)]
open(sys.argv[1], "wb").write(h.tobytes() + toks.tobytes())
EOF
common=(--vocab-size 256 --seq-len 64 --micro-batch 2 --global-batch 4 --steps 6 --data "$work/train.bin"
    --seed "$seed" --threads 2 --log-every 0)

# expect RC PATTERN -- ARGS: loom train ARGS exits RC and its last line matches PATTERN
expect() {
    local rc=$1 pat=$2
    shift 3
    local out
    out=$("$loom" train --model gpt2-tiny "${common[@]}" "$@" 2>&1)
    local got=$?
    local last
    last=$(tail -1 <<<"$out")
    if [[ $got -ne $rc || $last != *$pat* ]]; then
        fail "train $*: exit $got (expected $rc), last line: $last"
    else
        echo "ok   train $* -> exit $got: $last"
    fi
}
expect 2 "--device 'tpu': expected cpu or cuda" -- --device tpu
expect 2 "--device cuda: not with more than one process" -- --device cuda --dp 2
expect 2 "--device cuda: not with --n-experts (mixture of experts)" -- --device cuda --n-experts 4
expect 2 "--device cuda: not with checkpoints" -- --device cuda --ckpt-dir "$work/ck"
expect 2 "--device cuda: not with --ema-decay" -- --device cuda --ema-decay 0.99

"$loom" gpu-info >"$work/gpu.txt" 2>&1
gpu=$?
if grep -q "built without CUDA" "$work/gpu.txt"; then
    expect 2 "--device cuda: this loom was built without it" -- --device cuda
elif [[ $gpu -ne 0 ]]; then
    expect 1 "--device cuda: no CUDA device: " -- --device cuda
else
    echo "gpu: $(head -1 "$work/gpu.txt")"
    for model in gpt2-tiny llama-tiny; do
        for run in cuda1 cuda2 cpu; do
            dev=${run%[0-9]}
            "$loom" train --model "$model" "${common[@]}" --device "$dev" \
                --metrics "$work/$model.$run.jsonl" --save-weights "$work/$model.$run.safetensors" \
                >"$work/$model.$run.log" 2>&1 || fail "$model on $dev: exit $? ($(tail -1 "$work/$model.$run.log"))"
        done
        cmp -s "$work/$model.cuda1.safetensors" "$work/$model.cuda2.safetensors" &&
            echo "ok   $model: two cuda runs wrote byte-identical weights" ||
            fail "$model: two cuda runs wrote different weights"
        "$py" - "$work/$model".{cuda1,cuda2,cpu}.jsonl "$model" <<'EOF' || fails=$((fails + 1))
import json, sys
rows = [[json.loads(l) for l in open(p) if '"loss"' in l] for p in sys.argv[1:4]]
key = lambda r: (r["loss"], r["lr"], r["grad_norm"])
same = [key(r) for r in rows[0]] == [key(r) for r in rows[1]]
worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(rows[0], rows[2]))
ok = same and len(rows[0]) == len(rows[2]) == 6 and worst <= 1e-4
print(f"{'ok  ' if ok else 'FAIL:'} {sys.argv[4]}: two cuda runs' losses and grad norms "
      f"{'equal' if same else 'DIFFER'}; cuda vs cpu losses over {len(rows[0])} steps, worst "
      f"relative difference {worst:.2e} (bound 1e-4)")
sys.exit(0 if ok else 1)
EOF
    done
fi
[[ $fails -eq 0 ]] && echo "ok" && exit 0
echo "$fails check(s) failed (seed $seed)"
exit 1
