#!/usr/bin/python3
"""Sample quality of a Fashion-MNIST dit model: a classifier's accuracy on the samples and an
FID-like Frechet distance.

The judge is a small CNN trained here on the real Fashion-MNIST training images (Debian's
IDX files in /usr/share/datasets/fashion-mnist, read with gzip + numpy): conv 5x5 1->16
stride 2, ReLU, conv 3x3 16->32 stride 2, ReLU, linear 1568->64, ReLU (the features),
linear 64->10; Adam, 2 epochs of batch 128, on --threads threads (about a minute on 2 idle
cores). Its
weights are cached under --cache (trained again when the file is missing or stale). Its
accuracy on the 10,000 t10k images is printed first.

For a samples file (`loom sample --raw`: "samples" [N, 1, 1, 28, 28] in [-1, 1], "labels"
[N]) it reports:
  - accuracy: the classifier's prediction against each sample's intended class, per class
    and overall (chance: 0.1);
  - frechet_distance: the Frechet distance between Gaussians fitted to the classifier's
    64-dim penultimate-layer features (after ReLU) of the samples and of real held-out t10k
    images, the same count of each class as the samples. This is FID's formula on this
    classifier's features, not Inception FID: its numbers compare runs of this script
    only, and like FID it grows as the count falls (compare at equal N; the output also
    gives real_same_n_frechet_distance, real train images of the same class counts against
    the same reference: the floor at this N).
Samples are quantised as the PNG writer does (u8 = clamp(round((x + 1) * 127.5)), then back
to [-1, 1]) so that they are judged as the pictures are.

--validate checks the yardstick: a train-set subset (real images) against the t10k
reference must give a low distance and high accuracy, Gaussian noise images (N(0, 1)
clamped to [-1, 1]) a high distance and chance accuracy.

The last line of output is one JSON object.

Usage: /usr/bin/python3 bench/dit_quality.py --cache /tmp/fmnist_cnn.pt --validate
       /usr/bin/python3 bench/dit_quality.py --cache /tmp/fmnist_cnn.pt --samples raw.safetensors
"""

import argparse
import gzip
import json
import os
import struct
import sys
import time

import numpy as np

DATA = "/usr/share/datasets/fashion-mnist"
CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
           "Bag", "Ankle boot"]
ARCH = "cnn-s2-16-32-fc64-v2"  # bump when the classifier or its training changes
FEATURES = ("64-dim penultimate layer (after ReLU) of a 2-conv CNN trained here on "
            "Fashion-MNIST train (" + ARCH + "); FID-like, not Inception FID")


def read_idx(path):
    """An IDX file (the MNIST format): magic 0x0000080d with d dims (big-endian int32 each)."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != 0x08:
        sys.exit(f"{path}: not an unsigned-byte IDX file")
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        sys.exit(f"{path}: {data.size} bytes of data, the header says {dims}")
    return data.reshape(dims)


def load_split(name):
    images = read_idx(os.path.join(DATA, f"{name}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(DATA, f"{name}-labels-idx1-ubyte.gz")).astype(np.int64)
    if images.shape[0] != labels.shape[0]:
        sys.exit(f"{DATA}: {name} has {images.shape[0]} images and {labels.shape[0]} labels")
    return images, labels


def to_unit(u8):
    """u8 [N, 28, 28] -> float32 [N, 1, 28, 28] in [-1, 1] (the dit's x0 = u / 127.5 - 1)."""
    return (u8.astype(np.float32) / 127.5 - 1.0)[:, None]


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        sys.exit(f"{path}: not a safetensors file (shorter than 8 bytes)")
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, e in header.items():
        dt = {"F32": "<f4", "I32": "<i4"}.get(e["dtype"])
        if dt is None:
            sys.exit(f"{path}: tensor {name} has dtype {e['dtype']} (expected F32 or I32)")
        a, b = e["data_offsets"]
        out[name] = np.frombuffer(raw[base + a:base + b], dtype=dt).reshape(e["shape"])
    return out, meta


def build_classifier():
    import torch.nn as nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(1, 16, 5, stride=2, padding=2), nn.ReLU(),
                nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(),
                nn.Linear(32 * 7 * 7, 64), nn.ReLU())
            self.head = nn.Linear(64, 10)

        def forward(self, x):
            f = self.body(x)
            return self.head(f), f

    return Net()


def train_classifier(args, train_x, train_y):
    import torch
    torch.manual_seed(0)
    net = build_classifier()
    opt = torch.optim.Adam(net.parameters(), lr=2e-3)
    x = torch.from_numpy(train_x)
    y = torch.from_numpy(train_y)
    rng = np.random.default_rng(0)
    t0 = time.time()
    for epoch in range(args.epochs):
        net.train()
        order = torch.from_numpy(rng.permutation(len(x)))
        total, correct, loss_sum = 0, 0, 0.0
        for i in range(0, len(x), 128):
            idx = order[i:i + 128]
            logits, _ = net(x[idx])
            loss = torch.nn.functional.cross_entropy(logits, y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_sum += loss.item() * len(idx)
            correct += (logits.argmax(1) == y[idx]).sum().item()
            total += len(idx)
        print(f"  classifier epoch {epoch + 1}/{args.epochs}: loss {loss_sum / total:.4f}, "
              f"train accuracy {correct / total:.4f} ({time.time() - t0:.0f} s)", flush=True)
    return net


def run_net(net, x, batch=1000):
    """Predictions and features of float32 images [N, 1, 28, 28]."""
    import torch
    net.eval()
    preds, feats = [], []
    with torch.no_grad():
        for i in range(0, len(x), batch):
            logits, f = net(torch.from_numpy(np.ascontiguousarray(x[i:i + batch])))
            preds.append(logits.argmax(1).numpy())
            feats.append(f.double().numpy())
    return np.concatenate(preds), np.concatenate(feats)


def get_classifier(args, train, test):
    import torch
    key = {"arch": ARCH, "epochs": args.epochs}
    if args.cache and os.path.exists(args.cache):
        try:
            saved = torch.load(args.cache)
            if saved.get("key") == key:
                net = build_classifier()
                net.load_state_dict(saved["state"])
                print(f"classifier: cached {args.cache}", flush=True)
                return net
            print(f"classifier: {args.cache} is for {saved.get('key')}, training again",
                  flush=True)
        except Exception as e:  # a damaged cache is retrained, not fatal
            print(f"classifier: cannot read {args.cache} ({e}), training again", flush=True)
    print(f"classifier: training {ARCH} for {args.epochs} epochs on {args.threads} threads",
          flush=True)
    net = train_classifier(args, to_unit(train[0]), train[1])
    if args.cache:
        tmp = args.cache + ".tmp"
        torch.save({"key": key, "state": net.state_dict()}, tmp)
        os.replace(tmp, args.cache)
        print(f"classifier: saved {args.cache}", flush=True)
    return net


def frechet(f1, f2):
    """||mu1 - mu2||^2 + tr(S1 + S2 - 2 (S1 S2)^(1/2)) in float64; the trace of the root via
    the symmetric form tr((S1^(1/2) S2 S1^(1/2))^(1/2)) (both are PSD)."""
    mu1, mu2 = f1.mean(0), f2.mean(0)
    s1, s2 = np.cov(f1, rowvar=False), np.cov(f2, rowvar=False)
    w, v = np.linalg.eigh(s1)
    r1 = (v * np.sqrt(np.clip(w, 0, None))) @ v.T
    m = r1 @ s2 @ r1
    cross = np.sqrt(np.clip(np.linalg.eigvalsh((m + m.T) / 2), 0, None)).sum()
    return float(((mu1 - mu2) ** 2).sum() + np.trace(s1) + np.trace(s2) - 2 * cross)


def reference_images(test, labels, seed):
    """Real t10k images, as many of each class as `labels` has (a seeded pick)."""
    rng = np.random.default_rng(seed)
    idx = []
    for c in range(10):
        want = int((labels == c).sum())
        pool = np.flatnonzero(test[1] == c)
        if want > len(pool):
            sys.exit(f"class {c}: {want} samples but only {len(pool)} real t10k images")
        idx.append(rng.choice(pool, want, replace=False))
    return to_unit(test[0][np.concatenate(idx)])


def judge(net, x, labels, ref_x, name):
    """Accuracy per class and overall on x [N, 1, 28, 28] with intended labels, and the
    Frechet distance of its features to ref_x's."""
    pred, feat = run_net(net, x)
    _, ref_feat = run_net(net, ref_x)
    per_class = {}
    for c in range(10):
        m = labels == c
        if m.any():
            per_class[CLASSES[c]] = round(float((pred[m] == c).mean()), 4)
    acc = float((pred == labels).mean())
    fd = frechet(feat, ref_feat)
    print(f"[{name}] {len(x)} images: accuracy {acc:.4f}, Frechet distance {fd:.3f} "
          f"(vs {len(ref_x)} real t10k images)", flush=True)
    for cname, a in per_class.items():
        print(f"    {cname:12s} {a:.3f}")
    return {"n": int(len(x)), "accuracy": round(acc, 4), "per_class_accuracy": per_class,
            "frechet_distance": round(fd, 4), "reference_n": int(len(ref_x))}


def load_samples(path):
    t, meta = read_safetensors(path)
    if "samples" not in t or "labels" not in t:
        sys.exit(f"{path}: needs tensors 'samples' and 'labels' (loom sample --raw)")
    s, labels = t["samples"], t["labels"].astype(np.int64)
    if s.ndim != 5 or tuple(s.shape[1:]) != (1, 1, 28, 28):
        sys.exit(f"{path}: samples have shape {list(s.shape)} (expected [N, 1, 1, 28, 28]: "
                 "Fashion-MNIST images)")
    if labels.shape != (s.shape[0],) or labels.min() < 0 or labels.max() > 9:
        sys.exit(f"{path}: labels must be [N] in 0..9 (got shape {list(labels.shape)})")
    u8 = np.clip(np.round((s[:, 0, 0].astype(np.float64) + 1.0) * 127.5), 0, 255)
    bad = int((~np.isfinite(s)).sum())
    return to_unit(np.nan_to_num(u8).astype(np.uint8)), labels, meta, bad


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", help="loom sample --raw output to judge")
    ap.add_argument("--validate", action="store_true",
                    help="judge real train images and Gaussian noise (the yardstick's check)")
    ap.add_argument("--cache", help="classifier weights file (written when missing)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--per-class", type=int, default=100,
                    help="--validate: images of each class in each set (default 100)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the real images picked")
    args = ap.parse_args()
    if not args.samples and not args.validate:
        ap.error("give --samples FILE and/or --validate")
    import torch
    torch.set_num_threads(args.threads)
    t_start = time.time()
    train, test = load_split("train"), load_split("t10k")
    net = get_classifier(args, train, test)
    pred, _ = run_net(net, to_unit(test[0]))
    test_acc = float((pred == test[1]).mean())
    print(f"classifier: t10k accuracy {test_acc:.4f} ({len(test[1])} images)", flush=True)
    result = {"classifier": {"arch": ARCH, "t10k_accuracy": round(test_acc, 4),
                             "features": FEATURES}}
    if args.validate:
        rng = np.random.default_rng(args.seed + 1)
        labels = np.repeat(np.arange(10), args.per_class)
        ref = reference_images(test, labels, args.seed)
        idx = np.concatenate([rng.choice(np.flatnonzero(train[1] == c), args.per_class,
                                         replace=False) for c in range(10)])
        real = judge(net, to_unit(train[0][idx]), labels, ref, "real train subset")
        other = reference_images(test, labels, args.seed + 7)  # may overlap ref partly
        real_t10k = judge(net, other, labels, ref, "real t10k (another pick)")
        noise = np.clip(rng.standard_normal((len(labels), 1, 28, 28)), -1, 1).astype(np.float32)
        noise = to_unit(np.round((noise + 1) * 127.5).astype(np.uint8)[:, 0])
        gauss = judge(net, noise, labels, ref, "gaussian noise")
        ok = (real["frechet_distance"] * 5 < gauss["frechet_distance"] and
              real["accuracy"] > 0.8 and gauss["accuracy"] < 0.3)
        result["validation"] = {"real_train_subset": real, "real_t10k_other_pick": real_t10k,
                                "gaussian_noise": gauss, "ok": ok}
        if not ok:
            print("validation FAILED: real images should be far closer and better classified "
                  "than noise", flush=True)
    if args.samples:
        x, labels, meta, bad = load_samples(args.samples)
        if bad:
            print(f"warning: {bad} sample values are not finite", flush=True)
        ref = reference_images(test, labels, args.seed)
        r = judge(net, x, labels, ref, os.path.basename(args.samples))
        # The floor at this N: real train images, the same count of each class, against the
        # same reference (the distance is biased upwards at small N, real images included).
        rng = np.random.default_rng(args.seed + 1)
        idx = np.concatenate([rng.choice(np.flatnonzero(train[1] == c), int((labels == c).sum()),
                                         replace=False) for c in range(10)])
        _, real_feat = run_net(net, to_unit(train[0][idx]))
        _, ref_feat = run_net(net, ref)
        r["real_same_n_frechet_distance"] = round(frechet(real_feat, ref_feat), 4)
        print(f"    (real train images, same count per class: Frechet distance "
              f"{r['real_same_n_frechet_distance']:.3f})", flush=True)
        r["path"] = args.samples
        r["non_finite_values"] = bad
        r["sampler"] = {k: meta[k] for k in ("steps", "cfg", "solver", "seed", "weights")
                        if k in meta}
        result["samples"] = r
    result["wall_s"] = round(time.time() - t_start, 1)
    print(json.dumps(result))
    return 0 if result.get("validation", {}).get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
