#!/usr/bin/env bash
# Bad input gets one clear error line naming the flag/file and what was expected, exit
# code 2, never a crash. Usage: test_bad_input.sh PATH_TO_LOOM
set -u
LOOM=${1:?usage: test_bad_input.sh PATH_TO_LOOM}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0
fail=0

# A valid small shard (uint16 tokens < 256) written by loom itself.
head -c 20000 /dev/urandom > "$TMP/text.bin"
"$LOOM" data bytes --input "$TMP/text.bin" --out "$TMP/ok" --val-fraction 0 2>/dev/null ||
    { echo "FAIL: could not write the valid shard"; exit 1; }
GOOD="$TMP/ok/train_000000.bin"
BASE=(--model gpt2-tiny --vocab-size 256 --seq-len 16 --n-layer 1 --d-model 32 --n-head 2 --d-ff 64 --steps 1 --micro-batch 2 --global-batch 2)

# expect NAME EXPECTED_SUBSTRING -- loom args...
expect() {
    local name=$1 want=$2
    shift 3
    "$LOOM" "$@" >"$TMP/out" 2>"$TMP/err"
    local rc=$?
    local last
    last=$(tail -n 1 "$TMP/err")
    if [ $rc -eq 2 ] && grep -qF -- "$want" <<<"$last" && ! grep -qiE "sanitizer|segmentation|core dumped" "$TMP/err"; then
        pass=$((pass + 1))
    else
        fail=$((fail + 1))
        echo "FAIL: $name: exit $rc, last stderr line: '$last' (expected exit 2 and '$want')"
    fi
}

python3 - "$TMP" <<'PY'
import struct, sys, os
d = sys.argv[1]
def shard(name, magic=20240520, version=1, count=None, tokens=range(100), extra=b"", cut=0, fmt="H"):
    toks = list(tokens)
    n = len(toks) if count is None else count
    head = struct.pack("<256i", magic, version, n, *([0] * 253))
    body = struct.pack("<%d%s" % (len(toks), fmt), *toks) + extra
    data = head + body
    if cut: data = data[:-cut]
    open(os.path.join(d, name), "wb").write(data)
shard("bad_magic.bin", magic=0x1234)
shard("bad_version.bin", version=7)
shard("truncated.bin", cut=10)
shard("trailing.bin", extra=b"xyz")
shard("big_token.bin", tokens=[1, 2, 3] + [300] + list(range(96)))
shard("too_short.bin", tokens=range(5))
open(os.path.join(d, "short_header.bin"), "wb").write(b"\0" * 100)
open(os.path.join(d, "bad_key.ini"), "w").write("[model]\nn_layer = 2\nbogus_key = 3\n")
open(os.path.join(d, "near_key.ini"), "w").write("[model]\nn_head = 2\nn_layers = 3\n")
open(os.path.join(d, "bad_line.ini"), "w").write("n_layer = 2\nthis is not a pair\n")
PY

expect "unknown flag" "'--bogus'" -- train "${BASE[@]}" --data "$GOOD" --bogus 1
expect "missing value" "needs a value" -- train "${BASE[@]}" --data
# a mistyped flag names the nearest key, and the command once
expect "did you mean" "loom train: unknown option '--global-bach': did you mean --global-batch? (see --help)" -- train "${BASE[@]}" --data "$GOOD" --global-bach 4
expect "did you mean (swap)" "did you mean --micro-batch?" -- train "${BASE[@]}" --data "$GOOD" --mirco-batch 4
expect "no near key" "loom train: unknown option '--quantum-flux' (see --help)" -- train "${BASE[@]}" --data "$GOOD" --quantum-flux 4
if grep -q "loom train: loom train" "$TMP/err"; then
    fail=$((fail + 1)); echo "FAIL: the command named twice: $(tail -n 1 "$TMP/err")"
fi
expect "run: did you mean" "loom run: unknown option '--max-restart': did you mean --max-restarts?" -- run -n 1 --max-restart 2 -- --steps 1
expect "run: train options" "loom run: train options: unknown option '--stpes': did you mean --steps?" -- run -n 1 -- "${BASE[@]}" --data "$GOOD" --stpes 2
expect "unknown preset" "--model 'gpt9'" -- train --model gpt9 --data "$GOOD"
expect "bad number" "--lr 'abc': expected a number" -- train "${BASE[@]}" --data "$GOOD" --lr abc
expect "bad integer" "--steps '1.5': expected an integer" -- train "${BASE[@]}" --data "$GOOD" --steps 1.5
expect "bad family" "expected gpt2, llama, dit or vlm" -- train "${BASE[@]}" --data "$GOOD" --family bert
expect "n_head vs d_model" "--n-head 3: must divide --d-model 32" -- train "${BASE[@]}" --data "$GOOD" --n-head 3
expect "n_kv_head vs n_head" "--n-kv-head 3: must divide --n-head 4" -- train "${BASE[@]}" --data "$GOOD" --family llama --n-head 4 --n-kv-head 3
expect "gpt2 gqa" "--n-kv-head 1" -- train "${BASE[@]}" --data "$GOOD" --n-kv-head 1
expect "zero layers" "--n-layer 0" -- train "${BASE[@]}" --data "$GOOD" --n-layer 0
expect "batch split" "--global-batch 3" -- train "${BASE[@]}" --data "$GOOD" --global-batch 3
expect "no data flag" "--data: required" -- train "${BASE[@]}"
expect "missing file" "no file matches" -- train "${BASE[@]}" --data "$TMP/nope_*.bin"
expect "bad magic" "bad_magic.bin" -- train "${BASE[@]}" --data "$TMP/bad_magic.bin"
expect "bad version" "bad_version.bin" -- train "${BASE[@]}" --data "$TMP/bad_version.bin"
expect "short header" "short_header.bin" -- train "${BASE[@]}" --data "$TMP/short_header.bin"
expect "truncated" "truncated.bin" -- train "${BASE[@]}" --data "$TMP/truncated.bin"
expect "trailing bytes" "trailing.bin" -- train "${BASE[@]}" --data "$TMP/trailing.bin"
expect "token >= vocab" "position 3" -- train "${BASE[@]}" --data "$TMP/big_token.bin"
expect "too few tokens" "too_short.bin" -- train "${BASE[@]}" --data "$TMP/too_short.bin"
expect "config missing" "--config '$TMP/none.ini': cannot open" -- train --config "$TMP/none.ini"
expect "config bad key" "line 3: unknown key 'bogus_key'" -- train --config "$TMP/bad_key.ini"
expect "config near key" "line 3: unknown key 'n_layers': did you mean --n-layer?" -- train --config "$TMP/near_key.ini"
expect "config bad line" "line 2" -- train --config "$TMP/bad_line.ini"
expect "dp vs world size" "--dp 2 x --tp 1 x --pp 1 = 2 ranks, but the job has 1" -- train "${BASE[@]}" --data "$GOOD" --dp 2 --global-batch 4
expect "batch split over dp" "--global-batch 2: must be a multiple of --dp 2 x --micro-batch 2" -- train "${BASE[@]}" --data "$GOOD" --dp 2
expect "ep divides dp" "--ep 2: must divide --dp 1" -- train "${BASE[@]}" --data "$GOOD" --ep 2
expect "moe ep divides dp" "--ep 2: must divide --dp 1" -- train "${BASE[@]}" --data "$GOOD" --n-experts 4 --ep 2
expect "moe ep divides experts" "--ep 2: must divide --n-experts 3" -- train "${BASE[@]}" --data "$GOOD" --n-experts 3 --dp 2 --ep 2 --global-batch 4
expect "moe top-k" "--top-k 5: expected 1 <= top-k <= --n-experts 4" -- train "${BASE[@]}" --data "$GOOD" --n-experts 4 --top-k 5
expect "moe capacity" "--capacity-factor -1: expected >= 0 (0 = dropless)" -- train "${BASE[@]}" --data "$GOOD" --n-experts 4 --capacity-factor -1
expect "moe experts" "--n-experts -2: expected >= 0" -- train "${BASE[@]}" --data "$GOOD" --n-experts -2
expect "moe every" "--moe-every 0: expected 1 <= moe-every <= --n-layer" -- train "${BASE[@]}" --data "$GOOD" --n-experts 4 --moe-every 0
expect "moe ep needs experts" "--ep 2: needs a mixture-of-experts model" -- train "${BASE[@]}" --data "$GOOD" --dp 2 --ep 2 --global-batch 4
expect "moe chunks" "--moe-chunks 0: expected 1 <= chunks <= the 32 tokens of a micro-batch" -- train "${BASE[@]}" --data "$GOOD" --n-experts 4 --moe-chunks 0
expect "moe chunks dense" "--moe-chunks 2: needs a mixture-of-experts model" -- train "${BASE[@]}" --data "$GOOD" --moe-chunks 2
expect "pp chunks divide layers" "--n-layer 6: not divisible by --pp 2 x --virtual-stages 2 = 4 model chunks" -- train "${BASE[@]}" --data "$GOOD" --n-layer 6 --pp 2 --pp-schedule interleaved --virtual-stages 2 --global-batch 4
expect "pp more stages than layers" "--pp 2 x --virtual-stages 1 = 2 stages: more than --n-layer 1" -- train "${BASE[@]}" --data "$GOOD" --pp 2 --global-batch 4
expect "pp 1f1b micro-batches below pp" "--pp-schedule 1f1b: 1 micro-batch(es) per step, fewer than --pp 2" -- train "${BASE[@]}" --data "$GOOD" --n-layer 4 --pp 2 --pp-schedule 1f1b
expect "pp zb micro-batches below pp" "--pp-schedule zb: 1 micro-batch(es) per step, fewer than --pp 2" -- train "${BASE[@]}" --data "$GOOD" --n-layer 4 --pp 2 --pp-schedule zb
expect "moe pp ep divides stage dp" "--ep 4: must divide --dp 2" -- train "${BASE[@]}" --data "$GOOD" --n-experts 4 --pp 2 --dp 2 --ep 4 --global-batch 8
expect "startup timeout" "--startup-timeout 0: expected seconds in (0, 86400]" -- train "${BASE[@]}" --data "$GOOD" --startup-timeout 0
expect "zero stage" "--zero 4: expected 0, 1, 2 or 3" -- train "${BASE[@]}" --data "$GOOD" --zero 4
expect "overlap param gather zero 0" "--overlap-param-gather: needs --zero 1 or 2 (got --zero 0" -- train "${BASE[@]}" --data "$GOOD" --overlap-param-gather
expect "overlap param gather zero 3" "--overlap-param-gather: needs --zero 1 or 2 (got --zero 3" -- train "${BASE[@]}" --data "$GOOD" --dp 2 --global-batch 4 --zero 3 --overlap-param-gather
expect "overlap param gather pp" "--overlap-param-gather: not supported with --pp 2" -- train "${BASE[@]}" --data "$GOOD" --n-layer 4 --pp 2 --dp 2 --global-batch 8 --zero 1 --overlap-param-gather
expect "overlap param gather ep" "--overlap-param-gather: not supported with --ep 2" -- train "${BASE[@]}" --data "$GOOD" --n-experts 4 --dp 2 --ep 2 --global-batch 4 --zero 2 --overlap-param-gather
expect "bad size" "every size must be >= 1" -- train "${BASE[@]}" --data "$GOOD" --tp 0
expect "tp vs n_head" "--n-head 2: must be divisible by --tp 4" -- train "${BASE[@]}" --data "$GOOD" --tp 4
expect "tp vs n_kv_head" "--n-kv-head 1: must be divisible by --tp 2" -- train "${BASE[@]}" --data "$GOOD" --family llama --n-head 4 --n-kv-head 1 --tp 2
expect "tp vs d_ff" "--d-ff 63: must be divisible by --tp 2" -- train "${BASE[@]}" --data "$GOOD" --d-ff 63 --tp 2
expect "tp vs vocab" "--vocab-size 257: must be divisible by --tp 2 (embedding and output rows are split by vocabulary; e.g. --vocab-size 258)" -- train "${BASE[@]}" --data "$GOOD" --vocab-size 257 --tp 2
expect "tp vs world" "--tp 2: larger than the job's 1 rank(s)" -- train "${BASE[@]}" --data "$GOOD" --tp 2
expect "sp rows" "--sequence-parallel: --micro-batch x --seq-len = 16 tokens must be divisible by --tp 3" -- train "${BASE[@]}" --data "$GOOD" --d-model 48 --n-head 3 --d-ff 96 --vocab-size 258 --micro-batch 1 --global-batch 1 --tp 3 --sequence-parallel
expect "sp value" "--sequence-parallel 'maybe': expected 0, 1, true or false" -- train "${BASE[@]}" --data "$GOOD" --sequence-parallel=maybe
expect "unknown command" "unknown command 'fly'" -- fly
expect "near command" "unknown command 'trian': did you mean train?" -- trian
expect "data: missing input" "loom data" -- data bytes --input "$TMP/none.txt" --out "$TMP/x"

# The config file works and flags override it (the effective config is printed).
printf '[model]\nmodel = gpt2-tiny\nn_layer = 3\n[train]\nlr = 0.5\n' > "$TMP/good.ini"
if "$LOOM" train --config "$TMP/good.ini" --lr 0.25 "${BASE[@]:4}" --data "$GOOD" 2>"$TMP/err" >/dev/null &&
   grep -qx "lr = 0.25" "$TMP/err" && grep -qx "n-layer = 1" "$TMP/err"; then
    pass=$((pass + 1))
else
    fail=$((fail + 1)); echo "FAIL: config + flag override"; cat "$TMP/err"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
