#!/usr/bin/env bash
# loom data arith (splits, files, bad flags) and loom generate --prompt-file (batched
# decoding gives the completions of one prompt at a time; an empty line: exit 2 naming it).
# Usage: test_rl_data.sh PATH_TO_LOOM
set -u
LOOM=${1:?usage: test_rl_data.sh PATH_TO_LOOM}
. "$(dirname "$0")/check_lib.sh"

"$LOOM" data arith --out "$TMP/d" --digits 2 --train 2000 --val 40 --seed 7 2>/dev/null
check "arith: files" test -s "$TMP/d/train_000000.bin" -a -s "$TMP/d/val_000000.bin" \
    -a -s "$TMP/d/train_prompts.txt" -a -s "$TMP/d/val_answers.txt"
check "arith: task.json" [ "$(cat "$TMP/d/task.json")" = '{"op": "+", "digits": 2}' ]
check "arith: 40 held-out prompts" [ "$(wc -l <"$TMP/d/val_prompts.txt")" -eq 40 ]
check "arith: no held-out pair in train" [ "$(comm -12 <(sort -u "$TMP/d/train_prompts.txt") \
    <(sort -u "$TMP/d/val_prompts.txt") | wc -l)" -eq 0 ]
check "arith: answers are the sums" python3 - "$TMP/d" <<'PY'
import sys
d = sys.argv[1]
for split in ("train", "val"):
    ps = open(f"{d}/{split}_prompts.txt").read().split("\n")[:-1]
    ans = open(f"{d}/{split}_answers.txt").read().split("\n")[:-1]
    assert len(ps) == len(ans)
    for p, a in zip(ps, ans):
        x, y = p[:-1].split("+")
        assert 0 <= int(x) < 100 and 0 <= int(y) < 100 and int(x) + int(y) == int(a), (p, a)
body = open(f"{d}/train_000000.bin", "rb").read()[1024:]
lines = bytes(body[0::2]).decode().split("\n")[:-1]  # uint16 byte tokens
ps = open(f"{d}/train_prompts.txt").read().split("\n")[:-1]
ans = open(f"{d}/train_answers.txt").read().split("\n")[:-1]
assert lines == [p + a for p, a in zip(ps, ans)]
PY
"$LOOM" data arith --out "$TMP/d2" --digits 2 --train 2000 --val 40 --seed 7 2>/dev/null
check "arith: the same seed, the same files" cmp -s "$TMP/d/train_000000.bin" "$TMP/d2/train_000000.bin"
"$LOOM" data arith --out "$TMP/m" --op '*' --digits 3 --train 10 --val 10 2>/dev/null
check "arith: products" python3 -c "
import sys
for p, a in zip(open('$TMP/m/val_prompts.txt'), open('$TMP/m/val_answers.txt')):
    x, y = p.strip()[:-1].split('*'); assert int(x) * int(y) == int(a)"
"$LOOM" data arith --out "$TMP/c" --op countdown --numbers 4 --max 30 --train 500 --val 50 \
    --seed 3 2>/dev/null
check "countdown: task.json" [ "$(cat "$TMP/c/task.json")" = \
    '{"op": "countdown", "numbers": 4, "max": 30}' ]
check "countdown: each answer uses the numbers at most once and reaches the target; \
no held-out instance in train" python3 - "$TMP/c" <<'PY'
import re, sys
from collections import Counter
from fractions import Fraction
d = sys.argv[1]
seen = {}
for split in ("train", "val"):
    ps = open(f"{d}/{split}_prompts.txt").read().split("\n")[:-1]
    ans = open(f"{d}/{split}_answers.txt").read().split("\n")[:-1]
    assert len(ps) == len(ans) == (500 if split == "train" else 50)
    seen[split] = set(ps)
    for p, a in zip(ps, ans):
        m = re.fullmatch(r"((?:\d+ ){3}\d+)>(\d+)=", p)
        assert m, p
        nums = [int(x) for x in m.group(1).split()]
        assert all(1 <= x <= 30 for x in nums), p
        used = [int(x) for x in re.findall(r"\d+", a)]
        assert not Counter(used) - Counter(nums), (p, a)
        expr = re.sub(r"(\d+)", r"Fraction(\1)", a)
        assert eval(expr) == int(m.group(2)), (p, a)
assert not seen["train"] & seen["val"]
PY
expect "arith: --numbers 1" "--numbers" -- data arith --out "$TMP/x" --op countdown --numbers 1
expect "arith: --digits 0" "--digits" -- data arith --out "$TMP/x" --digits 0
expect "arith: --op" "--op" -- data arith --out "$TMP/x" --op -
expect "arith: --out missing" "--out" -- data arith

# A tiny model, a few steps: completions of a prompt file, greedy, equal one at a time.
"$LOOM" train --family llama --vocab-size 256 --seq-len 24 --n-layer 2 --d-model 32 --n-head 4 \
    --n-kv-head 2 --d-ff 64 --micro-batch 8 --global-batch 8 --steps 10 --lr 3e-3 --threads 2 \
    --log-every 0 --data "$TMP/d/train_*.bin" --save-weights "$TMP/w.safetensors" 2>/dev/null
head -6 "$TMP/d/val_prompts.txt" >"$TMP/p.txt"
"$LOOM" generate --weights "$TMP/w.safetensors" --prompt-file "$TMP/p.txt" --temperature 0 \
    --max-tokens 6 --batch 4 >"$TMP/batched.txt" 2>"$TMP/err"
check "generate: one line per prompt" [ "$(wc -l <"$TMP/batched.txt")" -eq 6 ]
: >"$TMP/single.txt"
while read -r p; do
    "$LOOM" generate --weights "$TMP/w.safetensors" --prompt "$p" --temperature 0 --max-tokens 6 \
        2>/dev/null | head -1 | cut -c$((${#p} + 1))- >>"$TMP/single.txt"
done <"$TMP/p.txt"
check "generate: batched greedy = one prompt at a time" cmp -s "$TMP/batched.txt" "$TMP/single.txt"
"$LOOM" generate --weights "$TMP/w.safetensors" --prompt-file "$TMP/p.txt" --temperature 1 \
    --max-tokens 6 --batch 6 --seed 3 >"$TMP/s6.txt" 2>/dev/null
"$LOOM" generate --weights "$TMP/w.safetensors" --prompt-file "$TMP/p.txt" --temperature 1 \
    --max-tokens 6 --batch 1 --seed 3 >"$TMP/s1.txt" 2>/dev/null
check "generate: sampling does not depend on --batch" cmp -s "$TMP/s6.txt" "$TMP/s1.txt"
printf '1+2=\n\n3+4=\n' >"$TMP/empty.txt"
expect "generate: empty line" "$TMP/empty.txt:2: empty line" -- generate --weights \
    "$TMP/w.safetensors" --prompt-file "$TMP/empty.txt"
expect "generate: both" "exactly one" -- generate --weights "$TMP/w.safetensors" \
    --prompt-file "$TMP/p.txt" --prompt x
finish test_rl_data
