#!/usr/bin/python3
"""Invariants 1 and 2 for the multimodal LLM (family vlm): every layout computes the same
function as one process.

On a random vlm shard (docs/vlm.md's format, written here: samples with 0 to 2 images of
12 x 8 pixels, random bytes and answer masks), trains a small vlm (a 2-block ViT, a 2-block
Llama decoder) on one process and in the layouts below; checks that every loss and every
final weight equal the single-process run (whole model <= 1e-5, worst tensor <= 1e-4, as
tests/harness/loomtest.py explains), that the initial weights are bitwise the unsharded
ones, that one layout twice is bitwise identical, and that a run stopped at a checkpoint and
resumed (in its layout: bitwise; in pp 2: equal) ends as the uninterrupted run. The pipeline layouts hold the encoder
and projector on the first stage (Megatron's placement); under tensor parallelism every
tp rank runs the (replicated) encoder and projector, the decoder is Megatron-sharded and
the masked loss vocabulary-parallel. Under context parallelism (cp 2 ring and Ulysses, and
cp 2 x tp 2 + sp x pp 2) a rank encodes the images with slot rows in its chunks and an
image cut by a chunk boundary runs on both ranks. A second case freezes the vision
encoder (--freeze vision, with --ema-decay): one process against dp 2 ZeRO-1 and ZeRO-3 (the
weights and their moving average), the encoder's weights and average must end bitwise as
they started, the report's gradient and AdamW bytes drop by the encoder's size (at ZeRO-3
AdamW's by its shard), a ZeRO-3 checkpoint resumes bitwise, average included (from disk and
from peers' memory) and, resumed with the encoder trainable (LLaVA's stage 2), one process
and dp 2 ZeRO-2 agree and the encoder's average starts at its weights; --freeze vision,llm
(with --ema-decay) at dp 2 ZeRO-3 and at pp 2 (1f1b and zb: a frozen decoder in the
pipeline) equals one process, ZeRO-3 twice bitwise. A third case trains on samples with 0 to 3 images with
--balance-dp at dp 2 and at pp 2 x dp 2 (the global batch's samples assigned by predicted
compute): equal to one process, bitwise twice, and the plan's slowest rank over the mean no worse than the
usual slices' on every step and better on the whole. A fourth case, with an encoder wider than
a decoder stage's work, runs --vision-schedule bubbles at pp 2 (1f1b and zb: the encoder's
pieces of some micro-batches on the second stage, on a replica of its weights), pp 2 x dp 2
at ZeRO-3 (sharded accumulation, its default) and at ZeRO-2 with --grad-accum sharded (zb),
pp 2 x cp 2, and interleaved (2 chunks a rank): equal to one process, the plan moved pieces
off the first stage, and 1f1b and each of the other four twice is bitwise; the ZeRO-3 one's
checkpoint resumes bitwise in its layout and equal in pp 2 x cp 2 with the pieces; under
--precision bf16, pp 2 1f1b with the pieces against the encoder on stage 0 (bf16_bubbles says
which bound and why; step 1's loss equal), twice bitwise. tp 2 under
--precision bf16 equals, bitwise, the one process that rounds the partial sums as its bf16
messages do (test_layouts_bf16.check_tp_rounded says why).
Usage: test_layouts_vlm.py --loom PATH [--seed S]
"""
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import types

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
from loomtest import (ADAM_EPS, MPIRUN, TOL, Layouts, bitwise, loss_error, parse_test_args,  # noqa: E402
                      same_tensors, weights_error)
from loomtest import check, check_resume, keep_or_remove, run_test  # noqa: E402
from loomtest import bf16_gemms  # noqa: E402
from test_layouts_bf16 import LOSS_TOL as BF16_LOSS_TOL  # noqa: E402
from test_layouts_bf16 import TENSOR_TOL as BF16_TENSOR_TOL  # noqa: E402
from test_layouts_bf16 import WHOLE_TOL as BF16_WHOLE_TOL  # noqa: E402
from test_layouts_bf16 import check_tp_rounded  # noqa: E402

D_MODEL = 16
LAYOUTS = [
    ("dp2_zero0", 2, ["--dp", "2"]),
    ("dp2_zero1", 2, ["--dp", "2", "--zero", "1"]),
    ("dp2_zero3", 2, ["--dp", "2", "--zero", "3"]),
    ("pp2_1f1b", 2, ["--pp", "2", "--pp-schedule", "1f1b"]),
    ("pp2_zb", 2, ["--pp", "2", "--pp-schedule", "zb"]),
    ("tp2", 2, ["--tp", "2"]),
    ("tp2_sp", 2, ["--tp", "2", "--sequence-parallel"]),
    ("recompute", 1, ["--recompute"]),
    ("cp2_ring", 2, ["--cp", "2"]),
    ("cp2_ulysses", 2, ["--cp", "2", "--cp-mode", "ulysses"]),
    ("cp2_tp2_sp_pp2", 8, ["--cp", "2", "--tp", "2", "--sequence-parallel", "--pp", "2"]),
    ("pp2_dp2_tp2_sp", 8, ["--pp", "2", "--dp", "2", "--tp", "2", "--sequence-parallel",
                           "--zero", "1"]),
]
H, W, P, T, MAX_IMAGES = 12, 8, 4, 24, 2  # 3 x 2 = 6 image tokens of 4 x 4 patches


def write_shard(path, rng, n, max_images=MAX_IMAGES):
    """docs/vlm.md: header, entries, int32 tokens, mask bytes, u8 images."""
    samples = []
    for _ in range(n):
        k = rng.randint(0, max_images)
        text = [rng.randint(0, 255) for _ in range(rng.randint(max(1, k), T + 1 - 6 * k))]
        for _ in range(k):
            text.insert(rng.randint(0, len(text) - 1), 256)
        mask = [0 if t == 256 else int(rng.random() < 0.7) for t in text]
        samples.append((text, mask, bytes(rng.randint(0, 255) for _ in range(k * H * W)), k))
    tokens = [t for s in samples for t in s[0]]
    header = np.zeros(256, dtype="<i4")
    header[:11] = [20261205, 1, n, 1, H, W, 256, 257, 258, len(tokens),
                   sum(s[3] for s in samples)]
    entries, t0, i0 = [], 0, 0
    for s in samples:
        entries += [t0, len(s[0]), i0, s[3]]
        t0, i0 = t0 + len(s[0]), i0 + s[3]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.array(entries, dtype="<i4").tobytes())
        f.write(np.array(tokens, dtype="<i4").tobytes())
        f.write(bytes(m for s in samples for m in s[1]))
        f.write(b"".join(s[2] for s in samples))


EMA = "ema_final.safetensors"  # --ema-decay's average of the weights (--dump-dir)


def has_ema(run):
    return os.path.exists(os.path.join(run.out, EMA))


def compare(layouts, ref, name, ranks, extra):
    """One layout against one process: losses, final weights and (with --ema-decay) the
    weights' moving average within the layout criterion, initial weights bitwise."""
    got = layouts.run(name, ranks, extra)
    loss_err = loss_error(got.losses, ref.losses)
    all_err, w_err, w_name = weights_error(got.params, ref.params, D_MODEL)
    init_same = same_tensors(got.init, ref.init)
    ema = ""
    ok = (len(got.losses) == len(ref.losses) and loss_err <= TOL and all_err <= TOL
          and w_err <= 10 * TOL and init_same)
    if has_ema(ref):
        e_all, e_worst, _ = weights_error(got.load(EMA), ref.load(EMA), D_MODEL)
        ok = ok and e_all <= TOL and e_worst <= 10 * TOL
        ema = f"  ema {e_all:.2e}"
    check(ok)
    print(f"  {name:16s} losses {loss_err:.2e}  weights {all_err:.2e} (worst {w_err:.2e} "
          f"{w_name}){ema}  init {'identical' if init_same else 'DIFFERS'}  "
          f"{'ok' if ok else 'FAIL'}")
    return got


def predicted(run_path):
    with open(run_path + ".jsonl") as f:
        return [json.loads(line)["dp_balance"]["predicted"] for line in f]


def balance_dp(args, base, tmp, seed):
    """--balance-dp on mixed samples (0 to 3 images): dp 2 equals one process, twice is
    bitwise, and the plan's slowest rank over the mean is lower than the usual slices'."""
    data = os.path.join(tmp, "mixed_000000.bin")
    write_shard(data, random.Random(seed + 1), 64, max_images=3)
    mixed = [a for a in base]
    mixed[mixed.index("--max-images") + 1] = "3"
    mixed[mixed.index("--data") + 1] = data
    mixed[mixed.index("--global-batch") + 1] = "16"
    lay = Layouts(mixed, tmp, "vlm_mixed_")
    mref = lay.run("single", 1)
    print(f"vlm, 0 to 3 images a sample: single process, loss {mref.losses[0]:.4f} -> "
          f"{mref.losses[-1]:.4f}")
    bal = ["--dp", "2", "--zero", "1", "--balance-dp"]
    compare(lay, mref, "dp2_balance", 2, bal)
    again = lay.run("dp2_balance_again", 2, bal)
    same = bitwise(again, lay.runs["dp2_balance"])
    check(same)
    print(f"  dp2_balance twice: {'bitwise identical' if same else 'FAIL: runs differ'}")
    compare(lay, mref, "pp2_dp2_balance", 4, ["--pp", "2", "--dp", "2", "--balance-dp"])
    compare(lay, mref, "dp2_slices", 2, ["--dp", "2", "--zero", "1"])
    with_b = predicted(lay.path("dp2_balance"))
    without = predicted(lay.path("dp2_slices"))
    ok = all(b <= w + 1e-9 for b, w in zip(with_b, without)) and sum(with_b) < sum(without)
    check(ok)
    print(f"  predicted slowest rank / mean: slices {max(without):.3f} (worst step), balanced "
          f"{max(with_b):.3f}  {'ok' if ok else 'FAIL'}")


def moved_off_first(run):
    """The start-up line of --vision-schedule bubbles: some micro-batch encoded off stage 0."""
    line = [x for x in run.stderr.splitlines() if "--vision-schedule bubbles:" in x]
    per = line[0].split("per stage ")[1].split(" ")[0].split(",") if line else []
    moved = any(n != "0" for n in per[1:])
    check(moved)
    print(f"    {line[0].split('loom: ')[-1] if line else 'no plan line'}  "
          f"{'ok' if moved else 'FAIL: no piece off stage 0'}")


def twice(lay, name, ranks, flags):
    """The layout `name` (run already) again: bitwise the same."""
    again = lay.run(name + "_again", ranks, flags)
    same = bitwise(again, lay.runs[name])
    check(same)
    print(f"  {name} twice: {'bitwise identical' if same else 'FAIL: runs differ'}")


def vision_bubbles(base, tmp):
    """--vision-schedule bubbles: an encoder of width 32 (about twice a decoder stage's
    forward) so that the plan moves pieces to stage 1; pp 2 1f1b and zb equal one process."""
    wide = list(base)
    wide[wide.index("--vit-d-model") + 1] = "32"
    lay = Layouts(wide, tmp, "vlm_bubbles_")
    bref = lay.run("single", 1)
    print(f"vlm, encoder width 32: single process, loss {bref.losses[0]:.4f} -> "
          f"{bref.losses[-1]:.4f}")
    for schedule in ("1f1b", "zb"):
        name = f"pp2_{schedule}_bubbles"
        flags = ["--pp", "2", "--pp-schedule", schedule, "--vision-schedule", "bubbles"]
        moved_off_first(compare(lay, bref, name, 2, flags))
    flags = ["--pp", "2", "--pp-schedule", "1f1b", "--vision-schedule", "bubbles"]
    twice(lay, "pp2_1f1b_bubbles", 2, flags)
    # the decoder's other layouts with the pieces, each twice: pp 2 x dp 2 at ZeRO-3 (its
    # default, sharded accumulation: the replicas' gradients join the last micro-batch's
    # reduction) and ZeRO-2 --grad-accum sharded with zb (micro-batch 1: 4 a dp rank, so
    # that pieces move), cp 2 (a replica encodes its cp rank's images), and interleaved
    # (2 chunks a rank: 4 decoder layers, its own reference, 3 steps)
    bb = ["--vision-schedule", "bubbles"]
    more = [("pp2_dp2_zero3_bubbles", 4,
             ["--pp", "2", "--dp", "2", "--zero", "3", "--micro-batch", "1"] + bb),
            ("pp2_dp2_zero2_sharded_zb_bubbles", 4,
             ["--pp", "2", "--dp", "2", "--zero", "2", "--grad-accum", "sharded",
              "--pp-schedule", "zb", "--micro-batch", "1"] + bb),
            ("pp2_cp2_bubbles", 4, ["--pp", "2", "--cp", "2"] + bb)]
    for name, ranks, f in more:
        got = compare(lay, bref, name, ranks, f)
        moved_off_first(got)
        if "--dp" in f:
            sharded = "(sharded accumulation)" in got.stderr
            check(sharded)
            print(f"    sharded accumulation: {sharded}")
        twice(lay, name, ranks, f)
    # a ZeRO-3 bubbles checkpoint: resumed in its layout bitwise, in pp 2 x cp 2 bubbles equal
    check_resume(lay, "pp2 dp2 ZeRO-3 bubbles", 4, more[0][2], 3,
                 [("pp2_cp2_bubbles", 4, more[2][2])], bref, D_MODEL)
    il = list(wide)
    il[il.index("--n-layer") + 1] = "4"
    il[il.index("--steps") + 1] = "3"
    ilay = Layouts(il, tmp, "vlm_bubbles_il_")
    iref = ilay.run("single", 1)
    f = ["--pp", "2", "--virtual-stages", "2", "--pp-schedule", "interleaved"] + bb
    moved_off_first(compare(ilay, iref, "pp2_interleaved_bubbles", 2, f))
    twice(ilay, "pp2_interleaved_bubbles", 2, f)
    # a frozen encoder: the replica on stage 1 sends back the projector's gradients only
    fz = Layouts(wide + ["--freeze", "vision"], tmp, "vlm_bubbles_frozen_")
    fref = fz.run("single", 1)
    got = compare(fz, fref, "pp2_1f1b_bubbles_frozen", 2, flags)
    still = all(np.array_equal(got.params[n], got.init[n]) for n in got.params
                if n.startswith("vision."))
    check(still)
    print(f"    --freeze vision: encoder unchanged {still}")


def bf16_bubbles(base, tmp):
    """--vision-schedule bubbles under --precision bf16: pp 2 1f1b with the pieces against
    the same layout with the encoder on stage 0 (`first`), both bf16. The decoder's stage
    boundary travels as bf16 in both; the encoder's messages stay fp32 (docs/vlm.md): the
    weights (an exact copy: the replica's GEMMs round them to the same bf16 bits), the
    projected image rows (the fp32 GEMM output `first` writes into the stream) and their
    gradient (the fp32 d(rows) whose bias gradient reads it unrounded). So every encoder
    GEMM has the operands, shapes and order of `first`'s; only the encoder's gradient is
    summed in another order (each owner's micro-batches, then added in stage order), an fp32
    reordering: the bound test_layouts_bf16.py derives for such a reordering under bf16
    (losses 1e-4, whole model 4e-4, worst tensor 5e-3), not bitwise (measured seeds 1-4:
    losses 0, whole 3.8e-9 to 8.1e-9, worst tensor 7.5e-8 to 1.0e-7). That bound would also
    pass image rows rounded to bf16 (tried by hand: whole 1.3e-4 to 2.1e-4), so the first
    step's loss must be equal as the metrics write it (10 digits): step 1's forward is the
    same arithmetic in both (the same weights, rows and GEMMs; the reordered gradients act
    from step 2), which bf16 rows would change (measured 3.5e-7 relative). Twice: bitwise."""
    wide = list(base) + ["--precision", "bf16"]
    wide[wide.index("--vit-d-model") + 1] = "32"
    lay = Layouts(wide, tmp, "vlm_bf16_bubbles_")
    pp = ["--pp", "2", "--pp-schedule", "1f1b"]
    first = lay.run("pp2_1f1b_first", 2, pp)
    flags = pp + ["--vision-schedule", "bubbles"]
    got = lay.run("pp2_1f1b_bubbles", 2, flags)
    check(bf16_gemms(got.stderr) is not None and "sent as bf16" in got.stderr,
          f"vlm bf16 bubbles: the bf16 start-up line ({bf16_gemms(got.stderr)}) and the "
          f"pipeline's bf16 messages")
    moved_off_first(got)
    within_bf16_bounds(got, first, "pp2_1f1b bubbles against the encoder on stage 0")
    check(got.losses[:1] == first.losses[:1],
          f"  vlm bf16 pp2_1f1b bubbles: step 1's loss {got.losses[:1]} equal to the encoder on "
          f"stage 0's {first.losses[:1]} (fp32 image rows)")
    twice(lay, "pp2_1f1b_bubbles", 2, flags)


def bf16_kept(base, tmp):
    """The encoder's activations under --precision bf16 (docs/precision.md): its norms'
    outputs and the activation (only GEMMs read them) and, rounded as the decoder's blocks
    round them, qkv, attention's output and the MLP's pre-activation are kept in bf16, as
    are the projector's norm output and activation. That is the same function as keeping
    the same values in fp32 (LOOM_BF16_FP32_ACTIVATIONS=1, which rounds qkv, att and fc in
    place): bitwise, with fewer activation bytes in the start-up report. dp 2 ZeRO-3 against
    one bf16 process within test_layouts_bf16.py's layout bounds (dp keeps every GEMM's
    operands: its docstring)."""
    bf = list(base) + ["--precision", "bf16"]
    lay = Layouts(bf, tmp, "vlm_bf16_kept_")
    ref = lay.run("single", 1)
    os.environ["LOOM_BF16_FP32_ACTIVATIONS"] = "1"
    try:
        f32 = Layouts(bf, tmp, "vlm_bf16_fp32acts_").run("single", 1)
    finally:
        del os.environ["LOOM_BF16_FP32_ACTIVATIONS"]
    a16, a32 = (re.search(r"activations ([0-9.]+) MiB", r.stderr) for r in (ref, f32))
    check(bitwise(ref, f32) and a16 and a32 and float(a16.group(1)) < float(a32.group(1)),
          f"  vlm bf16: the encoder's activations kept in bf16 bitwise the run keeping the same "
          f"values in fp32, activations {a16.group(1) if a16 else None} MiB against "
          f"{a32.group(1) if a32 else None}")
    within_bf16_bounds(lay.run("dp2_zero3", 2, ["--dp", "2", "--zero", "3"]), ref,
                       "dp2_zero3 against one bf16 process")


def within_bf16_bounds(got, ref, what):
    """got against ref within test_layouts_bf16.py's layout bounds under bf16."""
    l_err = loss_error(got.losses, ref.losses)
    whole, worst, w_name = weights_error(got.params, ref.params, D_MODEL)
    check(len(got.losses) == len(ref.losses) and l_err <= BF16_LOSS_TOL
          and whole <= BF16_WHOLE_TOL and worst <= BF16_TENSOR_TOL,
          f"  vlm bf16 {what}: losses {l_err:.1e} (<= {BF16_LOSS_TOL:.0e}), weights "
          f"{whole:.1e} (<= {BF16_WHOLE_TOL:.0e}), worst tensor {worst:.1e} {w_name} "
          f"(<= {BF16_TENSOR_TOL:.0e})")


def report_mib(stderr):
    """The start-up report's local gradient and AdamW MiB."""
    m = re.search(r"grads ([0-9.]+) MiB \((?:local|sharded) accumulation\).*optimizer ([0-9.]+) MiB", stderr)
    return (float(m.group(1)), float(m.group(2))) if m else (None, None)


def unchanged(run, prefix):
    """Whether every tensor of run whose name starts with prefix ends bitwise as it started
    (with --ema-decay its moving average too: a frozen tensor's average is its weight)."""
    final = [run.params] + ([run.load(EMA)] if has_ema(run) else [])
    return all(np.array_equal(w[n], run.init[n]) for w in final for n in w
               if n.startswith(prefix))


def dry_report(base, ranks, extra):
    """The start-up report of `base + extra` under --dry-run (set up, no step), standing in
    for a run in report_drop; ZeRO-3 with --grad-accum local, whose report counts the whole
    local gradient (its default, sharded, counts the shard's sum and two ranges)."""
    cmd = MPIRUN + ["-n", str(ranks)] + base + extra + ["--grad-accum", "local", "--dry-run"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return types.SimpleNamespace(stderr=p.stderr)


def report_drop(name, before, after, frozen_mib, shard_mib):
    """The report's local gradients drop by the frozen part, AdamW by its dp shard (2 x)."""
    (g0, o0), (g1, o1) = report_mib(before.stderr), report_mib(after.stderr)
    ok = (g0 is not None and g1 is not None and abs(g0 - g1 - frozen_mib) <= 2e-3
          and abs(o0 - o1 - 2 * shard_mib) <= 2e-3)
    check(ok)
    print(f"  report {name}: grads {g0} -> {g1} MiB, optimizer {o0} -> {o1} MiB; frozen "
          f"{frozen_mib:.3f} MiB (a shard {shard_mib:.3f})  {'ok' if ok else 'FAIL'}")


def frozen_case(layouts, ref, base, tmp):
    """--freeze vision: one process against dp 2 ZeRO-1 and ZeRO-3 (the encoder's weights end
    bitwise as they started); the report's gradient and AdamW bytes drop by the encoder's
    size (ZeRO-3: AdamW by its shard; the reports of --dry-run with --grad-accum local, whose
    gradient is the whole buffer); a ZeRO-3 checkpoint resumes bitwise (also from peers'
    memory, --ckpt-peer), and resumed with
    the encoder trainable (LLaVA's stage 1 -> stage 2: its moments start at zero) one process
    and dp 2 ZeRO-2 agree. --freeze vision,llm at dp 2 ZeRO-3: equal to one process, twice
    bitwise, AdamW's state only the projector's shard."""
    frozen = Layouts(base + ["--freeze", "vision", "--ema-decay", "0.8"], tmp, "vlm_frozen_")
    fref = frozen.run("single", 1)
    print(f"vlm --freeze vision: single process, loss {fref.losses[0]:.4f} -> "
          f"{fref.losses[-1]:.4f}")
    got = compare(frozen, fref, "dp2_zero1", 2, ["--dp", "2", "--zero", "1"])
    still = unchanged(got, "vision.")
    moved = not unchanged(got, "projector.")
    check(still and moved)
    print(f"    frozen encoder unchanged: {still}, projector trained: {moved}")
    mib = {part: sum(a.size for n, a in fref.params.items() if n.startswith(part)) * 4 / 2**20
           for part in ("vision.", "projector.")}
    report_drop("one process", ref, fref, mib["vision."], mib["vision."])
    saver = check_resume(frozen, "--freeze vision, dp2 ZeRO-3", 2, ["--dp", "2", "--zero", "3"], 3,
                         also=[EMA])
    all_err, w_err, _ = weights_error(saver.params, fref.params, D_MODEL)
    loss_err = loss_error(saver.losses, fref.losses)
    ema_err = weights_error(saver.load(EMA), fref.load(EMA), D_MODEL)[0]
    still = unchanged(saver, "vision.")
    ok = loss_err <= TOL and all_err <= TOL and w_err <= 10 * TOL and ema_err <= TOL and still
    check(ok)
    print(f"  dp2 ZeRO-3 (the saving run) against one process: losses {loss_err:.2e} weights "
          f"{all_err:.2e} ema {ema_err:.2e}, encoder unchanged {still}  {'ok' if ok else 'FAIL'}")
    # the same through peers' memory (--ckpt-peer): 3 steps saved, then resumed from memory
    z3_flags = ["--dp", "2", "--zero", "3"]
    ck = ["--ckpt-dir", frozen.path("ckpt_peer"), "--ckpt-every", "3", "--ckpt-peer",
          "--ckpt-peer-dir", frozen.path("peer")]
    frozen.run("peer_first", 2, z3_flags + ck + ["--steps", "3"])
    peer = frozen.run("peer_resumed", 2, z3_flags + ck + ["--resume", "auto"])
    ok = ("resume source: peer memory, step 3" in peer.stderr
          and peer.losses == saver.losses_after(3) and same_tensors(peer.params, saver.params)
          and same_tensors(peer.load(EMA), saver.load(EMA)))
    check(ok)
    print(f"  resumed at step 3 from peers' memory (dp2 ZeRO-3): "
          f"{'bitwise identical' if ok else 'FAIL: differs from the uninterrupted run'}")
    total = sum(a.size for a in fref.params.values()) * 4 / 2**20
    z3 = dry_report(base, 2, z3_flags)
    # the optimizer's shards: half of everything before, half of the trained span after
    report_drop("dp2 ZeRO-3", z3, dry_report(base + ["--freeze", "vision"], 2, z3_flags),
                mib["vision."], mib["vision."] / 2)
    at = ["--resume", os.path.join(frozen.path("ckpt"), "step_00000003"), "--ema-decay", "0.8"]
    u1 = layouts.run("unfrozen_single", 1, at)
    u2 = layouts.run("unfrozen_dp2_zero2", 2, ["--dp", "2", "--zero", "2"] + at)
    all_err, w_err, _ = weights_error(u2.params, u1.params, D_MODEL)
    loss_err = loss_error(u2.losses, u1.losses)
    ema_err = weights_error(u2.load(EMA), u1.load(EMA), D_MODEL)[0]
    moved = any(not np.array_equal(u1.params[n], saver.init[n]) for n in u1.params
                if n.startswith("vision."))
    ok = ("resumed from" in u1.stderr and moved and loss_err <= TOL and all_err <= TOL
          and w_err <= 10 * TOL and ema_err <= TOL)
    check(ok)
    print(f"  frozen checkpoint resumed with the encoder trainable: encoder trained {moved}, "
          f"dp2 ZeRO-2 vs one process losses {loss_err:.2e} weights {all_err:.2e} ema "
          f"{ema_err:.2e}  {'ok' if ok else 'FAIL'}")
    # the encoder's average starts at its (still initial) weights: one step later it is
    # 0.8 x initial + 0.2 x trained; the others' averages are the checkpoint's
    one = layouts.run("unfrozen_one_step", 1, at + ["--steps", "4"])
    ema, w = one.load(EMA), one.params
    err = max(float(np.max(np.abs(ema[n] - (np.float32(0.8) * saver.init[n]
                                             + np.float32(0.2) * w[n]))))
              / float(np.max(np.abs(w[n]))) for n in w if n.startswith("vision."))
    check(err <= 1e-6)
    print(f"  the encoder's average started at its weights: {err:.1e}  "
          f"{'ok' if err <= 1e-6 else 'FAIL'}")
    both = Layouts(base + ["--freeze", "vision,llm", "--ema-decay", "0.8"], tmp, "vlm_frozen2_")
    bref = both.run("single", 1)
    got = compare(both, bref, "dp2_zero3", 2, z3_flags)
    again = both.run("dp2_zero3_again", 2, z3_flags)
    same = bitwise(again, got) and same_tensors(again.load(EMA), got.load(EMA))
    still = unchanged(got, "vision.") and unchanged(got, "model.") and unchanged(got, "lm_head.")
    check(same and still)
    print(f"    --freeze vision,llm dp2 ZeRO-3: only the projector trained {still}, twice "
          f"{'bitwise identical' if same else 'FAIL: runs differ'}")
    # a frozen decoder in the pipeline: every stage runs B only (zb: W keeps the embedding's)
    for schedule in ("1f1b", "zb"):
        got = compare(both, bref, f"pp2_{schedule}", 2, ["--pp", "2", "--pp-schedule", schedule])
        still = unchanged(got, "model.") and unchanged(got, "lm_head.")
        check(still)
        print(f"    decoder unchanged {still}")
    report_drop("dp2 ZeRO-3 --freeze vision,llm", z3,
                dry_report(base + ["--freeze", "vision,llm"], 2, z3_flags),
                total - mib["projector."], (total - mib["projector."]) / 2)


def main():
    args = parse_test_args()
    seed = args.seed
    tmp = tempfile.mkdtemp(prefix="loom_layouts_vlm_")
    try:
        data = os.path.join(tmp, "train_000000.bin")
        write_shard(data, random.Random(seed), 48)
        base = [args.loom, "train", "--family", "vlm", "--n-layer", "2", "--n-head", "4",
                "--n-kv-head", "2", "--d-model", str(D_MODEL), "--d-ff", "40",
                "--vocab-size", "260", "--seq-len", str(T), "--vit-layers", "2",
                "--vit-d-model", "16", "--vit-n-head", "2", "--vit-d-ff", "24",
                "--vit-patch", str(P), "--height", str(H), "--width", str(W), "--channels", "1",
                "--max-images", str(MAX_IMAGES), "--micro-batch", "2", "--global-batch", "8",
                "--steps", "6", "--lr", "3e-3", "--warmup-steps", "2", "--grad-clip", "1.0",
                "--seed", str(seed), "--log-every", "0", "--threads", "1", "--data", data,
                "--adam-eps", ADAM_EPS, "--bucket-mb", "0.01"]
        layouts = Layouts(base, tmp, "vlm_")
        ref = layouts.run("single", 1)
        print(f"vlm: single process, loss {ref.losses[0]:.4f} -> {ref.losses[-1]:.4f}")
        for name, ranks, extra in LAYOUTS:
            compare(layouts, ref, name, ranks, extra)
        for name, ranks, extra in (LAYOUTS[1], LAYOUTS[3], LAYOUTS[6], LAYOUTS[8]):
            again = layouts.run(name + "_again", ranks, extra)
            same = bitwise(again, layouts.runs[name])
            check(same)
            print(f"  {name} twice: {'bitwise identical' if same else 'FAIL: runs differ'}")
        # saved at step 3 in one layout, resumed from there: the same end
        check_resume(layouts, "dp2 ZeRO-1", 2, ["--dp", "2", "--zero", "1"], 3,
                     [("pp2", 2, ["--pp", "2"])], ref, D_MODEL)
        check_tp_rounded("vlm", base, tmp, D_MODEL)
        frozen_case(layouts, ref, base, tmp)
        balance_dp(args, base, tmp, seed)
        vision_bubbles(base, tmp)
        bf16_bubbles(base, tmp)
        bf16_kept(base, tmp)
    finally:
        keep_or_remove(tmp, seed)


if __name__ == "__main__":
    run_test(main)
