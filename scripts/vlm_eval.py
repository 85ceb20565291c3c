#!/usr/bin/python3
"""The vlm journey's evaluation (scripts/demo.sh vlm, docs/vlm.md): on the first N held-out
caption grids of a vlm shard (from t10k), runs `loom generate --image FOLDER` (greedy, the
KV cache, the model loaded once) over the grids and parses each text back into position ->
class; prints the share of positions whose class the model names correctly, then the same
with a black image instead of every grid (the model must look at the image: a blind guess
names ~10-25%; greedy, so one black image gives the text for all). Writes the model's text
per grid to OUT.txt, the first 16 grids with the model's text under each to OUT.png (loom
generate --sheet), the first grid alone to OUT_first.png. Usage:
  scripts/vlm_eval.py --loom build/loom --weights W --shard DIR/val_000000.bin [--n 200]
                      [--out runs/vlm/heldout]
--compare-no-cache K (default 16, at most 16) captions the first K grids again with and without
the KV cache: the texts must be the same; the times give its speed-up.
Prints one JSON object last: {"grids", "accuracy", "accuracy_black", "generate_s", "kv_cache"}."""
import argparse
import json
import os
import struct
import subprocess
import tempfile
import time
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


def generate(loom, weights, image, sheet=None, no_cache=False):
    """{file name: text} for a folder of PNGs (one line each), or the text for one PNG."""
    cmd = [loom, "generate", "--weights", weights, "--image", image, "--temperature", "0",
           "--max-tokens", "400"] + (["--sheet", sheet] if sheet else [])
    cmd += ["--no-kv-cache"] if no_cache else []
    p = subprocess.run(cmd, capture_output=True, encoding="latin-1", timeout=3600)
    if p.returncode != 0:
        raise RuntimeError(p.stderr.strip())
    if not os.path.isdir(image):
        return p.stdout.strip()
    out = {}
    for line in p.stdout.splitlines():
        name, _, text = line.partition("\t")
        out[name] = text.strip()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", required=True)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--shard", required=True)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--out", default="runs/vlm/heldout")
    ap.add_argument("--compare-no-cache", type=int, default=16, metavar="K",
                    help="also caption the first K grids without the KV cache: same texts?")
    a = ap.parse_args()
    e, tok, px = read_shard(a.shard)
    tmp = tempfile.mkdtemp(prefix="loom_vlm_eval_")
    grids = []  # (sample index, caption, image)
    for i in range(len(e)):
        if len(grids) >= a.n:
            break
        t = tok[e[i, 0]:e[i, 0] + e[i, 1]]
        text = "".join(chr(x) for x in t if x < 256)
        if "?" in text or e[i, 3] != 1:
            continue  # captions only
        grids.append((i, text, px[e[i, 2], 0]))
    first, rest = os.path.join(tmp, "first"), os.path.join(tmp, "rest")
    for k, (i, _, img) in enumerate(grids):
        d = first if k < 16 else rest
        os.makedirs(d, exist_ok=True)
        write_png(os.path.join(d, f"{k:06d}.png"), img)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    t0 = time.time()
    got = generate(a.loom, a.weights, first, sheet=a.out + ".png") if grids else {}
    if os.path.isdir(rest):
        got.update(generate(a.loom, a.weights, rest))
    generate_s = time.time() - t0
    kv = {}
    k = min(a.compare_no_cache, len(grids), 16)
    if k > 0:  # the first K grids again without the KV cache, timed against the cached call
        few = os.path.join(tmp, "few")
        os.makedirs(few)
        for j in range(k):
            os.link(os.path.join(first, f"{j:06d}.png"), os.path.join(few, f"{j:06d}.png"))
        t1 = time.time()
        cached = generate(a.loom, a.weights, few)
        t2 = time.time()
        uncached = generate(a.loom, a.weights, few, no_cache=True)
        t3 = time.time()
        kv = {"grids": k, "same_texts": cached == uncached and all(
                  got[n] == cached[n] for n in cached),
              "cached_s": round(t2 - t1, 2), "uncached_s": round(t3 - t2, 2),
              "speedup": round((t3 - t2) / max(t2 - t1, 1e-9), 2)}
    black_png = os.path.join(tmp, "black.png")
    write_png(black_png, np.zeros_like(grids[0][2]) if grids else np.zeros((1, 1), np.uint8))
    black = generate(a.loom, a.weights, black_png) if grids else ""
    right = right_black = total = 0
    lines = []
    for k, (i, text, img) in enumerate(grids):
        truth, model = parse(text), got[f"{k:06d}.png"]
        pg, pb = parse(model), parse(black)
        right += sum(pg.get(q) == v for q, v in truth.items())
        right_black += sum(pb.get(q) == v for q, v in truth.items())
        total += len(truth)
        lines.append(f"{i}\ttruth: {text}\n\tmodel: {model}\n\tblack: {black}")
    with open(a.out + ".txt", "w") as f:
        f.write("\n".join(lines) + "\n")
    if grids:
        write_png(a.out + "_first.png", grids[0][2])  # one grid alone, for loom generate --image
    acc = right / max(total, 1)
    acc_b = right_black / max(total, 1)
    print(f"held-out grids {total // 4}: positions named correctly {100 * acc:.1f}%, with a "
          f"black image {100 * acc_b:.1f}% (texts: {a.out}.txt, grids with the model's text: "
          f"{a.out}.png)")
    print(json.dumps({"grids": total // 4, "accuracy": acc, "accuracy_black": acc_b,
                      "generate_s": round(generate_s, 1), "kv_cache": kv}))


if __name__ == "__main__":
    main()
