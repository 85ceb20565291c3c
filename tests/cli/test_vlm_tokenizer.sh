#!/usr/bin/env bash
# loom data vlm --tokenizer DIR and loom generate --image --tokenizer DIR: a vlm's text in a
# BPE (data/vlm_text.h). The BPE shards hold the byte-level shards' samples exactly: their
# text tokens decode (through encoder.json, in Python) to the same bytes, the loss mask
# covers the same bytes, the images and the <image> markers' places are the same, and the
# header names <image> V and <|endoftext|> V - 1 of a V-token tokenizer; every sample ends
# with <|endoftext|>, the longest ones (8 grids of 3 x 3) too, never cut; the shards train,
# generation with the KV cache writes the text the whole-sequence forward writes, and bad
# tokenizers are one line, exit 2.
# Usage: test_vlm_tokenizer.sh PATH_TO_LOOM
set -u
LOOM=${1:?usage: test_vlm_tokenizer.sh PATH_TO_LOOM}
source "$(dirname "$0")/check_lib.sh" # $TMP, check, expect, finish

SEED=$((RANDOM * 32768 + RANDOM))
echo "random captions, PNGs and data: seed $SEED"
# a BPE trained on caption-like text (its merges cover the captions' words), and a folder
# of the user's own pairs: random 56 x 56 PNGs with a caption or a prompt line and answer
/usr/bin/python3 - "$TMP" "$SEED" <<'PY'
import os, random, struct, sys, zlib
d, rng = sys.argv[1], random.Random(int(sys.argv[2]))
names = ["t-shirt/top", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker",
         "bag", "ankle boot"]
where = ["top left", "top right", "bottom left", "bottom right"]
with open(f"{d}/corpus.txt", "w") as f:
    for _ in range(2000):
        f.write("; ".join(f"{p}: {rng.choice(names)}" for p in where) + "\n")
        f.write(f"how many {rng.choice(names)}s?\n{rng.randrange(5)}\n")
def png(path, h, w):
    raw = b"".join(b"\x00" + bytes(rng.randrange(256) for _ in range(w)) for _ in range(h))
    ch = lambda k, b: struct.pack(">I", len(b)) + k + b + struct.pack(">I", zlib.crc32(k + b))
    open(path, "wb").write(b"\x89PNG\r\n\x1a\n" + ch(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
                           + ch(b"IDAT", zlib.compress(raw)) + ch(b"IEND", b""))
os.makedirs(f"{d}/pairs")
for i in range(4):
    png(f"{d}/pairs/{i}.png", 56, 56)
    text = "; ".join(f"{p}: {rng.choice(names)}" for p in where)
    open(f"{d}/pairs/{i}.txt", "w").write(text if i % 2 else f"what is it?\n{text}\n")
PY
check "tokenizer train" "$LOOM" tokenizer train --input "$TMP/corpus.txt" --vocab-size 320 \
    --out "$TMP/tok"
D=(data vlm --input fashion-mnist --samples 40 --val-samples 8 --questions 0.5 --seed "$SEED")
check "data vlm in bytes" "$LOOM" "${D[@]}" --out "$TMP/bytes"
check "data vlm --tokenizer" "$LOOM" "${D[@]}" --out "$TMP/bpe" --tokenizer "$TMP/tok"
check "data vlm: a folder in bytes" "$LOOM" data vlm --input "$TMP/pairs" --out "$TMP/fbytes" \
    --val-samples 1
check "data vlm: a folder --tokenizer" "$LOOM" data vlm --input "$TMP/pairs" --out "$TMP/fbpe" \
    --val-samples 1 --tokenizer "$TMP/tok"

same_samples() { # BYTES_SHARD BPE_SHARD: the same samples in the two vocabularies
    /usr/bin/python3 - "$TMP/tok/encoder.json" "$1" "$2" <<'PY'
import json, struct, sys
def byte_of():  # GPT-2's bytes_to_unicode, inverted: the character -> the byte
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    return {chr(c): b for b, c in zip(bs, cs)}
spell = byte_of()
enc = json.load(open(sys.argv[1]))
V = len(enc)
tok_bytes = {i: bytes(spell[c] for c in s) for s, i in enc.items()}
def shard(path):
    b = open(path, "rb").read()
    h = struct.unpack("<256i", b[:1024])
    n, nt = h[2], h[9]
    ent = struct.unpack(f"<{4 * n}i", b[1024:1024 + 16 * n])
    o = 1024 + 16 * n
    toks = struct.unpack(f"<{nt}i", b[o:o + 4 * nt])
    mask = b[o + 4 * nt:o + 5 * nt]
    samples = [(toks[ent[4 * s]:ent[4 * s] + ent[4 * s + 1]], mask[ent[4 * s]:ent[4 * s] + ent[4 * s + 1]])
               for s in range(n)]
    return h, samples, b[o + 5 * nt:]
def spans(sample, image, eot, decode):  # [(kind, bytes, mask bytes)] between markers
    out = []
    for t, m in zip(*sample):
        if t in (image, eot):
            out.append(("image" if t == image else "eot", b"", bytes([m])))
        else:
            piece = decode(t)
            if not out or out[-1][0] != "text":
                out.append(("text", b"", b""))
            k, text, ms = out[-1]
            out[-1] = (k, text + piece, ms + bytes([m]) * len(piece))
    return out
hb, sb, pb = shard(sys.argv[2])
ht, st, pt = shard(sys.argv[3])
bad = []
if (hb[6], hb[7], hb[8]) != (256, 257, 258): bad.append(f"bytes header ids {hb[6:9]}")
cut = [i for i, x in enumerate(sb) if x[0][-1] != 257] + [i for i, x in enumerate(st) if x[0][-1] != V - 1]
if cut: bad.append(f"samples {cut[:5]} do not end with <|endoftext|> (a text cut short)")
if (ht[6], ht[7], ht[8]) != (V, V - 1, V + 1):
    bad.append(f"BPE header ids {ht[6:9]} (expected <image> {V}, eot {V - 1}, vocab {V + 1})")
if pb != pt: bad.append("images differ")
if len(sb) != len(st): bad.append(f"{len(sb)} and {len(st)} samples")
for i, (b, t) in enumerate(zip(sb, st)):
    want = spans(b, 256, 257, lambda x: bytes([x]))
    got = spans(t, V, V - 1, lambda x: tok_bytes[x])
    if got != want:
        bad.append(f"sample {i}: {got} against {want}")
        break
nb, nt = sum(len(s[0]) for s in sb), sum(len(s[0]) for s in st)
if not nt < nb: bad.append(f"{nt} BPE tokens against {nb} bytes (no merge used)")
print(f"{len(st)} samples, {nb} byte tokens, {nt} BPE tokens; " + ("; ".join(bad) or "same"))
sys.exit(1 if bad else 0)
PY
}
# the longest samples loom data vlm writes: up to 8 grids of 3 x 3, each with its caption
M=(data vlm --input fashion-mnist --grid 3 --mixed-images 8 --samples 30 --val-samples 0 --seed "$SEED")
check "data vlm: 8 mixed 3 x 3 grids in bytes" "$LOOM" "${M[@]}" --out "$TMP/mbytes"
check "data vlm: 8 mixed 3 x 3 grids --tokenizer" "$LOOM" "${M[@]}" --out "$TMP/mbpe" \
    --tokenizer "$TMP/tok"
check "8 mixed 3 x 3 grids: whole texts, same samples" same_samples \
    "$TMP/mbytes/train_000000.bin" "$TMP/mbpe/train_000000.bin"
check "train split: same samples" same_samples "$TMP/bytes/train_000000.bin" "$TMP/bpe/train_000000.bin"
check "val split: same samples" same_samples "$TMP/bytes/val_000000.bin" "$TMP/bpe/val_000000.bin"
check "a folder: same samples" same_samples "$TMP/fbytes/train_000000.bin" "$TMP/fbpe/train_000000.bin"

# a vlm on the BPE shards: <image> is 320, so --vocab-size 321 (and more: padding ids).
# 60 steps: after 30, some seeds' model (599191089, 83928603) still put end-of-text first
# for every image, and the texts below were all empty
BASE=(train --family vlm --n-layer 1 --n-head 2 --n-kv-head 1 --d-model 32 --d-ff 64
      --vit-layers 1 --vit-d-model 16 --vit-n-head 2 --vit-d-ff 32 --vit-patch 7 --height 56
      --width 56 --channels 1 --seq-len 192 --micro-batch 4 --global-batch 4 --steps 60
      --lr 1e-2 --threads 1 --seed "$SEED" --data "$TMP/bpe/train_*.bin")
trains() { "$LOOM" "${BASE[@]}" "$@" >"$TMP/log" 2>&1 || { tail -3 "$TMP/log"; return 1; }; }
check "BPE shards train" trains --vocab-size 328 --save-weights "$TMP/w.safetensors"
expect "BPE shards, a byte model's vocabulary" "the model's --vocab-size is 264" -- \
    "${BASE[@]}" --vocab-size 264
GEN=(generate --weights "$TMP/w.safetensors" --tokenizer "$TMP/tok" --temperature 0)
same_text() { # ARGS...: cached and uncached outputs equal; the texts kept in $TMP/texts
    "$LOOM" "${GEN[@]}" "$@" >"$TMP/kv" 2>"$TMP/log" &&
        "$LOOM" "${GEN[@]}" "$@" --no-kv-cache >"$TMP/nokv" 2>>"$TMP/log" &&
        cmp -s "$TMP/kv" "$TMP/nokv" && awk -F'\t' '{print $NF}' "$TMP/kv" >>"$TMP/texts" ||
        { echo "cached: '$(cat "$TMP/kv")' uncached: '$(cat "$TMP/nokv")' $(cat "$TMP/log")"; return 1; }
}
check "generate --tokenizer: KV cache = whole sequence" same_text --image "$TMP/pairs"
check "generate --tokenizer: KV cache = whole sequence, prompt" same_text \
    --image "$TMP/pairs/0.png" --prompt "how many bags?"
bytes_named() { # --tokenizer bytes is the default's byte vocabulary
    "$LOOM" generate --weights "$TMP/bytes.safetensors" --image "$TMP/pairs" >"$TMP/b1" 2>/dev/null &&
        "$LOOM" generate --weights "$TMP/bytes.safetensors" --image "$TMP/pairs" \
            --tokenizer bytes >"$TMP/b2" 2>/dev/null && cmp -s "$TMP/b1" "$TMP/b2"
}
check "generate --tokenizer: not every text empty" test -n "$(tr -d '\n' <"$TMP/texts")"
echo "texts: $(head -c 300 "$TMP/texts" | tr '\n' '|')"
# bad tokenizers
cp -r "$TMP/tok" "$TMP/noeot"
/usr/bin/python3 - "$TMP/noeot/encoder.json" <<'PY'
import json, sys
e = json.load(open(sys.argv[1]))
e["<|other|>"] = e.pop("<|endoftext|>")
json.dump(e, open(sys.argv[1], "w"))
PY
expect "data vlm: a tokenizer without <|endoftext|> last" \
    "--tokenizer $TMP/noeot: the last token (id 319) is not <|endoftext|>" -- \
    data vlm --input fashion-mnist --samples 4 --val-samples 0 --out "$TMP/x" --tokenizer "$TMP/noeot"
expect "data vlm: no tokenizer there" "--tokenizer $TMP/none" -- \
    data vlm --input fashion-mnist --samples 4 --val-samples 0 --out "$TMP/x" --tokenizer "$TMP/none"
check "byte shards train" trains --vocab-size 264 --data "$TMP/bytes/train_*.bin" --steps 1 \
    --save-weights "$TMP/bytes.safetensors"
check "generate --tokenizer bytes = without it" bytes_named
expect "generate: a tokenizer larger than the model's vocabulary" \
    "--tokenizer $TMP/tok: its tokens and <image> need a vocabulary of 321, $TMP/bytes.safetensors has one of 264" -- \
    generate --weights "$TMP/bytes.safetensors" --image "$TMP/pairs/0.png" --tokenizer "$TMP/tok"
finish test_vlm_tokenizer
