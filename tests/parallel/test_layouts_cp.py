#!/usr/bin/python3
"""Invariants 1 and 2 for context parallelism (--cp, ring and Ulysses): every layout
computes the same function as one process.

For the three families (GPT-2 with learned positions; Llama with RoPE and grouped-query
attention; a DiT with bidirectional attention and 2-D positions), trains a few steps on one
process, then under mpirun with every sequence split over cp 2 and 4 ranks in both modes
(ring: key/value blocks passed round, zigzag chunks for the causal models; ulysses:
all-to-all to heads, key/value heads replicated where there are fewer than cp), and
composed with dp 2 x ZeRO 1/3, tp 2 + sequence parallelism, pp 2 (1F1B, zero-bubble),
recomputation and (Llama MoE, dropless) ep 2. Checks that every per-step loss and every
final weight equal the single-process run (whole model <= 1e-5, worst tensor <= 1e-4, as
tests/harness/loomtest.py explains), that the initial weights are bitwise the unsharded
ones, that one layout twice is bitwise identical, and that a checkpoint written under cp
resumes bitwise in the same layout and to the same end in others. All three families run
with AdamW's epsilon 1e-6 (1e-8 by default; the DiT joined them after seed 686808348 moved
its first block's qkv bias by 1.1-4.5e-4 of that tensor in ten layouts, losses within
7e-9): with 1e-8, seed 351969333 moved one element
of GPT-2's 32 x 32 position table by 6.6e-5 (a near-zero gradient coordinate's rounding
noise made an O(lr) step), 1.0-2.0e-4 of that tensor, in three layouts; with 1e-6 the
whole GPT-2 model stays within 1.5e-7 and that tensor within 2.4e-6.

MoE: top-k routing is discrete, so a near tie between two router probabilities can flip
under rounding-level differences (tests/parallel/test_layouts_moe.py explains); cp keeps no
routing dumps, so an MoE layout that fails while the single-process run had a near tie
(margin < FLIP_MARGIN) before the first differing loss runs again with another seed (at
most MAX_SEEDS), like test_layouts_moe.py's pipelined layouts.
Usage: test_layouts_cp.py --loom PATH [--seed S]   (LOOM_LAYOUTS=a,b: only those)
"""
import os
import re
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
from loomtest import (ADAM_EPS, TOL, Layouts, bitwise, loss_error, parse_test_args, same_tensors,  # noqa: E402
                      weights_error, write_text_shard)
from loomtest import check, check_resume, keep_or_remove, run_test  # noqa: E402
from moe_routes import FLIP_MARGIN, routes  # noqa: E402

D_MODEL = 32
STEPS = 8
MAX_SEEDS = 3
RING, ULY = ["--cp-mode", "ring"], ["--cp-mode", "ulysses"]
# (name, ranks, flags)
COMMON = [
    ("cp2_ring", 2, ["--cp", "2"] + RING),
    ("cp4_ring", 4, ["--cp", "4"] + RING),
    ("cp2_ulysses", 2, ["--cp", "2"] + ULY),
    ("cp4_ulysses", 4, ["--cp", "4"] + ULY),
    ("cp2_dp2_zero1", 4, ["--cp", "2", "--dp", "2", "--zero", "1"] + RING),
    ("cp2_dp2_zero3_ulysses", 4, ["--cp", "2", "--dp", "2", "--zero", "3"] + ULY),
    ("cp2_tp2_sp", 4, ["--cp", "2", "--tp", "2", "--sequence-parallel"] + RING),
    ("cp2_tp2_sp_ulysses", 4, ["--cp", "2", "--tp", "2", "--sequence-parallel"] + ULY),
    ("cp2_pp2_1f1b", 4, ["--cp", "2", "--pp", "2", "--pp-schedule", "1f1b"] + RING),
    ("cp2_pp2_zb_ulysses", 4, ["--cp", "2", "--pp", "2", "--pp-schedule", "zb"] + ULY),
    ("cp2_recompute", 2, ["--cp", "2", "--recompute"] + RING),
]
MOE = [
    ("cp2_ep2", 2, ["--cp", "2", "--ep", "2"] + RING),
    ("cp2_dp2_ep2_zero1_ulysses", 4, ["--cp", "2", "--dp", "2", "--ep", "2", "--zero", "1"] + ULY),
    ("cp2_ep2_pp2", 4, ["--cp", "2", "--pp", "2", "--ep", "2"] + RING),
]


def lm_base(loom, family, data, seed, moe=False):
    base = [loom, "train", "--family", family, "--vocab-size", "256", "--seq-len", "32",
            "--n-layer", "4" if moe else "2", "--d-model", str(D_MODEL),
            "--n-head", "8" if family == "llama" else "4",
            "--n-kv-head", "2" if family == "llama" else "4", "--d-ff", "64",
            "--micro-batch", "2", "--global-batch", "4", "--steps", str(STEPS), "--lr", "3e-3",
            "--warmup-steps", "2", "--grad-clip", "0.5", "--seed", str(seed), "--log-every", "0",
            "--threads", "1", "--data", data, "--bucket-mb", "0.01", "--adam-eps", ADAM_EPS]
    if moe:
        base += ["--n-experts", "4", "--top-k", "2", "--moe-every", "2", "--capacity-factor", "0"]
    return base


def write_image_shard(path, rng, n=32, size=16, classes=4):
    """A shard in loom's image format (docs/data.md): header, int32 labels, u8 pixels."""
    header = np.zeros(256, dtype="<i4")
    header[:8] = [20261202, 1, n, 1, 1, size, size, classes]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(rng.integers(0, classes, n).astype("<i4").tobytes())
        f.write(rng.integers(0, 256, (n, 1, 1, size, size)).astype(np.uint8).tobytes())


def dit_base(loom, data, seed):
    # 16 x 16 gray images in 4 x 4 patches: 16 tokens, 4 per rank at cp 4
    return [loom, "train", "--family", "dit", "--n-layer", "2", "--n-head", "4",
            "--d-model", str(D_MODEL), "--d-ff", "64", "--height", "16", "--width", "16",
            "--channels", "1", "--patch", "4", "--n-classes", "4", "--micro-batch", "2",
            "--global-batch", "4", "--steps", str(STEPS), "--lr", "3e-3", "--warmup-steps", "2",
            "--grad-clip", "1.0", "--class-dropout", "0.25", "--seed", str(seed),
            "--log-every", "0", "--threads", "1", "--data", data, "--bucket-mb", "0.01",
            "--adam-eps", ADAM_EPS]


def compare(got, ref):
    loss_err = loss_error(got.losses, ref.losses)
    all_err, w_err, w_name = weights_error(got.params, ref.params, D_MODEL)
    init_same = same_tensors(got.init, ref.init)
    ok = (len(got.losses) == len(ref.losses) and loss_err <= TOL and all_err <= TOL
          and w_err <= 10 * TOL and init_same)
    text = (f"losses {loss_err:.2e}  weights {all_err:.2e} (worst {w_err:.2e} {w_name})  init "
            f"{'identical' if init_same else 'DIFFERS'}")
    return ok, text


def activations(run):
    """The start-up report's activation MiB per rank, and with --cp the bytes it says the
    same rank would need holding whole sequences (None without --cp)."""
    act = float(re.search(r"activations ([\d.]+) MiB \(micro-batch", run.stderr).group(1))
    m = re.search(r"context parallel \d+ ranks: activations per rank ([\d.]+) MiB .*?, "
                  r"([\d.]+) MiB holding whole sequences", run.stderr)
    return act, (float(m.group(1)), float(m.group(2))) if m else None


def near_tie_before(ref, got):
    """Whether the single run had a router near tie at or before the first differing loss."""
    bad = [i for i, (a, b) in enumerate(zip(got.losses, ref.losses))
           if abs(a - b) > TOL * max(abs(b), 1e-12)]
    last = bad[0] if bad else len(ref.losses) - 1
    _, gap = routes(ref.out, 1, STEPS)
    return bool((gap[:last + 1] < FLIP_MARGIN).any())


def check_family(args, tmp, seed, case, make_base, layouts_list, moe=False):
    only = os.environ.get("LOOM_LAYOUTS")
    todo = [x for x in layouts_list if not only or x[0] in only.split(",")]
    for attempt in range(MAX_SEEDS if moe else 1):
        s = seed + attempt
        layouts = Layouts(make_base(s), tmp, f"{case}_s{s}_")
        ref = layouts.run("single", 1)
        print(f"{case} (seed {s}): single process, loss {ref.losses[0]:.4f} -> "
              f"{ref.losses[-1]:.4f}")
        retry = []
        for name, ranks, extra in todo:
            got = layouts.run(name, ranks, extra)
            ok, text = compare(got, ref)
            if extra[:2] == ["--cp", "2"] and len(extra) == 4:  # cp alone: the memory report
                act, cp = activations(got)
                whole = activations(ref)[0]
                mem_ok = cp is not None and cp[0] == act and cp[1] == whole and act < whole
                ok = ok and mem_ok
                text += (f"  activations {act:.3f} MiB of {whole:.3f} one process "
                         f"{'(whole: same)' if mem_ok else f'MISMATCH {cp}'}")
            if not ok and moe and attempt + 1 < MAX_SEEDS and near_tie_before(ref, got):
                print(f"  {name:28s} {text}  near tie in the router: again with another seed")
                retry.append((name, ranks, extra))
                continue
            check(ok)
            print(f"  {name:28s} {text}  {'ok' if ok else 'FAIL'}")
        if not retry:
            break
        todo = retry
    return layouts


def check_twice_and_resume(args, tmp, layouts, ref_name="single"):
    """The same layout twice: bitwise; a cp checkpoint resumed bitwise in its layout and to
    the same end elsewhere."""
    ref = layouts.runs[ref_name]
    again = layouts.run("cp2_ring_again", 2, ["--cp", "2"] + RING)
    same = bitwise(again, layouts.runs["cp2_ring"])
    check(same)
    print(f"  cp2_ring twice: {'bitwise identical' if same else 'FAIL: runs differ'}")
    check_resume(layouts, "cp2 dp2 ZeRO-1", 4, ["--cp", "2", "--dp", "2", "--zero", "1"] + RING, 4,
                 [("single", 1, []), ("cp4_ulysses", 4, ["--cp", "4"] + ULY)], ref, D_MODEL)


def main():
    args = parse_test_args()
    seed = args.seed
    tmp = tempfile.mkdtemp(prefix="loom_layouts_cp_")
    try:
        text = os.path.join(tmp, "train.bin")
        write_text_shard(text, seed)
        images = os.path.join(tmp, "images_000000.bin")
        write_image_shard(images, np.random.default_rng(seed))
        cases = [
            ("gpt2", lambda s: lm_base(args.loom, "gpt2", text, s), COMMON, False),
            ("llama", lambda s: lm_base(args.loom, "llama", text, s), COMMON, False),
            ("dit", lambda s: dit_base(args.loom, images, s), COMMON, False),
            ("llama_moe", lambda s: lm_base(args.loom, "llama", text, s, moe=True), MOE, True),
        ]
        for case, make, lay, moe in cases:
            layouts = check_family(args, tmp, seed, case, make, lay, moe)
            if case == "llama" and not os.environ.get("LOOM_LAYOUTS"):
                check_twice_and_resume(args, tmp, layouts)
    finally:
        keep_or_remove(tmp, seed)


if __name__ == "__main__":
    run_test(main)
