#!/usr/bin/python3
"""Tensor parallelism on this machine: `mpirun -n 2` x 1 thread with --tp 2 (with and
without --sequence-parallel) against 1 rank x 2 threads on the same global batch, GPT-2
124M (vocabulary padded to 50304 so that it splits over 2 ranks) on random tokens.

Figures (median over the measured steps of the --metrics JSON lines, and loom's start-up
and end-of-run log lines):
  tokens_per_s_ratio   tokens/s (tp 2) / tokens/s (1 rank x 2 threads)
  activations_mib      activation arena per rank (tp 1; tp 2 without / with SP)
  tp_bytes_per_step    bytes loom's tp communicator moved per step and rank (payload of each
                       collective: an all-reduce of n floats counts 4n bytes, an all-gather or
                       reduce-scatter the 4n bytes of the whole buffer), against
  analytic             Megatron's 4 all-reduces of B*T*d per layer per step (forward 2,
                       backward 2), plus what loom adds: the vocabulary-parallel embedding
                       (forward) and head (backward) reductions of B*T*d and the loss's
                       row maxima and sums; with SP 10 gathers/reduce-scatters of B*T*d per
                       layer (backward re-gathers the norm outputs), 5 more around the
                       embedding and head, and the norm-gradient all-reduce.
The machine is shared: os.getloadavg() goes into the JSON; compare ratios of one run.
Usage: bench_tp.py --loom build/loom [--seq-len 128] [--micro-batch 2] [--steps 4]
--smoke: a tiny GPT-2 (2 layers, d_model 64, vocabulary 256), seq 16, 2 steps: that the
bench runs end to end, in seconds (its figures mean nothing).
"""
import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_dp import write_random_shard  # noqa: E402


SMOKE_MODEL = ["--n-layer", "2", "--d-model", "64", "--n-head", "4", "--d-ff", "256"]


def run_loom(args, data, tmp, name, ranks, threads, extra):
    metrics = os.path.join(tmp, f"{name}.jsonl")
    cmd = [args.loom, "train", "--model", "gpt2-small"] + (SMOKE_MODEL if args.smoke else []) + [
           "--vocab-size", str(args.vocab), "--seq-len", str(args.seq_len), "--micro-batch", str(args.micro_batch),
           "--global-batch", str(args.micro_batch), "--steps", str(args.steps),
           "--threads", str(threads), "--data", data, "--metrics", metrics,
           "--log-every", "0", "--seed", "1234"] + extra
    if ranks > 1:
        cmd = ["mpirun", "-n", str(ranks), "--allow-run-as-root", "--oversubscribe",
               "--mca", "mpi_yield_when_idle", "1", "-x", "OMP_NUM_THREADS",
               "-x", "OPENBLAS_NUM_THREADS"] + cmd
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    print(f"$ {shlex.join(cmd)}", flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.run_timeout)
    if p.returncode != 0:
        print(f"FAIL: {name}: exit {p.returncode}\n{p.stderr[-3000:]}", flush=True)
        sys.exit(1)
    rows = [json.loads(line) for line in open(metrics)]
    measured = [r for r in rows if r["step"] > args.warmup]
    step_ms = statistics.median(r["step_ms"] for r in measured)
    act = float(re.search(r"activations ([\d.]+) MiB \(micro-batch", p.stderr).group(1))
    res = {"ranks": ranks, "threads": threads, "step_ms": round(step_ms, 1),
           "tokens_per_s": round(rows[0]["tokens"] / (step_ms * 1e-3), 2),
           "activations_mib": act, "final_loss": rows[-1]["loss"]}
    m = re.search(r"tensor-parallel communication: [\d.]+ MiB \((\d+) bytes\) per step", p.stderr)
    if m:
        res["tp_bytes_per_step"] = int(m.group(1))
    print(json.dumps({name: res}), flush=True)
    return res


def analytic(L, N, C, tp, sp):
    """Payload bytes per micro-batch and rank, counted as loom's comm layer counts them."""
    ntc = N * C * 4
    megatron = 4 * L * ntc
    if not sp:
        extra = 2 * ntc + tp * N * 4 + 2 * N * 8  # embedding, head, loss maxima and sums
        return megatron, megatron + extra
    norm_grads = (L * 4 * C + 2 * C) * 4  # GPT-2: ln_1, ln_2 (weight + bias) per layer, ln_f
    return megatron, 10 * L * ntc + 5 * ntc + tp * N * 4 + 2 * N * 8 + norm_grads


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", required=True)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--run-timeout", type=int, default=900)
    ap.add_argument("--smoke", action="store_true", help="a tiny model, 2 steps (seconds)")
    args = ap.parse_args()
    if args.smoke:
        args.seq_len, args.micro_batch, args.steps, args.warmup, args.vocab = 16, 1, 2, 0, 256
    t0 = time.time()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="loom_bench_tp_") as tmp:
        data = os.path.join(tmp, "train.bin")
        write_random_shard(data, 200000, min(args.vocab, 50257), 7)
        one = run_loom(args, data, tmp, "tp1_threads2", 1, 2, [])
        tp = run_loom(args, data, tmp, "tp2", 2, 1, ["--tp", "2"])
        sp = run_loom(args, data, tmp, "tp2_sp", 2, 1, ["--tp", "2", "--sequence-parallel"])
    L, C = (2, 64) if args.smoke else (12, 768)
    N = args.micro_batch * args.seq_len
    mega, loom_tp = analytic(L, N, C, 2, False)
    _, loom_sp = analytic(L, N, C, 2, True)
    out = {
        "model": "smoke: gpt2 L2 C64 V256" if args.smoke else "gpt2-124m (vocab 50304)",
        "seq_len": args.seq_len,
        "micro_batch": args.micro_batch, "global_batch": args.micro_batch,
        "tokens_per_s": {"tp1_x2threads": one["tokens_per_s"], "tp2": tp["tokens_per_s"],
                         "tp2_sp": sp["tokens_per_s"]},
        "tokens_per_s_ratio": {"tp2": round(tp["tokens_per_s"] / one["tokens_per_s"], 3),
                               "tp2_sp": round(sp["tokens_per_s"] / one["tokens_per_s"], 3)},
        "activations_mib_per_rank": {"tp1": one["activations_mib"], "tp2": tp["activations_mib"],
                                     "tp2_sp": sp["activations_mib"]},
        "tp_bytes_per_step": {"tp2": tp["tp_bytes_per_step"], "tp2_sp": sp["tp_bytes_per_step"]},
        "analytic_bytes_per_step": {"megatron_4_allreduces": mega, "tp2": loom_tp,
                                    "tp2_sp": loom_sp},
        "bytes_ratio_measured_vs_analytic": {
            "tp2": round(tp["tp_bytes_per_step"] / loom_tp, 4),
            "tp2_sp": round(sp["tp_bytes_per_step"] / loom_sp, 4),
            "tp2_vs_megatron": round(tp["tp_bytes_per_step"] / mega, 4)},
        "final_loss": {"tp1": one["final_loss"], "tp2": tp["final_loss"],
                       "tp2_sp": sp["final_loss"]},
        "overlap": "none (TP collectives are blocking)",
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "wall_s": round(time.time() - t0, 1),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
