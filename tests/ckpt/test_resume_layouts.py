#!/usr/bin/python3
"""Checkpoint resume across layouts (invariants 1 and 2 through a checkpoint).

For both families: an uninterrupted single-process run of 20 steps is the reference.
For each (A, B) pair of layouts (dp x ZeRO stage x tensor parallel x pipeline stages), layout A trains 20 steps saving a
checkpoint at step 10; layout B resumes from that step-10 checkpoint and runs to 20. The
resumed losses (steps 11-20, validation at 20) and final weights must equal the
reference to <= 1e-5 relative; when A == B they must equal A's own uninterrupted run
bitwise. Usage: test_resume_layouts.py --loom PATH [--seed S]
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
sys.path.insert(0, os.path.join(HERE, "..", "parallel"))
import safetensors_io  # noqa: E402
from test_layouts import MPIRUN, weights_error, write_text_shard  # noqa: E402

TOL = 1e-5
# (dp, zero, tp): world size dp x tp
PAIRS = [((1, 0, 1), (2, 1, 1)), ((2, 0, 1), (4, 3, 1)), ((4, 2, 1), (1, 0, 1)),
         ((2, 3, 1), (2, 3, 1)), ((4, 1, 1), (2, 2, 1)), ((1, 0, 1), (1, 0, 1)),
         ((1, 0, 2), (2, 1, 1)), ((2, 1, 2), (1, 0, 1)), ((1, 0, 1), (2, 3, 2)),
         ((2, 1, 2), (2, 1, 2)),
         # pipeline parallelism (dp, zero, tp, pp): stage-local shards merge into one manifest
         ((1, 0, 1, 2), (2, 1, 1)), ((2, 2, 1), (1, 0, 1, 2)), ((1, 0, 1, 2), (1, 0, 1, 2))]


def layout_name(layout):
    dp, zero, tp, pp = (tuple(layout) + (1,))[:4]
    return f"dp{dp}z{zero}" + (f"tp{tp}" if tp > 1 else "") + (f"pp{pp}" if pp > 1 else "")


def run(cmd, what):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        print(f"FAIL: {what}: exit {p.returncode}\n$ {' '.join(cmd)}\n{p.stderr[-3000:]}")
        sys.exit(1)
    return p.stderr


def losses(path):
    rows = [json.loads(line) for line in open(path)]
    return [r["loss"] for r in rows] + [r["val_loss"] for r in rows if "val_loss" in r]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", required=True)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    print(f"seed {seed}")
    tmp = tempfile.mkdtemp(prefix="loom_ckpt_layouts_")
    failures = 0
    try:
        data = os.path.join(tmp, "train.bin")
        write_text_shard(data, seed)
        for family in ("gpt2", "llama"):
            base = [args.loom, "train", "--family", family, "--vocab-size", "256",
                    "--seq-len", "24", "--n-layer", "2", "--d-model", "48", "--n-head", "4",
                    "--n-kv-head", "2" if family == "llama" else "4", "--d-ff", "96",
                    "--micro-batch", "2", "--global-batch", "8", "--steps", "20",
                    "--lr", "3e-3", "--warmup-steps", "3", "--grad-clip", "0.5",
                    "--seed", str(seed), "--log-every", "0", "--threads", "1",
                    "--data", data, "--bucket-mb", "0.02", "--val-data", data,
                    "--eval-every", "10", "--eval-batches", "2"]

            def train(name, layout, extra):
                dp, zero, tp, pp = (tuple(layout) + (1,))[:4]
                out = os.path.join(tmp, f"{family}_{name}")
                cmd = base + ["--dp", str(dp), "--zero", str(zero), "--tp", str(tp), "--pp", str(pp),
                              "--metrics", out + ".jsonl", "--dump-dir", out] + extra
                n = dp * tp * pp
                log = run((MPIRUN + ["-n", str(n)] if n > 1 else []) + cmd, f"{family} {name}")
                return losses(out + ".jsonl"), safetensors_io.load(
                    os.path.join(out, "params_final.safetensors")), log

            ref_l, ref_w, _ = train("reference", (1, 0, 1), [])
            for a, b in PAIRS:
                an = layout_name(a)
                ck = os.path.join(tmp, f"{family}_ck_{an}")
                if not os.path.isdir(ck):
                    train(f"a_{an}", a, ["--ckpt-dir", ck, "--ckpt-every", "10"])
                a_l, a_w = losses(os.path.join(tmp, f"{family}_a_{an}.jsonl")), \
                    safetensors_io.load(os.path.join(tmp, f"{family}_a_{an}",
                                                     "params_final.safetensors"))
                name = f"{an}->{layout_name(b)}"
                got_l, got_w, log = train("b_" + name.replace(">", ""), b,
                                          ["--resume", os.path.join(ck, "step_00000010")])
                if "resumed from" not in log:
                    print(f"  {name}: FAIL: did not resume\n{log[-2000:]}")
                    failures += 1
                    continue
                want = ref_l[10:20] + ref_l[21:]  # steps 11-20, validation at step 20
                loss_err = max(abs(x - y) / abs(y) for x, y in zip(got_l, want))
                all_err, w_err, w_name = weights_error(got_w, ref_w, 48)
                ok = (len(got_l) == len(want) and loss_err <= TOL and all_err <= TOL
                      and w_err <= 10 * TOL)
                msg = (f"losses rel err {loss_err:.2e}, weights {all_err:.2e}, worst tensor "
                       f"{w_err:.2e} ({w_name})")
                if a == b:  # same layout: bitwise what A computed without stopping
                    same = got_l == a_l[10:20] + a_l[21:] and all(
                        np.array_equal(got_w[k], a_w[k]) for k in a_w)
                    ok = ok and same
                    msg += ", bitwise identical to the uninterrupted run" if same else \
                        ", FAIL: not bitwise identical to the uninterrupted run"
                failures += not ok
                print(f"  {family} {name:18s} {msg}  {'ok' if ok else 'FAIL'}")
    finally:
        if failures:
            print(f"kept {tmp} (seed {seed})")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"{2 * len(PAIRS) - failures} passed, {failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
