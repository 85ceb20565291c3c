#!/usr/bin/python3
"""Mixture-of-experts benchmark: tokens/s of a Llama MoE model (E=8, K=2) on 2 ranks x 1
thread with expert parallelism (--dp 2 --ep 2) against replicated experts (--dp 2
--ep 1), measured in the same run; and the grouped expert computation (one GEMM per
expert after the permutation) against one dense GEMM pair of the same FLOPs
(build/moe_grouped); and the chunked all-to-all/compute overlap (--moe-chunks 4 against
1 at ep 2): overlap_hidden_share = 1 - (all-to-all time blocked per step with chunks) /
(blocked per step without), from loom's own timer of the ep communicator (the time
inside MPI waits and blocking calls, counts exchange included). The machine is shared:
the load average is recorded.
Last line: one JSON object. Usage: bench_moe.py [--loom build/loom] [--steps N]"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

import numpy as np

MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", default="build/loom")
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(args.loom))
    tmp = tempfile.mkdtemp(prefix="loom_bench_moe_")
    data = os.path.join(tmp, "train.bin")
    toks = np.random.default_rng(0).integers(0, 256, 1 << 20)
    header = np.zeros(256, dtype="<i4")
    header[:3] = [20240520, 1, len(toks)]
    with open(data, "wb") as f:
        f.write(header.tobytes() + toks.astype("<u2").tobytes())
    base = [args.loom, "train", "--family", "llama", "--vocab-size", "256", "--seq-len", "128",
            "--n-layer", "2", "--d-model", "128", "--n-head", "4", "--n-kv-head", "2",
            "--d-ff", "256", "--n-experts", "8", "--top-k", "2", "--micro-batch", "4",
            "--global-batch", "8", "--steps", str(args.steps), "--threads", "1",
            "--log-every", "0", "--data", data, "--dp", "2"]
    result = {"loadavg_start": os.getloadavg()}
    blocked = {}
    for ep, chunks in ((1, 1), (2, 1), (2, 4)):
        name = f"ep{ep}" + (f"_chunks{chunks}" if chunks > 1 else "")
        metrics = os.path.join(tmp, f"{name}.jsonl")
        p = subprocess.run(MPIRUN + ["-n", "2"] + base + ["--ep", str(ep), "--moe-chunks",
                                                          str(chunks), "--metrics", metrics],
                           check=True, capture_output=True, text=True)
        rows = [json.loads(line) for line in open(metrics)]
        result[f"tokens_per_s_{name}"] = statistics.median(r["tokens_per_s"] for r in rows[2:])
        m = re.search(r"expert-parallel all-to-all: ([0-9.]+) ms blocked per step", p.stderr)
        if m:
            blocked[chunks] = float(m.group(1))
            result[f"alltoall_blocked_ms_per_step_{name}"] = blocked[chunks]
    result["ep2_vs_ep1"] = result["tokens_per_s_ep2"] / result["tokens_per_s_ep1"]
    result["ep2_chunks4_vs_ep2"] = result["tokens_per_s_ep2_chunks4"] / result["tokens_per_s_ep2"]
    result["overlap_hidden_share"] = 1.0 - blocked[4] / blocked[1]
    grouped = subprocess.run([os.path.join(here, "moe_grouped")], check=True, text=True,
                             capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    g = json.loads(grouped.stdout.strip().splitlines()[-1])
    result.update({"grouped_" + k if not k.startswith("grouped") else k: v for k, v in g.items()})
    result["loadavg_end"] = os.getloadavg()
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
