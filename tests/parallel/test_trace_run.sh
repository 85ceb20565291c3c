#!/usr/bin/env bash
# A real 2-rank run with --trace: the merged Chrome trace parses, has one process per
# rank, compute spans per block inside forward/backward, the gradient collectives on
# communication lanes, and spans that nest and never overlap within a track; under --cp 2
# the ring's transfers (forward "ring kv", backward "ring dkv") are on the lanes too.
# Usage: test_trace_run.sh PATH_TO_LOOM
set -eu
LOOM=${1:?usage: test_trace_run.sh PATH_TO_LOOM}
HERE=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
head -c 20000 /dev/urandom > "$TMP/text.bin"
"$LOOM" data bytes --input "$TMP/text.bin" --out "$TMP/data" --val-fraction 0 2>/dev/null
for zero in 1 3; do
    mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1 -n 2 \
        "$LOOM" train --family gpt2 --vocab-size 256 --seq-len 16 --n-layer 2 --d-model 32 \
        --n-head 2 --d-ff 64 --micro-batch 2 --global-batch 8 --steps 3 --threads 1 \
        --log-every 0 --bucket-mb 0.01 --dp 2 --zero $zero --data "$TMP/data/train_000000.bin" \
        --trace "$TMP/trace_$zero.json" 2>"$TMP/err" || { cat "$TMP/err"; exit 1; }
    names=step,forward,backward,block,optimizer,allreduce
    [ $zero -eq 3 ] && names=step,forward,backward,block,optimizer,allreduce,allgatherv
    /usr/bin/python3 "$HERE/check_trace.py" "$TMP/trace_$zero.json" --ranks 2 \
        --expect-names "$names" --every-rank --max-dropped 0
done
mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1 -n 2 \
    "$LOOM" train --family llama --vocab-size 256 --seq-len 16 --n-layer 2 --d-model 32 \
    --n-head 2 --n-kv-head 2 --d-ff 64 --micro-batch 2 --global-batch 4 --steps 2 --threads 1 \
    --log-every 0 --cp 2 --data "$TMP/data/train_000000.bin" --trace "$TMP/trace_cp.json" \
    2>"$TMP/err" || { cat "$TMP/err"; exit 1; }
/usr/bin/python3 "$HERE/check_trace.py" "$TMP/trace_cp.json" --ranks 2 \
    --expect-names "step,forward,backward,block,ring kv,ring dkv,allreduce" --every-rank \
    --max-dropped 0
echo "3 passed, 0 failed"
