#!/usr/bin/env bash
# A rank that never starts must not leave the others waiting forever (--startup-timeout).
# An MPMD mpirun line makes rank 1 really late: it sleeps before exec'ing loom, so rank 0
# sits in MPI_Init's fence. Expected: the job ends within the timeout plus a margin, with
# a non-zero status, rank 0's line naming itself "rank 0 of 2" and no such line from
# rank 1 (the missing rank). Then the same job with rank 1 only slightly late (well
# within the timeout) trains normally.
# Usage: test_startup_timeout.sh PATH_TO_LOOM
set -u
LOOM=${1:?usage: test_startup_timeout.sh PATH_TO_LOOM}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
head -c 20000 /dev/urandom > "$TMP/text.bin"
"$LOOM" data bytes --input "$TMP/text.bin" --out "$TMP/data" --val-fraction 0 2>/dev/null || exit 1
ARGS="train --family gpt2 --vocab-size 256 --seq-len 16 --n-layer 1 --d-model 32 --n-head 2 \
--d-ff 64 --micro-batch 2 --global-batch 4 --steps 2 --threads 1 --log-every 0 --dp 2 \
--data $TMP/data/train_000000.bin --startup-timeout 3"
MPIRUN="mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1"
fail() { echo "FAIL: $*"; cat "$TMP/err"; exit 1; }

t0=$(date +%s)
timeout 60 $MPIRUN -n 1 "$LOOM" $ARGS : -n 1 sh -c "sleep 30; exec $LOOM $ARGS" \
    >"$TMP/out" 2>"$TMP/err"
rc=$?
dt=$(( $(date +%s) - t0 ))
[ $rc -ne 0 ] || fail "a missing rank: exit status 0"
[ $rc -ne 124 ] || fail "a missing rank: still waiting after 60 s"
[ $dt -lt 25 ] || fail "a missing rank: took $dt s with --startup-timeout 3"
grep -q "rank 0 of 2: start-up timed out after 3 s" "$TMP/err" || fail "no line from rank 0"
if grep -q "rank 1 of 2: start-up timed out" "$TMP/err"; then fail "rank 1 never started but reported"; fi
echo "missing rank: exit $rc after $dt s; $(grep -c 'start-up timed out' "$TMP/err") report line(s)"

$MPIRUN -n 1 "$LOOM" $ARGS : -n 1 sh -c "sleep 1; exec $LOOM $ARGS" >"$TMP/out" 2>"$TMP/err" ||
    fail "rank 1 one second late: the job failed"
grep -q "start-up timed out" "$TMP/err" && fail "rank 1 one second late: timed out"
echo "2 passed, 0 failed"
