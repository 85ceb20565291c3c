#!/usr/bin/python3
"""loom's `dit` family vs PyTorch: random small DiTs, 10 flow-matching steps, the sampler.

For each drawn configuration (images of random odd token grids, non-square, Cin 1 or 3,
p 2-4; every third one a video, F 2 or 4, pt 1 or 2) this writes two random image shards
(the spec's format), then:
 1. runs `loom train --family dit ...` from loom's own (DiT, zero adaLN) initialisation
    with --dump-dir/--metrics/--save-weights, and compares the float64 reference
    (dit_torch.py) started from loom's params_init.safetensors and fed loom's exact draws
    (flow_batch.safetensors: x0, noise, t, labels after class dropout): the step-1 v-hat
    of micro-batch 1, the step-1 loss, every step-1 gradient, loss / lr / grad norm per
    step, the final weights and the final EMA; plus loom's initialisation (zeros where
    DiT has zeros, xavier bounds, N(0, 0.02) spreads) and the draws themselves (every x0
    is a shard sample, every label that sample's or the null class, t in [0, 1], noise
    plausibly N(0, 1));
 2. runs it again with --init-from a file of random non-zero weights (adaLN and the
    final layer are zero at DiT's init, so half the step-1 gradients are exactly zero
    there; here every gradient is non-zero), same checks, with another micro-batch size:
    the draws must be the same as run 1's (keyed by seed, step, global sample index);
 3. `loom sample` (Euler and Heun, CFG) with run 2's --save-weights, compared against
    the reference sampler started from loom's recorded noise (--raw).
Error measures and the fp32 slack rule are test_vs_torch.py's (read its docstring):
tensors max|loom - ref| / max|ref| (step 1) or L2 (final weights, EMA), scalars relative;
each check's tolerance is max(tol, 5 x the fp32 PyTorch error), step 1's too (unlike the
LM test: the timestep embedding's fp32 angles t*1000*freq reach 1000 rad, so fp32 alone
puts ~1e-4 errors into its cos/sin and the t_embedder gradients). Left out of the L2
checks: the attention key bias (rows D..2D of attn.qkv.bias), whose exact gradient is
zero (q.b_k is constant along a softmax row), so AdamW turns rounding noise into O(lr)
steps there in any fp32 code.

Until loom has the family this fails at the first `loom train` (that is expected).
--self-test runs everything without loom: a float32 PyTorch stand-in writes the files
loom would (draws from numpy, DiT init, the same dump names and shapes), so the whole
reading / reference / comparison path runs; it says nothing about loom.

Usage: /usr/bin/python3 tests/reference/test_dit_vs_torch.py --loom build/loom [--seed S]
       [--configs N] [--keep] [--only I]     or     ... --self-test [--seed S]
Exit status 0 when every check passes, 1 otherwise (with the seed and loom commands).
"""

import argparse
import json
import math
import os
import random
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import check_dit_torch  # noqa: E402
import loomtest  # noqa: E402
import dit_torch as dt  # noqa: E402
import safetensors_io  # noqa: E402
import test_vs_torch as lm  # noqa: E402  (measures, Report, metrics reader)
import torch  # noqa: E402

STEPS = 10
TOL = {"pred": 1e-4, "loss1": 1e-5, "grads": 1e-4, "losses": 1e-5, "lr": 1e-6,
       "grad_norm": 1e-4, "final": 1e-4, "ema": 1e-4, "samples": 1e-4}
FP32_SLACK = lm.FP32_SLACK
SHARD_MAGIC, SHARD_VERSION = 20261202, 1
CLASS_DROPOUT, EMA_DECAY = 0.3, 0.9
LOOM_TIMEOUT = 300


# ---------------------------------------------------------------- configuration draw

def _odd_multiples(p, lo, hi):
    """Sizes in [lo, hi] that are p times an odd number."""
    return [s for s in range(lo, hi + 1) if s % p == 0 and (s // p) % 2 == 1]


def draw_config(rng, index):
    """(model cfg, train cfg, options) of configuration #index; every third is a video."""
    video = index % 3 == 2
    p = rng.choice([2, 3, 4])
    if video:
        frames, pt = rng.choice([2, 4]), rng.choice([1, 2])
        sizes = [s for s in range(8, 13) if s % p == 0]
        mult = 16
    else:
        frames, pt = 1, 1
        sizes = _odd_multiples(p, 8, 20)  # odd token counts
        mult = 4
    H, W = rng.choice(sizes), rng.choice(sizes)
    while True:  # d_model = heads * head_dim, a multiple of 4 (16 for video), <= 64
        n_head = rng.randint(1, 4)
        hd = rng.choice([4, 5, 6, 7, 8, 9, 10, 12, 15, 16])
        if (n_head * hd) % mult == 0 and n_head * hd <= 64:
            break
    D = n_head * hd
    cfg = dt.DiTConfig(n_layer=rng.randint(1, 3), n_head=n_head, d_model=D,
                       d_ff=rng.choice([2 * D, 3 * D + 2, 4 * D - 3, 4 * D]), patch=p,
                       height=H, width=W, channels=rng.choice([1, 3]),
                       n_classes=rng.randint(2, 7), patch_t=pt, frames=frames).validate()
    micro = rng.randint(1, 3)
    G = micro * rng.randint(1, 3)
    lr = 10 ** rng.uniform(-3, -2.3)
    clip = 0.0 if rng.random() < 0.2 else round(10 ** rng.uniform(-0.8, 0.3), 4)
    tc = dt.DiTTrainConfig(
        steps=STEPS, micro_batch=micro, global_batch=G, lr=lr,
        min_lr=lr * rng.choice([0.0, 0.1]), warmup_steps=rng.randint(0, 4),
        weight_decay=rng.choice([0.0, 0.01, 0.1]), grad_clip=clip,
        beta1=rng.choice([0.9, 0.8]), beta2=rng.choice([0.95, 0.999]),
        adam_eps=rng.choice([1e-6, 1e-5]),  # see test_vs_torch.py on eps 1e-8
        ema_decay=EMA_DECAY)
    divisors = [m for m in range(1, G + 1) if G % m == 0 and m != micro]
    opts = {
        "t_sampling": rng.choice(["logit-normal", "uniform"]),
        "class_dropout": CLASS_DROPOUT,
        "loom_seed": rng.randint(1, 2**31 - 1),
        "micro2": rng.choice(divisors) if divisors else micro,  # run 2's micro-batch
        "shard_sizes": [rng.randint(5, 16), rng.randint(5, 16)],
        "init_seed": rng.randint(0, 2**31 - 1),
        "sample": {"n": rng.randint(2, 4), "class": rng.randint(0, cfg.n_classes - 1),
                   "steps": rng.randint(2, 4), "cfg": rng.choice([1.0, 2.0, 3.5]),
                   "seed": rng.randint(1, 10**6)},
    }
    return cfg, tc, opts


def describe(c, t, o):
    kind = (f"video F{c.frames} pt{c.patch_t}" if c.frames > 1 else "image")
    return (f"{kind} {c.channels}x{c.height}x{c.width} p{c.patch} tokens {c.n_tokens} "
            f"K{c.n_classes} | L{c.n_layer} H{c.n_head} D{c.d_model} hd{c.head_dim} "
            f"F{c.d_ff} | M{t.micro_batch}/{o['micro2']} G{t.global_batch} lr{t.lr:.2e} "
            f"min{t.min_lr:.1e} wu{t.warmup_steps} wd{t.weight_decay} clip{t.grad_clip} "
            f"b{t.beta1}/{t.beta2} eps{t.adam_eps} t~{o['t_sampling']}")


# ---------------------------------------------------------------- files

def write_shard(path, cfg, n, nrng):
    """The spec's image shard: header, n int32 labels, n*F*C*H*W u8 pixels."""
    labels = nrng.integers(0, cfg.n_classes, n).astype("<i4")
    pixels = nrng.integers(0, 256, (n,) + cfg.sample_shape).astype(np.uint8)
    header = np.zeros(256, dtype="<i4")
    header[:8] = [SHARD_MAGIC, SHARD_VERSION, n, cfg.frames, cfg.channels, cfg.height,
                  cfg.width, cfg.n_classes]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(labels.tobytes())
        f.write(pixels.tobytes())
    return labels, pixels


def read_shard(path):
    """-> (header list, labels [n], pixels [n, F, C, H, W] u8); validates the size."""
    blob = open(path, "rb").read()
    h = np.frombuffer(blob[:1024], dtype="<i4")
    n, Fr, C, H, W = (int(v) for v in h[2:7])
    if h[0] != SHARD_MAGIC or h[1] != SHARD_VERSION:
        raise ValueError(f"{path}: bad magic/version {h[0]}/{h[1]}")
    want = 1024 + 4 * n + n * Fr * C * H * W
    if len(blob) != want:
        raise ValueError(f"{path}: {len(blob)} bytes, expected {want}")
    labels = np.frombuffer(blob[1024:1024 + 4 * n], dtype="<i4").copy()
    pixels = np.frombuffer(blob[1024 + 4 * n:], dtype=np.uint8).reshape(n, Fr, C, H, W).copy()
    return [int(v) for v in h[:8]], labels, pixels


def read_metadata(path):
    """The __metadata__ dict of a safetensors file ({} if none)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return dict(json.loads(f.read(n).decode("utf-8")).get("__metadata__", {}))


def write_png(path, img):
    """img [h, w] or [h, w, 3] u8 -> a minimal PNG (self-test stand-in for loom's grid)."""
    img = np.ascontiguousarray(img, dtype=np.uint8)
    h, w = img.shape[:2]
    color = 2 if img.ndim == 3 else 0
    raw = b"".join(b"\x00" + img[r].tobytes() for r in range(h))

    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff))

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, color, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


# ---------------------------------------------------------------- commands

def train_command(loom, cfg, tc, o, data, out, micro, init_from=None):
    cmd = [loom, "train", "--family", "dit",
           "--n-layer", cfg.n_layer, "--n-head", cfg.n_head, "--d-model", cfg.d_model,
           "--d-ff", cfg.d_ff, "--patch", cfg.patch, "--patch-t", cfg.patch_t,
           "--frames", cfg.frames, "--height", cfg.height, "--width", cfg.width,
           "--channels", cfg.channels, "--n-classes", cfg.n_classes,
           "--data", data, "--micro-batch", micro, "--global-batch", tc.global_batch,
           "--steps", tc.steps, "--lr", repr(tc.lr), "--min-lr", repr(tc.min_lr),
           "--warmup-steps", tc.warmup_steps, "--weight-decay", tc.weight_decay,
           "--grad-clip", tc.grad_clip, "--beta1", tc.beta1, "--beta2", tc.beta2,
           "--adam-eps", tc.adam_eps, "--t-sampling", o["t_sampling"],
           "--class-dropout", o["class_dropout"], "--ema-decay", tc.ema_decay,
           "--seed", o["loom_seed"], "--threads", 2, "--log-every", 1,
           "--dump-dir", out, "--metrics", os.path.join(out, "metrics.jsonl"),
           "--save-weights", os.path.join(out, "weights.safetensors")]
    if init_from:
        cmd += ["--init-from", init_from]
    return [str(c) for c in cmd]


def sample_command(loom, weights, s, solver, raw, png):
    cmd = [loom, "sample", "--weights", weights, "--n", s["n"], "--class", s["class"],
           "--steps", s["steps"], "--cfg", s["cfg"], "--seed", s["seed"], "--solver", solver,
           "--raw", raw, "-o", png]
    return [str(c) for c in cmd]


def run_loom(cmd):
    """-> (error message or None, seconds)."""
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=LOOM_TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"timed out after {LOOM_TIMEOUT} s", time.time() - t0
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return f"exit {proc.returncode}: " + " | ".join(tail), time.time() - t0
    return None, time.time() - t0


# ---------------------------------------------------------------- self-test stand-in for loom

class StandIn:
    """Writes what loom train / loom sample would, with the float32 PyTorch reference and
    numpy draws (self-test only; nothing here is compared against itself in float32)."""

    def __init__(self, cfg, tc, o, shard_paths):
        self.cfg, self.tc, self.o = cfg, tc, o
        parts = [read_shard(p) for p in shard_paths]
        self.labels = np.concatenate([p[1] for p in parts])
        self.pixels = np.concatenate([p[2] for p in parts])

    def draws(self):
        """Keyed by the seed only (like loom's Philox draws): same for any micro-batch."""
        cfg, tc, o = self.cfg, self.tc, self.o
        rng = np.random.default_rng(o["loom_seed"])
        idx = rng.integers(0, len(self.labels), (tc.steps, tc.global_batch))
        x0 = (self.pixels[idx].astype(np.float32) / np.float32(127.5) - np.float32(1))
        noise = rng.standard_normal(x0.shape).astype(np.float32)
        n = rng.standard_normal((tc.steps, tc.global_batch))
        t = 1 / (1 + np.exp(-n)) if o["t_sampling"] == "logit-normal" else rng.random(n.shape)
        drop = rng.random(idx.shape) < o["class_dropout"]
        labels = np.where(drop, cfg.n_classes, self.labels[idx]).astype(np.int32)
        return {"x0": x0, "noise": noise, "t": t.astype(np.float32), "labels": labels}

    def train(self, out, micro, init_from=None):
        cfg, tc = self.cfg, self.tc
        os.makedirs(out, exist_ok=True)
        model = dt.build_model(cfg, torch.float32)
        dt.init_dit(model, self.o["loom_seed"])
        f32 = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
        safetensors_io.save(os.path.join(out, "params_init.safetensors"), f32)
        if init_from:
            dt.load_params(model, safetensors_io.load(init_from))
        flow = self.draws()
        safetensors_io.save(os.path.join(out, "flow_batch.safetensors"), flow)
        snap = {}

        def on_step(s, info):
            if s == 0:
                snap["pred"] = info["pred0"].numpy().copy()
                snap["grads"] = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}

        tcm = dt.DiTTrainConfig(**{**tc.__dict__, "micro_batch": micro})
        hist, ema = dt.train(model, tcm, flow, on_step)
        safetensors_io.save(os.path.join(out, "pred_step1.safetensors"), {"pred": snap["pred"]})
        safetensors_io.save(os.path.join(out, "grads_step1.safetensors"), snap["grads"])
        final = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
        safetensors_io.save(os.path.join(out, "params_final.safetensors"), final)
        safetensors_io.save(os.path.join(out, "ema_final.safetensors"),
                            {n: e.numpy().copy() for n, e in ema.items()})
        safetensors_io.save(os.path.join(out, "weights.safetensors"),
                            {n: e.numpy().copy() for n, e in ema.items()}, {"family": "dit"})
        with open(os.path.join(out, "metrics.jsonl"), "w") as f:
            for s, h in enumerate(hist):
                f.write(json.dumps({"step": s + 1, **h}) + "\n")
        return None

    def sample(self, weights, s, solver, raw, png):
        cfg = self.cfg
        model = dt.build_model(cfg, torch.float32)
        dt.load_params(model, safetensors_io.load(weights))
        rng = np.random.default_rng(s["seed"])
        noise = rng.standard_normal((s["n"],) + cfg.sample_shape).astype(np.float32)
        labels = np.full(s["n"], s["class"], dtype=np.int32)
        x = dt.sample(model, noise, labels, s["steps"], s["cfg"], solver).numpy()
        safetensors_io.save(raw, {"samples": x, "labels": labels, "noise": noise})
        img = dt.to_u8(x[:, 0])  # [N, C, H, W], first frame
        img = np.concatenate(list(img.transpose(0, 2, 3, 1)), axis=1)  # side by side
        write_png(png, img[..., 0] if cfg.channels == 1 else img)
        return None


# ---------------------------------------------------------------- checks

class Report(lm.Report):
    def add_bool(self, name, ok, where):
        self.rows.append((name, 0.0 if ok else math.inf, where, math.nan, ""))

    @property
    def ok(self):
        return all((err == 0.0 if math.isnan(tol) else err <= tol)
                   for _, err, _, tol, _ in self.rows)

    def print(self):
        print(f"  {'check':<20} {'worst rel err':>13} {'tol':>8}  status  where")
        for name, err, where, tol, note in self.rows:
            if math.isnan(tol):
                status = "ok" if err == 0.0 else "FAIL"
                print(f"  {name:<20} {'-':>13} {'-':>8}  {status:<6}  {where}")
                continue
            status = "ok" if err <= tol else "FAIL"
            e = f"{err:.3e}" if math.isfinite(err) else "inf"
            print(f"  {name:<20} {e:>13} {tol:>8.1e}  {status:<6}  {where}{note}")


def compare_named(report, check, loom_t, ref_t, tol, measure=lm.rel_tensor, fp32_t=None):
    lm.compare_named(report, check, loom_t, ref_t, tol, measure, fp32_t)


def without_null_directions(tensors, cfg):
    """Copy with the key bias (rows D..2D of every attn.qkv.bias) zeroed (see docstring)."""
    out = dict(tensors)
    D = cfg.d_model
    for name in tensors:
        if name.endswith("attn.qkv.bias"):
            out[name] = np.array(tensors[name], dtype=np.float64)
            out[name][D:2 * D] = 0.0
    return out


def ks_distance(x, cdf):
    x = np.sort(np.asarray(x, dtype=np.float64).reshape(-1))
    n = x.size
    c = cdf(x)
    i = np.arange(1, n + 1)
    return float(max(np.max(i / n - c), np.max(c - (i - 1) / n)))


def ks_critical(n, alpha=1e-6):
    return math.sqrt(-math.log(alpha / 2) / (2 * n))


def normal_cdf(x):
    return 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def check_init(report, init, cfg):
    """loom's initial weights follow DiT's initialize_weights (zeros exactly; spreads loosely)."""
    bad = []
    for name, w in init.items():
        w = np.asarray(w, dtype=np.float64)
        kind = dt.init_kind(name)
        if kind == "zero":
            if np.any(w != 0):
                bad.append(f"{name} not all zero")
        elif kind == "xavier":
            b = dt.xavier_bound(w.shape)
            if np.abs(w).max() > b * (1 + 1e-6):
                bad.append(f"{name}: |w| {np.abs(w).max():.4g} > xavier bound {b:.4g}")
            elif w.size >= 100 and not 0.8 < w.std() / (b / math.sqrt(3)) < 1.2:
                bad.append(f"{name}: std {w.std():.4g}, xavier {b / math.sqrt(3):.4g}")
        else:
            std = kind[1]
            if w.size >= 100 and not 0.7 < w.std() / std < 1.3:
                bad.append(f"{name}: std {w.std():.4g}, expected {std}")
            elif np.all(w == 0):
                bad.append(f"{name}: all zero, expected N(0, {std}^2)")
    report.add_bool("init", not bad, "; ".join(bad[:3]) if bad else
                    "DiT's initialize_weights (zeros, xavier bounds, N(0, 0.02))")


def check_draws(report, flow, cfg, o, shard_labels, shard_pixels):
    """x0 rows are shard samples, labels theirs or the null class, t in [0, 1], noise ~ N(0,1)."""
    index = {shard_pixels[i].tobytes(): i for i in range(len(shard_pixels))}
    x0 = np.asarray(flow["x0"], dtype=np.float64)
    u = np.rint((x0 + 1) * 127.5)
    bad = []
    if np.abs(x0 - (u / 127.5 - 1)).max() > 1e-6 or u.min() < 0 or u.max() > 255:
        bad.append("x0 is not u/127.5 - 1 of u8 pixels")
    else:
        u = u.astype(np.uint8)
        steps, G = flow["t"].shape
        for s in range(steps):
            for g in range(G):
                i = index.get(u[s, g].tobytes())
                lab = int(flow["labels"][s, g])
                if i is None:
                    bad.append(f"x0[{s}][{g}] is no sample of the shards")
                elif lab != shard_labels[i] and lab != cfg.n_classes:
                    bad.append(f"labels[{s}][{g}] = {lab}: neither the sample's label "
                               f"{shard_labels[i]} nor the null class {cfg.n_classes}")
                if bad:
                    break
            if bad:
                break
    t = np.asarray(flow["t"], dtype=np.float64)
    if not (np.all(np.isfinite(t)) and t.min() >= 0 and t.max() <= 1) or np.ptp(t) == 0:
        bad.append(f"t outside [0, 1] or constant (min {t.min():.3g} max {t.max():.3g})")
    else:
        cdf = ((lambda v: normal_cdf(np.log(np.clip(v, 1e-300, None)) - np.log1p(-np.clip(v, None, 1 - 1e-16))))
               if o["t_sampling"] == "logit-normal" else (lambda v: v))
        d = ks_distance(t, cdf)
        if d > ks_critical(t.size):
            bad.append(f"t does not look {o['t_sampling']} (KS {d:.3f} > {ks_critical(t.size):.3f})")
    noise = np.asarray(flow["noise"], dtype=np.float64)
    d = ks_distance(noise, normal_cdf)
    if not np.all(np.isfinite(noise)) or d > ks_critical(noise.size):
        bad.append(f"noise does not look N(0, 1) (KS {d:.3f} > {ks_critical(noise.size):.3f})")
    lab = np.asarray(flow["labels"])
    if lab.min() < 0 or lab.max() > cfg.n_classes:
        bad.append(f"labels outside [0, {cfg.n_classes}]")
    n, k = lab.size, int((lab == cfg.n_classes).sum())
    mu, sd = n * o["class_dropout"], math.sqrt(n * o["class_dropout"] * (1 - o["class_dropout"]))
    if abs(k - mu) > 5 * sd + 1:
        bad.append(f"{k} of {n} labels are the null class (dropout {o['class_dropout']})")
    report.add_bool("draws", not bad, "; ".join(bad[:3]) if bad else
                    f"x0 from the shards, labels (null {k}/{n}), t, noise plausible")


def expect_shape(name, arr, shape):
    if tuple(arr.shape) != tuple(shape):
        raise ValueError(f"{name}: shape {list(arr.shape)}, expected {list(shape)}")


def load_train_dumps(out, cfg, tc, micro):
    """-> dict of loom's dumps, shapes validated (raises OSError/KeyError/ValueError)."""
    st = lambda f: safetensors_io.load(os.path.join(out, f))  # noqa: E731
    d = {"init": st("params_init.safetensors"), "grads": st("grads_step1.safetensors"),
         "final": st("params_final.safetensors"), "ema": st("ema_final.safetensors"),
         "flow": st("flow_batch.safetensors"), "pred": st("pred_step1.safetensors")["pred"],
         "metrics": lm.read_metrics(os.path.join(out, "metrics.jsonl"))}
    flow = d["flow"]
    sample = (tc.steps, tc.global_batch) + cfg.sample_shape
    for k in ("x0", "noise"):
        expect_shape(f"flow_batch {k}", flow[k], sample)
    for k in ("t", "labels"):
        expect_shape(f"flow_batch {k}", flow[k], (tc.steps, tc.global_batch))
    if not np.issubdtype(flow["labels"].dtype, np.integer):
        raise ValueError(f"flow_batch labels: dtype {flow['labels'].dtype}, expected int32")
    expect_shape("pred_step1 pred", d["pred"], (micro,) + cfg.sample_shape)
    steps = [r["step"] for r in d["metrics"]]
    if steps != list(range(1, tc.steps + 1)):
        raise ValueError(f"metrics.jsonl: expected steps 1..{tc.steps}, got {steps}")
    return d


def compare_training(report, tag, cfg, tc, micro, start, d):
    """The float64 (and float32) reference from `start`, fed loom's draws, vs loom's dumps."""
    tcm = dt.DiTTrainConfig(**{**tc.__dict__, "micro_batch": micro})
    model = dt.build_model(cfg, torch.float64)
    try:
        dt.load_params(model, start)
    except ValueError as e:
        report.fail(f"params {tag}", str(e))
        return None
    snap = {}

    def on_step(s, info):
        if s == 0:
            snap["pred"] = info["pred0"].numpy().copy()
            snap["grads"] = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}

    hist, ema = dt.train(model, tcm, d["flow"], on_step)
    model32 = dt.build_model(cfg, torch.float32)
    dt.load_params(model32, start)
    snap32 = {}

    def on_step32(s, info):
        if s == 0:
            snap32["pred"] = info["pred0"].numpy().copy()
            snap32["grads"] = {n: p.grad.numpy().copy() for n, p in model32.named_parameters()}

    hist32, ema32 = dt.train(model32, tcm, d["flow"], on_step32)
    m = d["metrics"]

    # Step 1 too takes the fp32 slack (unlike the LM test): the timestep embedding's angles
    # t*1000*freq reach 1000 rad, so fp32 alone puts ~1e-4 errors into cos/sin there.
    report.add(f"pred {tag}", lm.rel_tensor(d["pred"], snap["pred"]),
               f"shape {list(d['pred'].shape)}, max|ref| {np.abs(snap['pred']).max():.3g}",
               max(TOL["pred"], FP32_SLACK * lm.rel_tensor(snap32["pred"], snap["pred"])))
    report.add(f"loss step1 {tag}", lm.rel_scalar(float(m[0]["loss"]), hist[0]["loss"]),
               f"loom {float(m[0]['loss']):.8f} ref {hist[0]['loss']:.8f}",
               max(TOL["loss1"], FP32_SLACK * lm.rel_scalar(hist32[0]["loss"], hist[0]["loss"])))
    zero = sum(1 for g in snap["grads"].values() if not np.any(g))
    compare_named(report, f"grads step1 {tag}", d["grads"], snap["grads"], TOL["grads"],
                  fp32_t=snap32["grads"])
    report.rows[-1] = report.rows[-1][:4] + (report.rows[-1][4] + f", {zero} exactly zero",)
    for key, check in (("loss", "losses"), ("lr", "lr"), ("grad_norm", "grad_norm")):
        errs = [lm.rel_scalar(float(m[s][key]), hist[s][key]) for s in range(tc.steps)]
        tols = [TOL[check] if key == "lr" else
                max(TOL[check], FP32_SLACK * lm.rel_scalar(hist32[s][key], hist[s][key]))
                for s in range(tc.steps)]
        s = max(range(tc.steps), key=lambda i: errs[i] / tols[i])
        report.add(f"{check} {tag}", errs[s], f"step {s + 1}: loom {float(m[s][key]):.8g} "
                                              f"ref {hist[s][key]:.8g}", tols[s])
    for check, loom_t, ref, ref32 in (
            ("final", d["final"], {n: p.detach().numpy() for n, p in model.named_parameters()},
             {n: p.detach().numpy() for n, p in model32.named_parameters()}),
            ("ema", d["ema"], {n: e.numpy() for n, e in ema.items()},
             {n: e.numpy() for n, e in ema32.items()})):
        compare_named(report, f"{check} {tag}", without_null_directions(loom_t, cfg),
                      without_null_directions(ref, cfg), TOL[check], lm.rel_norm,
                      without_null_directions(ref32, cfg))
    clipped = sum(1 for h in hist if tc.grad_clip > 0 and h["grad_norm"] > tc.grad_clip)
    print(f"  {tag} losses ref: {hist[0]['loss']:.4f} -> {hist[-1]['loss']:.4f}; "
          f"clipped steps {clipped}/{tc.steps}; step-1 zero gradients {zero}/{len(snap['grads'])}")
    return hist


def compare_sampler(report, cfg, s, solver, weights, raw_path, png_path):
    W = safetensors_io.load(weights)
    R = safetensors_io.load(raw_path)
    shape = (s["n"],) + cfg.sample_shape
    try:
        for k in ("samples", "noise"):
            expect_shape(f"raw {k}", R[k], shape)
        expect_shape("raw labels", R["labels"], (s["n"],))
    except (KeyError, ValueError) as e:
        report.fail(f"sample {solver}", f"{raw_path}: {type(e).__name__}: {e}")
        return
    ok_lab = bool(np.all(R["labels"] == s["class"]))
    d = ks_distance(R["noise"], normal_cdf)
    ok_noise = bool(np.all(np.isfinite(R["noise"])) and d <= ks_critical(R["noise"].size))
    with open(png_path, "rb") as f:
        ok_png = f.read(8) == b"\x89PNG\r\n\x1a\n"
    report.add_bool(f"sample io {solver}", ok_lab and ok_noise and ok_png,
                    f"labels all {s['class']}: {ok_lab}, noise N(0,1)-like: {ok_noise} "
                    f"(KS {d:.3f}), PNG: {ok_png}")
    out = {}
    for dtype in (torch.float64, torch.float32):
        model = dt.build_model(cfg, dtype)
        dt.load_params(model, W)
        out[dtype] = dt.sample(model, R["noise"], R["labels"], s["steps"], s["cfg"], solver).numpy()
    ref = out[torch.float64]
    tol = max(TOL["samples"], FP32_SLACK * lm.rel_tensor(out[torch.float32], ref))
    report.add(f"samples {solver}", lm.rel_tensor(R["samples"], ref),
               f"N{s['n']} class {s['class']} steps {s['steps']} cfg {s['cfg']}, "
               f"max|ref| {np.abs(ref).max():.3g}", tol)


# ---------------------------------------------------------------- one configuration

def run_config(args, cfg, tc, o, workdir):
    """-> (report, list of the commands run)."""
    report, cmds = Report(), []
    nrng = np.random.default_rng(o["loom_seed"])
    shards = [os.path.join(workdir, f"train_{i:06d}.bin") for i in range(2)]
    parts = [write_shard(p, cfg, n, nrng) for p, n in zip(shards, o["shard_sizes"])]
    shard_labels = np.concatenate([p[0] for p in parts])
    shard_pixels = np.concatenate([p[1] for p in parts])
    data = os.path.join(workdir, "train_*.bin")
    stand_in = StandIn(cfg, tc, o, shards) if args.self_test else None
    loom = args.loom or "loom"

    def train(out, micro, init_from=None):
        cmd = train_command(loom, cfg, tc, o, data, out, micro, init_from)
        cmds.append(cmd)
        if stand_in:
            t0 = time.time()
            return stand_in.train(out, micro, init_from), time.time() - t0
        return run_loom(cmd)

    # Run 1: loom's own initialisation.
    out1 = os.path.join(workdir, "run1")
    err, secs = train(out1, tc.micro_batch)
    print(f"  run 1 (loom init): {secs:.1f} s")
    if err:
        if "unknown option" in err or "'dit'" in err or "unknown command" in err:
            err += "  [this loom has no dit family / loom sample yet?]"
        report.fail("loom train", err)
        return report, cmds
    try:
        d1 = load_train_dumps(out1, cfg, tc, tc.micro_batch)
    except (OSError, KeyError, ValueError) as e:
        report.fail("dumps run1", f"{type(e).__name__}: {e}")
        return report, cmds
    check_init(report, d1["init"], cfg)
    check_draws(report, d1["flow"], cfg, o, shard_labels, shard_pixels)
    compare_training(report, "[1]", cfg, tc, tc.micro_batch, d1["init"], d1)

    # Run 2: random non-zero weights through --init-from, another micro-batch size.
    start = dt.random_weights(cfg, o["init_seed"])
    init_file = os.path.join(workdir, "random_init.safetensors")
    safetensors_io.save(init_file, start,
                        read_metadata(os.path.join(out1, "params_init.safetensors")))
    out2 = os.path.join(workdir, "run2")
    err, secs = train(out2, o["micro2"], init_file)
    print(f"  run 2 (--init-from random weights, micro-batch {o['micro2']}): {secs:.1f} s")
    if err:
        report.fail("loom train [2]", err)
        return report, cmds
    try:
        d2 = load_train_dumps(out2, cfg, tc, o["micro2"])
    except (OSError, KeyError, ValueError) as e:
        report.fail("dumps run2", f"{type(e).__name__}: {e}")
        return report, cmds
    same = all(np.array_equal(d1["flow"][k], d2["flow"][k]) for k in ("x0", "noise", "t", "labels"))
    report.add_bool("draws [1]==[2]", same, f"flow_batch identical with --micro-batch "
                                            f"{tc.micro_batch} and {o['micro2']}")
    compare_training(report, "[2]", cfg, tc, o["micro2"], start, d2)

    # The sampler, from run 2's exported weights.
    weights = os.path.join(out2, "weights.safetensors")
    try:
        W = safetensors_io.load(weights)
        names_ok = set(W) == set(dt.param_names(cfg))
        which = [k for k in ("final", "ema") if names_ok and
                 all(np.array_equal(W[n], d2[k][n]) for n in W)]
        report.add_bool("weights [2]", names_ok and bool(which),
                        f"--save-weights = {' and '.join(which)} weights" if which else
                        f"names match: {names_ok}; equal neither params_final nor ema_final")
    except (OSError, ValueError) as e:
        report.fail("weights [2]", f"{type(e).__name__}: {e}")
        return report, cmds
    s = o["sample"]
    for solver in ("euler", "heun"):
        raw = os.path.join(workdir, f"raw_{solver}.safetensors")
        png = os.path.join(workdir, f"grid_{solver}.png")
        cmd = sample_command(loom, weights, s, solver, raw, png)
        cmds.append(cmd)
        if stand_in:
            err = stand_in.sample(weights, s, solver, raw, png)
        else:
            err, secs = run_loom(cmd)
        if err:
            if "unknown command" in err or "unknown option" in err:
                err += "  [this loom has no `loom sample` (or not these flags) yet?]"
            report.fail(f"loom sample {solver}", err)
            continue
        try:
            compare_sampler(report, cfg, s, solver, weights, raw, png)
        except (OSError, KeyError, ValueError) as e:
            report.fail(f"sample {solver}", f"{type(e).__name__}: {e}")
    return report, cmds


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loom", help="path to the loom binary")
    ap.add_argument("--self-test", action="store_true",
                    help="no loom: a float32 PyTorch stand-in writes loom's files")
    ap.add_argument("--seed", type=int, default=None, help="draw seed (random if omitted)")
    ap.add_argument("--configs", type=int, default=None,
                    help="configurations to draw (default 6; 3 with --self-test)")
    ap.add_argument("--only", type=int, default=None, help="run only configuration #i")
    ap.add_argument("--keep", action="store_true", help="keep the work directories")
    args = ap.parse_args()
    if args.self_test == bool(args.loom):
        ap.error("give --loom PATH or --self-test (one of them)")
    if args.loom:
        args.loom = os.path.abspath(args.loom)
        loomtest.check_loom(args.loom)
    if args.configs is None:
        args.configs = 3 if args.self_test else 6

    seed = args.seed if args.seed is not None else random.SystemRandom().randint(1, 10**9)
    torch.set_num_threads(2)
    print("reference self-check (check_dit_torch.py):")
    if not loomtest.check(check_dit_torch.main() == 0):
        print("the DiT reference failed its own self-check; not comparing")
        return
    rng = random.Random(seed)
    mode = "SELF-TEST (float32 PyTorch stands in for loom)" if args.self_test else args.loom
    print(f"\ntest_dit_vs_torch: seed {seed}, {args.configs} configurations, {STEPS} steps, "
          f"{mode}")
    failures, ran, t_start = [], 0, time.time()
    for i in range(args.configs):
        cfg, tc, o = draw_config(rng, i)  # draw all, so --only reproduces config i
        if args.only is not None and i != args.only:
            continue
        print(f"\n[config {i}] {describe(cfg, tc, o)}")
        workdir = tempfile.mkdtemp(prefix=f"loom_dit_ref_{i}_")
        t0 = time.time()
        report, cmds = run_config(args, cfg, tc, o, workdir)
        ran += 1
        report.print()
        print(f"  time: {time.time() - t0:.1f} s")
        if report.ok and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"  work dir kept: {workdir}")
        if not loomtest.check(report.ok):
            failures.append((i, cmds))

    print(f"\n{ran - len(failures)} passed, {len(failures)} failed, "
          f"{time.time() - t_start:.1f} s (seed {seed})")
    if failures:
        me = os.path.abspath(__file__)
        how = "--self-test" if args.self_test else f"--loom {args.loom}"
        for i, cmds in failures:
            print(f"\nFAILED config {i}. Reproduce with:\n"
                  f"  /usr/bin/python3 {me} {how} --seed {seed} --configs {args.configs} "
                  f"--only {i} --keep")
            for cmd in cmds:
                print(f"  command: {shlex.join(cmd)}")


if __name__ == "__main__":
    loomtest.run_test(main)
