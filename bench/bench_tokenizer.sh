#!/usr/bin/env bash
# Encoding throughput of loom's GPT-2 tokenizer against the reference JavaScript encoder
# (npm gpt-3-encoder under node) on the King James Bible, one core each. loom's time is
# the best of 3 runs of `loom tokenizer encode` (file read, load of encoder.json/vocab.bpe
# and printing included); node's is the encode loop only (tests/tokenizer/node_encode.js).
# Last line: one JSON object.   usage: bench/bench_tokenizer.sh PATH_TO_LOOM
set -euo pipefail
LOOM=${1:?usage: bench_tokenizer.sh PATH_TO_LOOM}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${LOOM_TOKENIZER_DIR:-$ROOT/third_party/gpt2}
[ -f "$DIR/encoder.json" ] || { echo "bench_tokenizer: $DIR/encoder.json missing; run scripts/fetch_gpt2_tokenizer.sh" >&2; exit 2; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
bible 'gen1:1-rev22:21' > "$TMP/kjv.txt"
bytes=$(wc -c < "$TMP/kjv.txt")
best=
for _ in 1 2 3; do
  t0=$EPOCHREALTIME
  taskset -c 0 "$LOOM" tokenizer encode --tokenizer "$DIR" < "$TMP/kjv.txt" > "$TMP/ids"
  t1=$EPOCHREALTIME
  best=$(awk -v a="$t0" -v b="$t1" -v m="$best" 'BEGIN { s = b - a; print (m == "" || s < m) ? s : m }')
done
tokens=$(wc -w < "$TMP/ids")
node_json=$(taskset -c 0 /usr/bin/node "$ROOT/tests/tokenizer/node_encode.js" "$DIR" "$TMP/kjv.txt" --time)
/usr/bin/python3 - "$bytes" "$tokens" "$best" "$node_json" <<'PY'
import json, sys
nbytes, tokens, secs, node = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), json.loads(sys.argv[4])
loom = nbytes / 1e6 / secs
print(f"loom: {nbytes} bytes -> {tokens} tokens in {secs:.3f} s = {loom:.1f} MB/s")
print(f"node: {node['seconds']:.3f} s = {node['mb_per_s']:.2f} MB/s")
print(json.dumps({"bench": "tokenizer_gpt2_encode", "text": "kjv", "bytes": nbytes, "tokens": tokens,
                  "loom_seconds": round(secs, 4), "loom_mb_per_s": round(loom, 2),
                  "node_seconds": round(node["seconds"], 4), "node_mb_per_s": round(node["mb_per_s"], 2),
                  "speedup": round(loom / node["mb_per_s"], 1), "tokens_match": tokens == node["tokens"]}))
PY
