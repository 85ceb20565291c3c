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
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
from loomtest import (ADAM_EPS, TOL, Layouts, bitwise, loss_error, parse_test_args, weights_error,  # noqa: E402
                      write_text_shard)
from loomtest import check, keep_or_remove, run_test  # noqa: E402


def main():
    args = parse_test_args()
    seed = args.seed
    tmp = tempfile.mkdtemp(prefix="loom_layouts_")
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
                    "--data", data, "--adam-eps", ADAM_EPS, "--bucket-mb", "0.02", "--val-data", data,
                    "--eval-every", "10", "--eval-batches", "2"]
            layouts = Layouts(base, tmp, f"{family}_")
            ref = layouts.run("single", 1)
            print(f"{family}: single process, loss {ref.losses[0]:.4f} -> {ref.losses[-1]:.4f}")
            # The last two: MPI asked for less than MPI_THREAD_MULTIPLE, so the communication
            # engine has no thread and collectives progress from the training thread.
            cases = [(dp, zero, False) for dp in (2, 4) for zero in (0, 1, 2, 3)]
            for dp, zero, funneled in cases + [(2, 0, True), (4, 3, True)]:
                name = f"dp{dp}_zero{zero}" + ("_funneled" if funneled else "")
                got = layouts.run(name, dp, ["--dp", str(dp), "--zero", str(zero)],
                                  ["LOOM_MPI_THREAD=funneled"] if funneled else [])
                # the engine said which way it progresses
                fallback = "communication engine: no thread" in got.stderr
                loss_err = loss_error(got.losses, ref.losses)
                # every tensor within TOL (so the whole model too)
                _, w_err, w_name = weights_error(got.params, ref.params, 48)
                ok = (len(got.losses) == len(ref.losses) and loss_err <= TOL and w_err <= TOL
                      and set(got.params) == set(ref.params) and fallback == funneled)
                check(ok)
                print(f"  {name:20s} losses rel err {loss_err:.2e}  weights rel err "
                      f"{w_err:.2e} ({w_name})  {'ok' if ok else 'FAIL'}"
                      f"{'' if fallback == funneled else ' (engine mode wrong)'}")
            # The same layout twice: bitwise the same run.
            again = layouts.run("dp2_zero3_again", 2, ["--dp", "2", "--zero", "3"])
            same = bitwise(again, layouts.runs["dp2_zero3"])
            check(same)
            print(f"  dp2_zero3 twice: {'bitwise identical' if same else 'FAIL: runs differ'}")
    finally:
        keep_or_remove(tmp, seed)


if __name__ == "__main__":
    run_test(main)
