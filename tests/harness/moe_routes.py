"""Router decisions dumped by loom train --dump-dir for MoE models (train/route_dump.h),
and the test of a routing flip: top-k is discrete, so rounding-level differences between
layouts can flip the choice of a token whose router probabilities are within rounding of
each other (a near tie). The tests accept a differing decision only as such a near tie
and then compare the runs up to that step (see test_layouts_moe.py)."""
import os

import numpy as np

import safetensors_io

FLIP_MARGIN = 1e-5  # relative gap of two router probabilities that counts as a tie


def routes(out, dp, steps):
    """Decisions [steps, global micro-batch, MoE layer, token, K] and margins (without K)
    from the dp ranks' dumps; rank r's micro-batch k of a step is global r * accum + k."""
    per = [safetensors_io.load(os.path.join(out, f"routes_dp{r}.safetensors")) for r in range(dp)]

    def stack(key):
        parts = [t[key].reshape(steps, -1, *t[key].shape[1:]) for t in per]
        return np.concatenate(parts, axis=1)
    return stack("idx"), stack("gap")


def first_flip(ref, got, lo=0, hi=None):
    """None if every decision of steps [lo, hi) is the same; else (step, [(micro-batch,
    layer, token, ref choice, ref margin, got choice, got margin)]) for the first step that
    differs, with the differing tokens of the first differing MoE layer of each micro-batch
    (later layers of that micro-batch see inputs changed by the flip)."""
    (ri, rg), (gi, gg) = ref, got
    diff = (ri != gi).any(axis=-1)  # [steps, mb, layer, token]
    steps = [s for s in np.flatnonzero(diff.any(axis=(1, 2, 3)))
             if s >= lo and (hi is None or s < hi)]
    if not steps:
        return None
    s = int(steps[0])
    flips = []
    for mb in np.flatnonzero(diff[s].any(axis=(1, 2))):
        layer = int(np.flatnonzero(diff[s, mb].any(axis=1))[0])
        for t in np.flatnonzero(diff[s, mb, layer]):
            flips.append((int(mb), layer, int(t), ri[s, mb, layer, t].tolist(),
                          float(rg[s, mb, layer, t]), gi[s, mb, layer, t].tolist(),
                          float(gg[s, mb, layer, t])))
    return s, flips


def near_tie(flips):
    return all(rm < FLIP_MARGIN and gm < FLIP_MARGIN for _, _, _, _, rm, _, gm in flips)


def describe(flips):
    return "; ".join(f"micro-batch {mb} MoE layer {ly} token {t}: one process {rc} (margin "
                     f"{rm:.1e}), here {gc} (margin {gm:.1e})"
                     for mb, ly, t, rc, rm, gc, gm in flips[:4])
