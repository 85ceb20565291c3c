#!/usr/bin/env bash
# loom's GPT-2 tokenizer against the reference JavaScript encoder (npm gpt-3-encoder,
# run by node): identical token streams on the King James Bible, a hand-written UTF-8
# stress text and random multi-script text, and decode(encode(x)) == x byte for byte.
# Needs the files of scripts/fetch_gpt2_tokenizer.sh (in $LOOM_TOKENIZER_DIR or
# third_party/gpt2); exits 77 (skipped) when they, node or the bible are missing.
#   usage: test_vs_node.sh PATH_TO_LOOM
set -u
LOOM=${1:?usage: test_vs_node.sh PATH_TO_LOOM}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
DIR=${LOOM_TOKENIZER_DIR:-$ROOT/third_party/gpt2}
NODE=${NODE:-/usr/bin/node}
SEED=${LOOM_TEST_SEED:-$(( $(date +%s) % 100000 ))}
for need in "$DIR/encoder.json" "$DIR/vocab.bpe" "$DIR/Encoder.js"; do
  [ -f "$need" ] || { echo "SKIP: $need missing (run scripts/fetch_gpt2_tokenizer.sh)"; exit 77; }
done
[ -x "$NODE" ] || { echo "SKIP: node not found at $NODE"; exit 77; }
command -v bible >/dev/null || { echo "SKIP: 'bible' missing (apt-get install bible-kjv)"; exit 77; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
bible 'gen1:1-rev22:21' > "$TMP/kjv.txt"
cp "$HERE/stress.txt" "$TMP/stress.txt"
/usr/bin/python3 "$HERE/random_text.py" "$SEED" 300000 "$TMP/random.txt"
echo "random text seed $SEED (LOOM_TEST_SEED overrides)"
fail=0
for name in kjv stress random; do
  f=$TMP/$name.txt
  "$LOOM" tokenizer encode --tokenizer "$DIR" < "$f" > "$TMP/$name.loom" ||
    { echo "FAIL: $name: loom encode exited $?"; fail=1; continue; }
  "$NODE" "$HERE/node_encode.js" "$DIR" "$f" > "$TMP/$name.node" ||
    { echo "FAIL: $name: node encode exited $?"; fail=1; continue; }
  n=$(wc -w < "$TMP/$name.loom")
  if ! cmp -s "$TMP/$name.loom" "$TMP/$name.node"; then
    first=$(cmp <(tr ' ' '\n' < "$TMP/$name.loom") <(tr ' ' '\n' < "$TMP/$name.node") | head -1)
    echo "FAIL: $name: token streams differ ($first)"
    fail=1
    continue
  fi
  "$LOOM" tokenizer decode --tokenizer "$DIR" < "$TMP/$name.loom" > "$TMP/$name.back" ||
    { echo "FAIL: $name: loom decode exited $?"; fail=1; continue; }
  if ! cmp -s "$TMP/$name.back" "$f"; then
    echo "FAIL: $name: decode(encode(x)) != x ($(cmp "$TMP/$name.back" "$f" | head -1))"
    fail=1
    continue
  fi
  echo "ok: $name: $(wc -c < "$f") bytes, $n tokens identical to node, round trip exact"
done
# Invalid UTF-8 (node cannot take it): loom must still encode it and round-trip it.
head -c 200000 /dev/urandom > "$TMP/bytes.bin"
cat "$TMP/stress.txt" "$TMP/bytes.bin" "$TMP/kjv.txt" | head -c 600000 > "$TMP/mixed.bin"
for f in "$TMP/bytes.bin" "$TMP/mixed.bin"; do
  if "$LOOM" tokenizer encode --tokenizer "$DIR" < "$f" > "$TMP/ids" &&
     "$LOOM" tokenizer decode --tokenizer "$DIR" < "$TMP/ids" | cmp -s - "$f"; then
    echo "ok: $(basename "$f"): invalid UTF-8 encodes and round-trips ($(wc -w < "$TMP/ids") tokens)"
  else
    echo "FAIL: $(basename "$f"): invalid UTF-8 did not round-trip"
    fail=1
  fi
done
[ $fail -eq 0 ] && echo "PASS: loom matches the node encoder" || echo "FAILED"
exit $fail
