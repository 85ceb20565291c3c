#!/usr/bin/python3
"""The start-up memory report matches ZeRO's formulas (fp32 training, AdamW).

For a random small GPT-2 or Llama shape, runs one step on one process and under mpirun
with dp in {2, 3} x ZeRO stage in {0, 1, 2, 3}, parses rank 0's "memory per rank" line and
checks, with P the parameter count the run prints and N the data-parallel size:
  params      4P (stages 0-2), 4P/N (stage 3)
  grads       4P local accumulation buffer (every stage), of which 4P/N stays after the
              reduction (the reduced shard, stages 2, 3)
  optimizer   8P (stage 0), 8P/N (stages 1-3)
(ZeRO-3 with --grad-accum local: its default, sharded, last; with one micro-batch a step
at ZeRO-2, grads between the shard and 4P: what the buckets
leave resident at the worst layer boundary), and, for stages 2 and 3, that the end-of-run line on resident local gradients (mincore
high-water mark) shows what accumulation wrote: 4P, less the rows of an untied
embedding (Llama) that no token touched; for stage 3, that "gathered at most" is every
range of the parameter view less the whole 2 MiB pages inside the blocks not in use (all
but two adjacent blocks), computed here from the model's shape, in the drawn shape and in
a wider one whose blocks hold whole huge pages. ZeRO-3's default (--grad-accum sharded),
in both shapes: grads = the shard's sum 4P/N + the end line's planned pair of ranges, the
pair at most twice the largest range widened to huge pages (+ GPT-2's tied embedding).
A shard is P/N snapped to whole rows, so "P/N" is allowed to be off by at most one row
of the widest tensor (or one whole 1-D tensor) plus the report's rounding (0.001 MiB).
Usage: test_memory_report.py --loom PATH [--seed S]
"""
import os
import random
import re
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import loomtest  # noqa: E402
from loomtest import MPIRUN, parse_test_args, run_test  # noqa: E402

MIB = 1 << 20
RESIDENT = re.compile(r"local gradients resident at the last micro-batch's layer boundaries: at "
                      r"most ([\d.]+) of ([\d.]+) MiB, ([\d.]+) MiB after the reduction")
LINE = re.compile(r"memory per rank: params ([\d.]+) MiB(?: \+ ([\d.]+) MiB gathered at most)?, "
                  r"grads ([\d.]+) MiB \((?:local|sharded) accumulation\) of which ([\d.]+) MiB stay "
                  r"\(reduced shard\), "
                  r"optimizer ([\d.]+) MiB")


HUGE = (2 << 20) // 4  # floats in a 2 MiB huge page


def zero3_gathered(family, P, L, C, V, T):
    """ZeRO-3's parameter bytes beyond the shard at most (parallel/fsdp.h's rule): the
    view's every range (head: the embeddings, tail: the final norm and an untied head),
    less the whole huge pages inside the blocks other than the two adjacent ones in use."""
    head = V * C + (T * C if family == "gpt2" else 0)
    tail = 2 * C if family == "gpt2" else C + V * C
    if (P - head - tail) % L:
        print(f"FAIL: {P} parameters are not head {head} + {L} equal blocks + tail {tail}")
        sys.exit(1)
    block = (P - head - tail) // L
    spans = [max(0, (head + (i + 1) * block) // HUGE * HUGE - -(-(head + i * block) // HUGE) * HUGE)
             for i in range(L)]
    in_use = max([spans[0]] + [spans[i] + spans[i + 1] for i in range(L - 1)])
    return 4 * (P - sum(spans) + in_use)


def report(cmd, planned=False):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        print(f"FAIL: exit {p.returncode}\n$ {' '.join(cmd)}\n{p.stderr[-2000:]}")
        sys.exit(1)
    m = LINE.search(p.stderr)
    n = re.search(r"model, (\d+) parameters", p.stderr)
    if not m or not n:
        print(f"FAIL: no memory line in\n{p.stderr[-2000:]}")
        sys.exit(1)
    vals = [float(x) * MIB if x is not None else 0.0 for x in m.groups()]
    got = dict(zip(("params", "gathered", "grads", "grad_shard", "optimizer"), vals))
    r = RESIDENT.search(p.stderr)
    got["resident"] = float(r.group(1)) * MIB if r else None
    got["after"] = float(r.group(3)) * MIB if r else None
    a = re.search(r"grads [\d.]+ MiB \((local|sharded) accumulation\)", p.stderr)
    got["accum"] = a.group(1)
    b = re.search(r"loom: data-parallel buffers: ([\d.]+) MiB", p.stderr)
    got["dp_buffers"] = float(b.group(1)) * MIB if b else 0.0
    if not planned:
        return int(n.group(1)), got
    # --grad-accum sharded's end line: the report's pair of ranges (0 when not sharded)
    q = re.search(r"--grad-accum sharded: .* ([\d.]+) MiB planned", p.stderr)
    return int(n.group(1)), got, float(q.group(1)) * MIB if q else 0.0


def main():
    args = parse_test_args()
    seed = args.seed
    rng = random.Random(seed)
    family = rng.choice(["gpt2", "llama"])
    heads = rng.choice([2, 4])
    C = heads * rng.choice([16, 24, 32])
    F = C * rng.choice([2, 3, 4])
    V = rng.randrange(1000, 3000)
    L = rng.randrange(1, 5)
    T = 16
    tmp = tempfile.mkdtemp(prefix="loom_memreport_")
    data = os.path.join(tmp, "tokens.bin")
    header = np.zeros(256, dtype="<i4")
    header[:3] = [20240520, 1, 4096]
    with open(data, "wb") as f:
        f.write(header.tobytes())
        f.write(np.random.default_rng(seed).integers(0, V, 4096).astype("<u2").tobytes())
    base = [args.loom, "train", "--family", family, "--vocab-size", str(V), "--seq-len", str(T),
            "--n-layer", str(L), "--d-model", str(C), "--n-head", str(heads), "--n-kv-head",
            str(heads // 2 if family == "llama" else heads), "--d-ff", str(F), "--micro-batch",
            "1", "--global-batch", "6", "--steps", "1", "--threads", "1", "--log-every", "0",
            "--data", data]
    print(f"{family}: L={L} C={C} F={F} V={V}")
    # One row of the widest tensor, or a whole 1-D tensor (biases of c_attn are 3C).
    slack = 4 * max(3 * C, F, C) + 0.0011 * MIB
    P, one = report(base)
    exact = {"params": 4 * P, "gathered": 0, "grads": 4 * P, "grad_shard": 0, "optimizer": 8 * P}

    def check(what, got, want, tol):
        ok = loomtest.check(abs(got - want) <= tol)
        print(f"  {what}: reported {got / MIB:.3f} MiB, formula {want / MIB:.3f} MiB"
              f"{'' if ok else '  <-- MISMATCH'}")

    print("dp 1")
    for k, v in exact.items():
        check(k, one[k], v, 0.0011 * MIB)
    for dp in (2, 3):
        for zero in (0, 1, 2, 3):
            print(f"dp {dp} zero {zero}")
            # ZeRO-3's default is --grad-accum sharded (checked below): local named here
            local = ["--grad-accum", "local"] if zero == 3 else []
            _, got = report(MPIRUN + ["-n", str(dp)] + base + ["--dp", str(dp), "--zero",
                                                               str(zero)] + local)
            shard = 4 * P / dp
            want = {"params": 4 * P if zero < 3 else shard, "grads": 4 * P,
                    "grad_shard": shard if zero >= 2 else 0,
                    "optimizer": 8 * P if zero == 0 else 2 * shard}
            # a shard is snapped to rows; the rest is exact (at dp 2 the optimizer's two
            # shards are 4P too, but still snapped: seed 4 was one row short)
            sharded = {"params": zero == 3, "grads": False, "grad_shard": zero >= 2,
                       "optimizer": zero >= 1}
            for k, v in want.items():
                tol = slack * (2 if k == "optimizer" else 1) if sharded[k] else 0.0011 * MIB
                check(k, got[k], v, tol)
            if zero >= 2:
                # Stages 2, 3 hand back each bucket's local gradient pages once reduced;
                # with accumulation (here 6 / dp micro-batches) the first micro-batches
                # write every gradient except, for an untied embedding (Llama), the rows
                # of tokens not seen: the high-water mark (mincore) lies in between.
                untouched = 4 * V * C if family == "llama" else 0
                lo, hi = 4 * P - untouched - 8192, 4 * P + 4096 + 0.0011 * MIB
                r = got["resident"]
                ok = loomtest.check(r is not None and lo <= r <= hi)
                print(f"  resident local grads: reported {'-' if r is None else f'{r / MIB:.3f}'}"
                      f" MiB, expected in [{lo / MIB:.3f}, {hi / MIB:.3f}]"
                      f"{'' if ok else '  <-- MISMATCH'}")
                # Once reduced, only the rank's shard and the pages shared by two buckets
                # (their edges) stay.
                after, edges = got["after"], 2 * 4096 * (P // 16384 + L + 8)
                ok = loomtest.check(after is not None and
                                    after <= shard + slack + edges + 0.0011 * MIB)
                print(f"  resident after the reduction: {after} bytes (at most the shard "
                      f"{shard:.0f} + {edges})"
                      f"{'' if ok else '  <-- MISMATCH'}")
            elif got["resident"] is not None:
                loomtest.check(False)
                print("  a 'local gradients resident' line at a stage that keeps them")
            if zero == 3:
                check("gathered", got["gathered"], zero3_gathered(family, P, L, C, V, T),
                      0.0011 * MIB)
    # One micro-batch a step: nothing accumulated before the only backward, whose buckets
    # hand their pages back as they reduce, so the report counts the worst layer boundary
    # (parallel/zero_resident.c; loom plan's own figure: test_plan_memory): at least the
    # shard, less than the whole buffer.
    print("dp 2 zero 2, one micro-batch a step, --bucket-mb 0.01")
    gb = base.index("--global-batch") + 1
    one_mb = base[:gb] + ["2"] + base[gb + 1:] + ["--bucket-mb", "0.01"]
    _, got = report(MPIRUN + ["-n", "2"] + one_mb + ["--dp", "2", "--zero", "2"])
    ok = loomtest.check(2 * P - slack <= got["grads"] < 4 * P)
    print(f"  grads: reported {got['grads'] / MIB:.3f} MiB, expected in [the shard "
          f"{2 * P / MIB:.3f}, the whole buffer {4 * P / MIB:.3f})"
          f"{'' if ok else '  <-- MISMATCH'}")
    # Buckets below the model: the embedding gradient's split (parallel/embed_grad.c)
    # gathers every rank's token ids and d(embedding) rows, N x (C + 1) floats per rank
    # (N = micro-batch 1 x T), and its counts and displacements (2 ints per rank)
    check("data-parallel buffers", got["dp_buffers"], 2 * (T * (C + 1) * 4 + 8), 0.0011 * MIB)
    # ZeRO-3 with blocks of ~6.8 MiB: each hands back whole huge pages after its use
    wide = {"--d-model": 384, "--d-ff": 4 * 384, "--n-layer": 3}
    cmd = list(base)
    for k, v in wide.items():
        cmd[cmd.index(k) + 1] = str(v)
    print("dp 2 zero 3, d_model 384, d_ff 1536, 3 layers, --grad-accum local")
    Pw, got = report(MPIRUN + ["-n", "2"] + cmd + ["--dp", "2", "--zero", "3", "--grad-accum",
                                                   "local"])
    want = zero3_gathered(family, Pw, 3, 384, V, T)
    check("gathered", got["gathered"], want, 0.0011 * MIB)
    if not loomtest.check(want < 4 * Pw):
        print(f"  nothing handed back: {want} bytes of {4 * Pw}")
    # ZeRO-3's default, --grad-accum sharded (FSDP's): grads = the shard's sum (4P/N) + the
    # local gradient of two adjacent ranges (the end line's "planned", the report's own
    # figure), at most two of the largest range (a block, the head's piece, the embedding)
    # each widened to the 2 MiB huge page below it, plus GPT-2's tied embedding (written
    # whole by the head's backward): O(P/N) + O(a block). (Below local's 4P only where the
    # sum and two ranges are: not for 3 blocks of 6.8 MiB at dp 2, 16.0 + 18.6 > 32.0 MiB)
    for name, shape, Ls, Cs in (("drawn", base, L, C), ("wide", cmd, 3, 384)):
        print(f"dp 2 zero 3 default (sharded), {name} shape")
        Pd, got, planned = report(MPIRUN + ["-n", "2"] + shape + ["--dp", "2", "--zero", "3"],
                                  planned=True)
        shard = 4 * Pd / 2
        ok = loomtest.check(got["accum"] == "sharded")
        print(f"  the line says \"{got['accum']} accumulation\"{'' if ok else '  <-- MISMATCH'}")
        check("grad_shard (the sum)", got["grad_shard"], shard, slack)
        check("grads = the sum + the planned pair", got["grads"], shard + planned, 0.0021 * MIB)
        emb = V * Cs + (T * Cs if family == "gpt2" else 0)
        tail = 2 * Cs if family == "gpt2" else Cs + V * Cs
        largest = max((Pd - emb - tail) // Ls, emb, tail)
        bound = 4 * (2 * largest + 2 * HUGE) + (4 * emb if family == "gpt2" else 0) + 8192
        ok = loomtest.check(planned <= bound)
        print(f"  planned pair {planned / MIB:.3f} MiB <= 2 x the largest range + 2 huge pages"
              f"{' + the tied embedding' if family == 'gpt2' else ''} {bound / MIB:.3f} MiB"
              f"{'' if ok else '  <-- MISMATCH'}")


if __name__ == "__main__":
    run_test(main)
