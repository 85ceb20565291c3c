#!/usr/bin/python3
"""--precision bf16 in every kind of layout: dp 2 (ZeRO 1 and 3), tp 2, pp 2 against one
bf16 process, 8 steps, both families; one layout twice bitwise.

Why the tolerance is not fp32's 1e-5. In fp32 the layouts differ from one process only by
summation order: operands of the GEMMs differ by delta ~ 1e-7 relative. In bf16 those
operands are rounded to 8 significant bits first, and rounding turns a small difference
into either none or one bf16 step: an operand within delta of a rounding midpoint (a
fraction ~ delta / 2^-8 of them) moves by ~2^-8 of itself, the others not at all. Over a
tensor that is a relative 2-norm difference of about sqrt(delta / 2^-8) * 2^-8 =
sqrt(delta) * 2^-4 ~ 2e-5 per GEMM (instead of 1e-7), which backward, AdamW and 8 steps
carry on. dp and pp keep every GEMM's operands and sums as one process has them, so they
stay at fp32's level (measured 0 to 3e-7); tp splits the row-parallel GEMMs' sums over the
ranks, so it sees the flips: measured over 3 seeds, losses 2.9e-6 to 1.2e-5, the whole
model's weights 2.0e-5 to 1.3e-4, the worst single tensor 1.2e-4 to 1.2e-3. Bounds: losses
1e-4, whole model 4e-4 (3x the worst measured), worst tensor 5e-3 (a small tensor whose
few elements flip, as fp32's per-tensor bound is 10x its whole-model one). What this still
catches: a layout whose GEMMs are not in bf16 at all (the sensitivity check: one process
in fp32 differs from the bf16 one by 8.8e-4 to 2.7e-3 in the whole model's weights, above
the bound), or any real error of the layout, which moves fp32 runs far above 1e-5 and
bf16 runs as far.

Usage: test_layouts_bf16.py --loom PATH [--seed S]
"""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
from loomtest import (ADAM_EPS, Layouts, bitwise, loss_error, parse_test_args, weights_error,  # noqa: E402
                      write_text_shard)
from loomtest import check, run_test  # noqa: E402

D_MODEL = 48
LOSS_TOL, WHOLE_TOL, TENSOR_TOL = 1e-4, 4e-4, 5e-3
LAYOUTS = [
    ("dp2_zero1", 2, ["--dp", "2", "--zero", "1"]),
    ("dp2_zero3", 2, ["--dp", "2", "--zero", "3"]),
    ("tp2", 2, ["--tp", "2"]),
    ("pp2", 2, ["--pp", "2", "--pp-schedule", "1f1b"]),
]


def main():
    args = parse_test_args()
    seed = args.seed
    tmp = tempfile.mkdtemp(prefix="loom_layouts_bf16_")
    try:
        data = os.path.join(tmp, "train.bin")
        write_text_shard(data, seed)
        for family in ("gpt2", "llama"):
            base = [args.loom, "train", "--family", family, "--vocab-size", "256",
                    "--seq-len", "24", "--n-layer", "2", "--d-model", str(D_MODEL),
                    "--n-head", "8" if family == "llama" else "4", "--n-kv-head", "4",
                    "--d-ff", "96", "--micro-batch", "2", "--global-batch", "8",
                    "--steps", "8", "--lr", "3e-3", "--warmup-steps", "2",
                    "--grad-clip", "1.0", "--seed", str(seed), "--log-every", "0",
                    "--threads", "1", "--data", data, "--bucket-mb", "0.02",
                    "--adam-eps", ADAM_EPS]
            layouts = Layouts(base + ["--precision", "bf16"], tmp, f"{family}_")
            ref = layouts.run("single", 1)
            check("precision bf16: oneDNN" in ref.stderr, f"{family}: the bf16 start-up line")
            print(f"{family}: one bf16 process, loss {ref.losses[0]:.4f} -> {ref.losses[-1]:.4f}")
            for name, ranks, extra in LAYOUTS:
                got = layouts.run(name, ranks, extra)
                l_err = loss_error(got.losses, ref.losses)
                whole, worst, w_name = weights_error(got.params, ref.params, D_MODEL)
                check(l_err <= LOSS_TOL and whole <= WHOLE_TOL and worst <= TENSOR_TOL,
                      f"{family} bf16 {name}: losses {l_err:.1e} (<= {LOSS_TOL:.0e}), weights "
                      f"{whole:.1e} (<= {WHOLE_TOL:.0e}), worst tensor {worst:.1e} {w_name} "
                      f"(<= {TENSOR_TOL:.0e})")
            again = layouts.run("dp2_zero3_again", 2, LAYOUTS[1][2])
            check(bitwise(again, layouts.runs["dp2_zero3"]),
                  f"{family} bf16 dp2_zero3 twice: bitwise the same losses and weights")
            fp32 = Layouts(base, tmp, f"{family}_fp32_").run("single", 1)
            whole, _, _ = weights_error(fp32.params, ref.params, D_MODEL)
            l_err = loss_error(fp32.losses, ref.losses)
            check(whole > WHOLE_TOL,
                  f"{family} sensitivity: fp32 against bf16 differs by weights {whole:.1e} "
                  f"(> {WHOLE_TOL:.0e}; losses {l_err:.1e})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    run_test(main)
