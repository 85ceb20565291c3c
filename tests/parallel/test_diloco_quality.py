#!/usr/bin/python3
"""DiLoCo's quality, test-sized: H = 50 with W = 4 ends within 2% of synchronous dp's
validation loss at the same tokens on the KJV demo data (docs/diloco.md, "Quality").

bench/bench_diloco.py's quality recipe (a warm start of half the run: --outer-start-step
150 of 300 steps, outer lr 0.8, Nesterov momentum 0.5, --inner-lr-scale 2) on a GPT-2 of 2
layers x 64 (the bench's own is 4 x 128), a random seed each run (printed). Checks:
1. DiLoCo's final validation loss is within 2% of sync dp's (the bench runs both, equal
   tokens: the same global batch and steps);
2. the warm start is synchronous dp: the two runs' validation losses up to step 150 agree
   (<= 1e-4 relative: the same function, the gradient sums in another order);
3. the rounds after it are DiLoCo's: after step 150 it sends >= 49x fewer bytes per token
   than sync dp (50x at H = 50: one exchange of the parameters per 50 steps).
Usage: test_diloco_quality.py --loom PATH [--seed S]
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "harness"))
from loomtest import Skip, check, parse_test_args, run_test  # noqa: E402

BENCH = os.path.join(HERE, "..", "..", "bench", "bench_diloco.py")
RECIPE = ["--model", "2x64", "--steps", "300", "--rounds", "0", "--no-streaming",
          "--outer-start-step", "150", "--outer-lr", "0.8", "--outer-momentum", "0.5",
          "--inner-lr-scale", "2"]


def main():
    args = parse_test_args()
    if shutil.which("bible") is None:
        raise Skip("needs Debian's bible-kjv (the KJV demo data)")
    work = tempfile.mkdtemp(prefix="loom_diloco_quality_")  # the bench draws its PNG here
    try:
        p = subprocess.run(["/usr/bin/python3", BENCH, "--loom", os.path.abspath(args.loom),
                            "--seed", str(args.seed)] + RECIPE, capture_output=True, text=True,
                           timeout=1200, cwd=work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        print(p.stdout[-2000:], p.stderr[-2000:])
        check(False, f"bench_diloco exited {p.returncode}")
        return
    runs = json.loads(lines[-1])["runs"]
    sync, diloco = runs["sync_dp"], runs["diloco"]
    gap = diloco["val_loss"] / sync["val_loss"] - 1.0
    check(gap <= 0.02, f"DiLoCo's validation loss {diloco['val_loss']:.4f} against sync dp's "
                       f"{sync['val_loss']:.4f}: {100 * gap:+.2f}% (expected within 2%)")
    warm = [(a[0], abs(a[1] / b[1] - 1.0)) for a, b in zip(diloco["val_curve"], sync["val_curve"])
            if a[0] == b[0] and a[0] <= 150]
    check(len(warm) >= 3 and all(e <= 1e-4 for _, e in warm),
          f"the warm start is sync dp: validation at steps {[s for s, _ in warm]} within "
          f"{max((e for _, e in warm), default=0):.1e} relative (expected <= 1e-4)")
    fewer = diloco["fewer_bytes_than_sync_after_start"]
    check(fewer >= 49, f"after step 150: {fewer:.1f}x fewer bytes per token than sync dp "
                       f"(expected 50x at H = 50)")
    print("curves (step, val loss): sync dp", sync["val_curve"], "DiLoCo", diloco["val_curve"])


if __name__ == "__main__":
    run_test(main)
