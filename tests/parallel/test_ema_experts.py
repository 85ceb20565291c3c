#!/usr/bin/python3
"""The moving average of the weights (--ema-decay) with expert parallelism's segments.

With --ep and ZeRO 1-3 the optimizer state is held per segment (dense tensors over dp,
experts over edp: parallel/ep_zero.h), and so is the moving average. A small MoE GPT-2
with --ema-decay trains on one process, then with --dp 4 --ep 2 at ZeRO 1 and 3, and
from a checkpoint saved by the ZeRO-1 run at step 4 resumed in --dp 2 without --ep:
every final weight and every moving-average weight must equal the single process's to the
layouts' criterion (tests/harness/loomtest.py), the resumed average too (the checkpoint
holds it as ema/ tensors, resharded like the moments). Top-k routing can flip on a near
tie between layouts (tests/parallel/test_layouts_moe.py explains), so a seed whose runs
differ is tried again with the next one, at most 3; a bug fails every seed.
Usage: test_ema_experts.py --loom PATH [--seed S]
"""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
from loomtest import (ADAM_EPS, TOL, Layouts, check, loss_error, parse_test_args, run_test,  # noqa: E402
                      weights_error, write_text_shard)

D_MODEL = 32
STEPS = 8


def attempt(args, tmp, seed):
    data = os.path.join(tmp, f"train_{seed}.bin")
    write_text_shard(data, seed)
    base = [args.loom, "train", "--family", "gpt2", "--vocab-size", "256", "--seq-len", "16",
            "--n-layer", "2", "--d-model", str(D_MODEL), "--n-head", "4", "--d-ff", "48",
            "--n-experts", "4", "--top-k", "2", "--capacity-factor", "0", "--micro-batch", "2",
            "--global-batch", "8", "--steps", str(STEPS), "--lr", "3e-3", "--warmup-steps", "2",
            "--ema-decay", "0.8", "--seed", str(seed), "--log-every", "0", "--threads", "1",
            "--data", data, "--adam-eps", ADAM_EPS, "--bucket-mb", "0.01"]
    lay = Layouts(base, tmp, f"s{seed}_")
    ref = lay.run("single", 1)
    ref_ema = ref.load("ema_final.safetensors")
    ckpt = os.path.join(tmp, f"s{seed}_ckpt")
    results = []
    for name, ranks, extra in (
            ("ep2_dp4_z1", 4, ["--dp", "4", "--ep", "2", "--zero", "1", "--ckpt-dir", ckpt,
                               "--ckpt-every", "4"]),
            ("ep2_dp4_z3", 4, ["--dp", "4", "--ep", "2", "--zero", "3"]),
            ("resumed_dp2", 2, ["--dp", "2", "--resume", os.path.join(ckpt, "step_00000004")])):
        got = lay.run(name, ranks, extra)
        want = ref.losses[4:] if name.startswith("resumed") else ref.losses
        loss_err = loss_error(got.losses, want)
        w_all, w_worst, _ = weights_error(got.params, ref.params, D_MODEL)
        e_all, e_worst, e_name = weights_error(got.load("ema_final.safetensors"), ref_ema, D_MODEL)
        ok = (len(got.losses) == len(want) and loss_err <= TOL and w_all <= TOL
              and w_worst <= 10 * TOL and e_all <= TOL and e_worst <= 10 * TOL)
        results.append((name, ok, f"losses {loss_err:.2e}  weights {w_all:.2e}  ema {e_all:.2e} "
                                  f"(worst {e_worst:.2e} {e_name})"))
    return results


def main():
    args = parse_test_args()
    seed = args.seed
    tmp = tempfile.mkdtemp(prefix="loom_ema_experts_")
    ok = False
    try:
        for s in range(seed, seed + 3):
            results = attempt(args, tmp, s)
            for name, good, line in results:
                print(f"  seed {s} {name:12s} {line}  {'ok' if good else 'differs'}")
            if all(good for _, good, _ in results):
                ok = True
                break
            print(f"  seed {s}: a layout differs (a routing near tie, or a bug): next seed")
    finally:
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp} (seed {seed})")
    check(ok, "every layout equal to one process with one of 3 seeds" if ok else
          "every seed differs")


if __name__ == "__main__":
    run_test(main)
