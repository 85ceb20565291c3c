#!/usr/bin/python3
"""Invariant 1 and 2 for data parallelism: every layout computes the same function.

For both model families, trains 20 steps on one process, then under mpirun with
dp in {2, 4} x ZeRO stage in {0, 1, 2, 3} from the same seed and data, and checks that
every per-step loss, the validation losses and every final weight equal the single-process run (relative
error <= 1e-5), and that the same layout run twice gives bitwise-identical losses and
weights. Two more layouts run with LOOM_MPI_THREAD=funneled (MPI gives less than
MPI_THREAD_MULTIPLE): the communication engine then has no thread and its collectives
progress from the training thread; they must say so and compute the same function. Usage: test_layouts.py --loom PATH [--seed S]
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import safetensors_io  # noqa: E402

TOL = 1e-5
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1"]


def write_text_shard(path, seed):
    """Byte tokens of English-like text (words drawn from a fixed list), llm.c format."""
    rng = random.Random(seed)
    words = ("the of and to in is was that for on with as by at from his her they "
             "which one all were we when there can an your said each she do how their "
             "if will up other about out many then them these so some would make").split()
    text = " ".join(rng.choice(words) for _ in range(40000)).encode()
    header = np.zeros(256, dtype="<i4")
    header[:3] = [20240520, 1, len(text)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.frombuffer(text, dtype=np.uint8).astype("<u2").tobytes())


def run(cmd, what):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        print(f"FAIL: {what}: exit {p.returncode}\n$ {' '.join(cmd)}\n{p.stderr[-3000:]}")
        sys.exit(1)
    return p.stderr


def losses(path):
    """Training loss of every step, then the validation losses (every 10 steps)."""
    rows = [json.loads(line) for line in open(path)]
    return [r["loss"] for r in rows] + [r["val_loss"] for r in rows if "val_loss" in r]


def rel_err(a, b):
    return float(np.linalg.norm(a.astype(np.float64) - b) / max(np.linalg.norm(b), 1e-30))


def comparable(name, w, d_model):
    """GPT-2's key bias (rows C..2C of c_attn.bias) has an exactly zero gradient (adding a
    constant to every key's score leaves the softmax unchanged), so in any implementation
    its values are AdamW-amplified rounding noise; it is left out, as in tests/reference."""
    if name.endswith("attn.c_attn.bias"):
        return np.concatenate([w[:d_model], w[2 * d_model:]])
    return w


def weights_error(got, ref, d_model):
    """(error of all weights together, worst single tensor's error, its name). Layouts are
    held to <= TOL on the first and <= 10 * TOL on the second: AdamW turns the rounding noise
    of a near-zero gradient coordinate into an O(lr) step (m / sqrt(v) ~ +-1), so one element
    of a small tensor (a norm bias, a tp-sharded projection) can move by ~1e-6 absolute, 1-3e-5
    of that tensor's norm (measured: tests/parallel/test_layouts_tp.py's docstring), while a
    real bug in any tensor moves the whole model's error far above TOL."""
    names = sorted(ref)
    worst, name = max((rel_err(comparable(k, got[k], d_model), comparable(k, ref[k], d_model)), k)
                      for k in names)
    whole = rel_err(np.concatenate([comparable(k, got[k], d_model).ravel() for k in names]),
                    np.concatenate([comparable(k, ref[k], d_model).ravel() for k in names]))
    return whole, worst, name


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", required=True)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    print(f"seed {seed}")
    tmp = tempfile.mkdtemp(prefix="loom_layouts_")
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

            def train(name, ranks, extra, mpi_env=()):
                out = os.path.join(tmp, f"{family}_{name}")
                cmd = base + extra + ["--metrics", out + ".jsonl", "--dump-dir", out]
                launch = MPIRUN + [a for kv in mpi_env for a in ("-x", kv)] + ["-n", str(ranks)]
                stderr = run((launch if ranks > 1 else []) + cmd, f"{family} {name}")
                train.stderr = stderr
                return losses(out + ".jsonl"), safetensors_io.load(
                    os.path.join(out, "params_final.safetensors"))

            ref_losses, ref_params = train("single", 1, [])
            print(f"{family}: single process, loss {ref_losses[0]:.4f} -> {ref_losses[-1]:.4f}")
            # The last two: MPI asked for less than MPI_THREAD_MULTIPLE, so the communication
            # engine has no thread and collectives progress from the training thread.
            cases = [(dp, zero, False) for dp in (2, 4) for zero in (0, 1, 2, 3)]
            for dp, zero, funneled in cases + [(2, 0, True), (4, 3, True)]:
                name = f"dp{dp}_zero{zero}" + ("_funneled" if funneled else "")
                got_losses, got_params = train(name, dp, ["--dp", str(dp), "--zero", str(zero)],
                                               ["LOOM_MPI_THREAD=funneled"] if funneled else [])
                # the engine said which way it progresses
                fallback = "communication engine: no thread" in train.stderr
                loss_err = max(abs(a - b) / abs(b) for a, b in zip(got_losses, ref_losses))
                w_err, w_name = max((rel_err(comparable(k, got_params[k], 48),
                                             comparable(k, ref_params[k], 48)), k)
                                    for k in ref_params)
                ok = (len(got_losses) == len(ref_losses) and loss_err <= TOL and w_err <= TOL
                      and set(got_params) == set(ref_params) and fallback == funneled)
                failures += not ok
                print(f"  {name:20s} losses rel err {loss_err:.2e}  weights rel err "
                      f"{w_err:.2e} ({w_name})  {'ok' if ok else 'FAIL'}"
                      f"{'' if fallback == funneled else ' (engine mode wrong)'}")
            # The same layout twice: bitwise the same run.
            a_losses, a_params = train("dp2_zero3_again", 2, ["--dp", "2", "--zero", "3"])
            b_losses, b_params = losses(os.path.join(tmp, f"{family}_dp2_zero3.jsonl")), \
                safetensors_io.load(os.path.join(tmp, f"{family}_dp2_zero3",
                                                 "params_final.safetensors"))
            same = a_losses == b_losses and all(np.array_equal(a_params[k], b_params[k])
                                                for k in a_params)
            failures += not same
            print(f"  dp2_zero3 twice: {'bitwise identical' if same else 'FAIL: runs differ'}")
    finally:
        if failures:
            print(f"kept {tmp} (seed {seed})")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    total = 2 * 11
    print(f"{total - failures} passed, {failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
