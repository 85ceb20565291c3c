#!/usr/bin/python3
"""Training throughput: loom vs PyTorch (same model, batch and random tokens), on CPU.

Runs, in one go: bench/sgemm_peak (the machine's fp32 GEMM ceiling), then for each
configuration `loom train` and the PyTorch reference (tests/reference/torch_model.py,
fp32, same threads). Steady-state tokens/s: median step after --warmup steps. Model FLOPs
per token = 6 * (parameters in matmuls, incl. the lm head) + 12 * L * T * C.
The last line of output is one JSON object (see bench/README.md).

The bf16 cell (--bf16-peak build/bf16_peak): each configuration also runs `loom train
--precision bf16` (docs/precision.md), and the run measures the bf16 matmul peak as loom
runs it (bench/bf16_peak.c) beside OpenBLAS's sgemm peak, both before and after (best kept): their
ratio is the ceiling of bf16 over fp32. Per configuration: loom_bf16_tokens_per_s,
bf16_vs_fp32, loom_bf16_gflops and loom_bf16_frac_bf16_peak (MFU against that peak).

On a CPU without AVX512-BF16 or AMX-BF16 loom's bf16 GEMMs are widened to fp32 for
OpenBLAS (bf16's numerics, fp32's speed): the cell then measures that, and "bf16_impl" says
so ("widened to fp32 ...").

Usage: /usr/bin/python3 bench/bench_train.py --loom build/loom --sgemm-peak build/sgemm_peak
       [--bf16-peak build/bf16_peak] [--no-torch]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

import torch_peer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "reference"))
import torch_model as tm  # noqa: E402  (torch itself is imported only by the worker)

# name -> (loom preset, model config, micro-batch, global batch, measured steps)
CONFIGS = {
    "gpt2-124m": ("gpt2-small", tm.Config("gpt2", 12, 12, 12, 768, 3072, 50257, 256), 4, 4, 3),
    "gpt2-small-L4C256": ("gpt2-tiny", tm.Config("gpt2", 4, 4, 4, 256, 1024, 8192, 256), 8, 8, 5),
}


def write_shard(path, vocab, n_tokens, seed):
    header = np.zeros(256, dtype="<i4")
    header[:3] = [20240520, 1, n_tokens]
    toks = np.random.default_rng(seed).integers(0, vocab, n_tokens).astype("<u2")
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(toks.tobytes())


def steady_tokens_per_s(tokens_per_step, step_seconds):
    """Tokens per second of the median measured step: on a shared machine a step that
    another process slowed down should not decide the result."""
    return tokens_per_step / float(np.median(step_seconds))


def run_loom(args, preset, m, micro, glob_batch, steps, workdir, extra=()):
    data = os.path.join(workdir, "shard.bin")
    write_shard(data, m.vocab_size, max(200_000, 4 * steps * glob_batch * (m.seq_len + 1)), 1)
    metrics = os.path.join(workdir, "metrics.jsonl")
    cmd = [args.loom, "train", "--model", preset, "--n-layer", m.n_layer, "--n-head",
           m.n_head, "--d-model", m.d_model, "--d-ff", m.d_ff, "--vocab-size", m.vocab_size,
           "--seq-len", m.seq_len, "--micro-batch", micro, "--global-batch", glob_batch,
           "--steps", steps, "--data", data, "--threads", args.threads,
           "--metrics", metrics, "--log-every", 1, "--seed", 1] + list(extra)
    cmd = [str(c) for c in cmd]
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          env=torch_peer.blas_env(args.threads, args.coretype))
    if proc.returncode != 0:
        sys.exit(f"loom failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    rows = [json.loads(line) for line in open(metrics) if line.strip()]
    rows = [r for r in rows if "step" in r]
    measured = rows[args.warmup:]
    if not measured:
        sys.exit("loom: no steps left after warm-up; raise --steps")
    # Step times from loom's own tokens/s per step.
    secs = [glob_batch * m.seq_len / r["tokens_per_s"] for r in measured]
    n_params = None
    found = re.search(r"(\d+) parameters", proc.stdout + proc.stderr)
    if found:
        n_params = int(found.group(1))
    return steady_tokens_per_s(glob_batch * m.seq_len, secs), secs, n_params


def run_torch(args, m, micro, glob_batch, steps):
    spec = {"config": m.__dict__, "micro": micro, "global": glob_batch, "steps": steps,
            "threads": args.threads}
    cmd = torch_peer.worker_command(__file__, spec)
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          env=torch_peer.blas_env(args.threads, args.coretype))
    if proc.returncode != 0:
        sys.exit(f"torch worker failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    secs = res["step_seconds"][args.warmup:]
    return steady_tokens_per_s(glob_batch * m.seq_len, secs), secs, res["n_params"]


def torch_worker(spec_json):
    """Runs in a child process so that the BLAS environment is set before torch loads."""
    import torch
    spec = json.loads(spec_json)
    torch.set_num_threads(spec["threads"])
    m = tm.Config(**spec["config"])
    tc = tm.TrainConfig(steps=spec["steps"], micro_batch=spec["micro"],
                        global_batch=spec["global"])
    model = tm.build_model(m, torch.float32)
    tm.init_gpt2_style(model, seed=1)
    opt = tm.make_optimizer(model, tc)
    rng = np.random.default_rng(1)
    tokens = torch.from_numpy(rng.integers(0, m.vocab_size,
                                           (tc.steps, tc.global_batch, m.seq_len + 1)))
    secs = []
    for s in range(tc.steps):
        t0 = time.perf_counter()
        info = tm.train_step(model, opt, tc, tokens[s], s)  # .item() inside syncs the step
        secs.append(time.perf_counter() - t0)
        print(f"  torch step {s + 1}/{tc.steps}: loss {info['loss']:.4f} "
              f"{secs[-1] * 1000:.0f} ms", file=sys.stderr, flush=True)
    n_params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"step_seconds": secs, "n_params": n_params}))


def sgemm_peak(args):
    out = subprocess.run([os.path.abspath(args.sgemm_peak)], capture_output=True, text=True,
                         env=torch_peer.blas_env(args.threads, args.coretype), check=True).stdout
    peak = json.loads(out.strip().splitlines()[-1])
    print(f"sgemm peak: {peak['sgemm_gflops']:.1f} GFLOP/s on {peak['threads']} threads",
          flush=True)
    return peak


def bf16_peak(args):
    out = subprocess.run([os.path.abspath(args.bf16_peak)], capture_output=True, text=True,
                         env=torch_peer.blas_env(args.threads, args.coretype), check=True).stdout
    peak = json.loads(out.strip().splitlines()[-1])
    print(f"bf16 matmul peak: {peak['bf16_gflops']:.1f} GFLOP/s ({peak['impl']})",
          flush=True)
    return peak


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loom", help="path to the loom binary")
    ap.add_argument("--sgemm-peak", help="path to the sgemm_peak binary")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1, help="steps excluded from timing")
    ap.add_argument("--steps", type=int, default=None,
                    help="measured steps per run (default: 3 for 124M, 5 for the small one)")
    ap.add_argument("--only", choices=sorted(CONFIGS), action="append",
                    help="run only this configuration (repeatable)")
    ap.add_argument("--coretype", default=torch_peer.default_coretype(),
                    help="OPENBLAS_CORETYPE for loom, PyTorch and sgemm_peak alike (default: "
                         "loom's own choice for this CPU, SkylakeX with AVX-512, else Haswell)")
    ap.add_argument("--bf16-peak", help="path to the bf16_peak binary: adds the bf16 cell")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch runs")
    args = torch_peer.parse_args(ap, torch_worker, required=("loom", "sgemm_peak"))

    t_start = time.time()
    peak = sgemm_peak(args)
    bpeak = bf16_peak(args) if args.bf16_peak else None

    result = {"sgemm_gflops": peak["sgemm_gflops"], "threads": args.threads,
              "openblas_coretype": args.coretype, "configs": {}}
    if bpeak:
        result["bf16_gflops"], result["bf16_impl"] = bpeak["bf16_gflops"], bpeak["impl"]
    for name, (preset, m, micro, glob_batch, measured) in CONFIGS.items():
        if args.only and name not in args.only:
            continue
        steps = args.warmup + (args.steps or measured)
        flops_tok = m.flops_per_token()
        print(f"\n[{name}] {m.family} L{m.n_layer} H{m.n_head} C{m.d_model} F{m.d_ff} "
              f"V{m.vocab_size} T{m.seq_len}, micro {micro}, global {glob_batch}, {steps} "
              f"steps ({args.warmup} warm-up); {flops_tok / 1e6:.1f} MFLOP/token", flush=True)
        with tempfile.TemporaryDirectory(prefix="loom_bench_") as workdir:
            loom_tps, loom_secs, loom_params = run_loom(args, preset, m, micro, glob_batch,
                                                        steps, workdir)
        print(f"  loom : {loom_tps:9.1f} tokens/s (steps {[round(s, 3) for s in loom_secs]} s)",
              flush=True)
        if bpeak:
            with tempfile.TemporaryDirectory(prefix="loom_bench_") as workdir:
                bf_tps, bf_secs, _ = run_loom(args, preset, m, micro, glob_batch, steps,
                                              workdir, ["--precision", "bf16"])
            print(f"  loom bf16: {bf_tps:9.1f} tokens/s (steps "
                  f"{[round(s, 3) for s in bf_secs]} s), {bf_tps / loom_tps:.2f}x fp32",
                  flush=True)
        if args.no_torch:
            torch_tps, torch_params = float("nan"), loom_params
        else:
            torch_tps, torch_secs, torch_params = run_torch(args, m, micro, glob_batch, steps)
            print(f"  torch: {torch_tps:9.1f} tokens/s (steps "
                  f"{[round(s, 3) for s in torch_secs]} s)", flush=True)
        if loom_params is not None and loom_params != torch_params:
            print(f"  WARNING: loom reports {loom_params} parameters, torch has {torch_params}")
        loom_gflops = loom_tps * flops_tok / 1e9
        result["configs"][name] = {
            "loom_tokens_per_s": round(loom_tps, 2),
            "torch_tokens_per_s": round(torch_tps, 2),
            "loom_vs_torch": round(loom_tps / torch_tps, 3),
            "flops_per_token": flops_tok,
            "loom_gflops": round(loom_gflops, 2),
            "torch_gflops": round(torch_tps * flops_tok / 1e9, 2),
            "loom_frac_sgemm_peak": round(loom_gflops / peak["sgemm_gflops"], 3),
            "params": torch_params,
        }
        if args.no_torch:
            for k in ("torch_tokens_per_s", "loom_vs_torch", "torch_gflops"):
                del result["configs"][name][k]
        if bpeak:
            result["configs"][name].update({
                "loom_bf16_tokens_per_s": round(bf_tps, 2),
                "bf16_vs_fp32": round(bf_tps / loom_tps, 3),
                "loom_bf16_gflops": round(bf_tps * flops_tok / 1e9, 2),
            })
    # Measured again at the end, best kept: a busy neighbour only ever lowers it.
    again = sgemm_peak(args)
    result["sgemm_gflops"] = max(peak["sgemm_gflops"], again["sgemm_gflops"])
    for r in result["configs"].values():
        r["loom_frac_sgemm_peak"] = round(r["loom_gflops"] / result["sgemm_gflops"], 3)
    if bpeak:
        result["bf16_gflops"] = max(bpeak["bf16_gflops"], bf16_peak(args)["bf16_gflops"])
        result["bf16_peak_over_sgemm"] = round(result["bf16_gflops"] / result["sgemm_gflops"], 3)
        for r in result["configs"].values():
            r["loom_bf16_frac_bf16_peak"] = round(r["loom_bf16_gflops"] / result["bf16_gflops"], 3)
    result["wall_s"] = round(time.time() - t_start, 1)
    print()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
