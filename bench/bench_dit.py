#!/usr/bin/python3
"""DiT training and sampling speed: loom vs the PyTorch reference DiT, on CPU.

Same model (dit-tiny: 4 layers, 4 heads, d_model 128, d_ff 512, patch 4 on 28 x 28 x 1
images, 10 classes: 49 tokens per image), same batch, same threads (--threads, default 2)
and the same OpenBLAS kernel for both (--coretype, as bench/bench_train.py: both processes
get OPENBLAS_CORETYPE, OMP_WAIT_POLICY=PASSIVE and the thread counts before BLAS loads).

1. Training: `loom train --family dit` on a shard of real Fashion-MNIST training images
   (written here in loom's image-shard format) against tests/reference/dit_torch.py's
   train_step (float32, AdamW + EMA like loom, flow-matching draws from numpy). Steady
   state: the median of the measured steps after --warmup steps; images/s = global batch /
   step time, tokens/s = images/s x 49.
2. Sampling: `loom sample` with the weights loom just saved (--sample-n images of one
   class, --sample-steps Euler steps, --cfg) against dit_torch.sample on the same weights,
   noise and labels, in batches of the same size; time per image (model load excluded on
   both sides: loom's figure is the one it prints, around the sampling loop alone).

The last line of output is one JSON object. Until loom has `loom train --family dit`
and `loom sample`, the script stops with a message saying so.

Usage: /usr/bin/python3 bench/bench_dit.py --loom build/loom
"""

import argparse
import gzip
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

import torch_peer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "reference"))

FMNIST = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
FMNIST_LABELS = "/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz"
SHARD_MAGIC, SHARD_VERSION = 20261202, 1

# dit-tiny, the fields of dit_torch.DiTConfig (and loom's --flags of the same names)
DIT_TINY = {"n_layer": 4, "n_head": 4, "d_model": 128, "d_ff": 512, "patch": 4, "height": 28,
            "width": 28, "channels": 1, "n_classes": 10, "patch_t": 1, "frames": 1}
# The optimiser of both runs (loom's flags / dit_torch.DiTTrainConfig's fields).
TRAIN = {"lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 2, "weight_decay": 0.0, "grad_clip": 1.0,
         "beta1": 0.9, "beta2": 0.999, "adam_eps": 1e-8, "ema_decay": 0.999}


def read_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def write_shard(path, n):
    """The first n Fashion-MNIST training images as one image shard (/work/dit_spec.md:
    a 1024-byte header of 256 int32, n int32 labels, n*F*C*H*W u8 pixels)."""
    images, labels = read_idx(FMNIST)[:n], read_idx(FMNIST_LABELS)[:n]
    c = DIT_TINY
    header = np.zeros(256, dtype="<i4")
    header[:8] = [SHARD_MAGIC, SHARD_VERSION, n, c["frames"], c["channels"], c["height"],
                  c["width"], c["n_classes"]]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(labels.astype("<i4").tobytes())
        f.write(np.ascontiguousarray(images).tobytes())


def check_loom(args):
    """Stops with a clear message unless this loom trains and samples dit models."""
    env = torch_peer.blas_env(args.threads, args.coretype)
    help_train = subprocess.run([args.loom, "train", "--help"], capture_output=True, text=True,
                                env=env)
    text = help_train.stdout + help_train.stderr
    if not re.search(r"--family\b.*\bdit\b", text):
        sys.exit(f"{args.loom}: this loom has no `loom train --family dit` yet (its train "
                 "--help lists no dit family); build one with the dit model to run this bench")
    help_sample = subprocess.run([args.loom, "sample", "--help"], capture_output=True, text=True,
                                 env=env)
    if help_sample.returncode != 0:
        sys.exit(f"{args.loom}: this loom has no `loom sample` yet (exit "
                 f"{help_sample.returncode}: {(help_sample.stderr or '').strip()[:200]})")


def run_loom_train(args, workdir, steps):
    data = os.path.join(workdir, "train_000000.bin")
    write_shard(data, args.shard_images)
    metrics = os.path.join(workdir, "metrics.jsonl")
    weights = os.path.join(workdir, "weights.safetensors")
    c, t = DIT_TINY, TRAIN
    cmd = [args.loom, "train", "--family", "dit", "--n-layer", c["n_layer"], "--n-head",
           c["n_head"], "--d-model", c["d_model"], "--d-ff", c["d_ff"], "--patch", c["patch"],
           "--patch-t", c["patch_t"], "--frames", c["frames"], "--height", c["height"],
           "--width", c["width"], "--channels", c["channels"], "--n-classes", c["n_classes"],
           "--data", data, "--micro-batch", args.micro_batch, "--global-batch", args.batch,
           "--steps", steps, "--lr", t["lr"], "--min-lr", t["min_lr"], "--warmup-steps",
           t["warmup_steps"], "--weight-decay", t["weight_decay"], "--grad-clip",
           t["grad_clip"], "--beta1", t["beta1"], "--beta2", t["beta2"], "--adam-eps",
           t["adam_eps"], "--ema-decay", t["ema_decay"], "--threads", args.threads,
           "--metrics", metrics, "--log-every", 1, "--seed", 1, "--save-weights", weights]
    cmd = [str(x) for x in cmd]
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          env=torch_peer.blas_env(args.threads, args.coretype))
    if proc.returncode != 0:
        sys.exit(f"loom train failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    rows = [json.loads(line) for line in open(metrics) if line.strip()]
    rows = [r for r in rows if "step" in r and "step_ms" in r]
    measured = rows[args.warmup:]
    if not measured:
        sys.exit("loom: no steps left after warm-up; raise --steps")
    secs = [r["step_ms"] / 1000.0 for r in measured]
    losses = [r.get("loss") for r in rows]
    return secs, losses, weights


def run_loom_sample(args, weights, workdir):
    raw = os.path.join(workdir, "samples.safetensors")
    cmd = [args.loom, "sample", "--weights", weights, "--class", 0, "--n", args.sample_n,
           "--steps", args.sample_steps, "--cfg", args.cfg, "--solver", "euler", "--seed", 1,
           "--batch", args.sample_batch, "--threads", args.threads,
           "-o", os.path.join(workdir, "grid.png"), "--raw", raw]
    cmd = [str(x) for x in cmd]
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          env=torch_peer.blas_env(args.threads, args.coretype))
    if proc.returncode != 0:
        sys.exit(f"loom sample failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    found = re.search(r"sampled (\d+) images in ([\d.]+) s: ([\d.]+) ms per image", proc.stdout)
    if not found:
        sys.exit(f"loom sample: no timing line in its output:\n{proc.stdout[-1000:]}")
    return float(found.group(3)) / 1000.0, raw


def run_torch(args, mode, extra):
    spec = dict(extra, mode=mode, threads=args.threads, config=DIT_TINY, train=TRAIN,
                micro=args.micro_batch, batch=args.batch)
    cmd = torch_peer.worker_command(__file__, spec)
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          env=torch_peer.blas_env(args.threads, args.coretype))
    if proc.returncode != 0:
        sys.exit(f"torch worker ({mode}) failed (exit {proc.returncode}):\n"
                 f"{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        dt = {"F32": "<f4", "I32": "<i4"}[e["dtype"]]
        a, b = e["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=dt).reshape(e["shape"])
    return out


def torch_worker(spec_json):
    """In a child process, so the BLAS environment is in place before torch loads."""
    import torch
    import dit_torch as dt
    spec = json.loads(spec_json)
    torch.set_num_threads(spec["threads"])
    cfg = dt.DiTConfig(**spec["config"])
    model = dt.build_model(cfg, torch.float32)
    if spec["mode"] == "train":
        dt.init_dit(model, seed=1)
        tc = dt.DiTTrainConfig(steps=spec["steps"], micro_batch=spec["micro"],
                               global_batch=spec["batch"], **spec["train"])
        opt = dt.make_optimizer(model, tc)
        ema = dt.ema_init(model)
        rng = np.random.default_rng(1)
        images = read_idx(FMNIST)[:spec["shard_images"]]
        labels = read_idx(FMNIST_LABELS)[:spec["shard_images"]].astype(np.int64)
        G, secs, losses = spec["batch"], [], []
        for s in range(tc.steps):
            pick = rng.integers(0, len(images), G)
            x0 = torch.from_numpy(images[pick].astype(np.float32) / 127.5 - 1.0)[:, None, None]
            noise = torch.from_numpy(rng.standard_normal(x0.shape).astype(np.float32))
            t = torch.sigmoid(torch.from_numpy(rng.standard_normal(G).astype(np.float32)))
            y = torch.from_numpy(labels[pick])
            drop = torch.from_numpy(rng.random(G) < 0.1)
            y = torch.where(drop, torch.full_like(y, cfg.null_class), y)
            t0 = time.perf_counter()
            info = dt.train_step(model, opt, ema, tc, (x0, noise, t, y), s)  # .item() syncs
            secs.append(time.perf_counter() - t0)
            losses.append(info["loss"])
            print(f"  torch step {s + 1}/{tc.steps}: loss {info['loss']:.4f} "
                  f"{secs[-1] * 1000:.0f} ms", file=sys.stderr, flush=True)
        print(json.dumps({"step_seconds": secs, "losses": losses,
                          "n_params": sum(p.numel() for p in model.parameters())}))
    else:
        W = read_safetensors(spec["weights"])
        dt.load_params(model, {n: W[n] for n in dt.param_names(cfg)})
        R = read_safetensors(spec["raw"])
        noise, labels = R["noise"], R["labels"]
        B, secs, out = spec["sample_batch"], 0.0, []
        for i in range(0, len(labels), B):
            t0 = time.perf_counter()
            x = dt.sample(model, noise[i:i + B], labels[i:i + B], spec["steps"], spec["cfg"],
                          "euler")
            secs += time.perf_counter() - t0
            out.append(x.numpy())
        x = np.concatenate(out)
        rel = float(np.linalg.norm(x - R["samples"]) / max(np.linalg.norm(x), 1e-30))
        print(json.dumps({"seconds_per_image": secs / len(labels), "rel_diff_vs_loom": rel}))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loom", help="path to the loom binary")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64, help="global batch (images per step)")
    ap.add_argument("--micro-batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=8, help="measured training steps")
    ap.add_argument("--warmup", type=int, default=2, help="training steps excluded from timing")
    ap.add_argument("--shard-images", type=int, default=4096,
                    help="Fashion-MNIST training images in the shard")
    ap.add_argument("--sample-n", type=int, default=32, help="images sampled")
    ap.add_argument("--sample-batch", type=int, default=32,
                    help="images per model evaluation (loom --batch; torch's batch)")
    ap.add_argument("--sample-steps", type=int, default=20)
    ap.add_argument("--cfg", type=float, default=1.0, help="guidance scale of both samplers")
    ap.add_argument("--coretype", default=torch_peer.default_coretype(),
                    help="OPENBLAS_CORETYPE for loom and PyTorch alike (default: loom's own "
                         "choice for this CPU, SkylakeX with AVX-512, else Haswell)")
    args = torch_peer.parse_args(ap, torch_worker)
    check_loom(args)
    t_start = time.time()
    tokens = (DIT_TINY["height"] // DIT_TINY["patch"]) * (DIT_TINY["width"] // DIT_TINY["patch"])
    steps = args.warmup + args.steps
    print(f"[dit-tiny] L{DIT_TINY['n_layer']} H{DIT_TINY['n_head']} D{DIT_TINY['d_model']} "
          f"F{DIT_TINY['d_ff']} p{DIT_TINY['patch']} 28x28x1, {tokens} tokens/image; batch "
          f"{args.batch} (micro {args.micro_batch}), {steps} steps ({args.warmup} warm-up), "
          f"{args.threads} threads, OPENBLAS_CORETYPE={args.coretype}", flush=True)
    with tempfile.TemporaryDirectory(prefix="loom_bench_dit_") as workdir:
        loom_secs, loom_losses, weights = run_loom_train(args, workdir, steps)
        loom_ips = args.batch / float(np.median(loom_secs))
        print(f"  loom : {loom_ips:8.1f} images/s (steps {[round(s, 3) for s in loom_secs]} s)",
              flush=True)
        tr = run_torch(args, "train", {"steps": steps, "shard_images": args.shard_images})
        torch_secs = tr["step_seconds"][args.warmup:]
        torch_ips = args.batch / float(np.median(torch_secs))
        print(f"  torch: {torch_ips:8.1f} images/s (steps {[round(s, 3) for s in torch_secs]} s)",
              flush=True)
        print(f"  losses: loom {loom_losses[0]:.4f} -> {loom_losses[-1]:.4f}, torch "
              f"{tr['losses'][0]:.4f} -> {tr['losses'][-1]:.4f}", flush=True)
        loom_spi, raw = run_loom_sample(args, weights, workdir)
        ts = run_torch(args, "sample", {"weights": weights, "raw": raw, "steps":
                                        args.sample_steps, "cfg": args.cfg,
                                        "sample_batch": args.sample_batch})
        print(f"  sampling ({args.sample_steps} Euler steps, cfg {args.cfg}, batch "
              f"{args.sample_batch}): loom {loom_spi * 1000:.1f} ms/image, torch "
              f"{ts['seconds_per_image'] * 1000:.1f} ms/image (samples differ by "
              f"{ts['rel_diff_vs_loom']:.2e} relative)", flush=True)
    result = {
        "config": "dit-tiny", "threads": args.threads, "openblas_coretype": args.coretype,
        "batch": args.batch, "micro_batch": args.micro_batch, "tokens_per_image": tokens,
        "params": tr["n_params"],
        "train": {"loom_images_per_s": round(loom_ips, 2),
                  "torch_images_per_s": round(torch_ips, 2),
                  "loom_tokens_per_s": round(loom_ips * tokens, 1),
                  "torch_tokens_per_s": round(torch_ips * tokens, 1),
                  "loom_vs_torch": round(loom_ips / torch_ips, 3)},
        "sample": {"steps": args.sample_steps, "cfg": args.cfg, "solver": "euler",
                   "n": args.sample_n, "batch": args.sample_batch,
                   "loom_ms_per_image": round(loom_spi * 1000, 2),
                   "torch_ms_per_image": round(ts["seconds_per_image"] * 1000, 2),
                   "loom_vs_torch": round(ts["seconds_per_image"] / loom_spi, 3),
                   "rel_diff_vs_loom": ts["rel_diff_vs_loom"]},
        "wall_s": round(time.time() - t_start, 1),
    }
    print()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
