"""Draws dumped by loom rl --dump-dir (rl/sample_dump.h) and the test of a sampling flip:
a layout's weights differ from one process's by rounding (~1e-7), so its logits do, and a
draw whose uniform lies within that much of the end of its token's interval (or whose
token nearly ties a neighbour in the sorted order, or a top-k / top-p cut) can draw
another token. loom_sample records each draw's margin, the smallest relative change of its
inputs that could change the token (model/generate.h); the tests accept a differing draw
only as such a near tie (see test_rl.py)."""
import glob
import os

import numpy as np

import safetensors_io

# A margin that counts as a tie: the layouts the tests compare differ by ~1e-7 in their
# weights (<= 1e-5 allowed); the one flip seen (rl_loop, seed 322449158) had 9.9e-8.
FLIP_MARGIN = 1e-5


def samples(out):
    """{sequence number in the run: (tokens, margins)} from every replica's dump."""
    d = {}
    for f in sorted(glob.glob(os.path.join(out, "samples_gen*.safetensors"))):
        t = safetensors_io.load(f)
        for i, q in enumerate(t["seq"].tolist()):
            if q >= 0:
                d[q] = (t["tok"][i], t["margin"][i])
    return d


def first_flip(ref, got, n_seq):
    """None if every sequence drew the same tokens; else (iteration, [(sequence, position,
    ref token, ref margin, got token, got margin)]) with each differing sequence of the
    first iteration that differs, at its first differing draw (each sequence is drawn on
    its own, so each needs its own near tie). A sequence in one dump only is a flip with
    margin inf."""
    qs = sorted(set(ref) | set(got))
    diff = [q for q in qs if q not in ref or q not in got or
            not np.array_equal(ref[q][0], got[q][0])]
    if not diff:
        return None
    it = diff[0] // n_seq
    flips = []
    for q in diff:
        if q // n_seq != it:
            break
        if q not in ref or q not in got:
            flips.append((q, -1, None, float("inf"), None, float("inf")))
            continue
        (rt, rm), (gt, gm) = ref[q], got[q]
        p = int(np.flatnonzero(rt != gt)[0])
        flips.append((q, p, int(rt[p]), float(rm[p]), int(gt[p]), float(gm[p])))
    return it, flips


def near_tie(flips):
    return all(rm < FLIP_MARGIN and gm < FLIP_MARGIN for _, _, _, rm, _, gm in flips)


def describe(flips):
    return "; ".join(f"sequence {q} draw {p}: one process {rt} (margin {rm:.1e}), here {gt} "
                     f"(margin {gm:.1e})" for q, p, rt, rm, gt, gm in flips[:4])
