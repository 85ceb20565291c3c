#!/usr/bin/env bash
# loom data prepare, end to end on the King James Bible with the GPT-2 tokenizer: shards
# decode back to the input, the val split follows the documented rule, the summary is
# printed, memory does not grow with the input, and bad input is one line + exit 2.
# Usage: test_data_prepare.sh PATH_TO_LOOM   (exit 77 = skipped: no GPT-2 files or `bible`)
set -u
LOOM=${1:?usage: test_data_prepare.sh PATH_TO_LOOM}
root=$(cd "$(dirname "$0")/../.." && pwd)
gpt2="$root/third_party/gpt2"
if [ ! -f "$gpt2/encoder.json" ] || [ ! -f "$gpt2/vocab.bpe" ]; then
    echo "SKIP: $gpt2 has no encoder.json/vocab.bpe (run scripts/fetch_gpt2_tokenizer.sh)"
    exit 77
fi
if ! command -v bible >/dev/null; then
    echo "SKIP: the 'bible' command (King James Bible text) is not installed"
    exit 77
fi
export LOOM_TOKENIZER_DIR="$gpt2"
tmp=$(mktemp -d /tmp/loom_cli_prepare_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# Token ids of shards (uint16 body after the 1024-byte header), one per line.
tokens() { for f in "$@"; do tail -c +1025 "$f" | od -An -v -tu2; done | tr -s ' ' '\n' | grep -v '^$'; }
decode() { tokens "$@" | "$LOOM" tokenizer decode --tokenizer gpt2; }
header() { head -c 12 "$1" | od -An -v -td4 | tr -s ' ' ' ' | sed 's/^ //'; }

bible 'gen1:1-rev22:21' >"$tmp/bible.txt"
[ -s "$tmp/bible.txt" ] || { echo "SKIP: bible printed nothing" && exit 77; }
EOT='<|endoftext|>'

# 1. File documents from a glob: the Bible in ~50 parts, every 10th part to val.
mkdir "$tmp/parts"
split -l 2000 -d -a 3 "$tmp/bible.txt" "$tmp/parts/part_"
out="$tmp/o1"
"$LOOM" data prepare --input "$tmp/parts/part_*" --tokenizer gpt2 --out "$out" \
    --val-fraction 0.1 --shard-tokens 200000 2>"$tmp/err1" || fail "parts: exit $?"
cat "$tmp/err1"
grep -q '^loom data: .* documents (.* train, .* val) from .* file(s)' "$tmp/err1" || fail "summary"
grep -q "^loom data: train: .* tokens in .* shards: $out/train_000000.bin" "$tmp/err1" ||
    fail "summary: train paths"
grep -q "^loom data: val: .* tokens in 1 shard: $out/val_000000.bin" "$tmp/err1" ||
    fail "summary: val path"
k=0
: >"$tmp/want_train"
: >"$tmp/want_val"
for f in "$tmp"/parts/part_*; do
    k=$((k + 1))
    if [ $((k % 10)) -eq 0 ]; then dst="$tmp/want_val"; else dst="$tmp/want_train"; fi
    printf '%s' "$EOT" >>"$dst"
    cat "$f" >>"$dst"
done
decode "$out"/train_*.bin >"$tmp/got_train"
decode "$out"/val_*.bin >"$tmp/got_val"
cmp -s "$tmp/got_train" "$tmp/want_train" || fail "train shards do not decode to the train parts"
cmp -s "$tmp/got_val" "$tmp/want_val" || fail "val shards do not decode to every 10th part"
for f in "$out"/*.bin; do
    n=$(header "$f" | cut -d' ' -f3)
    [ "$(header "$f" | cut -d' ' -f1,2)" = "20240520 1" ] || fail "$f: header $(header "$f")"
    [ "$n" -le 200000 ] || fail "$f: $n tokens > --shard-tokens 200000"
    [ "$(stat -c %s "$f")" -eq $((1024 + 2 * n)) ] || fail "$f: size does not match its header"
done
ls "$out" | grep -q tmp && fail "temporary file left behind"

# 2. One document (the whole file, read in 1 MiB chunks): the very tokens of a one-shot encode.
"$LOOM" data prepare --input "$tmp/bible.txt" --tokenizer gpt2 --out "$tmp/o2" \
    --val-fraction 0 2>"$tmp/err2" || fail "whole: exit $?"
grep -q '^loom data: .*MB/s' "$tmp/err2" || fail "no throughput in the summary: $(cat "$tmp/err2")"
head -1 "$tmp/err2"
{ echo 50256 && "$LOOM" tokenizer encode --tokenizer gpt2 <"$tmp/bible.txt" | tr ' ' '\n'; } |
    grep -v '^$' >"$tmp/want_ids"
tokens "$tmp/o2"/train_*.bin | cmp -s - "$tmp/want_ids" || fail "chunked encode != one-shot encode"
[ ! -e "$tmp/o2/val_000000.bin" ] || fail "val shard written with --val-fraction 0"

# 3. Blank-line documents (chapters and headings), stdin; EOT before each paragraph.
"$LOOM" data prepare --input - --tokenizer gpt2 --out "$tmp/o3" --val-fraction 0 \
    --doc-separator blank-line <"$tmp/bible.txt" 2>"$tmp/err3" || fail "blank-line: exit $?"
awk -v eot="$EOT" 'BEGIN { RS = ""; ORS = "" } { print eot $0 }' "$tmp/bible.txt" >"$tmp/want3"
decode "$tmp/o3"/train_*.bin | cmp -s - "$tmp/want3" || fail "blank-line documents"
paras=$(awk 'BEGIN { RS = "" } END { print NR }' "$tmp/bible.txt")
grep -q "^loom data: $paras documents" "$tmp/err3" || fail "expected $paras documents: $(head -1 "$tmp/err3")"

# 4. Invalid UTF-8 still encodes (byte-level) and round-trips.
printf 'ok \xff\xfe caf\xc3 \xe6\x97 end' >"$tmp/bad_utf8"
"$LOOM" data prepare --input "$tmp/bad_utf8" --tokenizer gpt2 --out "$tmp/o4" --val-fraction 0 \
    2>/dev/null || fail "invalid UTF-8: exit $?"
{ printf '%s' "$EOT" && cat "$tmp/bad_utf8"; } >"$tmp/want4"
decode "$tmp/o4"/train_000000.bin | cmp -s - "$tmp/want4" || fail "invalid UTF-8 round trip"

# 5. Bounded memory: max RSS with 4x the input is that of 1x (10000-token shards).
for i in 1 2 3 4; do cat "$tmp/bible.txt"; done >"$tmp/bible4.txt"
if [ -x /usr/bin/time ]; then
    for n in 1 4; do
        in="$tmp/bible.txt"
        [ "$n" -eq 4 ] && in="$tmp/bible4.txt"
        /usr/bin/time -o "$tmp/rss$n" -f %M "$LOOM" data prepare --input "$in" --tokenizer gpt2 \
            --out "$tmp/m$n" --shard-tokens 10000 --doc-separator blank-line 2>/dev/null ||
            fail "memory run ${n}x: exit $?"
    done
    rss1=$(tail -1 "$tmp/rss1") rss4=$(tail -1 "$tmp/rss4")
    echo "max RSS: ${rss1} KB for 1x, ${rss4} KB for 4x the Bible (10000-token shards)"
    [ "$rss4" -le $((rss1 + rss1 / 4 + 2048)) ] || fail "max RSS grew with the input: $rss1 -> $rss4 KB"
    n4=$(ls "$tmp/m4" | wc -l)
    [ "$n4" -gt 400 ] || fail "4x: only $n4 shards of 10000 tokens"
    for f in "$tmp/m4"/train_000000.bin "$tmp/m4"/val_000000.bin; do
        [ "$(header "$f" | cut -d' ' -f3)" -eq 10000 ] || fail "$f: not a full 10000-token shard"
    done
else
    echo "note: /usr/bin/time missing, bounded-memory check skipped"
fi

# 6. Bad input: exit 2 and exactly one line "loom data: ..." on stderr.
expect_error() {
    "$LOOM" "$@" >/dev/null 2>"$tmp/err"
    local rc=$?
    [ "$rc" -eq 2 ] || fail "'$*': exit $rc, expected 2"
    [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q '^loom data: ' "$tmp/err" ||
        fail "'$*': stderr: $(cat "$tmp/err")"
}
touch "$tmp/empty"
printf '\n\n\r\n' >"$tmp/blank"
mkdir -p "$tmp/badtok"
echo '{"a": 0,' >"$tmp/badtok/encoder.json"
echo '#version: 0.2' >"$tmp/badtok/vocab.bpe"
ok=(--tokenizer gpt2 --out "$tmp/x")
expect_error data prepare --input "$tmp/nosuch_*.txt" "${ok[@]}"
expect_error data prepare --input "$tmp/nosuch.txt" "${ok[@]}"
expect_error data prepare --input "$tmp/parts" "${ok[@]}"
expect_error data prepare --input "$tmp/empty" "${ok[@]}"
expect_error data prepare --input "$tmp/blank" "${ok[@]}" --doc-separator blank-line
expect_error data prepare --input - "${ok[@]}" </dev/null
expect_error data prepare --input "$tmp/bad_utf8" "${ok[@]}" --val-fraction 1
expect_error data prepare --input "$tmp/bad_utf8" "${ok[@]}" --val-fraction -0.5
expect_error data prepare --input "$tmp/bad_utf8" "${ok[@]}" --val-fraction abc
expect_error data prepare --input "$tmp/bad_utf8" "${ok[@]}" --shard-tokens 0
expect_error data prepare --input "$tmp/bad_utf8" "${ok[@]}" --shard-tokens 12x
expect_error data prepare --input "$tmp/bad_utf8" "${ok[@]}" --shard-tokens 3000000000
expect_error data prepare --input "$tmp/bad_utf8" "${ok[@]}" --doc-separator page
expect_error data prepare --input "$tmp/bad_utf8" --tokenizer "$tmp/nosuch_tok" --out "$tmp/x"
expect_error data prepare --input "$tmp/bad_utf8" --tokenizer "$tmp/badtok" --out "$tmp/x"
expect_error data prepare --input "$tmp/bad_utf8" --tokenizer gpt2 --out "$tmp/empty/sub"
expect_error data prepare --tokenizer gpt2 --out "$tmp/x"
expect_error data prepare --input "$tmp/bad_utf8" --out "$tmp/x"
expect_error data prepare --input "$tmp/bad_utf8" --tokenizer gpt2
expect_error data prepare --input "$tmp/bad_utf8" "${ok[@]}" --bogus
expect_error data prepare --input "$tmp/bad_utf8" "${ok[@]}" extra
expect_error data prepare --input
if [ "$(id -u)" -ne 0 ]; then # root reads files whatever their mode
    cp "$tmp/bad_utf8" "$tmp/unreadable" && chmod 000 "$tmp/unreadable"
    expect_error data prepare --input "$tmp/unreadable" "${ok[@]}"
fi

[ "$fails" -eq 0 ] && echo "test_data_prepare.sh: all passed"
exit $((fails > 0))
