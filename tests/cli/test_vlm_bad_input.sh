#!/usr/bin/env bash
# Bad input to the multimodal LLM (loom train --family vlm, loom data vlm): one clear error
# line naming the flag or file and what was expected, exit code 2, never a crash; and one
# good shard that trains a step.
# Usage: test_vlm_bad_input.sh PATH_TO_LOOM
set -u
LOOM=${1:?usage: test_vlm_bad_input.sh PATH_TO_LOOM}
source "$(dirname "$0")/check_lib.sh" # $TMP, expect, finish

# vlm shards written here in the docs/vlm.md format: 8 x 8 gray images.
/usr/bin/python3 - "$TMP" <<'PY'
import os, struct, sys, random
d = sys.argv[1]
rng = random.Random(3)
def shard(path, samples, h=8, w=8, magic=20261205, cut=0, header_images=None):
    toks = [t for s in samples for t in s[0]]
    n_img = sum(s[1] for s in samples)
    head = struct.pack("<256i", magic, 1, len(samples), 1, h, w, 256, 257, 258, len(toks),
                       n_img if header_images is None else header_images, *([0] * 245))
    ent, t0, i0 = [], 0, 0
    for s in samples:
        ent += [t0, len(s[0]), i0, s[1]]
        t0 += len(s[0]); i0 += s[1]
    body = struct.pack(f"<{len(ent)}i", *ent) + struct.pack(f"<{len(toks)}i", *toks)
    body += bytes(1 if t < 256 else 0 for t in toks) + bytes(rng.randrange(256) for _ in range(n_img * h * w))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = head + body
    open(path, "wb").write(data[:len(data) - cut] if cut else data)
good = [([256] + [rng.randrange(97, 123) for _ in range(6)] + [257], 1) for _ in range(6)]
shard(f"{d}/ok/train_000000.bin", good)
shard(f"{d}/big/train_000000.bin", good, h=16, w=16)
shard(f"{d}/magic/train_000000.bin", good, magic=20261202)
shard(f"{d}/cut/train_000000.bin", good, cut=10)
shard(f"{d}/nomarker/train_000000.bin", good + [([97, 98, 257], 1)], header_images=7)
shard(f"{d}/long/train_000000.bin", good + [([256] + [97] * 40 + [257], 1)])
PY
BASE=(train --family vlm --n-layer 1 --n-head 2 --n-kv-head 1 --d-model 16 --d-ff 24
      --vit-layers 1 --vit-d-model 8 --vit-n-head 2 --vit-d-ff 16 --vit-patch 4 --height 8
      --width 8 --channels 1 --seq-len 16 --micro-batch 2 --global-batch 2 --steps 1
      --threads 1)

trains() { "$LOOM" "${BASE[@]}" --data "$TMP/ok/train_*.bin" "$@" >"$TMP/log" 2>&1; }
check "good shard trains" trains
check "good shard trains with --freeze vision,llm" trains --freeze vision,llm
expect "image size differs" "images are 1 x 16 x 16 (channels x height x width), the model expects 1 x 8 x 8" -- \
    "${BASE[@]}" --data "$TMP/big/train_*.bin"
expect "bad magic" "$TMP/magic/train_000000.bin: bad magic 20261202" -- \
    "${BASE[@]}" --data "$TMP/magic/train_*.bin"
expect "truncated shard" "$TMP/cut/train_000000.bin: truncated" -- \
    "${BASE[@]}" --data "$TMP/cut/train_*.bin"
expect "image without marker" "0 <image> markers and 1 images" -- \
    "${BASE[@]}" --data "$TMP/nomarker/train_*.bin"
expect "sample too long" "does not fit --seq-len 16" -- "${BASE[@]}" --data "$TMP/long/train_*.bin"
expect "no shard" "--data" -- "${BASE[@]}" --data "$TMP/none/train_*.bin"
expect "freeze everything" "--freeze 'vision,projector,llm': every part frozen" -- \
    "${BASE[@]}" --data "$TMP/ok/train_*.bin" --freeze vision,projector,llm
expect "freeze unknown part" "--freeze 'vision,eyes': unknown part 'eyes'" -- \
    "${BASE[@]}" --data "$TMP/ok/train_*.bin" --freeze vision,eyes
expect "freeze on a language model" "--freeze: only the vlm family" -- \
    train --model llama-tiny --data "$TMP/ok/train_*.bin" --freeze vision
expect "balance-dp on a language model" "--balance-dp: balances image-text samples by their images (expected --family vlm, not llama)" -- \
    train --model llama-tiny --data "$TMP/ok/train_*.bin" --balance-dp
expect "vision-schedule bubbles without --pp" "--vision-schedule bubbles: needs --pp >= 2 (pipeline stages to fill)" -- \
    "${BASE[@]}" --data "$TMP/ok/train_*.bin" --vision-schedule bubbles
expect "vision-schedule bubbles on a language model" "--vision-schedule bubbles: needs --family vlm" -- \
    train --model llama-tiny --data "$TMP/ok/train_*.bin" --pp 2 --vision-schedule bubbles
expect "vision-schedule unknown" "--vision-schedule 'late': expected first or bubbles" -- \
    "${BASE[@]}" --data "$TMP/ok/train_*.bin" --vision-schedule late
expect "data vlm mixed with questions" "--questions: for one-image samples (expected no --questions with --mixed-images)" -- \
    data vlm --input fashion-mnist --out "$TMP/d" --mixed-images 2 --questions 0.5
expect "vit patch" "--vit-patch 3: must divide the image size 8 x 8" -- \
    "${BASE[@]}" --data "$TMP/ok/train_*.bin" --vit-patch 3
expect "vit width" "--vit-d-model 6: must be a multiple of 4" -- \
    "${BASE[@]}" --data "$TMP/ok/train_*.bin" --vit-d-model 6
expect "data vlm input" "--input 'mnist': expected fashion-mnist" -- \
    data vlm --input mnist --out "$TMP/d"
expect "data vlm grid" "--grid '4': expected an integer from 2 to 3" -- \
    data vlm --input fashion-mnist --out "$TMP/d" --grid 4
# --init-from a file with only some parts: those load, the others keep their initialisation
trains --save-weights "$TMP/w.safetensors"
/usr/bin/python3 - "$TMP" "$(dirname "$0")/../reference" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
import safetensors_io as st
w = st.load(f"{sys.argv[1]}/w.safetensors")
st.save(f"{sys.argv[1]}/llm.safetensors", {k: v for k, v in w.items() if k.startswith(("model.", "lm_head"))})
st.save(f"{sys.argv[1]}/none.safetensors", {"other.weight": w["lm_head.weight"]})
PY
check "--init-from the decoder only" trains --init-from "$TMP/llm.safetensors"
check "--init-from says what it kept" grep -q "kept from initialisation: vision projector" "$TMP/log"
expect "--init-from without a vlm part" "holds no part of a vlm" -- \
    "${BASE[@]}" --data "$TMP/ok/train_*.bin" --init-from "$TMP/none.safetensors"
# loom generate --image: the KV cache writes the text the whole-sequence forward writes
# (greedy), for one PNG, with a prompt, and for a folder of PNGs (one line each, --sheet).
# The model has trained one step, so a text may be empty (its first token ends it): each
# pair must be equal, and not all of them empty (else the comparison said nothing).
PNG_SEED=$((RANDOM * 32768 + RANDOM))
echo "random PNGs: seed $PNG_SEED"
/usr/bin/python3 - "$TMP" "$PNG_SEED" <<'PY'
import os, random, struct, sys, zlib
d, rng = sys.argv[1], random.Random(int(sys.argv[2]))
def png(path, h, w):
    raw = b"".join(b"\x00" + bytes(rng.randrange(256) for _ in range(w)) for _ in range(h))
    ch = lambda k, b: struct.pack(">I", len(b)) + k + b + struct.pack(">I", zlib.crc32(k + b))
    open(path, "wb").write(b"\x89PNG\r\n\x1a\n" + ch(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
                           + ch(b"IDAT", zlib.compress(raw)) + ch(b"IEND", b""))
os.makedirs(f"{d}/pngs"); os.makedirs(f"{d}/nopngs")
for i in range(3): png(f"{d}/pngs/{i}.png", 8, 8)
png(f"{d}/big.png", 16, 16)
PY
GEN=(generate --weights "$TMP/w.safetensors" --temperature 0)
same_text() { # ARGS...: cached and uncached outputs equal; the texts kept in $TMP/texts
    "$LOOM" "${GEN[@]}" "$@" >"$TMP/kv" 2>"$TMP/log" &&
        "$LOOM" "${GEN[@]}" "$@" --no-kv-cache >"$TMP/nokv" 2>>"$TMP/log" &&
        cmp -s "$TMP/kv" "$TMP/nokv" && awk -F'\t' '{print $NF}' "$TMP/kv" >>"$TMP/texts" ||
        { echo "cached: '$(cat "$TMP/kv")' uncached: '$(cat "$TMP/nokv")'"; return 1; }
}
check "generate: KV cache = whole sequence" same_text --image "$TMP/pngs/0.png"
check "generate: KV cache = whole sequence, prompt" same_text --image "$TMP/pngs/1.png" --prompt ab
check "generate: a folder, KV cache = whole sequence" same_text --image "$TMP/pngs" \
    --sheet "$TMP/sheet.png"
check "generate: not every text empty" test -n "$(tr -d '\n' <"$TMP/texts")"
check "generate: a folder's lines" test "$(cut -f1 "$TMP/kv" | tr '\n' ' ')" = "0.png 1.png 2.png "
check "generate: a folder's line = the file's text" \
    test "$(sed -n 3p "$TMP/kv" | cut -f2-)" = "$("$LOOM" "${GEN[@]}" --image "$TMP/pngs/2.png")"
check "generate --sheet writes a PNG" test "$(head -c 4 "$TMP/sheet.png" | tail -c 3)" = PNG
expect "generate: a folder without PNGs" "--image $TMP/nopngs: a folder without .png files" -- \
    "${GEN[@]}" --image "$TMP/nopngs"
expect "generate: image size" "--image $TMP/big.png: 16 x 16 pixels, the model reads 8 x 8" -- \
    "${GEN[@]}" --image "$TMP/big.png"
# loom data vlm --input DIR: NAME.png with NAME.txt beside each; the shards train
printf 'ab\n' >"$TMP/pngs/0.txt"
printf 'what?\ncd\n' >"$TMP/pngs/1.txt"
printf 'ef' >"$TMP/pngs/2.txt"
check "data vlm from a folder" "$LOOM" data vlm --input "$TMP/pngs" --out "$TMP/fd" --val-samples 1
trains_on() {
    "$LOOM" "${BASE[@]}" --data "$1" >"$TMP/log" 2>&1 &&
        grep -qF "data $1: 1 file(s), 2 image-text" "$TMP/log"
}
check "a folder's shards train" trains_on "$TMP/fd/train_*.bin"
mkdir -p "$TMP/f2" "$TMP/f3" "$TMP/f4"
cp "$TMP/pngs/0.png" "$TMP/pngs/0.txt" "$TMP/f2/" && cp "$TMP/big.png" "$TMP/f2/1.png"
printf 'x' >"$TMP/f2/1.txt"
cp "$TMP/pngs/0.png" "$TMP/f3/"
cp "$TMP/pngs/0.png" "$TMP/f4/" && printf 'a prompt only\n\n' >"$TMP/f4/0.txt"
expect "data vlm: folder image sizes" "$TMP/f2/1.png: 16 x 16 pixels, expected 8 x 8" -- \
    data vlm --input "$TMP/f2" --out "$TMP/fx"
expect "data vlm: folder without a text" "$TMP/f3/0.png: no $TMP/f3/0.txt beside it" -- \
    data vlm --input "$TMP/f3" --out "$TMP/fx"
expect "data vlm: a prompt and no answer" "$TMP/f4/0.txt: a prompt line and no answer" -- \
    data vlm --input "$TMP/f4" --out "$TMP/fx"
expect "data vlm: folder without PNGs" "$TMP/nopngs: no .png files" -- \
    data vlm --input "$TMP/nopngs" --out "$TMP/fx"
expect "data vlm: --grid with a folder" "--grid: for --input fashion-mnist" -- \
    data vlm --input "$TMP/pngs" --out "$TMP/fx" --grid 3
expect "data vlm: every file val" "--val-samples 3: the folder $TMP/pngs holds 3 samples" -- \
    data vlm --input "$TMP/pngs" --out "$TMP/fx" --val-samples 3
finish test_vlm_bad_input
