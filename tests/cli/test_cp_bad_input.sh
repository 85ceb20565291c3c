#!/usr/bin/env bash
# Bad context-parallel layouts (loom train --cp, --cp-mode): one clear error line naming
# the flag and what was expected, exit code 2, before any rank starts (no mpirun needed).
# Usage: test_cp_bad_input.sh PATH_TO_LOOM
set -u
LOOM=${1:?usage: test_cp_bad_input.sh PATH_TO_LOOM}
source "$(dirname "$0")/check_lib.sh" # $TMP, expect, finish

# a token shard (llm.c format) and an image shard (docs/data.md: 12 x 20, 15 patches of 4 x 4)
/usr/bin/python3 - "$TMP" <<'PY'
import random, struct, sys
d = sys.argv[1]
rng = random.Random(11)
toks = [rng.randrange(256) for _ in range(4096)]
open(f"{d}/tokens.bin", "wb").write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253))
                                     + struct.pack(f"<{len(toks)}H", *toks))
n = 8
head = struct.pack("<256i", 20261202, 1, n, 1, 1, 12, 20, 3, *([0] * 248))
body = struct.pack(f"<{n}i", *[rng.randrange(3) for _ in range(n)]) + bytes(
    rng.randrange(256) for _ in range(n * 12 * 20))
open(f"{d}/images.bin", "wb").write(head + body)
PY
LM=(train --family llama --vocab-size 256 --n-layer 1 --d-model 32 --n-head 4 --n-kv-head 2
    --d-ff 64 --micro-batch 1 --global-batch 1 --steps 1 --threads 1 --data "$TMP/tokens.bin")

expect "cp zero" "--cp 0: expected >= 1" -- "${LM[@]}" --seq-len 32 --cp 0
expect "unknown mode" "--cp-mode" -- "${LM[@]}" --seq-len 32 --cp 2 --cp-mode sideways
expect "sequence does not split" "--cp 3" -- "${LM[@]}" --seq-len 32 --cp 3
expect "zigzag needs 2 x cp" "2 x --cp" -- "${LM[@]}" --seq-len 36 --cp 4
expect "ulysses: too few heads" "--n-head" -- "${LM[@]}" --seq-len 32 --cp 8 --cp-mode ulysses
expect "ulysses: kv heads" "--n-kv-head" -- \
    train --family llama --vocab-size 256 --n-layer 1 --d-model 48 --n-head 6 --n-kv-head 3 \
    --d-ff 64 --micro-batch 1 --global-batch 1 --steps 1 --threads 1 --data "$TMP/tokens.bin" \
    --seq-len 32 --cp 2 --cp-mode ulysses
expect "moe needs dropless" "--capacity-factor" -- "${LM[@]}" --seq-len 32 --cp 2 \
    --n-experts 4 --top-k 2 --capacity-factor 1.25
expect "dit tokens do not split" "--cp 2" -- \
    train --family dit --n-layer 1 --n-head 2 --d-model 32 --d-ff 64 --height 12 --width 20 \
    --channels 1 --patch 4 --n-classes 3 --micro-batch 1 --global-batch 1 --steps 1 \
    --threads 1 --data "$TMP/images.bin" --cp 2
expect "ranks do not match" "--cp 2" -- "${LM[@]}" --seq-len 32 --cp 2

finish test_cp_bad_input
