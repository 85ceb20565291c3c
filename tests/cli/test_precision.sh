#!/usr/bin/env bash
# --precision (docs/precision.md): bad values give one error line naming the flag, exit 2;
# a bf16 run names its GEMMs' implementation at start-up (oneDNN's, or on a CPU without
# AVX512-BF16 / AMX-BF16, real or pretended, the GEMMs widened to fp32 for OpenBLAS) and
# runs every GEMM shape of a dense model prepared (0 calls unprepared); the same bf16 run
# twice is bitwise identical and so is one resumed from a checkpoint; fp32 is the default;
# loom generate --precision the same way.
# Usage: test_precision.sh PATH_TO_LOOM
set -u
LOOM=${1:?usage: test_precision.sh PATH_TO_LOOM}
source "$(dirname "$0")/check_lib.sh" # $TMP, check, expect, finish

/usr/bin/python3 - "$TMP" <<'PY'
import random, struct, sys
rng = random.Random(5)
toks = [rng.randrange(256) for _ in range(4096)]
open(f"{sys.argv[1]}/tokens.bin", "wb").write(
    struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)) + struct.pack(f"<{len(toks)}H", *toks))
PY
LM=(train --family llama --vocab-size 256 --n-layer 1 --d-model 32 --n-head 4 --n-kv-head 2
    --d-ff 64 --seq-len 16 --micro-batch 2 --global-batch 4 --threads 1
    --data "$TMP/tokens.bin" --log-every 0)

expect "fp16 is not supported" "--precision 'fp16': expected fp32 or bf16" -- "${LM[@]}" \
    --precision fp16
expect "upper case" "--precision 'BF16'" -- "${LM[@]}" --precision BF16
expect "not on a GPU yet" "--precision bf16" -- "${LM[@]}" --precision bf16 --device cuda
expect "bf16 reduction of fp32 gradients" "--grad-reduce-dtype bf16: needs --precision bf16" \
    -- "${LM[@]}" --grad-reduce-dtype bf16
expect "reduce dtype fp16" "--grad-reduce-dtype 'fp16': expected fp32 or bf16" -- "${LM[@]}" \
    --precision bf16 --grad-reduce-dtype fp16
expect "bf16 reduction with --ep" "--grad-reduce-dtype bf16: not with --ep 2" -- "${LM[@]}" \
    --precision bf16 --grad-reduce-dtype bf16 --n-experts 2 --dp 2 --ep 2
expect "loom run passes it to train's check" "--grad-reduce-dtype bf16: needs --precision bf16" \
    -- run -n 1 -- "${LM[@]:1}" --grad-reduce-dtype bf16

# the start-up line: oneDNN's implementation, or the widened GEMMs on a CPU without bf16
# instructions (LOOM_BF16_PRETEND_NO_CPU=1 makes any CPU one)
BF16_LINE="^loom: precision bf16: (oneDNN [0-9.]+ bf16 matmul [a-z_:0-9]+|bf16 matmul widened to \
fp32 for OpenBLAS sgemm \(this CPU has no AVX512-BF16 or AMX-BF16[^)]*\)), [0-9]+ shapes"
LOOM_BF16_PRETEND_NO_CPU=1 "$LOOM" "${LM[@]}" --steps 2 --precision bf16 >/dev/null 2>"$TMP/errp"
check "a CPU without AVX512-BF16 (pretended) runs bf16" test $? -eq 0
check "... and says its GEMMs are widened to fp32" \
    grep -q "^loom: precision bf16: bf16 matmul widened to fp32 for OpenBLAS sgemm (this CPU has no AVX512-BF16 or AMX-BF16" "$TMP/errp"

# a bf16 run: the start-up line, every shape prepared, twice the same bits
for k in 1 2; do
    "$LOOM" "${LM[@]}" --steps 3 --precision bf16 --metrics "$TMP/m$k.jsonl" \
        --save-weights "$TMP/w$k.safetensors" >"$TMP/out$k" 2>"$TMP/err$k"
    check "bf16 run $k exits 0" test $? -eq 0
done
check "start-up line names the GEMMs' implementation" grep -qE "$BF16_LINE" "$TMP/err1"
check "no GEMM ran unprepared" grep -q "precision bf16 at the end: .*, 0 calls unprepared" "$TMP/err1"
losses() { grep -o '"loss":[^,]*,"lr":[^,]*,"grad_norm":[^,]*' "$1"; }
check "same bf16 run twice: same losses" test "$(losses "$TMP/m1.jsonl")" = "$(losses "$TMP/m2.jsonl")" \
    -a -n "$(losses "$TMP/m1.jsonl")"
check "same bf16 run twice: same weights" cmp -s "$TMP/w1.safetensors" "$TMP/w2.safetensors"
# activations only bf16 GEMMs read (the norms' outputs, the MLP's activation) are kept in
# bf16: bitwise the run that kept them in fp32 (LOOM_BF16_FP32_ACTIVATIONS=1), with fewer
# activation bytes in the start-up report; llama here, gpt2 with selective recomputation
acts() { grep -o 'activations [0-9.]* MiB' "$1" | grep -o '[0-9.]*'; }
LOOM_BF16_FP32_ACTIVATIONS=1 "$LOOM" "${LM[@]}" --steps 3 --precision bf16 \
    --save-weights "$TMP/w32a.safetensors" >/dev/null 2>"$TMP/err32a"
check "bf16 activations: bitwise the fp32-activation run (llama)" \
    cmp -s "$TMP/w1.safetensors" "$TMP/w32a.safetensors"
check "bf16 activations: fewer bytes reported (llama)" \
    awk -v a="$(acts "$TMP/err1")" -v b="$(acts "$TMP/err32a")" 'BEGIN { exit !(a > 0 && a < b) }'
GPT=("${LM[@]}")
GPT[2]=gpt2
for k in 0 1; do
    LOOM_BF16_FP32_ACTIVATIONS=$k "$LOOM" "${GPT[@]}" --n-kv-head 4 --steps 3 --precision bf16 \
        --recompute selective --save-weights "$TMP/g$k.safetensors" >/dev/null 2>&1
done
check "bf16 activations: bitwise the fp32-activation run (gpt2, selective recompute)" \
    cmp -s "$TMP/g0.safetensors" "$TMP/g1.safetensors"
"$LOOM" "${LM[@]}" --steps 3 --metrics "$TMP/f.jsonl" >/dev/null 2>"$TMP/errf"
check "fp32 is the default (no bf16 line)" test $? -eq 0 -a -z "$(grep 'precision bf16' "$TMP/errf")"
check "bf16 is not fp32" test "$(losses "$TMP/m1.jsonl")" != "$(losses "$TMP/f.jsonl")"

# checkpoints hold the fp32 master and optimizer state: a bf16 run stopped at step 3 and
# resumed is bitwise the uninterrupted one (warm-up over the first 4 steps: steps 1-3 have
# the same learning rate with --steps 3 or 6), and the same checkpoint resumes in fp32
steps() { grep -o '"step":[0-9]*,"loss":[^,]*,"lr":[^,]*,"grad_norm":[^,]*' "$1" | tail -n "$2"; }
WU=(--warmup-steps 4 --precision bf16)
"$LOOM" "${LM[@]}" "${WU[@]}" --steps 6 --metrics "$TMP/full.jsonl" 2>/dev/null
"$LOOM" "${LM[@]}" "${WU[@]}" --steps 3 --ckpt-dir "$TMP/ck" >/dev/null 2>&1
cp -r "$TMP/ck" "$TMP/ck32"
"$LOOM" "${LM[@]}" "${WU[@]}" --steps 6 --ckpt-dir "$TMP/ck" --resume auto \
    --metrics "$TMP/res.jsonl" 2>"$TMP/res_err"
check "bf16 resume exits 0" test $? -eq 0
check "bf16 resumed from step 3" grep -q "resumed from .*step 3" "$TMP/res_err"
check "bf16 resumed: bitwise the uninterrupted run" \
    test "$(steps "$TMP/res.jsonl" 3)" = "$(steps "$TMP/full.jsonl" 3)" -a -n "$(steps "$TMP/res.jsonl" 3)"
"$LOOM" "${LM[@]}" --warmup-steps 4 --steps 6 --ckpt-dir "$TMP/ck32" --resume auto \
    --metrics "$TMP/res32.jsonl" 2>/dev/null
check "the bf16 checkpoint resumes in fp32" test $? -eq 0 -a -n "$(steps "$TMP/res32.jsonl" 3)"

# loom generate --precision bf16: the line, the same text twice; a bad value exits 2
GEN=(generate --weights "$TMP/w1.safetensors" --prompt "ab" --max-tokens 12 --temperature 0)
"$LOOM" "${GEN[@]}" --precision bf16 >"$TMP/g1" 2>"$TMP/ge1"
check "generate bf16 exits 0" test $? -eq 0
"$LOOM" "${GEN[@]}" --precision bf16 >"$TMP/g2" 2>/dev/null
check "generate bf16 twice: the same text" cmp -s "$TMP/g1" "$TMP/g2"
check "generate bf16 names its GEMMs" grep -qE "$BF16_LINE" "$TMP/ge1"
expect "generate fp8" "--precision 'fp8': expected fp32 or bf16" -- "${GEN[@]}" --precision fp8
LOOM_BF16_PRETEND_NO_CPU=1 "$LOOM" "${GEN[@]}" --precision bf16 >"$TMP/gp" 2>"$TMP/gep"
check "generate bf16 without AVX512-BF16 (pretended): widened, some text" \
    test $? -eq 0 -a -s "$TMP/gp" -a -n "$(grep 'widened to fp32' "$TMP/gep")"

finish test_precision
