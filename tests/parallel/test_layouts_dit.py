#!/usr/bin/python3
"""Invariants 1 and 2 for the diffusion transformer (family dit): every layout computes the
same function as one process, including the moving average of the weights.

On random image shards (random pixels and labels, written here; a non-square image with an
odd number of patch tokens, and a clip case with frames and temporal patches), trains a
small class-conditional DiT with flow matching (random t, noise and class dropout: all
drawn from (seed, step, sample), so the same in every layout) and --ema-decay, on one
process and then in the layouts below. Checks that every loss and every final weight and
moving-average weight equal the single-process run (whole model <= 1e-5, worst tensor
<= 1e-4, as tests/harness/loomtest.py explains), that the initial weights are bitwise the
unsharded ones, that one layout twice is bitwise identical (the image case also its pp 2 x
dp 2 layouts with sharded accumulation: ZeRO-3's default and ZeRO-2 --grad-accum sharded
under zb, whose start-up report must say "sharded accumulation"), and that a run stopped at a
checkpoint and resumed in another layout ends with the uninterrupted run's weights and
average. The image case also runs tp 2 under --precision bf16 against the one process that
rounds the partial sums as its bf16 messages do: bitwise (test_layouts_bf16.check_tp_rounded
says why). AdamW's epsilon is loomtest.ADAM_EPS (1e-6), which explains the seed of this
test that failed with 1e-8. Usage: test_layouts_dit.py --loom PATH [--seed S] [--quick]
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
from loomtest import (ADAM_EPS, TOL, Layouts, bitwise, loss_error, parse_test_args, same_tensors,  # noqa: E402
                      weights_error)
from loomtest import check, check_resume, keep_or_remove, run_test  # noqa: E402
from test_layouts_bf16 import (CP_BYTES, LOSS_TOL, PP_MIN, TENSOR_TOL, WHOLE_TOL,  # noqa: E402
                               check_tp_rounded)

D_MODEL = 32
# (name, ranks, extra flags)
IMAGE_LAYOUTS = [
    ("dp2_zero0", 2, ["--dp", "2"]),
    ("dp2_zero1", 2, ["--dp", "2", "--zero", "1"]),
    ("dp2_zero2", 2, ["--dp", "2", "--zero", "2"]),
    ("dp2_zero3", 2, ["--dp", "2", "--zero", "3"]),
    ("dp4_zero1", 4, ["--dp", "4", "--zero", "1"]),
    ("dp4_zero3", 4, ["--dp", "4", "--zero", "3"]),
    ("tp2", 2, ["--tp", "2"]),
    ("tp2_sp", 2, ["--tp", "2", "--sequence-parallel"]),
    ("pp2_1f1b", 2, ["--pp", "2", "--pp-schedule", "1f1b"]),
    ("pp2_zb", 2, ["--pp", "2", "--pp-schedule", "zb"]),
    ("pp2_interleaved", 2, ["--pp", "2", "--pp-schedule", "interleaved", "--virtual-stages", "2"]),
    ("recompute", 1, ["--recompute"]),
    # sharded accumulation (every micro-batch's stage ranges reduced into the shard):
    # ZeRO-3's default, and ZeRO-2 asked for it (zb: a block's reduction after its W)
    ("pp2_dp2_zero3", 4, ["--pp", "2", "--dp", "2", "--zero", "3"]),
    ("pp2_dp2_zero2_sharded_zb", 4, ["--pp", "2", "--dp", "2", "--zero", "2", "--grad-accum",
                                     "sharded", "--pp-schedule", "zb"]),
    ("pp2_dp2_tp2_sp", 8, ["--pp", "2", "--dp", "2", "--tp", "2", "--sequence-parallel",
                           "--zero", "1", "--recompute"]),
]
# pipelines with sharded accumulation (the start-up report must say so; the image case
# runs each twice: bitwise)
SHARDED = {"pp2_dp2_zero3", "pp2_dp2_zero2_sharded_zb"}
VIDEO_LAYOUTS = [
    ("dp2_zero3", 2, ["--dp", "2", "--zero", "3"]),
    ("tp2_sp", 2, ["--tp", "2", "--sequence-parallel"]),
    ("pp2_zb", 2, ["--pp", "2", "--pp-schedule", "zb"]),
    ("pp2_dp2_zero3", 4, ["--pp", "2", "--dp", "2", "--zero", "3"]),
]


def write_image_shard(path, rng, n, frames, channels, height, width, classes):
    """A shard in loom's image format (docs/data.md): header, int32 labels, u8 pixels."""
    header = np.zeros(256, dtype="<i4")
    header[:8] = [20261202, 1, n, frames, channels, height, width, classes]
    labels = rng.integers(0, classes, n).astype("<i4")
    pixels = rng.integers(0, 256, (n, frames, channels, height, width)).astype(np.uint8)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(labels.tobytes())
        f.write(pixels.tobytes())


def check_case(args, tmp, seed, case, shape, layouts_list, tp_bf16=False):
    rng = np.random.default_rng(seed)
    frames, patch_t, channels, height, width, patch, classes = shape
    data = os.path.join(tmp, f"{case}_train_000000.bin")
    write_image_shard(data, rng, 64, frames, channels, height, width, classes)
    base = [args.loom, "train", "--family", "dit", "--n-layer", "4", "--n-head", "4",
            "--d-model", str(D_MODEL), "--d-ff", "64", "--frames", str(frames),
            "--patch-t", str(patch_t), "--channels", str(channels), "--height", str(height),
            "--width", str(width), "--patch", str(patch), "--n-classes", str(classes),
            "--micro-batch", "2", "--global-batch", "8", "--steps", "8", "--lr", "3e-3",
            "--warmup-steps", "2", "--grad-clip", "1.0", "--class-dropout", "0.25",
            "--ema-decay", "0.8", "--seed", str(seed), "--log-every", "0", "--threads", "1",
            "--data", data, "--adam-eps", ADAM_EPS, "--bucket-mb", "0.01"]
    layouts = Layouts(base, tmp, f"{case}_")
    ref = layouts.run("single", 1)
    ref_ema = ref.load("ema_final.safetensors")
    print(f"{case}: single process, loss {ref.losses[0]:.4f} -> {ref.losses[-1]:.4f}")
    for name, ranks, extra in layouts_list:
        got = layouts.run(name, ranks, extra)
        loss_err = loss_error(got.losses, ref.losses)
        all_err, w_err, w_name = weights_error(got.params, ref.params, D_MODEL)
        ema_err, ema_w, ema_name = weights_error(got.load("ema_final.safetensors"), ref_ema,
                                                 D_MODEL)
        init_same = same_tensors(got.init, ref.init)
        ok = (len(got.losses) == len(ref.losses) and loss_err <= TOL and all_err <= TOL
              and w_err <= 10 * TOL and ema_err <= TOL and ema_w <= 10 * TOL and init_same)
        # ZeRO 2/3 pipelines asked for (or defaulting to) sharded accumulation: the
        # start-up report says it is on (not fallen back to local)
        sharded = name in SHARDED
        if sharded:
            ok = ok and "(sharded accumulation)" in got.stderr
        check(ok)
        print(f"  {name:16s} losses {loss_err:.2e}  weights {all_err:.2e} (worst {w_err:.2e} "
              f"{w_name})  ema {ema_err:.2e} (worst {ema_w:.2e} {ema_name})  init "
              f"{'identical' if init_same else 'DIFFERS'}"
              f"{'  sharded accumulation' if sharded else ''}  {'ok' if ok else 'FAIL'}")
    # the same layout twice: bitwise (the last one, and the image case's sharded ones)
    twice = layouts_list[-1:] + [x for x in layouts_list if case == "image" and x[0] in SHARDED]
    for name, ranks, extra in twice:
        again = layouts.run(name + "_again", ranks, extra)
        same = bitwise(again, layouts.runs[name]) and same_tensors(
            again.load("ema_final.safetensors"), layouts.runs[name].load("ema_final.safetensors"))
        check(same)
        print(f"  {name} twice: {'bitwise identical' if same else 'FAIL: runs differ'}")
    # saved at step 4 in one layout, resumed from there: bitwise in it (weights and
    # average), the same end in others
    check_resume(layouts, "dp2 ZeRO-1", 2, ["--dp", "2", "--zero", "1"], 4,
                 [("tp2_sp", 2, ["--tp", "2", "--sequence-parallel"]),
                  ("pp2_dp2_zero3", 4, ["--pp", "2", "--dp", "2", "--zero", "3"])],
                 ref, D_MODEL, also=["ema_final.safetensors"])
    if tp_bf16:
        check_tp_rounded("dit", base, tmp, D_MODEL)
    check_bf16_layouts(base, tmp, case)


ACTIVATIONS = re.compile(r"activations ([0-9.]+) MiB")


def check_bf16_layouts(base, tmp, case):
    """The dit under --precision bf16 (docs/precision.md): qkv, attention's output and the
    MLP's pre-activation are rounded to bf16 values and kept as bf16 (as the language models
    keep them; the modulated norms and the activation, which only GEMMs read, too). Keeping
    them in bf16 is the same function as keeping the rounded values in fp32
    (LOOM_BF16_FP32_ACTIVATIONS=1): bitwise, with fewer activation bytes in the start-up
    report, also under selective recomputation (layer 0's fp32 attention output serves every
    layer, rounded in place). Full and selective recomputation run the same kernels on the
    same bits: bitwise the plain run. dp 2 (ZeRO 1, 3) and cp 2 against one bf16 process
    within test_layouts_bf16.py's layout bounds (its docstring derives them: dp keeps every
    GEMM's operands, cp sums attention in another order before the rounding). cp has one
    more difference, a rounding's place: each rank's adaLN weight gradient is its tokens'
    part of d(mod), which the bf16 GEMM rounds before the ranks' parts are summed (one
    process rounds the whole sum), a relative change up to 2^-8 of that gradient each step;
    measured over 34 seeds (2026-12-07) the worst tensor, always an adaLN weight, 1.7e-3 to
    2.5e-3, inside the worst-tensor bound, and the whole model 1.3e-5 to 1.6e-5; pp 2 zb (split
    backward: attention's backward reads the kept qkv and output widened into the MLP's free
    scratch) against one process that rounds the residual stream at the stage boundary as
    its bf16 messages do (LOOM_BF16_ROUND_STREAM), and more than PP_MIN from the plain one.
    The image case (15 tokens) runs all but cp; the video case (12) the fp32-activation
    pair, dp 2 ZeRO-3 and cp 2."""
    image = case == "image"
    bf = base + ["--precision", "bf16"]
    lay = Layouts(bf, tmp, f"{case}_bf16_")
    ref = lay.run("single", 1)
    wide = Layouts(bf, tmp, f"{case}_bf16_fp32acts_")
    os.environ["LOOM_BF16_FP32_ACTIVATIONS"] = "1"
    try:
        f32 = wide.run("single", 1)
        f32_sel = wide.run("selective", 1, ["--recompute", "selective"]) if image else None
    finally:
        del os.environ["LOOM_BF16_FP32_ACTIVATIONS"]
    a16, a32 = (ACTIVATIONS.search(r.stderr) for r in (ref, f32))
    check(bitwise(ref, f32) and a16 and a32 and float(a16.group(1)) < float(a32.group(1)),
          f"dit {case} bf16: activations kept in bf16 bitwise the run keeping the rounded values in "
          f"fp32, activations {a16.group(1) if a16 else None} MiB against "
          f"{a32.group(1) if a32 else None}")
    dp = [("dp2_zero3", 2, ["--dp", "2", "--zero", "3"])]
    if not image:
        for name, ranks, extra in dp + [("cp2", 2, ["--cp", "2"])]:
            compare_bf16(f"{case} {name}", lay.run(name, ranks, extra), ref, "one bf16 process")
        # qkv and the output are bf16 values, so cp's ring sends its K/V blocks as bf16, and
        # loom plan prices the bytes the run's end line counts
        line = CP_BYTES.search(lay.runs["cp2"].stderr)
        p = subprocess.run([bf[0], "plan"] + bf[2:] + ["--explain", "--cp 2", "--json"],
                           capture_output=True, text=True)
        planned = ([int(json.loads(p.stdout).get(k, -1)) for k in
                    ("cp_message_bytes", "cp_message_bytes_bf16", "cp_message_bytes_fp32")]
                   if p.returncode == 0 else f"loom plan exit {p.returncode}: {p.stderr[-300:]}")
        check(line and int(line.group(2)) > 0 and planned == [int(line.group(i)) for i in (1, 2, 3)],
              f"dit video bf16 cp2: {line.group(0) if line else 'no bytes line'}; loom plan's "
              f"cp_message_bytes (total, bf16, fp32) {planned}")
        return
    for name, flags in (("recompute", ["--recompute"]),
                        ("selective", ["--recompute", "selective"])):
        check(bitwise(lay.run(name, 1, flags), ref),
              f"dit bf16 --{' '.join(flags)[2:]}: bitwise the plain bf16 run")
    check(bitwise(lay.runs["selective"], f32_sel), "dit bf16 selective recomputation: bitwise "
          "with the rounded values kept in fp32")
    for name, ranks, extra in [("dp2_zero1", 2, ["--dp", "2", "--zero", "1"])] + dp:
        compare_bf16(name, lay.run(name, ranks, extra), ref, "one bf16 process")
    os.environ["LOOM_BF16_ROUND_STREAM"] = "2"
    try:
        rounded = lay.run("rounded_stream_2", 1)
    finally:
        del os.environ["LOOM_BF16_ROUND_STREAM"]
    got = lay.run("pp2_zb", 2, ["--pp", "2", "--pp-schedule", "zb"])
    compare_bf16("pp2_zb", got, rounded, "one process rounding the stream entering layer 2")
    whole, _, _ = weights_error(got.params, ref.params, D_MODEL)
    check(whole > PP_MIN, f"dit bf16 pp2_zb: its bf16 messages move the weights {whole:.1e} "
          f"from the plain process (> {PP_MIN:.0e})")


def compare_bf16(name, got, ref, what):
    l_err = loss_error(got.losses, ref.losses)
    whole, worst, w_name = weights_error(got.params, ref.params, D_MODEL)
    check(l_err <= LOSS_TOL and whole <= WHOLE_TOL and worst <= TENSOR_TOL,
          f"dit bf16 {name} against {what}: losses {l_err:.1e} (<= {LOSS_TOL:.1e}), weights "
          f"{whole:.1e} (<= {WHOLE_TOL:.1e}), worst tensor {worst:.1e} {w_name} "
          f"(<= {TENSOR_TOL:.1e})")


def main():
    args = parse_test_args()
    seed = args.seed
    tmp = tempfile.mkdtemp(prefix="loom_layouts_dit_")
    try:
        # (frames, patch_t, channels, height, width, patch, classes): 3 x 5 = 15 tokens of
        # 4 x 4 gray patches; clips of 4 frames in 2-frame patches, 2 x 2 x 3 = 12 tokens
        for case, shape, lay in (("image", (1, 1, 1, 12, 20, 4, 5), IMAGE_LAYOUTS),
                                 ("video", (4, 2, 3, 8, 12, 4, 3), VIDEO_LAYOUTS)):
            check_case(args, tmp, seed, case, shape, lay, tp_bf16=case == "image")
    finally:
        keep_or_remove(tmp, seed)


if __name__ == "__main__":
    run_test(main)
