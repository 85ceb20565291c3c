#!/usr/bin/python3
"""Invariant 1 for pipeline parallelism: every schedule computes the same function.

For both families (8 layers, Llama with 4 query / 2 key-value heads), trains on one
process, then under mpirun with pp in {2, 4} x every schedule (gpipe, 1f1b, interleaved
with 2 virtual stages, zb), pp 2 with uneven --pp-layers, pp 2 x dp 2 (ZeRO 0, 1 and 3)
and pp 2 x tp 2 (with and without sequence parallelism), and on 8 ranks pp 4 x dp 2
(ZeRO 2 and 3), pp 4 x tp 2 and pp 2 x dp 2 x tp 2 (every schedule appears with dp and
with tp), from the same seed and data; and with --recompute
(one process, dp 2 ZeRO-3 without pp, pp 2 with 1f1b and zb, with ZeRO-3 (1f1b and zb),
with tp 2 + sequence parallelism),
which must also be bitwise the same layout without recomputation. Checks that every
per-step loss, the validation losses and the final weights (gathered from the stages to
rank 0 by --dump-dir and --save-weights) equal the single-process run: whole-model
relative error <= 1e-5, every tensor <= 1e-4 (the criterion of test_layouts_tp.py), and
the initial weights bitwise. Usage: test_layouts_pp.py --loom PATH [--seed S]
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
from loomtest import (ADAM_EPS, TOL, Layouts, bitwise, loss_error, safetensors_io, same_tensors,  # noqa: E402
                      weights_error, write_text_shard)
from loomtest import check, keep_or_remove, parse_test_args, run_test  # noqa: E402

D_MODEL = 32
# (name, ranks, extra flags)
LAYOUTS = [
    ("pp2_gpipe", 2, ["--pp", "2", "--pp-schedule", "gpipe"]),
    ("pp2_1f1b", 2, ["--pp", "2", "--pp-schedule", "1f1b"]),
    ("pp2_interleaved", 2, ["--pp", "2", "--pp-schedule", "interleaved", "--virtual-stages", "2"]),
    ("pp2_zb", 2, ["--pp", "2", "--pp-schedule", "zb"]),
    ("pp2_uneven", 2, ["--pp", "2", "--pp-layers", "3,5"]),
    ("pp4_gpipe", 4, ["--pp", "4", "--pp-schedule", "gpipe"]),
    ("pp4_1f1b", 4, ["--pp", "4", "--pp-schedule", "1f1b"]),
    ("pp4_interleaved", 4, ["--pp", "4", "--pp-schedule", "interleaved", "--virtual-stages", "2"]),
    ("pp4_zb", 4, ["--pp", "4", "--pp-schedule", "zb"]),
    ("pp2_dp2_zero1_zb", 4, ["--pp", "2", "--dp", "2", "--zero", "1", "--pp-schedule", "zb"]),
    ("pp2_dp2_zero3", 4, ["--pp", "2", "--dp", "2", "--zero", "3"]),
    ("pp2_tp2_sp_zb", 4, ["--pp", "2", "--tp", "2", "--sequence-parallel", "--pp-schedule", "zb"]),
    ("pp2_tp2_interleaved", 4, ["--pp", "2", "--tp", "2", "--pp-schedule", "interleaved",
                                "--virtual-stages", "2"]),
    ("pp2_dp2_gpipe", 4, ["--pp", "2", "--dp", "2", "--pp-schedule", "gpipe"]),
    ("pp2_tp2_1f1b", 4, ["--pp", "2", "--tp", "2", "--pp-schedule", "1f1b"]),
    # 8 ranks: pp 4 with dp 2 or tp 2, and pp 2 x dp 2 x tp 2
    ("pp4_dp2_zero2_1f1b", 8, ["--pp", "4", "--dp", "2", "--zero", "2", "--pp-schedule", "1f1b"]),
    ("pp4_dp2_zero3_zb", 8, ["--pp", "4", "--dp", "2", "--zero", "3", "--pp-schedule", "zb"]),
    ("pp4_tp2_sp_interleaved", 8, ["--pp", "4", "--tp", "2", "--sequence-parallel",
                                   "--pp-schedule", "interleaved", "--virtual-stages", "2"]),
    ("pp4_tp2_gpipe", 8, ["--pp", "4", "--tp", "2", "--pp-schedule", "gpipe"]),
    ("pp2_dp2_tp2_sp_zero1_zb", 8, ["--pp", "2", "--dp", "2", "--tp", "2", "--sequence-parallel",
                                    "--zero", "1", "--pp-schedule", "zb"]),
    ("pp2_dp2_tp2_zero3_interleaved", 8, ["--pp", "2", "--dp", "2", "--tp", "2", "--zero", "3",
                                          "--pp-schedule", "interleaved", "--virtual-stages", "2"]),
    # activation recomputation: bitwise the run without it (4th field), and equivalent
    ("single_recompute", 1, ["--recompute"], "single"),
    ("dp2_zero3", 2, ["--dp", "2", "--zero", "3"]),  # recomputation under ZeRO-3's hooks
    ("dp2_zero3_recompute", 2, ["--dp", "2", "--zero", "3", "--recompute"], "dp2_zero3"),
    ("pp2_1f1b_recompute", 2, ["--pp", "2", "--pp-schedule", "1f1b", "--recompute"], "pp2_1f1b"),
    ("pp2_zb_recompute", 2, ["--pp", "2", "--pp-schedule", "zb", "--recompute"], "pp2_zb"),
    ("pp2_dp2_zero3_recompute", 4, ["--pp", "2", "--dp", "2", "--zero", "3", "--recompute"],
     "pp2_dp2_zero3"),
    ("pp2_dp2_zero3_zb", 4, ["--pp", "2", "--dp", "2", "--zero", "3", "--pp-schedule", "zb"]),
    ("pp2_dp2_zero3_zb_recompute", 4, ["--pp", "2", "--dp", "2", "--zero", "3", "--pp-schedule",
                                       "zb", "--recompute"], "pp2_dp2_zero3_zb"),
    ("pp2_tp2_sp_zb_recompute", 4, ["--pp", "2", "--tp", "2", "--sequence-parallel",
                                    "--pp-schedule", "zb", "--recompute"], "pp2_tp2_sp_zb"),
]


def main():
    args = parse_test_args()
    seed = args.seed
    tmp = tempfile.mkdtemp(prefix="loom_layouts_pp_")
    try:
        data = os.path.join(tmp, "train.bin")
        write_text_shard(data, seed)
        for family in ("gpt2", "llama"):
            base = [args.loom, "train", "--family", family, "--vocab-size", "256",
                    "--seq-len", "16", "--n-layer", "8", "--d-model", str(D_MODEL),
                    "--n-head", "4", "--n-kv-head", "2" if family == "llama" else "4",
                    "--d-ff", "64", "--micro-batch", "2", "--global-batch", "16", "--steps", "8",
                    "--lr", "3e-3", "--warmup-steps", "2", "--grad-clip", "0.5",
                    "--seed", str(seed), "--log-every", "0", "--threads", "1",
                    "--data", data, "--adam-eps", ADAM_EPS, "--bucket-mb", "0.01", "--val-data", data,
                    "--eval-every", "4", "--eval-batches", "1"]

            layouts = Layouts(base, tmp, f"{family}_")
            ref = layouts.run("single", 1)
            print(f"{family}: single process, loss {ref.losses[0]:.4f} -> {ref.losses[-1]:.4f}")
            for name, ranks, extra, *same_as in LAYOUTS:
                weights = os.path.join(tmp, f"{family}_{name}.safetensors")
                got = layouts.run(name, ranks, extra + ["--save-weights", weights])
                # the same layout without recomputation: bitwise equal
                same = bitwise(got, layouts.runs[same_as[0]]) if same_as else True
                loss_err = loss_error(got.losses, ref.losses)
                same_names = set(got.params) == set(ref.params)
                # whole model over the raw tensors (GPT-2's key bias included)
                all_err, w_err, w_name = weights_error(got.params, ref.params, D_MODEL,
                                                       whole_raw=True)
                init_same = same_tensors(got.init, ref.init)
                saved_same = same_tensors(safetensors_io.load(weights), got.params)
                ok = (len(got.losses) == len(ref.losses) and loss_err <= TOL and all_err <= TOL
                      and w_err <= 10 * TOL and same_names and init_same and saved_same
                      and same)
                check(ok)
                print(f"  {name:27s} losses rel err {loss_err:.2e}  weights rel err {all_err:.2e}, "
                      f"worst tensor {w_err:.2e} ({w_name})  init "
                      f"{'identical' if init_same else 'DIFFERS'}  saved "
                      f"{'= final' if saved_same else 'DIFFERS'}"
                      + (f"  {'bitwise =' if same else 'NOT bitwise'} {same_as[0]}"
                         if same_as else "") + f"  {'ok' if ok else 'FAIL'}")
    finally:
        keep_or_remove(tmp, seed)


if __name__ == "__main__":
    run_test(main)
