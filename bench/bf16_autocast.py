#!/usr/bin/python3
"""loom --precision bf16 against PyTorch 1.13's own CPU autocast (bf16), on the demo's model.

One run, four trainings of configs/demo.ini's model (GPT-2, 4 layers, d_model 256, d_ff
1024, vocab 4096, T 128; micro-batch 16, global batch 32; AdamW lr 2e-3 -> min 2e-4,
warmup 20, cosine over --steps, weight decay 0.1 on the matrices, clip 1.0, betas
0.9/0.95, eps 1e-8: loom's defaults), from the same initial weights on the same batches
in the same order:
  1. `loom train --precision bf16` (with --dump-dir: its initial weights and every batch),
  2. PyTorch (tests/reference/torch_model.py) with `torch.autocast("cpu",
     dtype=torch.bfloat16)` around forward and loss, the master weights fp32, AdamW fp32,
  3. `loom train` in fp32,
  4. PyTorch in fp32,
in that order (the two compared for speed run back to back). PyTorch loads loom's
initial weights (params_init.safetensors) and replays loom's batches (tokens.safetensors);
both loom runs must have drawn the same ones (checked).

Reports the per-step losses and their relative differences |a - b| / |b| (max over the
steps, at the final step, and the mean of the last 10 steps): loom bf16 against torch
autocast (the issue's target: within 1%), loom fp32 against torch fp32 and loom bf16
against loom fp32 (context: how far two correct fp32 codes drift apart, and how far bf16
moves loom), torch autocast against torch fp32. Speed: tokens/s of the median step after
--warmup steps, loom bf16 against torch autocast (the issue's target: >= 2x), and the fp32
pair; same threads (--threads: loom --threads, torch.set_num_threads, OMP and OpenBLAS),
the same OpenBLAS kernel (OPENBLAS_CORETYPE as the environment sets it; each side's kernel
is read back and named in the JSON). The machine's load average is recorded per run.

Data (--data): the demo's KJV shards (data/kjv/bpe/train_*.bin, made by scripts/demo.sh
or by hand with `loom tokenizer train` and `loom data prepare`) when they exist, else a
shard of English-like byte text written to a temporary folder (tokens < 256 of the 4096).

--quick: a smoke run of seconds (3 steps, micro-batch 2, global 4, T 32; both PyTorch modes
in one worker after the two loom runs, one torch import); its figures mean nothing.
The last line of output is one JSON object (bench/README.md).

Usage: /usr/bin/python3 bench/bf16_autocast.py --loom build/loom [--steps 300] [--quick]
"""

import argparse
import configparser
import ctypes
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

import torch_peer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
sys.path.insert(0, os.path.join(ROOT, "tests", "harness"))
import safetensors_io  # noqa: E402
import torch_model as tm  # noqa: E402  (torch itself is imported only by the worker)

DEMO = os.path.join(ROOT, "configs", "demo.ini")
TARGET_LOSS, TARGET_SPEED = 0.01, 2.0


def demo_config(path):
    """The model and training settings of configs/demo.ini."""
    ini = configparser.ConfigParser()
    if not ini.read(path) or not ini.has_section("model") or not ini.has_section("train"):
        print(f"--config {path}: expected a loom config file with [model] and [train]",
              file=sys.stderr)
        sys.exit(2)
    md, tr = ini["model"], ini["train"]
    if md.get("family") != "gpt2":
        print(f"--config {path}: family {md.get('family')}: expected gpt2", file=sys.stderr)
        sys.exit(2)
    m = tm.Config("gpt2", md.getint("n_layer"), md.getint("n_head"), md.getint("n_head"),
                  md.getint("d_model"), md.getint("d_ff"), md.getint("vocab_size"),
                  md.getint("seq_len"))
    t = tm.TrainConfig(steps=tr.getint("steps"), micro_batch=tr.getint("micro_batch"),
                       global_batch=tr.getint("global_batch"), lr=tr.getfloat("lr"),
                       min_lr=tr.getfloat("min_lr"), warmup_steps=tr.getint("warmup_steps"),
                       weight_decay=tr.getfloat("weight_decay"),
                       grad_clip=tr.getfloat("grad_clip"))
    return m, t, tr.getint("seed"), tr.get("data")


def load_avg():
    return round(os.getloadavg()[0], 2)


def write_byte_shard(path, n_tokens, seed):
    """English-like text as byte tokens (loomtest.write_text_shard's words), llm.c format."""
    import random
    rng = random.Random(seed)
    words = ("the of and to in is was that for on with as by at from his her they which one "
             "all were we when there can an your said each she do how their if will up other "
             "about out many then them these so some would make").split()
    text = b""
    while len(text) < n_tokens:
        text += (" ".join(rng.choice(words) for _ in range(10000)) + " ").encode()
    text = text[:n_tokens]
    header = np.zeros(256, dtype="<i4")
    header[:3] = [20240520, 1, len(text)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.frombuffer(text, dtype=np.uint8).astype("<u2").tobytes())


def loom_command(args, m, t, seed, data, out, precision):
    cmd = [args.loom, "train", "--model", "gpt2-tiny", "--n-layer", m.n_layer, "--n-head",
           m.n_head, "--d-model", m.d_model, "--d-ff", m.d_ff, "--vocab-size", m.vocab_size,
           "--seq-len", m.seq_len, "--norm-eps", m.norm_eps, "--data", data,
           "--micro-batch", t.micro_batch, "--global-batch", t.global_batch,
           "--steps", t.steps, "--lr", repr(t.lr),
           "--min-lr", repr(t.min_lr), "--warmup-steps", t.warmup_steps, "--weight-decay",
           t.weight_decay, "--grad-clip", t.grad_clip, "--beta1", t.beta1, "--beta2", t.beta2,
           "--adam-eps", t.adam_eps, "--seed", seed, "--threads", args.threads,
           "--metrics", os.path.join(out, "metrics.jsonl"), "--dump-dir", out,
           "--log-every", max(1, t.steps // 10), "--precision", precision]
    return [str(c) for c in cmd]


def run_loom(args, m, t, seed, data, workdir, precision):
    out = os.path.join(workdir, "loom_" + precision)
    os.makedirs(out)
    cmd = loom_command(args, m, t, seed, data, out, precision)
    print("$ " + " ".join(cmd), flush=True)
    load0, t0 = load_avg(), time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          env=torch_peer.blas_env(args.threads))
    if proc.returncode != 0:
        sys.exit(f"loom train --precision {precision} failed (exit {proc.returncode}):\n"
                 f"{proc.stderr[-2000:]}")
    rows = {}
    for line in open(os.path.join(out, "metrics.jsonl")):
        rec = json.loads(line) if line.strip() else {}
        if "step" in rec and "loss" in rec:
            rows[int(rec["step"])] = rec
    rows = [rows[s] for s in sorted(rows)]
    if [r["step"] for r in rows] != list(range(1, t.steps + 1)):
        sys.exit(f"loom {precision}: metrics has steps {[r['step'] for r in rows]}")
    kernel = re.search(r"OpenBLAS kernel ([^\s,]+)", proc.stderr)
    impl = re.search(r"precision bf16: (oneDNN [^,]*|bf16 matmul widened to fp32[^)]*\)),",
                     proc.stderr)
    res = {"losses": [float(r["loss"]) for r in rows], "lrs": [float(r["lr"]) for r in rows],
           "grad_norms": [float(r["grad_norm"]) for r in rows],
           "step_seconds": [float(r["step_ms"]) / 1000.0 for r in rows],
           "openblas_kernel": kernel.group(1) if kernel else None,
           "bf16_gemm": impl.group(1) if impl else None,
           "load_avg": [load0, load_avg()], "wall_s": round(time.time() - t0, 1),
           "tokens": safetensors_io.load(os.path.join(out, "tokens.safetensors"))["tokens"],
           "init": os.path.join(out, "params_init.safetensors")}
    print(f"  loom {precision}: loss {res['losses'][0]:.4f} -> {res['losses'][-1]:.4f}, "
          f"{res['wall_s']} s", flush=True)
    return res


def run_torch(args, m, t, init, tokens_path, modes):
    """One PyTorch worker process training once per mode (in order); {mode: result}."""
    spec = {"config": m.__dict__, "train": t.__dict__, "threads": args.threads, "modes": modes,
            "init": init, "tokens": tokens_path}
    cmd = torch_peer.worker_command(__file__, spec)
    print(f"$ torch worker ({', '.join(modes)})", flush=True)
    load0, t0 = load_avg(), time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          env=torch_peer.blas_env(args.threads))
    if proc.returncode != 0:
        sys.exit(f"torch worker ({', '.join(modes)}) failed (exit {proc.returncode}):\n"
                 f"{proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for mode, res in out.items():
        res.update({"load_avg": [load0, load_avg()], "wall_s": round(time.time() - t0, 1)})
        print(f"  torch {mode}: loss {res['losses'][0]:.4f} -> {res['losses'][-1]:.4f}, "
              f"{res['wall_s']} s", flush=True)
    return out


def openblas_corename():
    """The kernel the OpenBLAS loaded into this process runs (None if there is none)."""
    with open("/proc/self/maps") as f:
        libs = sorted({ln.split()[-1] for ln in f if "blas" in ln.split()[-1].lower()})
    for lib in libs:
        try:
            fn = ctypes.CDLL(lib).openblas_get_corename
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_char_p
        return fn().decode()
    return None


def mkldnn_version(torch):
    """The oneDNN (MKL-DNN) that torch's bf16 linears run on, from its build summary."""
    found = re.search(r"MKL-DNN (v[\d.]+)", torch.__config__.show())
    on = torch.backends.mkldnn.is_available()
    return f"oneDNN {found.group(1) if found else '?'}{'' if on else ' (not available)'}"


def torch_train(torch, spec, mode):
    """One training from loom's initial weights on loom's batches; mode autocast or fp32."""
    import torch.nn.functional as F
    m, t = tm.Config(**spec["config"]), tm.TrainConfig(**spec["train"])
    model = tm.build_model(m, torch.float32)
    tm.load_params(model, safetensors_io.load(spec["init"]))
    opt = tm.make_optimizer(model, t)
    params = [p for group in opt.param_groups for p in group["params"]]
    tokens = torch.from_numpy(safetensors_io.load(spec["tokens"])["tokens"].astype(np.int64))
    autocast = mode == "autocast"
    G, M, T = t.global_batch, t.micro_batch, m.seq_len
    losses, lrs, norms, secs = [], [], [], []
    for s in range(t.steps):
        t0 = time.perf_counter()
        batch = tokens[s]
        opt.zero_grad(set_to_none=False)
        loss_sum = 0.0
        for k in range(G // M):
            mb = batch[k * M:(k + 1) * M]
            # PyTorch's recipe: autocast around forward and loss, backward outside it.
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits = model(mb[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                       mb[:, 1:].reshape(-1), reduction="sum") / (G * T)
            loss.backward()
            loss_sum += loss.item()
        norm = torch.nn.utils.clip_grad_norm_(params, t.grad_clip).item()
        lr = tm.lr_at(t, s)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        secs.append(time.perf_counter() - t0)
        losses.append(loss_sum)
        lrs.append(lr)
        norms.append(norm)
        if (s + 1) % max(1, t.steps // 10) == 0 or s == 0:
            print(f"  torch {mode} step {s + 1}/{t.steps}: loss {loss_sum:.4f} "
                  f"{secs[-1] * 1000:.0f} ms", file=sys.stderr, flush=True)
    return {"losses": losses, "lrs": lrs, "grad_norms": norms, "step_seconds": secs,
            "openblas_kernel": openblas_corename(),
            "bf16_gemm": mkldnn_version(torch) if autocast else None, "torch": torch.__version__}


def torch_worker(spec_json):
    """Runs in a child process so that the thread and BLAS settings precede torch's load."""
    import torch
    spec = json.loads(spec_json)
    torch.set_num_threads(spec["threads"])
    print(json.dumps({mode: torch_train(torch, spec, mode) for mode in spec["modes"]}))


def curve_diff(a, b):
    """Relative differences |a - b| / |b| of two loss curves: max (and where), final, and
    the mean over the last 10 steps."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    rel = np.abs(a - b) / np.maximum(np.abs(b), 1e-12)
    i = int(np.argmax(rel))
    return {"max_rel": float(f"{rel[i]:.3e}"), "max_rel_step": i + 1,
            "final_rel": float(f"{rel[-1]:.3e}"),
            "last10_mean_rel": float(f"{rel[-10:].mean():.3e}"),
            "signed_final": float(f"{(a[-1] - b[-1]) / b[-1]:+.3e}")}


def tokens_per_s(res, warmup, tokens_per_step):
    secs = res["step_seconds"][warmup:] or res["step_seconds"][-1:]
    return tokens_per_step / float(np.median(secs))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loom", help="path to the loom binary (with bf16: oneDNN)")
    ap.add_argument("--config", default=DEMO, help="the demo's config (default configs/demo.ini)")
    ap.add_argument("--steps", type=int, default=None,
                    help="optimizer steps (default: the config's, 300; the cosine runs over them)")
    ap.add_argument("--data", default=None,
                    help="token shards (glob; default: the config's data/kjv/bpe/train_*.bin if "
                         "present, else English-like byte text in a temporary folder)")
    ap.add_argument("--threads", type=int, default=2, help="threads of every run (default 2)")
    ap.add_argument("--warmup", type=int, default=2, help="steps left out of the timing")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 3 steps, micro-batch 2, global 4, T 32 (seconds)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    args = torch_peer.parse_args(ap, torch_worker)
    m, t, seed, data = demo_config(args.config)
    if args.quick:
        m.seq_len, t.micro_batch, t.global_batch, t.steps = 32, 2, 4, 3
        args.warmup = min(args.warmup, 1)
    if args.steps is not None:
        t.steps = args.steps
    if t.steps < 1 or t.global_batch % t.micro_batch:
        ap.error("--steps must be >= 1 (and the config's global batch a multiple of its micro)")
    t.warmup_steps = min(t.warmup_steps, t.steps)
    if args.data is None:
        default = os.path.join(ROOT, data) if data else ""
        args.data = default if default and glob.glob(default) else None
    if args.data and not glob.glob(args.data):
        print(f"--data {args.data}: no such file (expected llm.c token shards)", file=sys.stderr)
        return 2
    workdir = tempfile.mkdtemp(prefix="loom_bf16_autocast_")
    try:  # the work folder goes also when a run fails (sys.exit) or is interrupted
        result = measure(args, m, t, seed, workdir)
    finally:
        if args.keep:
            print(f"work folder kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(json.dumps(result))
    return 0


def measure(args, m, t, seed, workdir):
    """The four trainings and their comparison: the JSON result."""
    t_start, load_start = time.time(), load_avg()
    if args.data:
        data_desc = os.path.relpath(args.data, ROOT) if args.data.startswith(ROOT) else args.data
    else:
        args.data = os.path.join(workdir, "text_000.bin")
        write_byte_shard(args.data, 4 * t.steps * t.global_batch * (m.seq_len + 1) + 100_000, 1)
        data_desc = "English-like byte text (no KJV shards found)"
    print(f"bf16_autocast: gpt2 L{m.n_layer} H{m.n_head} C{m.d_model} F{m.d_ff} "
          f"V{m.vocab_size} T{m.seq_len}, micro {t.micro_batch}, global {t.global_batch}, "
          f"{t.steps} steps, data {data_desc}, {args.threads} threads, "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}", flush=True)

    # The two compared for speed run back to back (--quick: both PyTorch modes in one
    # worker after both loom runs, one torch import instead of two).
    runs = {"loom_bf16": run_loom(args, m, t, seed, args.data, workdir, "bf16")}
    tokens_path = os.path.join(workdir, "loom_bf16", "tokens.safetensors")
    init = runs["loom_bf16"]["init"]
    if not args.quick:
        runs["torch_autocast"] = run_torch(args, m, t, init, tokens_path, ["autocast"])["autocast"]
    runs["loom_fp32"] = run_loom(args, m, t, seed, args.data, workdir, "fp32")
    init_bf16, init_fp32 = safetensors_io.load(init), safetensors_io.load(runs["loom_fp32"]["init"])
    same_batches = bool(np.array_equal(runs["loom_fp32"]["tokens"], runs["loom_bf16"]["tokens"]))
    same_init = (init_bf16.keys() == init_fp32.keys() and
                 all(np.array_equal(a, init_fp32[n]) for n, a in init_bf16.items()))
    if not (same_batches and same_init):
        sys.exit(f"loom fp32 and bf16 started differently: same batches {same_batches}, "
                 f"same initial weights {same_init}")
    modes = ["autocast", "fp32"] if args.quick else ["fp32"]
    for mode, res in run_torch(args, m, t, init, tokens_path, modes).items():
        runs["torch_" + mode] = res

    tps = t.global_batch * m.seq_len
    speed = {k: round(tokens_per_s(r, args.warmup, tps), 1) for k, r in runs.items()}
    lr_err = max(abs(a - b) / b for k in ("loom_bf16", "loom_fp32")
                 for a, b in zip(runs[k]["lrs"], runs["torch_fp32"]["lrs"]))
    pairs = {"loom_bf16_vs_torch_autocast": ("loom_bf16", "torch_autocast"),
             "loom_fp32_vs_torch_fp32": ("loom_fp32", "torch_fp32"),
             "loom_bf16_vs_loom_fp32": ("loom_bf16", "loom_fp32"),
             "torch_autocast_vs_torch_fp32": ("torch_autocast", "torch_fp32")}
    diffs = {k: curve_diff(runs[a]["losses"], runs[b]["losses"]) for k, (a, b) in pairs.items()}
    ratio = speed["loom_bf16"] / speed["torch_autocast"]
    kernels = {k: r["openblas_kernel"] for k, r in runs.items()}
    for name, d in diffs.items():
        print(f"  {name}: max {d['max_rel']:.2e} (step {d['max_rel_step']}), final "
              f"{d['final_rel']:.2e}", flush=True)
    print("  tokens/s: " + ", ".join(f"{k} {v}" for k, v in speed.items()), flush=True)
    result = {
        "bench": "bf16_autocast",
        "model": f"gpt2 L{m.n_layer} H{m.n_head} C{m.d_model} F{m.d_ff} V{m.vocab_size} "
                 f"T{m.seq_len}",
        "micro_batch": t.micro_batch, "global_batch": t.global_batch, "steps": t.steps,
        "schedule": f"lr {t.lr} warmup {t.warmup_steps} cosine to {t.min_lr} over {t.steps}",
        "data": data_desc, "quick": args.quick, "threads": args.threads,
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
        "openblas_kernel": kernels,
        "bf16_gemm": {"loom": runs["loom_bf16"]["bf16_gemm"],
                      "torch": runs["torch_autocast"]["bf16_gemm"]},
        "torch": runs["torch_fp32"]["torch"],
        "same_batches_and_init": True, "lr_max_rel_err": float(f"{lr_err:.2e}"),
        "loss_target": TARGET_LOSS,
        "loss_diff": diffs,
        "loss_ok": diffs["loom_bf16_vs_torch_autocast"]["max_rel"] <= TARGET_LOSS,
        "tokens_per_s": speed,
        "loom_bf16_vs_torch_autocast": round(ratio, 3),
        "loom_fp32_vs_torch_fp32": round(speed["loom_fp32"] / speed["torch_fp32"], 3),
        "loom_bf16_vs_loom_fp32": round(speed["loom_bf16"] / speed["loom_fp32"], 3),
        "torch_autocast_vs_torch_fp32": round(speed["torch_autocast"] / speed["torch_fp32"], 3),
        "speed_target": TARGET_SPEED, "speed_ok": ratio >= TARGET_SPEED,
        "loaded": {"load_avg_start": load_start, "load_avg_end": load_avg(),
                   "per_run": {k: r["load_avg"] for k, r in runs.items()},
                   "wall_s_per_run": {k: r["wall_s"] for k, r in runs.items()}},
        "losses": {k: [round(x, 5) for x in r["losses"]] for k, r in runs.items()},
        "wall_s": round(time.time() - t_start, 1),
    }
    if len(set(kernels.values())) != 1:
        print(f"  WARNING: the runs did not all use one OpenBLAS kernel: {kernels}", flush=True)
    return result


if __name__ == "__main__":
    sys.exit(main())
