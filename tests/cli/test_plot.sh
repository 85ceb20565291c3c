#!/usr/bin/env bash
# loom plot: trains a tiny model for 30 steps, plots its metrics (alone, with a second file
# carrying validation losses, with --log-y and a hostile --title), checks that a plausible
# PNG comes out, then every bad input: exit 2 and one line "loom plot: ...".
# Usage: test_plot.sh PATH_TO_LOOM
set -u
LOOM=${1:?usage: test_plot.sh PATH_TO_LOOM}
tmp=$(mktemp -d /tmp/loom_cli_plot_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
if ! command -v gnuplot >/dev/null; then
    echo "test_plot.sh: gnuplot not installed (apt-get install gnuplot-nox)" >&2
    exit 1
fi
# A tiny model trains fastest on one thread (and a busy machine makes OpenMP spin).
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

# Checks that $1 is a PNG (signature, IHDR) of at least 10 kB with a sane width and height.
is_png() {
    [ -s "$1" ] || return 1
    [ "$(head -c 8 "$1" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] || return 1
    [ "$(head -c 16 "$1" | tail -c 4)" = "IHDR" ] || return 1
    local w h
    w=$(head -c 20 "$1" | tail -c 4 | od -An -tu1 | awk '{print $1*16777216+$2*65536+$3*256+$4}')
    h=$(head -c 24 "$1" | tail -c 4 | od -An -tu1 | awk '{print $1*16777216+$2*65536+$3*256+$4}')
    [ "$w" -ge 400 ] && [ "$w" -le 4000 ] && [ "$h" -ge 300 ] && [ "$h" -le 4000 ] || return 1
    [ "$(stat -c %s "$1")" -ge 10000 ]
}

# 30 steps of a one-layer GPT-2 on bytes of loom's own sources.
cat "$(dirname "$0")"/../../src/*/*.c | head -c 200000 >"$tmp/text"
"$LOOM" data bytes --input "$tmp/text" --out "$tmp/data" 2>/dev/null || fail "data bytes: exit $?"
"$LOOM" train --family gpt2 --vocab-size 256 --seq-len 32 --n-layer 1 --d-model 32 --n-head 2 \
    --d-ff 64 --micro-batch 4 --global-batch 4 --steps 30 --log-every 0 \
    --data "$tmp/data/train_*.bin" --metrics "$tmp/m.jsonl" 2>"$tmp/train.err" ||
    fail "train: exit $?: $(tail -1 "$tmp/train.err")"
[ "$(wc -l <"$tmp/m.jsonl")" -eq 30 ] || fail "metrics: expected 30 lines"

"$LOOM" plot "$tmp/m.jsonl" -o "$tmp/out/loss.png" 2>"$tmp/err" || fail "plot: exit $?: $(cat "$tmp/err")"
is_png "$tmp/out/loss.png" || fail "plot: $tmp/out/loss.png is not a plausible PNG"
ls "$tmp/out" | grep -qv '^loss.png$' && fail "plot: left files beside the PNG: $(ls "$tmp/out")"

# A second run with validation losses (and a blank line); names with quotes and spaces.
awk 'NF { print } NR % 10 == 0 { printf "{\"step\": %d, \"val_loss\": %s}\n\n", NR, 5 - NR / 30 }' \
    "$tmp/m.jsonl" >"$tmp/it's a run.jsonl"
"$LOOM" plot "$tmp/m.jsonl" "$tmp/it's a run.jsonl" -o "$tmp/two.png" --log-y \
    --title "\`touch $tmp/pwned\` it's @x \$(touch $tmp/pwned)" 2>"$tmp/err" ||
    fail "plot two files: exit $?: $(cat "$tmp/err")"
is_png "$tmp/two.png" || fail "plot two files: not a plausible PNG"
[ -e "$tmp/pwned" ] && fail "the title ran a command"
# An output name that gnuplot would take for a pipe is just a file name to loom.
(cd "$tmp" && "$LOOM" plot m.jsonl -o "|touch pwned2" 2>/dev/null) || fail "plot -o '|...': exit $?"
[ -e "$tmp/pwned2" ] && fail "-o '|touch pwned2' ran a command"
is_png "$tmp/|touch pwned2" || fail "-o '|touch pwned2' did not write that file"

# Every bad invocation: exit 2 and exactly one line "loom plot: ..." naming the problem.
expect_error() {
    local want=$1
    shift
    "$LOOM" plot "$@" >/dev/null 2>"$tmp/err"
    local rc=$?
    [ "$rc" -eq 2 ] || fail "plot $*: exit $rc, expected 2"
    [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q '^loom plot: ' "$tmp/err" ||
        fail "plot $*: stderr: $(cat "$tmp/err")"
    grep -qF -- "$want" "$tmp/err" || fail "plot $*: message lacks '$want': $(cat "$tmp/err")"
}
: >"$tmp/empty.jsonl"
printf '\n  \n' >"$tmp/blank.jsonl"
head -3 "$tmp/m.jsonl" >"$tmp/bad.jsonl"
echo '{"step": 4, "loss": 1.5' >>"$tmp/bad.jsonl"
printf '{"step": 1, "loss": 2}\n[1, 2]\n' >"$tmp/array.jsonl"
printf '{"step": 1, "loss": 2}\n{"loss": 2}\n' >"$tmp/nostep.jsonl"
printf '{"step": 1, "loss": "2"}\n' >"$tmp/strloss.jsonl"
printf '{"step": 1, "lr": 0.1}\n' >"$tmp/noloss.jsonl"
expect_error "no metrics file" -o "$tmp/x.png"
expect_error "-o OUT.png is required" "$tmp/m.jsonl"
expect_error "needs a value" "$tmp/m.jsonl" -o
expect_error "unknown option" "$tmp/m.jsonl" -o "$tmp/x.png" --bogus
expect_error "$tmp/nosuch.jsonl" "$tmp/nosuch.jsonl" -o "$tmp/x.png"
expect_error "$tmp/empty.jsonl': no records" "$tmp/empty.jsonl" -o "$tmp/x.png"
expect_error "$tmp/blank.jsonl': no records" "$tmp/m.jsonl" "$tmp/blank.jsonl" -o "$tmp/x.png"
expect_error "$tmp/bad.jsonl:4:" "$tmp/bad.jsonl" -o "$tmp/x.png"
expect_error "$tmp/array.jsonl:2: expected a JSON object" "$tmp/array.jsonl" -o "$tmp/x.png"
expect_error "$tmp/nostep.jsonl:2: expected a number in field \"step\"" "$tmp/nostep.jsonl" -o "$tmp/x.png"
expect_error "$tmp/strloss.jsonl:1: field \"loss\"" "$tmp/strloss.jsonl" -o "$tmp/x.png"
expect_error "$tmp/noloss.jsonl:1: expected a field \"loss\" or \"val_loss\"" "$tmp/noloss.jsonl" -o "$tmp/x.png"
expect_error "$tmp/m.jsonl" "$tmp/m.jsonl" -o "$tmp/m.jsonl/sub/x.png"
[ -e "$tmp/x.png" ] && fail "an output was written by a failing command"
# gnuplot missing from PATH (loom itself is called by its path).
mkdir -p "$tmp/emptybin"
PATH="$tmp/emptybin" "$LOOM" plot "$tmp/m.jsonl" -o "$tmp/x.png" >/dev/null 2>"$tmp/err"
rc=$?
[ "$rc" -eq 2 ] || fail "no gnuplot: exit $rc, expected 2"
[ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q '^loom plot: .*apt-get install gnuplot-nox' "$tmp/err" ||
    fail "no gnuplot: stderr: $(cat "$tmp/err")"
# gnuplot failing (a stand-in that fails, one that writes no image): exit 1, one line.
mkdir -p "$tmp/fakebin"
printf '#!/bin/sh\necho "gnuplot> plot x" >&2\necho "line 7: some error" >&2\nexit 1\n' >"$tmp/fakebin/gnuplot"
chmod +x "$tmp/fakebin/gnuplot"
PATH="$tmp/fakebin:$PATH" "$LOOM" plot "$tmp/m.jsonl" -o "$tmp/x.png" >/dev/null 2>"$tmp/err"
rc=$?
[ "$rc" -eq 1 ] || fail "failing gnuplot: exit $rc, expected 1"
[ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q '^loom plot: gnuplot failed (exit 1): line 7: some error' "$tmp/err" ||
    fail "failing gnuplot: stderr: $(cat "$tmp/err")"
printf '#!/bin/sh\ncat >/dev/null\n' >"$tmp/fakebin/gnuplot"
PATH="$tmp/fakebin:$PATH" "$LOOM" plot "$tmp/m.jsonl" -o "$tmp/x.png" >/dev/null 2>"$tmp/err"
rc=$?
[ "$rc" -eq 1 ] && grep -q '^loom plot: gnuplot exited without writing an image' "$tmp/err" ||
    fail "silent gnuplot: exit $rc, stderr: $(cat "$tmp/err")"
[ -e "$tmp/x.png" ] && fail "an output was written by a failing gnuplot"
# The temporary folder goes away, after success and after failure.
mkdir -p "$tmp/tmpdir"
TMPDIR="$tmp/tmpdir" "$LOOM" plot "$tmp/m.jsonl" -o "$tmp/t.png" 2>/dev/null || fail "TMPDIR run"
TMPDIR="$tmp/tmpdir" "$LOOM" plot "$tmp/bad.jsonl" -o "$tmp/t.png" 2>/dev/null
[ -z "$(ls -A "$tmp/tmpdir")" ] || fail "temporary files left: $(ls -A "$tmp/tmpdir")"

[ "$fails" -eq 0 ] && echo "test_plot.sh: all passed"
exit $((fails > 0))
