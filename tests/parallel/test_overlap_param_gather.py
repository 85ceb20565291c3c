#!/usr/bin/python3
"""--overlap-param-gather (parallel/param_gather.h): the ZeRO-1/2 parameter all-gather
split per block and waited for in the next forward gathers the same values, so a run
must be bitwise the run without the flag, and the same function as one process.

For both families, with validation every 10 steps (evaluation waits for every range),
20 steps of dp2 ZeRO-1, dp2 ZeRO-2, dp4 ZeRO-2 and dp2 x tp2 (sequence parallel) ZeRO-2,
each with and without the flag:
per-step and validation losses and final weights bitwise equal, and equivalent to one
process (losses and the whole model within 1e-5, every tensor within 1e-4: test_layouts'
criterion); --metrics rows carry dp.param_wait_ms. Then (GPT-2) dp2 ZeRO-1 with the flag
under LOOM_MPI_THREAD=funneled (engine without its thread) must equal the threaded run without the flag bitwise, and a dp2
ZeRO-2 run with the flag that saves a checkpoint at step 10 (the save waits for the
gather) and one resumed from it must end bitwise as the uninterrupted run.
Usage: test_overlap_param_gather.py --loom PATH [--seed S]
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
from loomtest import (ADAM_EPS, TOL, Layouts, bitwise, loss_error,  # noqa: E402
                      weights_error, write_text_shard)
from loomtest import check, check_resume, keep_or_remove, parse_test_args, run_test  # noqa: E402

FLAG = "--overlap-param-gather"
# (dp, tp, zero) run with and without the flag, for both families
LAYOUTS = ((2, 1, 1), (2, 1, 2), (4, 1, 2), (2, 2, 2))


def main():
    args = parse_test_args()
    seed = args.seed
    tmp = tempfile.mkdtemp(prefix="loom_overlap_pg_")
    try:
        data = os.path.join(tmp, "train.bin")
        write_text_shard(data, seed)
        for family in ("gpt2", "llama"):
            base = [args.loom, "train", "--family", family, "--vocab-size", "256",
                    "--seq-len", "24", "--n-layer", "3", "--d-model", "48", "--n-head", "4",
                    "--n-kv-head", "2" if family == "llama" else "4", "--d-ff", "96",
                    "--micro-batch", "2", "--global-batch", "8", "--steps", "20",
                    "--lr", "3e-3", "--warmup-steps", "3", "--grad-clip", "0.5",
                    "--seed", str(seed), "--log-every", "0", "--threads", "1",
                    "--data", data, "--adam-eps", ADAM_EPS, "--bucket-mb", "0.02", "--val-data", data,
                    "--eval-every", "10", "--eval-batches", "2"]

            layouts = Layouts(base, tmp, f"{family}_")
            ref = layouts.run("single", 1)
            print(f"{family}: single process, loss {ref.losses[0]:.4f} -> {ref.losses[-1]:.4f}")
            plain = {}
            for dp, tp, zero in LAYOUTS:
                layout = ["--dp", str(dp), "--zero", str(zero)]
                name = f"dp{dp}_zero{zero}"
                if tp > 1:  # the gathered ranges are then each tp rank's slices
                    layout += ["--tp", str(tp), "--sequence-parallel"]
                    name = f"dp{dp}_tp{tp}_sp_zero{zero}"
                plain[name] = layouts.run(name, dp * tp, layout)
                got = layouts.run(name + "_overlap", dp * tp, layout + [FLAG])
                # the dp breakdown reports the forward's exposed wait for the gather
                waits = all(r["dp"]["param_wait_ms"] >= 0 for r in got.rows)
                same = waits and bitwise(plain[name], got)
                loss_err = loss_error(got.losses, ref.losses)
                # the layouts' criterion (loomtest.weights_error): whole model, worst tensor
                w_err, w_worst, w_name = weights_error(got.params, ref.params, 48)
                ok = (same and len(got.losses) == len(ref.losses) and loss_err <= TOL
                      and w_err <= TOL and w_worst <= 10 * TOL)
                check(ok)
                print(f"  {name} {FLAG}: {'bitwise = without' if same else 'DIFFERS from without'}"
                      f"{'' if waits else ' (no dp.param_wait_ms in --metrics)'}"
                      f", vs one process: losses {loss_err:.2e}, weights {w_err:.2e} (worst tensor "
                      f"{w_worst:.2e}, {w_name})  "
                      f"{'ok' if ok else 'FAIL'}")
            if family != "gpt2":
                continue
            # The engine without its thread: the gathers progress from the training thread.
            got = layouts.run("dp2_zero1_overlap_funneled", 2, ["--dp", "2", "--zero", "1", FLAG],
                              ["LOOM_MPI_THREAD=funneled"])
            fallback = "communication engine: no thread" in got.stderr
            ok = fallback and bitwise(plain["dp2_zero1"], got)
            check(ok)
            print(f"  dp2_zero1 {FLAG} funneled (no engine thread: {fallback}): "
                  f"{'bitwise = threaded without' if ok else 'FAIL'}")
            # Checkpoint at step 10 with gathers in flight, and a resume from it: bitwise (steps
            # 11-20 and the validation at step 20), and the saving run bitwise the one without
            full = check_resume(layouts, f"dp2 ZeRO-2 {FLAG}", 2, ["--dp", "2", "--zero", "2", FLAG],
                                10)
            ok = bitwise(plain["dp2_zero2"], full)
            check(ok)
            print(f"  dp2_zero2 {FLAG} saving a checkpoint at 10: "
                  f"{'bitwise = uninterrupted' if ok else 'FAIL'}")
    finally:
        keep_or_remove(tmp, seed)


if __name__ == "__main__":
    # every layout for both families, then funneled, the checkpoint resume and the saving
    # run (GPT-2)
    run_test(main, expect=2 * len(LAYOUTS) + 3)
