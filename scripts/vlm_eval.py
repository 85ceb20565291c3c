#!/usr/bin/python3
"""The vlm journey's evaluation (scripts/demo.sh vlm, docs/vlm.md): on the first N held-out
caption grids of a vlm shard (from t10k), runs `loom generate --image` (greedy) on each and
parses the text back into position -> class; prints the share of positions whose class
the model names correctly, then the same with a black image instead of the grid (the model
must look at the image: a blind guess names ~10-25%). Writes the grids as one PNG and the
model's text per grid to OUT.txt, the first grid alone to OUT_first.png. Usage:
  scripts/vlm_eval.py --loom build/loom --weights W --shard DIR/val_000000.bin [--n 200]
                      [--out runs/vlm/heldout]
Prints one JSON object last: {"grids", "accuracy", "accuracy_black"}."""
import argparse
import json
import os
import struct
import subprocess
import tempfile
import zlib

import numpy as np

CLASSES = ["t-shirt/top", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker",
           "bag", "ankle boot"]


def read_shard(path):
    b = open(path, "rb").read()
    h = np.frombuffer(b[:1024], "<i4")
    n, C, H, W, nt, ni = (int(h[i]) for i in (2, 3, 4, 5, 9, 10))
    e = np.frombuffer(b[1024:1024 + 16 * n], "<i4").reshape(n, 4)
    o = 1024 + 16 * n
    tok = np.frombuffer(b[o:o + 4 * nt], "<i4")
    px = np.frombuffer(b[o + 5 * nt:], np.uint8).reshape(ni, C, H, W)
    return e, tok, px


def write_png(path, img):
    img = np.ascontiguousarray(img, dtype=np.uint8)
    h, w = img.shape
    raw = b"".join(b"\x00" + img[r].tobytes() for r in range(h))

    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data +
                struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff))

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def parse(text):
    """'top left: bag; top right: coat; ...' -> {position: class}."""
    out = {}
    for part in text.split(";"):
        if ":" in part:
            pos, cls = part.split(":", 1)
            out[pos.strip()] = cls.strip()
    return out


def generate(loom, weights, png):
    p = subprocess.run([loom, "generate", "--weights", weights, "--image", png,
                        "--temperature", "0", "--max-tokens", "400"],
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(p.stderr.strip())
    return p.stdout.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", required=True)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--shard", required=True)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--out", default="runs/vlm/heldout")
    a = ap.parse_args()
    e, tok, px = read_shard(a.shard)
    tmp = tempfile.mkdtemp(prefix="loom_vlm_eval_")
    right = right_black = total = 0
    lines, shown = [], []
    for i in range(len(e)):
        if total // 4 >= a.n:
            break
        t = tok[e[i, 0]:e[i, 0] + e[i, 1]]
        text = "".join(chr(x) for x in t if x < 256)
        if "?" in text or e[i, 3] != 1:
            continue  # captions only
        truth = parse(text)
        img = px[e[i, 2], 0]
        png = os.path.join(tmp, "grid.png")
        write_png(png, img)
        got = generate(a.loom, a.weights, png)
        write_png(png, np.zeros_like(img))
        black = generate(a.loom, a.weights, png)
        pg, pb = parse(got), parse(black)
        right += sum(pg.get(k) == v for k, v in truth.items())
        right_black += sum(pb.get(k) == v for k, v in truth.items())
        total += len(truth)
        lines.append(f"{i}\ttruth: {text}\n\tmodel: {got}\n\tblack: {black}")
        if len(shown) < 16:
            shown.append(img)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out + ".txt", "w") as f:
        f.write("\n".join(lines) + "\n")
    if shown:
        write_png(a.out + "_first.png", shown[0])  # one grid alone, for loom generate --image
        h, w = shown[0].shape
        sheet = np.full((2 * (h + 4), 8 * (w + 4)), 255, np.uint8)
        for k, img in enumerate(shown):
            r, c = divmod(k, 8)
            sheet[r * (h + 4):r * (h + 4) + h, c * (w + 4):c * (w + 4) + w] = img
        write_png(a.out + ".png", sheet)
    acc = right / max(total, 1)
    acc_b = right_black / max(total, 1)
    print(f"held-out grids {total // 4}: positions named correctly {100 * acc:.1f}%, with a "
          f"black image {100 * acc_b:.1f}% (texts: {a.out}.txt, grids: {a.out}.png)")
    print(json.dumps({"grids": total // 4, "accuracy": acc, "accuracy_black": acc_b}))


if __name__ == "__main__":
    main()
