#!/usr/bin/python3
"""Memory per rank, measured against the start-up report, and the cost of recomputation.

1. memory: for each model (--models: a preset or a width:layers Llama/GPT-2 shape) at dp
   1, 2 and 4 with ZeRO 0-3, runs `loom train` for --steps steps and measures the peak
   resident memory of the largest rank (getrusage RUSAGE_CHILDREN of a fresh wrapper
   process: the maximum over mpirun's children). From it the same layout's peak with a
   tiny model of the same family (the process's own code, MPI and thread stacks) is
   subtracted, and the rest compared with the report's "memory per rank in all"
   (params + gathered + grads + optimizer + activations); the target is within 5%.
2. --grad-accum sharded: ZeRO-3 at dp 4 with 8 micro-batches per step, local
   accumulation (today's: a whole local gradient kept over the micro-batches) against
   sharded (each micro-batch reduced into the shard): the peak resident memory of each and
   the difference against the whole model's gradient bytes.
3. recomputation: on one process with --recompute none, selective and full, the
   training thread's CPU time in forward + backward (median of the steps after the
   first, --metrics' dp.compute_cpu_ms: on a shared machine wall time mostly measures
   the wait for a core) and the step time (step_ms), and selective's extra cost over
   none as a share of full's, from the CPU time (target <= 1/3; the wall-time share too).
The machine is shared: os.getloadavg() goes into the JSON; only ratios of one run mean
anything. There is no peer here: the figures are loom's report against loom's own
process. Prints one JSON object last.
Usage: bench_memory.py --loom build/loom [--models llama:512:8,gpt2:512:8] [--steps 2]
       [--seq-len 256] [--dps 1,2,4] [--zeros 0,1,2,3] [--smoke] [--only memory,accum,recompute]
(--dps and --zeros select the memory section's cells: e.g. --dps 2,4 --zeros 2,3 runs
ZeRO-2 and ZeRO-3 at dp 2 and 4; dp 1 runs only where --zeros has 0.)
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_dp import write_random_shard  # noqa: E402

MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "mpi_yield_when_idle",
          "1", "-x", "OMP_NUM_THREADS", "-x", "OPENBLAS_NUM_THREADS"]
WRAP = ("import resource, subprocess, sys\n"
        "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, "
        "text=True)\n"
        "sys.stderr.write(r.stderr)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r.returncode)\n")
MiB = 1 << 20


def model_flags(spec, seq_len):
    """'llama-100m' (a preset) or 'llama:512:8' (family, width, layers)."""
    if ":" not in spec:
        return ["--model", spec, "--seq-len", str(seq_len)]
    fam, width, layers = spec.split(":")
    w = int(width)
    return ["--family", fam, "--d-model", str(w), "--n-layer", layers, "--n-head", str(w // 64),
            "--n-kv-head", str(w // 64 if fam == "gpt2" else max(1, w // 256)),
            "--d-ff", str(4 * w if fam == "gpt2" else 8 * w // 3 // 64 * 64),
            "--vocab-size", "8192", "--seq-len", str(seq_len)]


def tiny(spec, seq_len):
    fam = spec.split(":")[0].split("-")[0]
    return ["--family", fam, "--d-model", "64", "--n-layer", "1", "--n-head", "1",
            "--n-kv-head", "1", "--d-ff", "64", "--vocab-size", "8192", "--seq-len", str(seq_len)]


def measure(loom, data, ranks, flags, steps, metrics=None):
    cmd = [loom, "train", "--data", data, "--steps", str(steps), "--log-every", "0",
           "--threads", "1", "--micro-batch", "2", "--warmup-steps", "1"] + flags
    if metrics:
        cmd += ["--metrics", metrics]
    if ranks > 1:
        cmd = MPIRUN + ["-n", str(ranks)] + cmd
    p = subprocess.run([sys.executable, "-c", WRAP] + cmd, capture_output=True, text=True,
                       timeout=3600)
    rss_kib, rc = map(int, p.stdout.split())
    if rc != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {rc}: {p.stderr[-800:]}")
    total = float(re.search(r"memory per rank in all: ([\d.]+) MiB", p.stderr).group(1))
    return rss_kib * 1024 / MiB, total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", default="build/loom")
    ap.add_argument("--models", default="llama:512:8,gpt2:512:8")
    ap.add_argument("--dps", default="1,2,4", help="the memory section's data-parallel "
                    "sizes (default 1,2,4)")
    ap.add_argument("--zeros", default="0,1,2,3", help="the memory section's ZeRO stages at "
                    "dp > 1 (default 0,1,2,3); dp 1 runs ZeRO-0 only, and only if 0 is listed")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--time-steps", type=int, default=4)
    ap.add_argument("--smoke", action="store_true", help="a tiny model, dp 1 and 2, 1 step")
    ap.add_argument("--only", default="memory,accum,recompute")
    ap.add_argument("--accum-model", default=None, help="the --grad-accum section's model "
                    "(default: the first of --models)")
    ap.add_argument("--bucket-mb", type=float, default=4.0, help="the --grad-accum runs'")
    args = ap.parse_args()
    zeros = sorted({int(z) for z in args.zeros.split(",") if z.strip().isdigit()})
    if len(zeros) != len(set(args.zeros.split(","))) or any(z > 3 for z in zeros):
        ap.error(f"--zeros: expected ZeRO stages from 0-3, comma-separated, got '{args.zeros}'")
    if args.smoke:
        args.models, args.dps, args.steps, args.seq_len, args.time_steps = \
            "llama:128:2", "1,2", 1, 64, 2
    os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    tmp = tempfile.mkdtemp(prefix="bench_memory_")
    data = os.path.join(tmp, "tokens.bin")
    write_random_shard(data, 1 << 18, 8192, 1)
    rows, worst = [], 0.0
    only = args.only.split(",")
    for spec in args.models.split(",") if "memory" in only else []:
        for dp in map(int, args.dps.split(",")):
            for zero in ([0] if 0 in zeros else []) if dp == 1 else zeros:
                lay = ["--dp", str(dp), "--zero", str(zero), "--global-batch", str(2 * dp)]
                base_rss, base_rep = measure(args.loom, data, dp, tiny(spec, args.seq_len) + lay, 1)
                rss, rep = measure(args.loom, data, dp,
                                   model_flags(spec, args.seq_len) + lay, args.steps)
                model_rss = rss - base_rss
                err = (model_rss - (rep - base_rep)) / (rep - base_rep)
                worst = max(worst, abs(err))
                row = dict(model=spec, dp=dp, zero=zero, peak_rss_mib=round(rss, 1),
                           overhead_mib=round(base_rss, 1), measured_mib=round(model_rss, 1),
                           reported_mib=round(rep - base_rep, 1), rel_err=round(err, 4))
                rows.append(row)
                print(f"{spec:14s} dp {dp} ZeRO-{zero}: peak {rss:9.1f} MiB - overhead "
                      f"{base_rss:6.1f} = {model_rss:9.1f} MiB; report {rep - base_rep:9.1f} MiB "
                      f"({err:+.1%})", flush=True)
    # --grad-accum: dp 4 ZeRO-3, 8 micro-batches per rank
    spec = args.accum_model or args.models.split(",")[0]
    accum = {}
    for mode in ("local", "sharded") if "accum" in only else []:
        lay = ["--dp", "4", "--zero", "3", "--micro-batch", "1", "--global-batch", "32",
               "--grad-accum", mode, "--bucket-mb", str(args.bucket_mb)]
        rss, rep = measure(args.loom, data, 4, model_flags(spec, args.seq_len) + lay, args.steps)
        accum[mode] = dict(peak_rss_mib=round(rss, 1), reported_mib=round(rep, 1))
        print(f"{spec} dp 4 ZeRO-3 x 8 micro-batches, --grad-accum {mode:7s}: peak {rss:.1f} MiB, "
              f"report {rep:.1f} MiB", flush=True)
    if accum:
        p = subprocess.run([args.loom, "plan", "--explain", "--dp 1 --micro-batch 1",
                            "--json"] + model_flags(spec, args.seq_len), capture_output=True,
                           text=True, timeout=120)
        full = json.loads(p.stdout)["memory"]["grads_local_bytes"] / MiB
        saved = accum["local"]["peak_rss_mib"] - accum["sharded"]["peak_rss_mib"]
        accum.update(full_gradient_mib=round(full, 1), saved_mib=round(saved, 1),
                     saved_over_full=round(saved / full, 3))
        print(f"  saved {saved:.1f} MiB of a {full:.1f} MiB whole gradient", flush=True)
    # recomputation: one process, the first model
    spec = args.models.split(",")[0]
    times = {}
    for mode in ("none", "selective", "full") if "recompute" in only else []:
        met = os.path.join(tmp, f"rc_{mode}.jsonl")
        rss, rep = measure(args.loom, data, 1, model_flags(spec, args.seq_len) +
                           ["--recompute", mode, "--global-batch", "2"], args.time_steps, met)
        steps = [json.loads(x) for x in open(met) if '"step_ms"' in x]
        later = steps[1:] if len(steps) > 1 else steps
        ms = statistics.median(s["step_ms"] for s in later)
        # the training thread's CPU time in forward + backward: what recomputation adds,
        # and not inflated by waiting for a core on a shared machine (--threads 1)
        cpu = statistics.median(s["dp"]["compute_cpu_ms"] for s in later)
        times[mode] = dict(step_ms=round(ms, 2), compute_cpu_ms=round(cpu, 2),
                           peak_rss_mib=round(rss, 1), reported_mib=round(rep, 1))
        print(f"{spec} --recompute {mode:9s}: step {ms:8.2f} ms, forward+backward CPU "
              f"{cpu:8.2f} ms, peak {rss:.1f} MiB, report {rep:.1f} MiB", flush=True)
    share = share_wall = None
    if times:
        def share_of(key):
            extra_sel = times["selective"][key] - times["none"][key]
            extra_full = times["full"][key] - times["none"][key]
            return extra_sel / extra_full if extra_full > 0 else None
        share, share_wall = share_of("compute_cpu_ms"), share_of("step_ms")
    out = dict(bench="memory", load=os.getloadavg(), seq_len=args.seq_len, steps=args.steps,
               memory=rows, memory_worst_rel_err=round(worst, 4) if rows else None,
               memory_within_5pct=worst <= 0.05 if rows else None, grad_accum=accum, recompute=times,
               selective_share_of_full=None if share is None else round(share, 3),
               selective_share_of_full_wall=None if share_wall is None else round(share_wall, 3),
               selective_within_third=share is not None and share <= 1 / 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
