#!/usr/bin/python3
"""loom's `vlm` family vs PyTorch (vlm_torch.py, float64): the loss and every gradient of
step 1 on random configurations, each with random freezing.

Each configuration draws a ViT (patch 2-4, a 1-3 x 1-3 patch grid, 1 or 3 channels, 1-2
blocks, odd MLP widths), a Llama decoder (1-2 blocks, grouped-query, odd vocabularies),
1-3 image slots per sample and a sequence just long enough; writes a vlm shard (the
docs/vlm.md format) whose samples hold 0 to max images with markers anywhere a token
follows them, random bytes and random answer masks; runs `loom train --family vlm --steps
1 --dump-dir` with --freeze of a random subset (sometimes none), then checks:
- every record loom trained on (tokens.safetensors) is the record this file builds from
  some sample of the shard (expansion, padding, weights, pixels);
- the step-1 loss (metrics) against the reference's, relative error <= 1e-5;
- every gradient of a trained part (grads_step1.safetensors) against autograd's, max abs
  error / max abs reference <= 1e-5; frozen parts' gradients are all zero (none is
  computed) and their weights after the step equal the initial ones (no AdamW update).
Usage: /usr/bin/python3 tests/reference/test_vlm_vs_torch.py --loom build/loom [--seed S]
       [--configs N] [--only I] [--keep]
"""

import argparse
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import loomtest  # noqa: E402
import safetensors_io  # noqa: E402
import torch  # noqa: E402
import torch_model as tm  # noqa: E402
import vlm_torch as vt  # noqa: E402

TOL = 1e-5
FREEZE_ON = True
MAGIC, VERSION, IMAGE, EOT = 20261205, 1, 256, 257
FREEZE = ["", "", "vision", "projector", "llm", "vision,projector", "vision,llm",
          "projector,llm"]


def draw(rng):
    p = rng.choice([2, 3, 4])
    gh, gw = rng.randint(1, 3), rng.randint(1, 3)
    Hv = rng.randint(1, 3)
    # encoder width >= 8: a LayerNorm over 4 features cancels too much for 1e-5 in fp32
    # (seed 270119850: a norm bias's gradient off by 1.4e-5)
    hdv = rng.choice([8]) if Hv == 1 else rng.choice([4, 8]) if Hv % 2 else rng.choice([4, 6])
    vc = vt.VitConfig(patch=p, height=p * gh, width=p * gw, channels=rng.choice([1, 3]),
                      n_layer=rng.randint(1, 2), n_head=Hv, d_model=Hv * hdv,
                      d_ff=rng.randint(5, 40))
    H = rng.choice([2, 4])
    KV = rng.choice([k for k in (1, 2, 4) if H % k == 0])
    hd = rng.choice([4, 6, 8])
    max_images = rng.randint(1, 3)
    P = vc.image_tokens
    T = max_images * P + rng.randint(6, 16)
    cfg = tm.Config(family="llama", n_layer=rng.randint(1, 2), n_head=H, n_kv_head=KV,
                    d_model=H * hd, d_ff=rng.randint(7, 50), vocab_size=rng.randint(258, 300),
                    seq_len=T)
    micro = rng.randint(1, 3)
    o = {"max_images": max_images, "micro": micro, "G": micro * rng.randint(1, 2),
         "freeze": rng.choice(FREEZE) if FREEZE_ON else "", "seed": rng.randint(1, 2**31 - 1),
         "n_samples": rng.randint(4, 10)}
    return cfg, vc, o


def make_samples(rng, cfg, vc, o):
    """Random samples that fit: (tokens, mask, images u8 [n, C, H, W])."""
    T, P = cfg.seq_len, vc.image_tokens
    out = []
    while len(out) < o["n_samples"]:
        n = rng.randint(0, o["max_images"])
        budget = T + 1 - n * P
        n_text = rng.randint(max(1, n), max(1, budget))
        text = [rng.randint(0, 255) if rng.random() < 0.9 else EOT for _ in range(n_text)]
        # markers before text positions (each followed by a token)
        for _ in range(n):
            text.insert(rng.randint(0, len(text) - 1), IMAGE)
        mask = [0 if t == IMAGE else int(rng.random() < 0.6) for t in text]
        imgs = np.array([[[[rng.randint(0, 255) for _ in range(vc.width)]
                           for _ in range(vc.height)] for _ in range(vc.channels)]
                         for _ in range(n)], dtype=np.uint8).reshape(n, vc.channels, vc.height,
                                                                      vc.width)
        S = vc.channels * vc.height * vc.width
        if vt.expand(text, mask, imgs, IMAGE, EOT, T, P, o["max_images"], S) is None:
            continue
        out.append((text, mask, imgs))
    return out


def write_shard(path, samples, vc):
    tokens = [t for s in samples for t in s[0]]
    mask = [m for s in samples for m in s[1]]
    n_img = sum(len(s[2]) for s in samples)
    h = np.zeros(256, dtype="<i4")
    h[:11] = [MAGIC, VERSION, len(samples), vc.channels, vc.height, vc.width, IMAGE, EOT,
              max(tokens) + 1, len(tokens), n_img]
    entries, tok, img = [], 0, 0
    for s in samples:
        entries += [tok, len(s[0]), img, len(s[2])]
        tok += len(s[0])
        img += len(s[2])
    with open(path, "wb") as f:
        f.write(h.tobytes())
        f.write(np.array(entries, dtype="<i4").tobytes())
        f.write(np.array(tokens, dtype="<i4").tobytes())
        f.write(np.array(mask, dtype=np.uint8).tobytes())
        for s in samples:
            f.write(np.ascontiguousarray(s[2]).tobytes())


def command(loom, cfg, vc, o, data, out):
    cmd = [loom, "train", "--family", "vlm", "--n-layer", cfg.n_layer, "--n-head", cfg.n_head,
           "--n-kv-head", cfg.n_kv_head, "--d-model", cfg.d_model, "--d-ff", cfg.d_ff,
           "--vocab-size", cfg.vocab_size, "--seq-len", cfg.seq_len,
           "--vit-layers", vc.n_layer, "--vit-d-model", vc.d_model, "--vit-n-head", vc.n_head,
           "--vit-d-ff", vc.d_ff, "--vit-patch", vc.patch, "--height", vc.height,
           "--width", vc.width, "--channels", vc.channels, "--max-images", o["max_images"],
           "--data", data, "--micro-batch", o["micro"], "--global-batch", o["G"],
           "--steps", 1, "--lr", "1e-3", "--warmup-steps", 0, "--seed", o["seed"],
           "--threads", 1, "--dump-dir", out, "--metrics", os.path.join(out, "metrics.jsonl")]
    if o["freeze"]:
        cmd += ["--freeze", o["freeze"]]
    return [str(c) for c in cmd]


def part(name):
    return ("vision" if name.startswith("vision.") else
            "projector" if name.startswith("projector.") else "llm")


def run_config(loom, cfg, vc, o, work, rng):
    samples = make_samples(rng, cfg, vc, o)
    data = os.path.join(work, "train_000000.bin")
    write_shard(data, samples, vc)
    out = os.path.join(work, "out")
    cmd = command(loom, cfg, vc, o, data, out)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        loomtest.check(False, f"loom train failed: {proc.stderr.strip().splitlines()[-3:]}")
        return cmd
    T, P = cfg.seq_len, vc.image_tokens
    S = vc.channels * vc.height * vc.width
    words = 2 * T + 2 + o["max_images"] * S
    recs = safetensors_io.load(os.path.join(out, "tokens.safetensors"))["tokens"]
    recs = recs.reshape(-1, words)[:o["G"]]
    built = [vt.expand(s[0], s[1], s[2], IMAGE, EOT, T, P, o["max_images"], S) + (len(s[2]),)
             for s in samples]
    batch, ok = [], True
    for r in recs:
        tok = r[:T + 1].astype(np.int64)
        w = r[T + 1:2 * T + 1].view(np.float32).astype(np.float64)
        n = int(r[2 * T + 1])
        px = r[2 * T + 2:].view(np.float32).reshape(o["max_images"], S).astype(np.float64)
        match = [b for b in built if np.array_equal(b[0], tok) and b[3] == n and
                 np.allclose(b[1], w, rtol=1e-6, atol=0) and np.allclose(b[2], px, atol=1e-6)]
        ok &= len(match) > 0
        if match:
            b = match[0]
            batch.append((b[0], b[1], b[3], b[2]))
    loomtest.check(ok, f"  records: {len(recs)} records equal to records built from the shard")
    if not ok:
        return cmd
    init = safetensors_io.load(os.path.join(out, "params_init.safetensors"))
    final = safetensors_io.load(os.path.join(out, "params_final.safetensors"))
    grads = safetensors_io.load(os.path.join(out, "grads_step1.safetensors"))
    model = vt.VLM(cfg, vc).to(torch.float64)
    tm.load_params(model, init)
    frozen = set(o["freeze"].split(",")) if o["freeze"] else set()
    for n, p in model.named_parameters():
        p.requires_grad_(part(n) not in frozen)
    loss = vt.loss_of(model, batch, T, P, vc, o["G"])
    if loss.requires_grad:  # else no image in the batch reaches the only trained part
        loss.backward()
    with open(os.path.join(out, "metrics.jsonl")) as f:
        loom_loss = json.loads(f.readline())["loss"]
    # a batch without answer tokens has loss 0: then the absolute error
    err = abs(loom_loss - loss.item()) / max(abs(loss.item()), 1.0 if loss.item() == 0 else 0.0)
    loomtest.check(err <= TOL, f"  loss {loom_loss:.8f} vs {loss.item():.8f}: rel {err:.2e}")
    worst, worst_name, missing = 0.0, "", []
    for n, p in model.named_parameters():
        if part(n) in frozen:
            if n in grads and np.any(grads[n] != 0):
                missing.append(f"{n} has a gradient")
            if not np.array_equal(final[n], init[n]):
                missing.append(f"{n} moved")
            continue
        if n not in grads:
            missing.append(f"{n} absent")
            continue
        ref = p.grad.numpy() if p.grad is not None else np.zeros(p.shape)  # no image
        scale = np.abs(ref).max()
        e = np.abs(grads[n] - ref).max() / scale if scale > 0 else np.abs(grads[n]).max()
        if e > worst:
            worst, worst_name = e, n
    loomtest.check(not missing, f"  frozen/trained tensors as expected {missing[:3]}")
    loomtest.check(worst <= TOL, f"  gradients: worst {worst:.2e} ({worst_name})")
    return cmd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", required=True)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--configs", type=int, default=6)
    ap.add_argument("--only", type=int)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    loom = os.path.abspath(a.loom)
    loomtest.check_loom(loom)
    seed = a.seed if a.seed is not None else random.SystemRandom().randint(1, 10**9)
    print(f"test_vlm_vs_torch: seed {seed}")
    torch.set_num_threads(1)
    rng = random.Random(seed)
    for i in range(a.configs):
        cfg, vc, o = draw(rng)
        crng = random.Random(rng.randint(0, 2**31))
        if a.only is not None and i != a.only:
            continue
        print(f"[config {i}] vit p{vc.patch} {vc.channels}x{vc.height}x{vc.width} "
              f"L{vc.n_layer} D{vc.d_model} H{vc.n_head} F{vc.d_ff} | llama L{cfg.n_layer} "
              f"H{cfg.n_head}/{cfg.n_kv_head} D{cfg.d_model} F{cfg.d_ff} V{cfg.vocab_size} "
              f"T{cfg.seq_len} | images<={o['max_images']} M{o['micro']} G{o['G']} "
              f"freeze '{o['freeze']}'")
        work = tempfile.mkdtemp(prefix=f"loom_vlm_ref_{i}_")
        before = loomtest.failed()
        cmd = run_config(loom, cfg, vc, o, work, crng)
        failed = loomtest.failed() > before
        if failed or a.keep:
            print(f"  kept {work}; reproduce: --seed {seed} --only {i}\n  {shlex.join(cmd)}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    loomtest.run_test(main)
