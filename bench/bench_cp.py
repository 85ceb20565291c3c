#!/usr/bin/python3
"""Context parallelism on this machine (--cp, ring and Ulysses), in one run:

1. memory: activation memory per rank (the arena loom's start-up report prints, plus the
   context-parallel attention's own buffers) for one fixed sequence at cp 1, 2 and 4
   (ring); targets <= 0.55x and <= 0.3x of cp 1.
2. longest sequence: the longest sequence length (a multiple of --t-step) whose whole
   per-rank memory (params + grads + optimizer + activations + cp buffers, from
   `loom train --dry-run`'s report, the formulas training allocates by) fits --budget-mib,
   at cp 1, 2 and 4; targets >= 1.8x and >= 3.5x of cp 1.
3. balance: attention compute per rank of a causal ring at cp 4 with and without the
   zigzag split (bench/cp_attention.c, forward + backward); target: the slowest rank
   within 10% of the mean with zigzag.
4. speed: tokens/s of training at cp 2 (2 ranks x 1 thread, ring and Ulysses) against one
   rank with 2 threads, same model and sequence; and the share of the ring's transfer time
   hidden behind compute (1 - blocked / in flight of the cp communicator, loom's end-of-run
   line).
Model: Llama family (RoPE, causal), small width so that attention's activations matter.
The machine is shared (2 cores): os.getloadavg() goes into the JSON; compare ratios of one
run. Prints one JSON object last.
Usage: bench_cp.py --loom build/loom --cp-attention build/cp_attention [--seq-len 2048]
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_dp import write_random_shard  # noqa: E402

MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "mpi_yield_when_idle",
          "1", "-x", "OMP_NUM_THREADS", "-x", "OPENBLAS_NUM_THREADS", "-x", "OPENBLAS_CORETYPE"]


def run(cmd, ranks, threads, timeout, what):
    if ranks > 1:
        cmd = MPIRUN + ["-n", str(ranks)] + cmd
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    print(f"$ {shlex.join(cmd)}", flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if p.returncode != 0:
        print(f"FAIL: {what}: exit {p.returncode}\n{p.stderr[-3000:]}", flush=True)
        sys.exit(1)
    return p


def model_flags(args, seq_len):
    return ["--family", "llama", "--vocab-size", "256", "--seq-len", str(seq_len),
            "--n-layer", str(args.layers), "--d-model", str(args.d_model), "--n-head", "4",
            "--n-kv-head", "4", "--d-ff", str(2 * args.d_model), "--micro-batch", "1",
            "--global-batch", "1", "--seed", "1234", "--log-every", "0"]


def memory(report):
    """MiB per rank from the start-up report: params, grads, optimizer, activations, cp."""
    m = re.search(r"memory per rank: params ([\d.]+) MiB.*?grads ([\d.]+) MiB.*?optimizer "
                  r"([\d.]+) MiB.*?activations ([\d.]+) MiB", report)
    cp = re.search(r"attention buffers ([\d.]+) MiB", report)
    params, grads, opt, act = (float(x) for x in m.groups())
    return {"params": params, "grads": grads, "optimizer": opt, "activations": act,
            "cp_buffers": float(cp.group(1)) if cp else 0.0}


def dry_run(args, data, seq_len, cp, mode="ring"):
    cmd = [args.loom, "train"] + model_flags(args, seq_len) + [
        "--data", data, "--steps", "1", "--threads", "1", "--dry-run"]
    if cp > 1:
        cmd += ["--cp", str(cp), "--cp-mode", mode]
    return memory(run(cmd, cp, 1, args.run_timeout, f"dry run T={seq_len} cp={cp}").stderr)


def total(mem):
    return sum(mem.values())


def longest(args, data, cp):
    """The longest multiple of t_step whose memory per rank fits the budget."""
    step = args.t_step
    lo, hi = 0, step
    while total(dry_run(args, data, hi, cp)) <= args.budget_mib:  # grow until it does not fit
        lo, hi = hi, 2 * hi
    while hi - lo > step:
        mid = (lo + hi) // 2 // step * step
        if total(dry_run(args, data, mid, cp)) <= args.budget_mib:
            lo = mid
        else:
            hi = mid
    return lo


def train(args, data, tmp, name, ranks, threads, extra):
    metrics = os.path.join(tmp, f"{name}.jsonl")
    cmd = [args.loom, "train"] + model_flags(args, args.seq_len) + [
        "--data", data, "--steps", str(args.steps), "--threads", str(threads),
        "--metrics", metrics] + extra
    p = run(cmd, ranks, threads, args.run_timeout, name)
    rows = [json.loads(line) for line in open(metrics)]
    step_ms = statistics.median(r["step_ms"] for r in rows[args.warmup:])
    res = {"ranks": ranks, "threads": threads, "step_ms": round(step_ms, 1),
           "tokens_per_s": round(args.seq_len / (step_ms * 1e-3), 1),
           "final_loss": rows[-1]["loss"]}
    c = re.search(r"context-parallel communication: ([\d.]+) ms blocked per step \(([\d.]+) ms "
                  r"in flight\), ([\d.]+) MiB per step; attention compute ([\d.]+) ms", p.stderr)
    if c:
        blocked, flight, mib, att = (float(x) for x in c.groups())
        res.update({"cp_blocked_ms": blocked, "cp_inflight_ms": flight, "cp_mib_per_step": mib,
                    "attention_ms": att,
                    "hidden_share": round(1 - blocked / flight, 3) if flight > 0 else None})
    return res


def balance(args, zigzag):
    cmd = [args.cp_attention, "--mode", "ring", "--T", str(args.balance_seq_len), "--B", "1",
           "--H", "4", "--KV", "4", "--hd", "64", "--causal", "1", "--iters", "3"]
    if not zigzag:
        cmd.append("--no-zigzag")
    p = run(cmd, 4, 1, args.run_timeout, f"cp_attention zigzag={zigzag}")
    out = json.loads([line for line in p.stdout.splitlines() if line.startswith("{")][-1])
    per_rank = out["compute_ms"]
    mean = statistics.mean(per_rank)
    return {"compute_ms_per_rank": [round(x, 2) for x in per_rank],
            "slowest_over_mean": round(max(per_rank) / mean, 3)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", default="build/loom")
    ap.add_argument("--cp-attention", default="build/cp_attention")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--balance-seq-len", type=int, default=4096)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--budget-mib", type=float, default=256.0)
    ap.add_argument("--t-step", type=int, default=256)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--run-timeout", type=int, default=900)
    args = ap.parse_args()
    coretype = os.environ.get("OPENBLAS_CORETYPE", "")
    tmp = tempfile.mkdtemp(prefix="loom_bench_cp_")
    data = os.path.join(tmp, "train.bin")
    write_random_shard(data, 200000, 256, 7)

    mem = {cp: dry_run(args, data, args.seq_len, cp) for cp in (1, 2, 4)}
    act = {cp: mem[cp]["activations"] + mem[cp]["cp_buffers"] for cp in mem}
    longest_t = {cp: longest(args, data, cp) for cp in (1, 2, 4)}
    bal = {"zigzag": balance(args, True), "contiguous": balance(args, False)}
    speed = {"one_rank_2_threads": train(args, data, tmp, "cp1", 1, 2, []),
             "cp2_ring": train(args, data, tmp, "cp2_ring", 2, 1, ["--cp", "2"]),
             "cp2_ulysses": train(args, data, tmp, "cp2_ulysses", 2, 1,
                                  ["--cp", "2", "--cp-mode", "ulysses"])}
    base = speed["one_rank_2_threads"]["tokens_per_s"]
    result = {
        "bench": "cp", "seq_len": args.seq_len, "d_model": args.d_model, "layers": args.layers,
        "openblas_coretype": coretype, "loadavg": [round(x, 2) for x in os.getloadavg()],
        "memory_mib": {str(cp): mem[cp] for cp in mem},
        "activation_mib_per_rank": {str(cp): round(act[cp], 3) for cp in act},
        "activation_ratio": {"cp2": round(act[2] / act[1], 3), "cp4": round(act[4] / act[1], 3)},
        "budget_mib": args.budget_mib,
        "longest_seq_len": {str(cp): longest_t[cp] for cp in longest_t},
        "longest_ratio": {"cp2": round(longest_t[2] / longest_t[1], 3),
                          "cp4": round(longest_t[4] / longest_t[1], 3)},
        "balance_cp4_causal_ring": bal,
        "speed": speed,
        "tokens_per_s_ratio": {k: round(v["tokens_per_s"] / base, 3) for k, v in speed.items()},
        "ring_hidden_share": speed["cp2_ring"].get("hidden_share"),
    }
    result["targets_met"] = {
        "activations_cp2_le_0.55": result["activation_ratio"]["cp2"] <= 0.55,
        "activations_cp4_le_0.3": result["activation_ratio"]["cp4"] <= 0.3,
        "longest_cp2_ge_1.8": result["longest_ratio"]["cp2"] >= 1.8,
        "longest_cp4_ge_3.5": result["longest_ratio"]["cp4"] >= 3.5,
        "zigzag_slowest_within_10pct": bal["zigzag"]["slowest_over_mean"] <= 1.10,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
