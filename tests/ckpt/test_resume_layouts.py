#!/usr/bin/python3
"""Checkpoint resume across layouts (invariants 1 and 2 through a checkpoint).

For both families: an uninterrupted single-process run of 20 steps is the reference.
For each (A, B) pair of layouts (dp x ZeRO stage x tensor parallel x pipeline stages),
layout A trains 20 steps saving a checkpoint at step 10; layout B resumes from that
step-10 checkpoint and runs to 20. The resumed losses (steps 11-20, validation at 20) must
equal the reference to <= 1e-5 relative and the final weights by test_layouts.py's
weights_error (whole model <= 1e-5, worst tensor <= 1e-4); when A == B they must equal
A's own uninterrupted run bitwise.

Mixture of experts (Llama with SwiGLU experts in every second layer, capacity factor 1):
MOE_PAIRS add the expert-parallel degree, (dp, zero, tp, pp, ep); each expert tensor is
written once (dense tensors by dp shard, experts by edp shard) and loaded into any ep. As
in tests/parallel/test_layouts_moe.py, a routing decision that differs from the reference
(checked on A's steps 1-10 and B's steps 11-20) is accepted only as a near tie: the losses
are then compared up to it and the pair runs again with another seed (at most MAX_SEEDS).
A pipelined side dumps its routes as any other (each stage its own layers).
Usage: test_resume_layouts.py --loom PATH [--seed S]
"""
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
from loomtest import (ADAM_EPS, TOL, Layouts, Run, losses, safetensors_io, same_tensors,  # noqa: E402
                      weights_error, write_text_shard)
from loomtest import check, keep_or_remove, parse_test_args, run_test  # noqa: E402
from moe_routes import describe, first_flip, near_tie, routes  # noqa: E402

# (dp, zero, tp[, pp]): world size dp x tp x pp
PAIRS = [((1, 0, 1), (2, 1, 1)), ((2, 0, 1), (4, 3, 1)), ((4, 2, 1), (1, 0, 1)),
         ((2, 3, 1), (2, 3, 1)), ((4, 1, 1), (2, 2, 1)), ((1, 0, 1), (1, 0, 1)),
         ((1, 0, 2), (2, 1, 1)), ((2, 1, 2), (1, 0, 1)), ((1, 0, 1), (2, 3, 2)),
         ((2, 1, 2), (2, 1, 2)),
         # pipeline parallelism (dp, zero, tp, pp): stage-local shards merge into one manifest
         ((1, 0, 1, 2), (2, 1, 1)), ((2, 2, 1), (1, 0, 1, 2)), ((1, 0, 1, 2), (1, 0, 1, 2))]
# (dp, zero, tp, pp, ep): expert parallel <-> one process, ep 1 <-> ep 2, ep 4 -> ZeRO-3 at
# ep 1, same layout bitwise, and ep 1 with ZeRO; ZeRO 1-2 with ep (state sharded per kind,
# parallel/ep_zero.h): ep2 dp4 ZeRO-2 -> ep2 dp2 ZeRO-1, same layout bitwise, dp 2 -> ep 4
# ZeRO-2, ep2 dp4 ZeRO-3 -> ep2 dp2 ZeRO-3, and ep2 dp2 ZeRO-3 twice bitwise; MoE in
# pipeline stages: dp2 ZeRO-1 -> pp2 (its validation loss too), pp2 dp2 ZeRO-1 twice
# bitwise; with tensor
# parallelism (MoE replicated over tp): tp2 dp2 ZeRO-1 -> one process; expert
# parallelism inside pipeline stages: pp2 ep2 dp2 -> one process, one process -> pp2 ep2
# dp2 ZeRO-2; with tensor parallelism: tp2 ep2 dp2 ZeRO-1 -> one process, one process ->
# pp2 tp2 ep2 dp2 ZeRO-3 (8 ranks)
MOE_PAIRS = [((2, 0, 1, 1, 2), (1, 0, 1)), ((2, 0, 1), (4, 0, 1, 1, 2)),
             ((4, 0, 1, 1, 4), (2, 3, 1)), ((4, 0, 1, 1, 2), (4, 0, 1, 1, 2)),
             ((1, 0, 1), (2, 1, 1)),
             ((4, 2, 1, 1, 2), (2, 1, 1, 1, 2)), ((4, 1, 1, 1, 2), (4, 1, 1, 1, 2)),
             ((2, 0, 1), (4, 2, 1, 1, 4)), ((4, 3, 1, 1, 2), (2, 3, 1, 1, 2)),
             ((2, 3, 1, 1, 2), (2, 3, 1, 1, 2)), ((2, 1, 1), (1, 0, 1, 2)),
             ((2, 1, 1, 2), (2, 1, 1, 2)), ((2, 1, 2), (1, 0, 1)),
             ((2, 0, 1, 2, 2), (1, 0, 1)), ((1, 0, 1), (2, 2, 1, 2, 2)),
             ((2, 1, 2, 1, 2), (1, 0, 1)), ((1, 0, 1), (2, 3, 2, 2, 2))]
MOE = ["--n-experts", "8", "--top-k", "2", "--moe-every", "2", "--capacity-factor", "1.0",
       "--aux-loss-coef", "0.01", "--z-loss-coef", "0.001"]
MAX_SEEDS = 4


def unpack(layout):
    """(dp, zero, tp, pp, ep), pp and ep 1 when left out."""
    return (tuple(layout) + (1, 1))[:5]


def layout_name(layout):
    dp, zero, tp, pp, ep = unpack(layout)
    return (f"dp{dp}z{zero}" + (f"tp{tp}" if tp > 1 else "") + (f"pp{pp}" if pp > 1 else "")
            + (f"ep{ep}" if ep > 1 else ""))


def written_once(step_dir):
    """Every tensor's chunks add up to exactly its size (no element written twice or not
    at all: with ep each expert is written by one rank of its edp group)."""
    with open(os.path.join(step_dir, "manifest.json")) as f:
        m = json.load(f)
    bad = [t["name"] for t in m["tensors"]
           if sum(int(np.prod(c["length"])) for c in t["chunks"]) != int(np.prod(t["shape"]))]
    n_exp = sum("experts" in t["name"] for t in m["tensors"])
    print(f"  {step_dir}: {len(m['tensors'])} tensors ({n_exp} expert tensors), "
          f"{'each written once' if not bad else 'FAIL: not written exactly once: ' + bad[0]}")
    return not bad


def main():
    args = parse_test_args()
    seed = args.seed
    tmp = tempfile.mkdtemp(prefix="loom_ckpt_layouts_")
    try:
        data = os.path.join(tmp, "train.bin")
        write_text_shard(data, seed)
        for family, moe in (("gpt2", False), ("llama", False), ("llama", True)):
            tag = family + ("_moe" if moe else "")

            def train(name, layout, extra, run_seed):
                dp, zero, tp, pp, ep = unpack(layout)
                base = [args.loom, "train", "--family", family, "--vocab-size", "256",
                        "--seq-len", "24", "--n-layer", "2", "--d-model", "48", "--n-head", "4",
                        "--n-kv-head", "2" if family == "llama" else "4", "--d-ff", "96",
                        "--micro-batch", "2", "--global-batch", "8", "--steps", "20",
                        "--lr", "3e-3", "--warmup-steps", "3", "--grad-clip", "0.5",
                        "--seed", str(run_seed), "--log-every", "0", "--threads", "1",
                        "--data", data, "--adam-eps", ADAM_EPS, "--bucket-mb", "0.02", "--val-data", data,
                        "--eval-every", "10", "--eval-batches", "2"] + (MOE if moe else [])
                flags = ["--dp", str(dp), "--zero", str(zero), "--tp", str(tp), "--pp", str(pp)]
                flags += extra + (["--ep", str(ep)] if ep > 1 else [])
                got = Layouts(base, tmp, f"{tag}_s{run_seed}_").run(name, dp * tp * pp, flags)
                return (got.losses, got.params, got.stderr,
                        routes(got.out, dp, 20) if moe else None)

            refs = {}
            for a, b in MOE_PAIRS if moe else PAIRS:
                for attempt in range(MAX_SEEDS if moe else 1):
                    run_seed = seed + attempt
                    if run_seed not in refs:
                        refs[run_seed] = train("reference", (1, 0, 1), [], run_seed)
                    ref_l, ref_w, _, ref_r = refs[run_seed]
                    an = layout_name(a)
                    ck = os.path.join(tmp, f"{tag}_s{run_seed}_ck_{an}")
                    if not os.path.isdir(ck):
                        train(f"a_{an}", a, ["--ckpt-dir", ck, "--ckpt-every", "10"], run_seed)
                        if moe and not written_once(os.path.join(ck, "step_00000010")):
                            check(False)
                    a_out = os.path.join(tmp, f"{tag}_s{run_seed}_a_{an}")
                    a_l = losses(a_out + ".jsonl")
                    a_w = safetensors_io.load(os.path.join(a_out, "params_final.safetensors"))
                    a_r = routes(a_out, a[0], 20) if moe else None
                    name = f"{an}->{layout_name(b)}"
                    got_l, got_w, log, got_r = train("b_" + name.replace(">", ""), b,
                                                     ["--resume",
                                                      os.path.join(ck, "step_00000010")],
                                                     run_seed)
                    if "resumed from" not in log:
                        print(f"  {name}: FAIL: did not resume\n{log[-2000:]}")
                        check(False)
                        break
                    # steps 11-20, validation at step 20
                    want = Run(os.path.join(tmp, f"{tag}_s{run_seed}_reference")).losses_after(10)
                    errs = [abs(x - y) / abs(y) for x, y in zip(got_l, want)]
                    all_err, w_err, w_name = weights_error(got_w, ref_w, 48)
                    same = None
                    if a == b:  # same layout: bitwise what A computed without stopping
                        same = got_l == Run(a_out).losses_after(10) and same_tensors(got_w, a_w)
                    # A's decisions before the save, then B's after it, against the reference.
                    flip = moe and (first_flip(ref_r, a_r, 0, 10) or first_flip(ref_r, got_r, 10))
                    if flip:
                        s, flips = flip
                        before = [abs(x - y) / abs(y) for x, y in zip(a_l[:10], ref_l[:10])]
                        before = max(before[:s] + errs[:max(s - 10, 0)], default=0.0)
                        ok = near_tie(flips) and before <= TOL and same is not False
                        print(f"  {tag} {name:18s} seed {run_seed}: routing differs first at step "
                              f"{s + 1} ({describe(flips)}): "
                              f"{'near tie' if near_tie(flips) else 'NOT A NEAR TIE'}; losses "
                              f"before it rel err {before:.2e}"
                              f"{', bitwise identical to the uninterrupted run' if same else ''}"
                              f"  {'ok, again with another seed' if ok else 'FAIL'}")
                        if not ok:
                            check(False)
                            break
                        if attempt + 1 == MAX_SEEDS:
                            print(f"  {tag} {name}: FAIL: a routing flip at each of {MAX_SEEDS} "
                                  "seeds")
                            check(False)
                        continue
                    ok = (len(got_l) == len(want) and max(errs) <= TOL and all_err <= TOL
                          and w_err <= 10 * TOL)
                    msg = (f"losses rel err {max(errs):.2e}, weights {all_err:.2e}, worst tensor "
                           f"{w_err:.2e} ({w_name})")
                    if same is not None:
                        ok = ok and same
                        msg += ", bitwise identical to the uninterrupted run" if same else \
                            ", FAIL: not bitwise identical to the uninterrupted run"
                    check(ok)
                    print(f"  {tag} {name:18s} {msg}  {'ok' if ok else 'FAIL'}")
                    break
    finally:
        keep_or_remove(tmp, seed)


if __name__ == "__main__":
    run_test(main)
