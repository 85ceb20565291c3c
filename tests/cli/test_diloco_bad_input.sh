#!/usr/bin/env bash
# Bad DiLoCo flags (loom train --outer diloco ...): one clear error line naming the flag
# and what was expected, exit code 2 (before any rank starts; one case under mpirun).
# Usage: test_diloco_bad_input.sh PATH_TO_LOOM
set -u
LOOM=${1:?usage: test_diloco_bad_input.sh PATH_TO_LOOM}
source "$(dirname "$0")/check_lib.sh" # $TMP, check, expect, finish

/usr/bin/python3 - "$TMP" <<'PY'
import random, struct, sys
rng = random.Random(7)
toks = [rng.randrange(256) for _ in range(4096)]
open(f"{sys.argv[1]}/tokens.bin", "wb").write(
    struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)) + struct.pack(f"<{len(toks)}H", *toks))
PY
LM=(train --family gpt2 --vocab-size 256 --seq-len 16 --n-layer 2 --d-model 32 --n-head 2
    --d-ff 64 --micro-batch 1 --global-batch 4 --steps 2 --threads 1 --data "$TMP/tokens.bin")
D=("${LM[@]}" --outer diloco)

expect "inner steps 0" "--inner-steps 0: expected >= 1" -- "${D[@]}" --inner-steps 0
expect "workers do not divide the world" "--workers 2: must divide the job's 1 rank(s)" -- \
    "${D[@]}" --workers 2
expect "more fragments than blocks" "--outer-fragments 3: larger than the model's 2 blocks" -- \
    "${D[@]}" --outer-fragments 3 --inner-steps 9
expect "int4 with an odd block" "--outer-block 33: expected an even number" -- \
    "${D[@]}" --outer-dtype int4 --outer-block 33
expect "unknown dtype" "--outer-dtype fp8: expected fp32, bf16, int8 or int4" -- \
    "${D[@]}" --outer-dtype fp8
expect "unknown outer" "--outer adam: expected none or diloco" -- "${LM[@]}" --outer adam
expect "workers without diloco" "--workers 2: needs --outer diloco" -- "${LM[@]}" --workers 2
expect "batch over workers" "--global-batch 4: must be a multiple of --workers 3" -- \
    "${D[@]}" --workers 3
expect "fragments need inner steps" "--inner-steps 4 with --outer-fragments 2" -- \
    "${D[@]}" --outer-fragments 2 --inner-steps 4
expect "outer momentum" "--outer-momentum 1: expected in [0, 1)" -- "${D[@]}" --outer-momentum 1
expect "outer warm-up" "--outer-warmup -1: expected >= 0" -- "${D[@]}" --outer-warmup -1
expect "outer start step" "--outer-start-step -1: expected >= 0" -- "${D[@]}" --outer-start-step -1
expect "start step without diloco" "--outer-start-step 4: needs --outer diloco" -- \
    "${LM[@]}" --outer-start-step 4
expect "inner lr scale 0" "--inner-lr-scale 0: expected > 0" -- "${D[@]}" --inner-lr-scale 0
expect "inner lr scale nan" "--inner-lr-scale nan: expected > 0" -- "${D[@]}" --inner-lr-scale nan
expect "inner lr scale without diloco" "--inner-lr-scale 0.5: needs --outer diloco" -- \
    "${LM[@]}" --inner-lr-scale 0.5

# --elastic-worker (parallel/outer_elastic.c): checked before MPI starts
E=("${D[@]}" --workers 2)
expect "elastic without diloco" "--elastic-worker 0: needs --outer diloco" -- \
    "${LM[@]}" --elastic-worker 0
expect "elastic worker out of range" "--elastic-worker 2: expected 0..1" -- \
    "${E[@]}" --elastic-worker 2
expect "join without a worker" "--elastic-join: needs --elastic-worker I" -- "${E[@]}" --elastic-join
expect "elastic streaming, too few inner steps" \
    "--inner-steps 4 with --outer-fragments 2: expected >= 3 x fragments" -- \
    "${E[@]}" --elastic-worker 1 --outer-fragments 2 --inner-steps 4
expect "elastic int4 with an odd block" "--outer-block 33: expected an even number" -- \
    "${E[@]}" --elastic-worker 1 --outer-dtype int4 --outer-block 33
# --ckpt-peer's memory copies live in the worker job's own hosts (docs/diloco.md)
expect "elastic peer memory" "--outer diloco: not with --elastic-worker and --ckpt-peer yet" -- \
    "${E[@]}" --elastic-worker 1 --ckpt-dir "$TMP/ck" --ckpt-peer
# loom run --elastic with --workers: one mpirun per worker (ft/elastic_workers.c)
expect "elastic run: -n not a multiple of the workers" \
    "loom run: --elastic with --workers 2: -n 3 must be a multiple of the workers" -- \
    run --elastic -n 3 --run-dir "$TMP/run" -- "${E[@]:1}"
expect "elastic run: --elastic-worker given" "leave --elastic-worker out" -- \
    run --elastic -n 2 --run-dir "$TMP/run" -- "${E[@]:1}" --elastic-worker 1
expect "elastic run: a worker across hosts" "worker 1's 2 ranks span hosts localhost and 127.0.0.1" -- \
    run --elastic -n 4 --hosts localhost:3,127.0.0.1:1 --run-dir "$TMP/run" -- "${E[@]:1}"
expect "elastic timeout" "--elastic-timeout 0: expected > 0" -- \
    "${E[@]}" --elastic-worker 1 --elastic-timeout 0
expect "elastic worker without mpirun" "--elastic-worker 0: expected to run under mpirun" -- \
    "${E[@]}" --elastic-worker 0

# Under mpirun: 3 ranks do not split into 2 worker groups; rank 0 says so once, exit 2.
# (no leak check there: OpenMPI's own allocations, as in test_plan.sh)
if command -v mpirun >/dev/null; then
    ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1 -n 3 "$LOOM" \
        "${D[@]}" --workers 2 >"$TMP/out" 2>"$TMP/err"
    rc=$?
    n=$(grep -c "^loom train: --workers 2: must divide the job's 3 rank(s)" "$TMP/err")
    check "mpirun -n 3 --workers 2: exit 2 (got $rc), one line (got $n)" [ "$rc" -eq 2 -a "$n" -eq 1 ]
fi

# Under mpirun: an elastic worker job is laid out by its own ranks (any layout inside the
# worker): --dp 2 --tp 2 in a job of 2 ranks is refused, one line, exit 2.
if command -v mpirun >/dev/null; then
    ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1 -n 2 "$LOOM" \
        "${D[@]}" --workers 2 --elastic-worker 0 --dp 2 --tp 2 >"$TMP/out" 2>"$TMP/err"
    rc=$?
    n=$(grep -c "^loom train: --dp 2 x --tp 2 x --pp 1 = 4 ranks, but the job has 2" "$TMP/err")
    check "mpirun -n 2 --elastic-worker 0 --dp 2 --tp 2: exit 2 (got $rc), one line (got $n)" [ "$rc" -eq 2 -a "$n" -eq 1 ]
fi

finish test_diloco_bad_input
