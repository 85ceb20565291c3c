#!/usr/bin/python3
"""--recompute selective: the same run as no recomputation, bit for bit, with less memory.

For every family (GPT-2, Llama, Llama with MoE layers, DiT) trains a few steps with
`--recompute none` and with `--recompute selective` in the same layout (one process, tp 2
with sequence parallelism, pp 2 with the zero-bubble schedule (split backward: W recomputes
too), cp 2 ring) and checks that the per-step losses and the final weights are bitwise
identical. On one process it also runs `--recompute full` (and the old spelling, the bare
`--recompute`, the same run as full) and checks the start-up report's activation memory:
full < selective < none. Selective recomputation keeps every linear layer's output and
recomputes attention (from the kept qkv and its log-sum-exp) and the MLP's activation
function, so its run is the same kernels on the same inputs.
Usage: test_recompute_selective.py --loom PATH [--seed S]
"""
import os
import re
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
from loomtest import Layouts, bitwise, parse_test_args, write_text_shard  # noqa: E402
from loomtest import check, keep_or_remove, run_test  # noqa: E402

STEPS = 4
LAYOUTS = [
    ("single", 1, []),
    ("tp2_sp", 2, ["--tp", "2", "--sequence-parallel"]),
    ("pp2_zb", 2, ["--pp", "2", "--pp-schedule", "zb"]),
    ("cp2_ring", 2, ["--cp", "2", "--cp-mode", "ring"]),
]


def lm_base(loom, family, data, seed, moe=False):
    base = [loom, "train", "--family", family, "--vocab-size", "256", "--seq-len", "32",
            "--n-layer", "4", "--d-model", "32", "--n-head", "4",
            "--n-kv-head", "2" if family == "llama" else "4", "--d-ff", "64",
            "--micro-batch", "2", "--global-batch", "4", "--steps", str(STEPS), "--lr", "3e-3",
            "--warmup-steps", "1", "--grad-clip", "0.5", "--seed", str(seed), "--log-every", "0",
            "--threads", "1", "--data", data]
    if moe:
        base += ["--n-experts", "4", "--top-k", "2", "--moe-every", "2", "--capacity-factor", "0"]
    return base


def write_image_shard(path, rng, n=32, size=16, classes=4):
    """A shard in loom's image format (docs/IMAGES.md): header, int32 labels, u8 pixels."""
    header = np.zeros(256, dtype="<i4")
    header[:8] = [20261202, 1, n, 1, 1, size, size, classes]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(rng.integers(0, classes, n).astype("<i4").tobytes())
        f.write(rng.integers(0, 256, (n, 1, 1, size, size)).astype(np.uint8).tobytes())


def dit_base(loom, data, seed):
    return [loom, "train", "--family", "dit", "--n-layer", "3", "--n-head", "4",
            "--d-model", "32", "--d-ff", "64", "--height", "16", "--width", "16",
            "--channels", "1", "--patch", "4", "--n-classes", "4", "--micro-batch", "2",
            "--global-batch", "4", "--steps", str(STEPS), "--lr", "3e-3", "--warmup-steps", "1",
            "--grad-clip", "1.0", "--class-dropout", "0.25", "--seed", str(seed),
            "--log-every", "0", "--threads", "1", "--data", data]


def activations(run):
    return float(re.search(r"activations ([\d.]+) MiB \(micro-batch", run.stderr).group(1))


def main():
    args = parse_test_args()
    seed = args.seed
    tmp = tempfile.mkdtemp(prefix="loom_recompute_selective_")
    try:
        text = os.path.join(tmp, "train.bin")
        write_text_shard(text, seed)
        images = os.path.join(tmp, "images_000000.bin")
        write_image_shard(images, np.random.default_rng(seed))
        cases = [("gpt2", lm_base(args.loom, "gpt2", text, seed)),
                 ("llama", lm_base(args.loom, "llama", text, seed)),
                 ("llama_moe", lm_base(args.loom, "llama", text, seed, moe=True)),
                 ("dit", dit_base(args.loom, images, seed))]
        for case, base in cases:
            lay = Layouts(base, tmp, case + "_")
            print(f"{case} (seed {seed}):")
            for name, ranks, flags in LAYOUTS:
                if case == "llama_moe" and name == "cp2_ring":
                    continue  # MoE with cp: covered by one process and pp/tp here
                none = lay.run(name + "_none", ranks, flags + ["--recompute", "none"])
                sel = lay.run(name + "_selective", ranks, flags + ["--recompute", "selective"])
                same = bitwise(none, sel)
                check(same, f"  {name:10s} selective vs none: "
                      f"{'bitwise identical' if same else 'DIFFER'}")
            full = lay.run("single_full", 1, ["--recompute=full"])
            bare = lay.run("single_bare", 1, ["--recompute"])
            a_none = activations(lay.runs["single_none"])
            a_sel = activations(lay.runs["single_selective"])
            a_full = activations(full)
            check(bitwise(full, bare) and bitwise(full, lay.runs["single_none"]),
                  "  --recompute and --recompute=full: the same run as none")
            check(a_full < a_sel < a_none,
                  f"  activations MiB: none {a_none:.3f} > selective {a_sel:.3f} > "
                  f"full {a_full:.3f}")
    finally:
        keep_or_remove(tmp, seed)


if __name__ == "__main__":
    run_test(main)
