#!/usr/bin/python3
"""Models past 2^31 and 2^32 parameters per rank on the size-only paths: `loom train
--dry-run` (a layout that cannot fit this host is sized, not allocated) and `loom plan
--explain`, checked against the parameter counts computed here.

The model is Llama-shaped with d_model 8192, 80 layers, d_ff 28672, 64 heads (8 key/value
heads), vocabulary 128256: 70,553,706,496 parameters. Layouts: one process (7.1e10 per
rank, past 2^32), tp 8 under mpirun (8.8e9 per rank, past 2^32), dp 2 with ZeRO-3 under
mpirun (a 3.5e10-element shard), and loom plan's tp 8 x pp 4 (2.4e9 per rank on stage 0,
past 2^31) and dp 1024 with ZeRO-3 (with --recompute selective). Every figure is an exact
count (bytes = 4 x elements), a shard within one row of total / dp. Bad input: `loom train
--memory-per-rank` below the layout's need exits 2 naming the smallest layout of the same
world that fits (checked with loom plan), or saying none does.
Usage: test_big_sizes.py --loom PATH
"""
import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
from loomtest import MPIRUN, check, check_loom, run_test  # noqa: E402

V, C, L, F, H, KV = 128256, 8192, 80, 28672, 64, 8
HD = C // H
MODEL = ["--family", "llama", "--n-layer", str(L), "--d-model", str(C), "--n-head", str(H),
         "--n-kv-head", str(KV), "--d-ff", str(F), "--vocab-size", str(V), "--seq-len", "4096"]
MiB = 1 << 20


def layer(tp):
    """One block's parameters on a tensor-parallel rank (norms replicated)."""
    return 2 * C + C * (H + 2 * KV) * HD // tp + C * (H * HD) // tp + 2 * F // tp * C + F // tp * C


def params(tp=1, layers=L, first=True, last=True):
    return (V // tp * C if first else 0) + layers * layer(tp) + ((C + V // tp * C) if last else 0)


def dry_run(loom, data, ranks, flags):
    cmd = [loom, "train"] + MODEL + ["--micro-batch", "1", "--global-batch", "2", "--data", data,
                                     "--threads", "1", "--dry-run"] + flags
    if ranks > 1:
        cmd = MPIRUN + ["-n", str(ranks)] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stderr


def report(stderr):
    m = re.search(r"llama model, (\d+) parameters \((\d+) on this rank\)", stderr)
    mem = re.search(r"memory per rank: params ([\d.]+) MiB.*?grads ([\d.]+) MiB \((?:local|sharded) "
                    r"accumulation\) of which ([\d.]+) MiB stay.*?optimizer ([\d.]+) MiB", stderr)
    if not m or not mem:
        return None
    return [int(m.group(1)), int(m.group(2))] + [float(x) for x in mem.groups()]


def mib(n_floats):
    return round(n_floats * 4 / MiB, 3)


def plan(loom, layout, world=None):
    cmd = [loom, "plan", "--explain", layout, "--json"] + MODEL
    if world:
        cmd += ["--world", str(world)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return p.returncode, (json.loads(p.stdout) if p.returncode == 0 else p.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", required=True)
    args = ap.parse_args()
    check_loom(args.loom)
    total = params()
    check(total == 70553706496, f"the model: {total} parameters (python)")
    check(total > 2 ** 32 and params(8) > 2 ** 32, "past 2^32 per rank in one process and tp 8")
    tmp = tempfile.mkdtemp(prefix="loom_big_sizes_")
    try:
        data = os.path.join(tmp, "tokens.bin")
        with open(data, "wb") as f:  # llm.c shard: header, 4096 uint16 tokens
            f.write(struct.pack("<256i", 20240520, 1, 4096, *([0] * 253)))
            f.write(struct.pack("<4096H", *[(7 * i) % 1000 for i in range(4096)]))
        # one process: 7.1e10 parameters, sized only
        rc, err = dry_run(args.loom, data, 1, [])
        got = report(err)
        want = [total, total, mib(total), mib(total), 0.0, mib(2 * total)]
        check(rc == 0 and "sized only" in err and got == want,
              f"--dry-run, one process: {got} (want {want})")
        # tp 8: 8.8e9 per rank
        rc, err = dry_run(args.loom, data, 8, ["--tp", "8"])
        got, p8 = report(err), params(8)
        want = [total, p8, mib(p8), mib(p8), 0.0, mib(2 * p8)]
        check(rc == 0 and got == want, f"--dry-run, tp 8: {got} (want {want})")
        # dp 2, ZeRO-3: a shard of half the model, within one row of total / 2
        rc, err = dry_run(args.loom, data, 2, ["--dp", "2", "--zero", "3"])
        got = report(err)
        ok = rc == 0 and got is not None and got[:2] == [total, total]
        if ok:
            shard = got[2] * MiB / 4
            ok = abs(shard - total / 2) <= F and got[4] == got[2] and got[5] == mib(2 * shard)
        check(ok, f"--dry-run, dp 2 ZeRO-3: {got} (shard within a row of {total / 2:.0f})")
        # loom plan: tp 8 x pp 4, stage 0 past 2^31
        split = [21, 20, 20, 19]
        rc, out = plan(args.loom, "--tp 8 --pp 4 --micro-batch 1 --global-batch 8 --pp-layers "
                       + ",".join(map(str, split)), 32)
        if check(rc == 0, f"loom plan tp 8 x pp 4 (exit {rc})"):
            want = [params(8, n, s == 0, s == 3) * 4 for s, n in enumerate(split)]
            got = [int(s["params_bytes"]) for s in out["stages"]]
            check(got == want and want[0] > 4 * 2 ** 31,
                  f"  params bytes per stage {got} (want {want})")
        # loom plan: dp 1024 ZeRO-3 with selective recomputation
        rc, out = plan(args.loom, "--dp 1024 --zero 3 --micro-batch 1 --global-batch 1024 "
                       "--recompute selective", 1024)
        rc2, full = plan(args.loom, "--dp 1024 --zero 3 --micro-batch 1 --global-batch 1024 "
                         "--recompute full", 1024)
        rc3, none = plan(args.loom, "--dp 1024 --zero 3 --micro-batch 1 --global-batch 1024", 1024)
        if check(rc == 0 and rc2 == 0 and rc3 == 0, "loom plan dp 1024 ZeRO-3 x recompute"):
            shard = out["memory"]["params_bytes"] / 4
            a = [x["memory"]["activations_bytes"] for x in (full, out, none)]
            check(abs(shard - total / 1024) <= F and a[0] < a[1] < a[2],
                  f"  shard {shard:.0f} (total / 1024 = {total / 1024:.0f}); activations "
                  f"full < selective < none: {a}")
        # --memory-per-rank: refused (exit 2) naming the smallest layout that fits
        small = [args.loom, "train", "--model", "gpt2-small", "--data", data, "--steps", "1",
                 "--micro-batch", "1", "--global-batch", "4", "--threads", "1"]
        p = subprocess.run(MPIRUN + ["-n", "4"] + small + ["--dp", "4", "--memory-per-rank",
                                                            "1.5"],
                           capture_output=True, text=True, timeout=300)
        m = re.search(r"--memory-per-rank 1.5: this layout holds ([\d.]+) GiB on a rank .*? the "
                      r"smallest layout of 4 rank\(s\) that fits: (.*?) \(([\d.]+) GiB\)", p.stderr)
        ok = p.returncode == 2 and m is not None and float(m.group(1)) > 1.5
        if ok:  # the named layout, sized by loom plan, fits
            q = subprocess.run([args.loom, "plan", "--explain", m.group(2), "--json", "--model",
                                "gpt2-small", "--global-batch", "4"], capture_output=True,
                               text=True, timeout=120)
            ok = q.returncode == 0 and json.loads(q.stdout)["memory"]["total_bytes"] <= 1.5 * 2**30
        check(ok, f"--memory-per-rank 1.5 at dp 4: exit {p.returncode}, "
              f"{m.group(0) if m else p.stderr[-300:]}")
        p = subprocess.run(small + ["--memory-per-rank", "0.01"], capture_output=True, text=True,
                           timeout=120)
        check(p.returncode == 2 and "no layout of 1 rank(s) fits" in p.stderr,
              f"--memory-per-rank 0.01 on one rank: exit {p.returncode}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    run_test(main)
