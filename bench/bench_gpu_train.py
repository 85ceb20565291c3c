#!/usr/bin/env python3
"""Training throughput on one GPU: `loom train --device cuda` against PyTorch on the same
GPU, in one run, same model, batch and random tokens, fp32 (TF32 off on both sides: loom's
CUDA GEMMs use CUBLAS_COMPUTE_32F with the default math mode).

The peer is the PyTorch reference model (tests/reference/torch_model.py) with its attention
switched to torch's scaled_dot_product_attention (what a PyTorch user runs), AdamW with
fused=True, gradient clipping at 1.0: eager, and torch.compile when --compile is given.
Steady state: the median step after --warmup steps. Model FLOPs per token = 6 x
(parameters in matmuls, lm head included) + 12 L T C (torch_model.flops_per_token); MFU is
quoted against the GPU's dense fp32 peak (--peak-fp32-tflops, H200 SXM: 67) and, for the
record, its dense bf16 peak (--peak-bf16-tflops, H200 SXM: 989). The last line of output
is one JSON object. Without a GPU (torch sees none) it says so there and exits 0.

  python3 bench/bench_gpu_train.py --loom build-cuda/loom [--configs gpt2-124m,llama-1b]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "reference"))
import torch_model as tm  # noqa: E402
from bench_train import write_shard  # noqa: E402  (the same random llm.c shard)

# name -> (loom preset, model, micro-batch = global batch, steps)
CONFIGS = {
    "gpt2-124m": ("gpt2-small", tm.Config("gpt2", 12, 12, 12, 768, 3072, 50257, 1024), 16, 8),
    # TinyLlama-1.1B's shape (22 layers, 2048 wide, 32 heads over 4 key/value heads)
    "llama-1b": ("llama-100m", tm.Config("llama", 22, 32, 4, 2048, 5632, 32000, 2048), 4, 6),
    "llama-100m": ("llama-100m", tm.Config("llama", 8, 12, 4, 768, 2048, 32000, 1024), 16, 8),
}


def run_loom(args, preset, m, batch, steps, workdir):
    data = os.path.join(workdir, "shard.bin")
    write_shard(data, m.vocab_size, 4 * steps * batch * (m.seq_len + 1), 1)
    metrics = os.path.join(workdir, "metrics.jsonl")
    cmd = [args.loom, "train", "--device", "cuda", "--model", preset, "--n-layer", m.n_layer,
           "--n-head", m.n_head, "--n-kv-head", m.n_kv_head, "--d-model", m.d_model,
           "--d-ff", m.d_ff, "--vocab-size", m.vocab_size, "--seq-len", m.seq_len,
           "--micro-batch", batch, "--global-batch", batch, "--steps", steps, "--data", data,
           "--metrics", metrics, "--log-every", 1, "--seed", 1, "--grad-clip", 1.0]
    cmd = [str(c) for c in cmd]
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-600:]}"}
    rows = [json.loads(line) for line in open(metrics) if line.strip()]
    rows = [r for r in rows if "step" in r]
    secs = [batch * m.seq_len / r["tokens_per_s"] for r in rows[args.warmup:]]
    if not secs:
        return {"error": "no steps after the warm-up"}
    return {"tokens_per_s": batch * m.seq_len / float(np.median(secs)),
            "step_ms": [round(1000 * s, 1) for s in secs],
            "losses": [round(r["loss"], 4) for r in rows], "wall_s": round(time.time() - t0, 1)}


def torch_worker(spec_json):
    """One PyTorch run (a child process, so a failure or compile hang stays contained)."""
    import torch
    import torch.nn.functional as F
    spec = json.loads(spec_json)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    m = tm.Config(**spec["config"])
    B, steps = spec["batch"], spec["steps"]
    tm.causal_attention = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    dev = torch.device("cuda")
    tables, host_tables = {}, tm.rope_tables  # RoPE tables on the GPU, made once per shape

    def rope_on_device(*a):
        if a not in tables:
            tables[a] = tuple(t.to(dev) for t in host_tables(*a))
        return tables[a]
    tm.rope_tables = rope_on_device
    model = tm.build_model(m, torch.float32).to(dev)
    torch.manual_seed(1)  # GPT-2's init on the GPU (the timing does not depend on the values)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 0.02)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.fill_(1.0)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    fwd = torch.compile(model) if spec["compile"] else model
    rng = np.random.default_rng(1)
    tokens = torch.from_numpy(rng.integers(0, m.vocab_size, (steps, B, m.seq_len + 1))).to(dev)
    secs, losses = [], []
    for s in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = fwd(tokens[s, :, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[s, :, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())  # syncs the step
        secs.append(time.perf_counter() - t0)
    print(json.dumps({"step_seconds": secs, "losses": losses,
                      "n_params": sum(p.numel() for p in model.parameters()),
                      "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
                      "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}))


def run_torch(args, m, batch, steps, compile_):
    spec = {"config": m.__dict__, "batch": batch, "steps": steps, "compile": compile_}
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-worker", json.dumps(spec)]
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {args.timeout} s"}
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-600:]}"}
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    secs = res["step_seconds"][args.warmup:]
    return {"tokens_per_s": batch * m.seq_len / float(np.median(secs)),
            "step_ms": [round(1000 * s, 1) for s in secs],
            "losses": [round(x, 4) for x in res["losses"]], "n_params": res["n_params"],
            "peak_mem_gib": round(res["peak_mem_gib"], 2), "torch": res["torch"],
            "gpu": res["gpu"], "wall_s": round(time.time() - t0, 1)}


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--torch-worker":
        torch_worker(sys.argv[2])
        return 0
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loom", default="build-cuda/loom")
    ap.add_argument("--configs", default="gpt2-124m,llama-1b")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--compile", action="store_true", help="also time torch.compile")
    ap.add_argument("--compile-configs", default="gpt2-124m",
                    help="configurations --compile applies to (compiling costs a minute or more)")
    ap.add_argument("--timeout", type=int, default=240, help="seconds per run")
    ap.add_argument("--peak-fp32-tflops", type=float, default=67.0)
    ap.add_argument("--peak-bf16-tflops", type=float, default=989.0)
    args = ap.parse_args()
    result = {"bench": "gpu_train", "dtype": "fp32 (TF32 off)", "configs": {}}
    try:
        import torch
        if not torch.cuda.is_available():
            result["skipped"] = "torch sees no CUDA device"
    except ImportError:
        result["skipped"] = "torch not importable"
    if "skipped" not in result and not os.access(args.loom, os.X_OK):
        result["skipped"] = f"{args.loom}: not an executable (a -DLOOM_CUDA=ON build)"
    if "skipped" in result:
        print(json.dumps(result))
        return 0
    for name in args.configs.split(","):
        preset, m, batch, steps = CONFIGS[name]
        flops_tok = m.flops_per_token()
        row = {"model": f"{m.family} L{m.n_layer} C{m.d_model} H{m.n_head}/{m.n_kv_head} "
                        f"V{m.vocab_size} T{m.seq_len}", "batch": batch,
               "flops_per_token": flops_tok}
        with tempfile.TemporaryDirectory(prefix="loom_gpu_bench_") as wd:
            row["loom"] = run_loom(args, preset, m, batch, steps, wd)
        row["torch_eager"] = run_torch(args, m, batch, steps, False)
        if args.compile and name in args.compile_configs.split(","):
            row["torch_compile"] = run_torch(args, m, batch, steps, True)
        for side in ("loom", "torch_eager", "torch_compile"):
            r = row.get(side)
            if r and "tokens_per_s" in r:
                tflops = r["tokens_per_s"] * flops_tok / 1e12
                r["model_tflops"] = round(tflops, 2)
                r["mfu_fp32_peak"] = round(tflops / args.peak_fp32_tflops, 4)
                r["mfu_bf16_peak"] = round(tflops / args.peak_bf16_tflops, 4)
                r["tokens_per_s"] = round(r["tokens_per_s"], 1)
        if "tokens_per_s" in row["loom"] and "tokens_per_s" in row["torch_eager"]:
            row["loom_vs_torch_eager"] = round(
                row["loom"]["tokens_per_s"] / row["torch_eager"]["tokens_per_s"], 3)
        tc = row.get("torch_compile", {})
        if "tokens_per_s" in row["loom"] and "tokens_per_s" in tc:
            row["loom_vs_torch_compile"] = round(row["loom"]["tokens_per_s"] / tc["tokens_per_s"], 3)
        result["configs"][name] = row
        print(json.dumps({name: row}), file=sys.stderr, flush=True)
    result["peaks_tflops"] = {"fp32": args.peak_fp32_tflops, "bf16_dense": args.peak_bf16_tflops}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
