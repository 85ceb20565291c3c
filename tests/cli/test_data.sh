#!/usr/bin/env bash
# loom data bytes: shard sizes and contents, stdin input, and one-line errors (exit 2).
# Usage: test_data.sh PATH_TO_LOOM
set -u
LOOM=${1:?usage: test_data.sh PATH_TO_LOOM}
tmp=$(mktemp -d /tmp/loom_cli_data_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# Decimal token values of a shard's body (T = u2 or u4), one per line.
tokens() { tail -c +1025 "$1" | od -An -v -t"$2" | tr -s ' ' '\n' | grep -v '^$'; }
bytes() { od -An -v -tu1 "$1" | tr -s ' ' '\n' | grep -v '^$'; }
header() { head -c 12 "$1" | od -An -v -td4 | tr -s ' ' ' ' | sed 's/^ //'; }

# 1000 bytes, 1% val -> 990 train + 10 val tokens, in a directory that does not exist yet.
head -c 1000 /dev/urandom >"$tmp/in.bin"
out="$tmp/a/b/c"
"$LOOM" data bytes --input "$tmp/in.bin" --out "$out" 2>"$tmp/err" || fail "bytes: exit $?"
[ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "summary is not one line: $(cat "$tmp/err")"
[ "$(stat -c %s "$out/train_000000.bin")" -eq $((1024 + 2 * 990)) ] || fail "train size"
[ "$(stat -c %s "$out/val_000000.bin")" -eq $((1024 + 2 * 10)) ] || fail "val size"
[ "$(header "$out/train_000000.bin")" = "20240520 1 990" ] || fail "train header"
head -c 990 "$tmp/in.bin" >"$tmp/train_part"
tail -c 10 "$tmp/in.bin" >"$tmp/val_part"
diff <(tokens "$out/train_000000.bin" u2) <(bytes "$tmp/train_part") >/dev/null || fail "train tokens"
diff <(tokens "$out/val_000000.bin" u2) <(bytes "$tmp/val_part") >/dev/null || fail "val tokens"

# stdin, 4-byte tokens, no val file.
printf 'hello, loom' | "$LOOM" data bytes --input - --out "$tmp/s" --val-fraction 0 \
    --token-bytes 4 2>/dev/null || fail "stdin: exit $?"
[ "$(header "$tmp/s/train_000000.bin")" = "20240801 1 11" ] || fail "u32 header"
[ ! -e "$tmp/s/val_000000.bin" ] || fail "val file written with --val-fraction 0"
printf 'hello, loom' >"$tmp/hello"
diff <(tokens "$tmp/s/train_000000.bin" u4) <(bytes "$tmp/hello") >/dev/null || fail "u32 tokens"
ls "$tmp/s" | grep -q tmp && fail "temporary file left behind"

# Every bad invocation: exit 2 and exactly one line "loom data: ..." on stderr.
touch "$tmp/file"
expect_error() {
    "$LOOM" "$@" >/dev/null 2>"$tmp/err"
    local rc=$?
    [ "$rc" -eq 2 ] || fail "'$*': exit $rc, expected 2"
    [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q '^loom data: ' "$tmp/err" ||
        fail "'$*': stderr: $(cat "$tmp/err")"
}
expect_error data
expect_error data nosuch
expect_error data bytes --out "$tmp/x"
expect_error data bytes --input "$tmp/in.bin"
expect_error data bytes --input "$tmp/in.bin" --out "$tmp/x" --bogus
expect_error data bytes --input "$tmp/in.bin" --out
expect_error data bytes --input "$tmp/nosuch" --out "$tmp/x"
expect_error data bytes --input "$tmp/in.bin" --out "$tmp/file/sub"
expect_error data bytes --input "$tmp/in.bin" --out "$tmp/x" --val-fraction 1.5
expect_error data bytes --input "$tmp/in.bin" --out "$tmp/x" --val-fraction abc
expect_error data bytes --input "$tmp/in.bin" --out "$tmp/x" --token-bytes 3
expect_error data bytes --input "$tmp/file" --out "$tmp/x"

[ "$fails" -eq 0 ] && echo "test_data.sh: all passed"
exit $((fails > 0))
