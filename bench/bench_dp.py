#!/usr/bin/python3
"""Data-parallel weak scaling of `loom train` on this machine (bench/README.md).

1 rank x 1 thread versus `mpirun -n 2` x 1 thread (--dp 2) at the same per-rank batch
(the global batch doubles), GPT-2 124M on random tokens, for --zero 0, 1, 2; each 2-rank
run twice: with overlap (--bucket-mb 25, buckets reduced during backward) and without
(--bucket-mb 100000: one bucket, sent after backward ends, so the whole reduction is
exposed). All configurations run interleaved for --rounds rounds (machine load drifts;
other jobs may share the cores: the load average is recorded). Figures come from the
--metrics JSON lines (median over the measured steps of every round):

  efficiency[z]      = tokens/s (2 ranks, overlap) / (2 x tokens/s (1 rank))
  hidden_fraction[z] = 1 - grad_wait_ms (overlap) / grad_wait_ms (no overlap)
  breakdown_ms[cfg]  = where rank 0's step goes (the metrics' "dp" object, medians):
                       compute (forward + backward, wall) and the training thread's CPU
                       in it, the optimizer, the ZeRO-1/2 parameter all-gather, the
                       communication engine thread's CPU (MPI's copies and sums, on the
                       same cores), the exposed gradient wait; cpu_demand is the CPU one
                       rank needs per step (compute CPU + optimizer CPU + gather + engine):
                       with 2 ranks on 2 cores it bounds the step time from below;
  efficiency_cpu_demand[z] = cpu_demand (1 rank) / cpu_demand (2 ranks, overlap)
  overlap_param_gather[z] (z = 1, 2) = the same overlap run with --overlap-param-gather
                       against it: the parameter gather's exposed ms per step
                       (param_gather + param_wait: the blocking all-gather without the
                       flag; posting + the next forward's waits with it), step times,
                       engine CPU and the tokens/s ratio

The last line of output is one JSON object with every figure.
Usage: bench_dp.py --loom build/loom [--seq-len 128] [--micro-batch 2] [--steps 7]
                   [--warmup 2]
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

import numpy as np

OVERLAP_MB = 25.0  # loom's default
NO_OVERLAP_MB = 100000.0  # larger than the model: one bucket, sent after backward
ZERO_STAGES = (0, 1, 2)  # stages whose exposed communication is compared; ZeRO-3 below
PARAM_GATHER_STAGES = (1, 2)  # also run with --overlap-param-gather


def write_random_shard(path, n_tokens, vocab, seed):
    """llm.c shard: 256 int32 header [20240520, 1, n_tokens, 0...], then uint16 tokens."""
    header = np.zeros(256, dtype="<i4")
    header[:3] = [20240520, 1, n_tokens]
    tokens = np.random.default_rng(seed).integers(0, vocab, n_tokens).astype("<u2")
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())


def mpirun_prefix(n):
    cmd = ["mpirun", "-n", str(n), "-x", "OMP_NUM_THREADS", "-x", "OPENBLAS_NUM_THREADS"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd


def run_loom(args, data, tmp, name, ranks, zero, bucket_mb, copies=1, extra=()):
    """One loom run of `ranks` ranks; with copies=2 two independent 1-rank runs at the same
    time (the machine's ceiling for two ranks: they share the cores' memory bandwidth and
    caches but never communicate), reported as their summed tokens/s."""
    metrics = os.path.join(tmp, f"{name}.jsonl")
    per_rank = args.micro_batch
    cmd = [args.loom, "train", "--model", args.model, "--seq-len", str(args.seq_len),
           "--micro-batch", str(args.micro_batch), "--global-batch", str(per_rank * ranks),
           "--steps", str(args.steps), "--threads", "1", "--data", data,
           "--log-every", "0", "--seed", "1234"]
    if ranks > 1:
        cmd = mpirun_prefix(ranks) + cmd + ["--dp", str(ranks), "--zero", str(zero),
                                            "--bucket-mb", f"{bucket_mb:g}"] + list(extra)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    print(f"$ {shlex.join(cmd)}" + (f" (x{copies} at once)" if copies > 1 else ""), flush=True)
    t0 = time.time()
    outs = [metrics if c == 0 else os.path.join(tmp, f"{name}_copy{c}.jsonl")
            for c in range(copies)]
    procs = [subprocess.Popen(cmd + ["--metrics", m], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, env=env) for m in outs]
    waits = {}
    for p in procs:
        _, stderr = p.communicate(timeout=args.run_timeout)
        # --overlap-param-gather: every rank's mean wait (rank 0's is also in --metrics)
        for rank, ms in re.findall(r"rank (\d+): --overlap-param-gather: the forward waited "
                                   r"([0-9.]+) ms per step", stderr):
            waits[f"rank{rank}"] = float(ms)
        if p.returncode != 0:
            print(f"FAIL: {name}: exit {p.returncode}\n{stderr[-3000:]}", flush=True)
            sys.exit(1)
    if copies > 1:  # summed throughput, as the step time of one copy's tokens
        per_copy = [[json.loads(line) for line in open(m)] for m in outs]
        rows = [dict(r, step_ms=1.0 / sum(1.0 / c[i]["step_ms"] for c in per_copy))
                for i, r in enumerate(per_copy[0])]
    else:
        rows = [json.loads(line) for line in open(metrics)]
    measured = [r for r in rows if r["step"] > args.warmup]
    if not measured:
        print(f"FAIL: {name}: no steps after the {args.warmup} warm-up steps", flush=True)
        sys.exit(1)
    step_ms = statistics.median(r["step_ms"] for r in measured)
    tokens_per_step = rows[0]["tokens"]  # cumulative: the first row is one step's tokens
    res = {
        "ranks": ranks, "zero": zero if ranks > 1 else None,
        "bucket_mb": bucket_mb if ranks > 1 else None,
        "tokens_per_step": tokens_per_step,
        "step_ms": round(step_ms, 1),
        "tokens_per_s": round(tokens_per_step / (step_ms * 1e-3), 2),
        "grad_wait_ms": round(statistics.median(r["grad_wait_ms"] for r in measured), 1),
        "step_ms_all": [round(r["step_ms"], 1) for r in rows],
        "measured_step_ms": [r["step_ms"] for r in measured],
        "measured_wait_ms": [r["grad_wait_ms"] for r in measured],
        "measured_dp": [r["dp"] for r in measured if "dp" in r],
        "param_wait_per_rank": waits,
        "wall_s": round(time.time() - t0, 1),
    }
    print(f"  {name}: median step {res['step_ms']:.0f} ms, {res['tokens_per_s']:.1f} tok/s, "
          f"grad wait {res['grad_wait_ms']:.0f} ms (steps: {res['step_ms_all']}, "
          f"{res['wall_s']:.0f} s)", flush=True)
    return res


BREAKDOWN = ("compute_ms", "compute_cpu_ms", "optimizer_ms", "optimizer_cpu_ms",
             "param_gather_ms", "param_wait_ms", "engine_cpu_ms")


def breakdown(rows, waits):
    """Medians of the per-step "dp" figures of --metrics (rank 0), and the CPU one rank
    needs per step."""
    if not rows:
        return None
    out = {k[:-3]: round(statistics.median(r.get(k, 0.0) for r in rows), 1) for k in BREAKDOWN}
    out["grad_wait"] = round(statistics.median(waits), 1)
    out["cpu_demand"] = round(out["compute_cpu"] + out["optimizer_cpu"] + out["param_gather"] +
                              out["engine_cpu"], 1)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loom", default="build/loom")
    ap.add_argument("--model", default="gpt2-small")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--micro-batch", type=int, default=2, help="= the per-rank batch")
    ap.add_argument("--steps", type=int, default=6, help="steps per run, warm-up included")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds of all configs")
    ap.add_argument("--warmup", type=int, default=2, help="first steps not measured")
    ap.add_argument("--run-timeout", type=float, default=240.0, help="seconds per loom run")
    args = ap.parse_args()
    if args.steps <= args.warmup:
        ap.error("--steps must exceed --warmup")
    t_start = time.time()
    tmp = tempfile.mkdtemp(prefix="loom_bench_dp_")
    data = os.path.join(tmp, "random.bin")
    write_random_shard(data, 1 << 18, 50257, 7)
    print(f"bench_dp: {args.model}, T={args.seq_len}, per-rank batch {args.micro_batch}, "
          f"{args.steps} steps ({args.warmup} warm-up), 1 thread per rank; cores: "
          f"{os.cpu_count()}, load average at start: {os.getloadavg()[0]:.2f}", flush=True)

    # Configurations run interleaved, round after round, so a change in machine load
    # (other jobs share the cores) hits every configuration alike; each figure is the
    # median over all measured steps of all rounds.
    configs = [("1rank", 1, 0, OVERLAP_MB), ("2x1rank_at_once", 1, 0, OVERLAP_MB)]
    for z in ZERO_STAGES:
        configs += [(f"2rank_zero{z}_overlap", 2, z, OVERLAP_MB),
                    (f"2rank_zero{z}_no_overlap", 2, z, NO_OVERLAP_MB)]
    configs.append(("2rank_zero3_overlap", 2, 3, OVERLAP_MB))
    # --overlap-param-gather: the ZeRO-1/2 parameter all-gather per block, waited for in
    # the next forward (param_wait is then its exposed part, param_gather only posting)
    for z in PARAM_GATHER_STAGES:
        configs.append((f"2rank_zero{z}_overlap_param_gather", 2, z, OVERLAP_MB))
    per_round = {name: [] for name, *_ in configs}
    load = [os.getloadavg()[0]]
    for rnd in range(args.rounds):
        for name, ranks, zero, mb in configs:
            copies = 2 if name == "2x1rank_at_once" else 1
            extra = ["--overlap-param-gather"] if name.endswith("_overlap_param_gather") else []
            per_round[name].append(run_loom(args, data, tmp, f"{name}_r{rnd}", ranks, zero, mb,
                                            copies, extra))
            load.append(os.getloadavg()[0])
    runs = {}
    for name, res in per_round.items():
        step_ms = statistics.median(ms for r in res for ms in r["measured_step_ms"])
        tps = res[0]["tokens_per_step"] / (step_ms * 1e-3)
        runs[name] = {"tokens_per_s": round(tps, 2), "step_ms": step_ms,
                      "tokens_per_step": res[0]["tokens_per_step"],
                      "grad_wait_ms": round(statistics.median(
                          w for r in res for w in r["measured_wait_ms"]), 1),
                      "per_round_tokens_per_s": [r["tokens_per_s"] for r in res],
                      "param_wait_per_rank": [r["param_wait_per_rank"] for r in res],
                      "breakdown_ms": breakdown([d for r in res for d in r["measured_dp"]],
                                                [w for r in res for w in r["measured_wait_ms"]])}
    base_tps = runs["1rank"]["tokens_per_s"]
    base_ms = runs["1rank"]["step_ms"]

    efficiency, efficiency_no_overlap, hidden, exposed = {}, {}, {}, {}
    for z in ZERO_STAGES:
        ov, no = runs[f"2rank_zero{z}_overlap"], runs[f"2rank_zero{z}_no_overlap"]
        efficiency[f"zero{z}"] = round(ov["tokens_per_s"] / (2 * base_tps), 3)
        efficiency_no_overlap[f"zero{z}"] = round(no["tokens_per_s"] / (2 * base_tps), 3)
        hidden[f"zero{z}"] = (round(1 - ov["grad_wait_ms"] / no["grad_wait_ms"], 3)
                              if no["grad_wait_ms"] > 0 else None)
        exposed[f"zero{z}"] = {"with_overlap_ms": ov["grad_wait_ms"],
                               "without_overlap_ms": no["grad_wait_ms"]}

    ceiling = runs["2x1rank_at_once"]["tokens_per_s"] / (2 * base_tps)
    print("\nzero | tok/s 2 ranks (overlap / none) | efficiency | exposed ms (overlap / none) "
          "| hidden")
    for z in ZERO_STAGES:
        ov, no = runs[f"2rank_zero{z}_overlap"], runs[f"2rank_zero{z}_no_overlap"]
        h = hidden[f"zero{z}"]
        print(f"  {z}  | {ov['tokens_per_s']:8.1f} / {no['tokens_per_s']:8.1f}     "
              f"|   {efficiency[f'zero{z}']:.3f}    | {ov['grad_wait_ms']:7.0f} / "
              f"{no['grad_wait_ms']:7.0f}      | {'-' if h is None else f'{h:.3f}'}")
    print(f"1 rank: {base_tps:.1f} tok/s (median step {base_ms:.0f} ms over all rounds)")
    print("\nms per step (rank 0)   | step | compute (cpu) | optimizer (cpu) | param gather "
          "(wait) | engine cpu | wait | cpu demand")
    for name, r in runs.items():
        b = r["breakdown_ms"]
        if b:
            print(f"  {name:25s} {r['step_ms']:6.0f} | {b['compute']:6.0f} "
                  f"({b['compute_cpu']:5.0f})"
                  f" | {b['optimizer']:6.0f} ({b['optimizer_cpu']:5.0f}) | "
                  f"{b['param_gather']:6.0f} ({b['param_wait']:4.0f}) | {b['engine_cpu']:6.0f} | "
                  f"{b['grad_wait']:5.0f} | {b['cpu_demand']:6.0f}")
    load_end = os.getloadavg()[0]
    # The parameter gather's exposed time per step (rank 0): the blocking all-gather
    # without the flag; with it, the posting plus the forward's waits for ranges.
    param_gather = {}
    for z in PARAM_GATHER_STAGES:
        no, ov = runs[f"2rank_zero{z}_overlap"], runs[f"2rank_zero{z}_overlap_param_gather"]
        bn, bo = no["breakdown_ms"], ov["breakdown_ms"]
        param_gather[f"zero{z}"] = {
            "exposed_ms_without": round(bn["param_gather"] + bn["param_wait"], 1),
            "exposed_ms_with": round(bo["param_gather"] + bo["param_wait"], 1),
            "step_ms_without": no["step_ms"], "step_ms_with": ov["step_ms"],
            "engine_cpu_ms_without": bn["engine_cpu"], "engine_cpu_ms_with": bo["engine_cpu"],
            "tokens_per_s_ratio": round(ov["tokens_per_s"] / no["tokens_per_s"], 3),
            # per round, each rank's mean wait over all steps after the first (warm-up
            # included): rank 1 waits for the embedding range, which rank 0 owns
            "param_wait_ms_per_rank_per_round": ov["param_wait_per_rank"]}

    out = {
        "model": args.model, "seq_len": args.seq_len, "per_rank_batch": args.micro_batch,
        "steps": args.steps, "warmup": args.warmup, "threads_per_rank": 1,
        "rounds": args.rounds,
        "tokens_per_s": {k: v["tokens_per_s"] for k, v in runs.items()},
        "tokens_per_s_per_round": {k: v["per_round_tokens_per_s"] for k, v in runs.items()},
        "efficiency": efficiency,
        # Two ranks that never communicate still slow each other down on this machine
        # (shared memory bandwidth, caches, clocks): their summed tokens/s over twice one
        # rank's is the best any 2-rank layout can reach here; efficiency_vs_ceiling
        # divides by it, leaving what data parallelism itself costs.
        "ceiling_2_independent_ranks": round(ceiling, 3),
        "efficiency_vs_ceiling": {k: round(v / ceiling, 3) for k, v in efficiency.items()},
        "efficiency_no_overlap": efficiency_no_overlap,
        "hidden_fraction": hidden,
        "exposed_ms": exposed,
        "breakdown_ms": {k: v["breakdown_ms"] for k, v in runs.items()},
        # 1 rank's CPU per step over a 2-rank config's (per rank): the efficiency the CPU
        # work alone allows, less sensitive to other jobs than the step times
        "efficiency_cpu_demand": {
            f"zero{z}": round(runs["1rank"]["breakdown_ms"]["cpu_demand"] /
                              runs[f"2rank_zero{z}_overlap"]["breakdown_ms"]["cpu_demand"], 3)
            for z in ZERO_STAGES},
        "overlap_param_gather": param_gather,
        "zero3_vs_zero0": round(runs["2rank_zero3_overlap"]["tokens_per_s"] /
                                runs["2rank_zero0_overlap"]["tokens_per_s"], 3),
        "load_avg_start": round(load[0], 2),
        "load_avg_max": round(max(load), 2),
        "load_avg_end": round(load_end, 2),
        "note": "other jobs shared the 2 cores (see load_avg_*): compare ratios of this run",
        "wall_s": round(time.time() - t_start, 1),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
