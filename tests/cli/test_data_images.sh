#!/usr/bin/env bash
# loom data images / video: Debian's Fashion-MNIST packed into image shards (counts, shape,
# classes, the published first label and pixels), a PNG folder of class subfolders, moving
# clips (shape, determinism, preview), and bad input: exit 2 with one line naming the file
# or flag. The Fashion-MNIST checks are skipped (with a note) where the package is missing.
# Usage: test_data_images.sh PATH_TO_LOOM
set -u
LOOM=${1:?usage: test_data_images.sh PATH_TO_LOOM}
source "$(dirname "$0")/check_lib.sh"
FM=/usr/share/datasets/fashion-mnist

# Header fields 0..7 of a shard, space-separated.
header() { head -c 32 "$1" | od -An -v -td4 | tr -s ' \n' ' ' | sed 's/^ //;s/ $//'; }
# int32 at byte offset $2.
i32() { od -An -td4 -j"$2" -N4 "$1" | tr -d ' '; }
size() { stat -c %s "$1"; }
differ() { ! cmp -s "$1" "$2"; }

# Every bad invocation: exit 2 and exactly one line "loom data: ..." containing $1.
expect_error() {
    local want=$1
    shift
    "$LOOM" "$@" >/dev/null 2>"$TMP/err"
    local rc=$?
    if [ "$rc" -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q '^loom data: ' "$TMP/err" &&
        grep -qF -- "$want" "$TMP/err"; then
        pass=$((pass + 1))
    else
        fail=$((fail + 1))
        echo "FAIL: '$*': exit $rc, expected 2 and one line with '$want': $(cat "$TMP/err")"
    fi
}

# ---- Fashion-MNIST (train + t10k as val) ----
if [ -r "$FM/train-images-idx3-ubyte.gz" ]; then
    t0=$(date +%s.%N)
    "$LOOM" data images --input fashion-mnist --out "$TMP/fm" 2>"$TMP/log"
    rc=$?
    t1=$(date +%s.%N)
    echo "packing Fashion-MNIST: $(awk "BEGIN { printf \"%.2f\", $t1 - $t0 }") s wall: $(cat "$TMP/log")"
    check "fashion-mnist: exit 0" [ "$rc" -eq 0 ]
    check "fashion-mnist: one summary line" [ "$(wc -l <"$TMP/log")" -eq 1 ]
    check "fashion-mnist: summary" grep -q "60000 train + 10000 val samples of 1x28x28 (CxHxW), 10 classes, 1 + 1 shard" "$TMP/log"
    tr=$TMP/fm/train_000000.bin
    va=$TMP/fm/val_000000.bin
    check "train header" [ "$(header "$tr")" = "20261202 1 60000 1 1 28 28 10" ]
    check "val header" [ "$(header "$va")" = "20261202 1 10000 1 1 28 28 10" ]
    check "train size" [ "$(size "$tr")" -eq $((1024 + 60000 * (4 + 784))) ]
    check "val size" [ "$(size "$va")" -eq $((1024 + 10000 * (4 + 784))) ]
    check "first train label is 9 (ankle boot)" [ "$(i32 "$tr" 1024)" -eq 9 ]
    check "first val label is 9" [ "$(i32 "$va" 1024)" -eq 9 ]
    check "last train label as in the IDX file" [ "$(i32 "$tr" $((1024 + 4 * 59999)))" -eq \
        "$(zcat "$FM/train-labels-idx1-ubyte.gz" | tail -c 1 | od -An -tu1 | tr -d ' ')" ]
    check "first train image as in the IDX file" cmp -s \
        <(zcat "$FM/train-images-idx3-ubyte.gz" | tail -c +17 | head -c 784) \
        <(tail -c +$((1024 + 4 * 60000 + 1)) "$tr" | head -c 784)
    check "last val image as in the IDX file" cmp -s \
        <(zcat "$FM/t10k-images-idx3-ubyte.gz" | tail -c 784) <(tail -c 784 "$va")
    check "no temporary file left" [ -z "$(ls "$TMP/fm" | grep -v '^\(train\|val\)_000000.bin$')" ]

    # Smaller shards; a rerun with bigger shards removes the extra files.
    "$LOOM" data images --input fashion-mnist --out "$TMP/fm3" --shard-samples 25000 2>"$TMP/log"
    check "shard-samples: 3 + 1 shards" grep -q "3 + 1 shard" "$TMP/log"
    check "shard 2 holds 10000" [ "$(header "$TMP/fm3/train_000002.bin")" = "20261202 1 10000 1 1 28 28 10" ]
    "$LOOM" data images --input fashion-mnist --out "$TMP/fm3" 2>/dev/null
    check "stale shards removed" [ ! -e "$TMP/fm3/train_000001.bin" ]

    # Explicit IDX paths with a val fraction; label range checks.
    "$LOOM" data images --input "$FM/t10k-images-idx3-ubyte.gz" \
        --labels "$FM/t10k-labels-idx1-ubyte.gz" --out "$TMP/t10k" --val-fraction 0.1 \
        --n-classes 12 2>"$TMP/log"
    check "val-fraction 0.1: 9000 + 1000" grep -q "9000 train + 1000 val samples" "$TMP/log"
    check "--n-classes 12 in the header" [ "$(i32 "$TMP/t10k/train_000000.bin" 28)" -eq 12 ]
    expect_error "t10k-labels-idx1-ubyte.gz" data images --input "$FM/t10k-images-idx3-ubyte.gz" \
        --labels "$FM/t10k-labels-idx1-ubyte.gz" --out "$TMP/x" --n-classes 5
    expect_error "--n-classes 5" data images --input fashion-mnist --out "$TMP/x" --n-classes 5
    expect_error "60000 labels, expected 10000" data images \
        --input "$FM/t10k-images-idx3-ubyte.gz" --labels "$FM/train-labels-idx1-ubyte.gz" \
        --out "$TMP/x"
    expect_error "0x00000803" data images --input "$FM/t10k-labels-idx1-ubyte.gz" \
        --labels "$FM/t10k-labels-idx1-ubyte.gz" --out "$TMP/x"
    expect_error "--labels" data images --input fashion-mnist --labels x --out "$TMP/x"

    # ---- moving clips ----
    vid=(data video --from-images "$TMP/fm/train_*.bin" --frames 4 --size 40 --objects 2
        --clips 50 --val-clips 5 --seed 3)
    "$LOOM" "${vid[@]}" --out "$TMP/v1" --preview "$TMP/v1.gif" 2>"$TMP/log"
    rc=$?
    check "video: exit 0, one line" [ "$rc" -eq 0 -a "$(wc -l <"$TMP/log")" -eq 1 ]
    check "video: summary" grep -q "50 train + 5 val clips of 4x1x40x40 (FxCxHxW)" "$TMP/log"
    check "video header" [ "$(header "$TMP/v1/train_000000.bin")" = "20261202 1 50 4 1 40 40 10" ]
    check "video size" [ "$(size "$TMP/v1/train_000000.bin")" -eq $((1024 + 50 * (4 + 4 * 1600))) ]
    check "video val header" [ "$(header "$TMP/v1/val_000000.bin")" = "20261202 1 5 4 1 40 40 10" ]
    check "preview is a GIF89a" [ "$(head -c 6 "$TMP/v1.gif")" = "GIF89a" ]
    "$LOOM" "${vid[@]}" --out "$TMP/v2" 2>/dev/null
    check "video: deterministic" cmp -s "$TMP/v1/train_000000.bin" "$TMP/v2/train_000000.bin"
    "$LOOM" "${vid[@]}" --seed 4 --out "$TMP/v3" 2>/dev/null
    check "video: seed matters" differ "$TMP/v1/train_000000.bin" "$TMP/v3/train_000000.bin"
    check "video: val differs from train" differ <(tail -c 6400 "$TMP/v1/train_000000.bin") \
        <(tail -c 6400 "$TMP/v1/val_000000.bin")
    "$LOOM" "${vid[@]}" --out "$TMP/v4" --preview "$TMP/v4.png" 2>/dev/null
    check "PNG strip preview" [ "$(head -c 4 "$TMP/v4.png" | tail -c 3)" = "PNG" ]

    # A truncated shard: one line naming it.
    mkdir -p "$TMP/trunc"
    head -c $((1024 + 4 * 60000 + 1000)) "$tr" >"$TMP/trunc/train_000000.bin"
    expect_error "$TMP/trunc/train_000000.bin: truncated" data video \
        --from-images "$TMP/trunc/train_*.bin" --out "$TMP/x"
    expect_error "--size 20" data video --from-images "$TMP/fm/train_*.bin" --out "$TMP/x" --size 20
    expect_error "--from-images" data video --from-images "$TMP/v1/train_*.bin" --out "$TMP/x"
else
    echo "note: $FM not installed (Debian's dataset-fashion-mnist): its checks skipped"
fi

# ---- a PNG folder and an IDX pair (written here with Python's zlib, in one start) ----
P=$TMP/pngs
mkdir -p "$P/dog" "$P/cat" "$P/bird" "$TMP/spare"
python3 - "$P" "$TMP" <<'EOF'
import random, struct, sys, zlib
P, T = sys.argv[1], sys.argv[2]
def chunk(t, d):
    return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d) & 0xffffffff)
def png(path, w, h, ctype, const=None):  # ctype 0 gray, 2 RGB; random pixels unless const
    ch = 3 if ctype == 2 else 1
    px = lambda: const if const is not None else random.randrange(256)
    raw = b''.join(b'\0' + bytes(px() for _ in range(w * ch)) for _ in range(h))
    ihdr = struct.pack('>IIBBBBB', w, h, 8, ctype, 0, 0, 0)
    open(path, 'wb').write(b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', ihdr) +
                           chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b''))
png(P + '/bird/1.png', 6, 8, 0, 77)
png(P + '/bird/2.png', 6, 8, 2)
png(P + '/cat/a.png', 6, 8, 0)
png(P + '/cat/b.png', 6, 8, 2)
png(P + '/cat/c.png', 6, 8, 0)
png(P + '/dog/x.png', 6, 8, 2)
png(T + '/spare/d.png', 6, 9, 0)  # the wrong size
open(T + '/i.idx', 'wb').write(struct.pack('>IIII', 0x803, 3, 2, 2) + bytes(range(12)))
open(T + '/l.idx', 'wb').write(struct.pack('>II', 0x801, 3) + bytes([1, 12, 3]))
EOF
"$LOOM" data images --input "$P" --out "$TMP/po" --val-fraction 0 2>"$TMP/log"
rc=$?
check "png folder: exit 0" [ "$rc" -eq 0 ]
check "png folder: summary" grep -q "6 train + 0 val samples of 3x8x6 (CxHxW), 3 classes" "$TMP/log"
check "png folder: header" [ "$(header "$TMP/po/train_000000.bin")" = "20261202 1 6 1 3 8 6 3" ]
check "png folder: labels by sorted class" [ "$(tail -c +1025 "$TMP/po/train_000000.bin" | head -c 24 |
    od -An -td4 | tr -s ' \n' ' ' | sed 's/^ //;s/ $//')" = "0 0 1 1 1 2" ]
check "png folder: gray replicated to RGB" cmp -s <(tail -c +$((1024 + 24 + 1)) \
    "$TMP/po/train_000000.bin" | head -c 144) <(head -c 144 /dev/zero | tr '\0' '\115')
check "png folder: no val file" [ ! -e "$TMP/po/val_000000.bin" ]
"$LOOM" data images --input "$P" --out "$TMP/po" --val-fraction 0.5 --channels 1 2>"$TMP/log"
check "png folder: val-fraction 0.5" grep -q "3 train + 3 val samples of 1x8x6" "$TMP/log"
check "png folder: 1 channel" [ "$(header "$TMP/po/val_000000.bin")" = "20261202 1 3 1 1 8 6 3" ]
expect_error "--labels" data images --input "$P" --labels "$P/x" --out "$TMP/x"
expect_error "more than --n-classes 2" data images --input "$P" --out "$TMP/x" --n-classes 2
cp "$TMP/spare/d.png" "$P/cat/d.png"
expect_error "$P/cat/d.png: 9x6 (HxW), expected 8x6" data images --input "$P" --out "$TMP/x"
rm "$P/cat/d.png"
printf 'not a png' >"$P/dog/y.png"
expect_error "$P/dog/y.png: not a PNG" data images --input "$P" --out "$TMP/x"
rm "$P/dog/y.png"

# ---- the IDX pair: a label out of range ----
"$LOOM" data images --input "$TMP/i.idx" --labels "$TMP/l.idx" --out "$TMP/ii" --val-fraction 0 2>"$TMP/log"
check "plain IDX: 13 classes from the labels" grep -q "3 train + 0 val samples of 1x2x2 (CxHxW), 13 classes" "$TMP/log"
expect_error "$TMP/l.idx': label 12 of sample 1" data images --input "$TMP/i.idx" \
    --labels "$TMP/l.idx" --out "$TMP/x" --n-classes 10
head -c 20 "$TMP/i.idx" >"$TMP/short.idx"
expect_error "$TMP/short.idx: truncated" data images --input "$TMP/short.idx" --labels "$TMP/l.idx" --out "$TMP/x"

# ---- flags ----
expect_error "--bogus" data images --input "$P" --out "$TMP/x" --bogus
expect_error "--bogus" data video --from-images "$TMP/po/train_*.bin" --out "$TMP/x" --bogus
expect_error "--input is required" data images --out "$TMP/x"
expect_error "--out is required" data images --input "$P"
expect_error "--from-images is required" data video --out "$TMP/x"
expect_error "needs a value" data video --from-images
expect_error "--channels '2'" data images --input "$P" --out "$TMP/x" --channels 2
expect_error "--shard-samples '0'" data images --input "$P" --out "$TMP/x" --shard-samples 0
expect_error "--val-fraction '1'" data images --input "$P" --out "$TMP/x" --val-fraction 1
expect_error "--frames '0'" data video --from-images "$TMP/po/train_*.bin" --out "$TMP/x" --frames 0
expect_error "--objects 'x'" data video --from-images "$TMP/po/train_*.bin" --out "$TMP/x" --objects x
expect_error "no image shard matches" data video --from-images "$TMP/nothing_*.bin" --out "$TMP/x"
printf 'some bytes for a token shard' >"$TMP/bytes.txt"
"$LOOM" data bytes --input "$TMP/bytes.txt" --out "$TMP/tok" --val-fraction 0 2>/dev/null
expect_error "this is a token shard" data video --from-images "$TMP/tok/*.bin" --out "$TMP/x"
expect_error "nosuch" data images --input "$TMP/nosuch" --labels "$TMP/l.idx" --out "$TMP/x"
expect_error "unexpected argument" data images --input "$P" --out "$TMP/x" extra
expect_error "unknown subcommand" data pictures

finish test_data_images.sh
