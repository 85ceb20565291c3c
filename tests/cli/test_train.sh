#!/usr/bin/env bash
# Training end to end for both families: the loss falls, metrics have every field, and
# the same seed gives a bitwise-identical run (invariant 2); a different seed does not.
# Usage: test_train.sh PATH_TO_LOOM
set -u
LOOM=${1:?usage: test_train.sh PATH_TO_LOOM}
source "$(dirname "$0")/check_lib.sh"

# Real English text: a slice of the King James Bible when the package is there, else
# this script repeated (still text with structure to learn).
if command -v bible >/dev/null; then
    bible 'gen1:1-gen10:32' > "$TMP/text.txt"
else
    for _ in $(seq 20); do cat "$0"; done > "$TMP/text.txt"
fi
"$LOOM" data bytes --input "$TMP/text.txt" --out "$TMP/data" --val-fraction 0 2>/dev/null
SEED=${LOOM_TEST_SEED:-$RANDOM}
echo "seed $SEED"

for family in gpt2 llama; do
    args=(train --family "$family" --vocab-size 256 --seq-len 32 --n-layer 2 --d-model 32
          --n-head 4 --d-ff 64 --micro-batch 4 --global-batch 8 --steps 30 --lr 3e-3
          --warmup-steps 3 --threads 2 --log-every 0 --data "$TMP/data/train_*.bin")
    [ "$family" = llama ] && args+=(--n-kv-head 2)
    "$LOOM" "${args[@]}" --seed "$SEED" --metrics "$TMP/$family.a.jsonl" 2>"$TMP/err" ||
        { echo "FAIL: $family run"; cat "$TMP/err"; fail=$((fail + 1)); continue; }
    "$LOOM" "${args[@]}" --seed "$SEED" --metrics "$TMP/$family.b.jsonl" 2>/dev/null
    "$LOOM" "${args[@]}" --seed $((SEED + 1)) --metrics "$TMP/$family.c.jsonl" 2>/dev/null
    losses() { python3 -c 'import json,sys; print(" ".join(repr(json.loads(l)["loss"]) for l in open(sys.argv[1])))' "$1"; }
    check "$family: 30 metric lines with every field" python3 - "$TMP/$family.a.jsonl" <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 30, len(rows)
for i, r in enumerate(rows):
    for k in ("step", "loss", "lr", "grad_norm", "tokens_per_s", "step_ms", "tokens"):
        assert k in r, k
    assert r["step"] == i + 1 and math.isfinite(r["loss"]) and r["tokens_per_s"] > 0
PY
    check "$family: loss falls (first 3 vs last 3 steps)" python3 - "$TMP/$family.a.jsonl" <<'PY'
import json, sys
l = [json.loads(x)["loss"] for x in open(sys.argv[1])]
first, last = sum(l[:3]) / 3, sum(l[-3:]) / 3
print(f"  loss {first:.4f} -> {last:.4f}")
assert last < first - 0.5, (first, last)
PY
    check "$family: same seed, identical losses" [ "$(losses "$TMP/$family.a.jsonl")" = "$(losses "$TMP/$family.b.jsonl")" ]
    check "$family: other seed, other losses" [ "$(losses "$TMP/$family.a.jsonl")" != "$(losses "$TMP/$family.c.jsonl")" ]
done
# Weights for generate: saved at the end, sampled deterministically for a seed, and bad
# input refused with one line and exit 2.
"$LOOM" "${args[@]}" --seed "$SEED" --save-weights "$TMP/w.safetensors" 2>/dev/null
gen=(generate --weights "$TMP/w.safetensors" --prompt "In the beginning" --max-tokens 12)
"$LOOM" "${gen[@]}" --seed 5 >"$TMP/gen1" 2>&1
"$LOOM" "${gen[@]}" --seed 5 >"$TMP/gen2" 2>&1
check "generate: same seed, same text" cmp -s "$TMP/gen1" "$TMP/gen2"
check "generate: continues the prompt" grep -aq "^In the beginning" "$TMP/gen1"
long=$(head -c 200 /dev/zero | tr '\0' a)
"$LOOM" generate --weights "$TMP/w.safetensors" --prompt "$long" >/dev/null 2>"$TMP/gerr"
rc=$?
check "generate: prompt longer than the context" test $rc -eq 2 -a "$(grep -c "longer than the model's context of 32" "$TMP/gerr")" = 1
head -c 100 /dev/urandom > "$TMP/junk.safetensors"
"$LOOM" generate --weights "$TMP/junk.safetensors" --prompt hi >/dev/null 2>"$TMP/gerr"
rc=$?
check "generate: malformed weights file" test $rc -eq 2 -a "$(grep -c "junk.safetensors" "$TMP/gerr")" = 1

# TensorBoard event files from a real run carry the step scalars (the record format and
# CRCs are checked by tests/unit/test_tensorboard.c).
"$LOOM" "${args[@]}" --seed "$SEED" --steps 4 --val-data "$TMP/data/train_000000.bin" \
    --eval-every 2 --tensorboard "$TMP/tb" 2>/dev/null
ev=$(ls "$TMP"/tb/events.out.tfevents.* 2>/dev/null | head -1)
check "tensorboard: event file with train/loss and val/loss" \
    test -n "$ev" -a "$(grep -ac 'train/loss' "$ev")" -ge 1 -a "$(grep -ac 'val/loss' "$ev")" -ge 1

# The same run under mpirun (one rank) is bitwise the same as without it.
if command -v mpirun >/dev/null; then
    mpirun --allow-run-as-root -n 1 "$LOOM" "${args[@]}" --seed "$SEED" --metrics "$TMP/mpi.jsonl" 2>/dev/null
    check "mpirun -n 1: identical losses" [ "$(losses "$TMP/llama.a.jsonl")" = "$(losses "$TMP/mpi.jsonl")" ]
fi

# loom picks OpenBLAS's fast kernel by itself on AVX-512 machines (SkylakeX), and leaves
# a user's choice alone.
if grep -qw avx512bw /proc/cpuinfo && grep -qw avx512dq /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo; then
    check "fast OpenBLAS kernel chosen" grep -q "kernel SkylakeX" <(env -u OPENBLAS_CORETYPE "$LOOM" version)
fi
check "user's OPENBLAS_CORETYPE kept" grep -q "kernel Haswell" <(OPENBLAS_CORETYPE=Haswell "$LOOM" version)

finish test_train
