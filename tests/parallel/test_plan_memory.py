#!/usr/bin/python3
"""loom plan's memory per rank is the start-up report's, for every layout of the layout tests.

For each layout of test_layouts.py (dp x ZeRO), test_layouts_tp.py, test_layouts_pp.py,
test_layouts_moe.py, test_layouts_cp.py, test_layouts_dit.py (image and video) and
test_layouts_vlm.py (VLM_LAYOUTS below, with and without --freeze), on a random small model
of a random family (gpt2 / llama; the MoE layouts a Llama MoE, the dit layouts a dit, the
vlm layouts a vlm with a random encoder), runs `mpirun -n R loom train ... --dry-run` (the real set-up of every rank,
the start-up report of rank 0, no step) and `loom plan ... --explain "<layout>" --json`
(no MPI: the layout's objects sized on shapes), and requires for rank 0 (pipeline stage
0) the same text of the "memory per rank: ..." line, the same "memory per rank in all"
figure, and the same numbers in the pipeline (micro-batches in flight, activations,
message buffers), tensor-parallel (under bf16 also its message buffers, whose bytes must be
tp/tp.c's (2 x rows + tp) x d_model bf16 values), context-parallel and MoE-buffer lines; and that the
stage the plan checks against the budget holds the most of all stages; BF16_LAYOUTS run
both with --precision bf16 (activations partly bf16); SHARDED_LAYOUTS with --grad-accum
sharded (pp 2 x dp 2 under 1f1b and zb), ONE_MICRO_LAYOUTS with one micro-batch a step at
ZeRO 2/3 with local accumulation (the local gradient's resident peak, not the whole
buffer), and a MoE layout with --ep 2 and --grad-accum sharded; EMA_LAYOUTS with --ema-decay
(the average, held like AdamW's m, is in the line and the totals: exactly half the
optimizer's bytes). Every other ZeRO-3 layout runs ZeRO-3's default, --grad-accum sharded
(with --ep and --pp too: pp2_ep2_dp2_z3; the dit's pp 2 x dp 2 too), and the report's line
must say "sharded accumulation" exactly where a layout asks for it or defaults to it. For the vlm the
parameter count of the plan's headline and of the start-up report must both equal the
count written out here from the shapes (encoder, projector, Llama decoder).
Usage: test_plan_memory.py --loom PATH [--seed S]   (LOOM_LAYOUTS=a,b: only those)
"""
import json
import os
import random
import re
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "harness"))
sys.path.insert(0, HERE)
import loomtest  # noqa: E402
from loomtest import MPIRUN, parse_test_args, run_test, write_text_shard  # noqa: E402
import test_layouts_cp  # noqa: E402
import test_layouts_dit  # noqa: E402
import test_layouts_moe  # noqa: E402
import test_layouts_pp  # noqa: E402
import test_layouts_tp  # noqa: E402
import test_layouts_vlm  # noqa: E402

MIB = 1 << 20
VLM_LAYOUTS = [  # the encoder and projector on every rank (dp, tp) or the first stage (pp)
    ("vlm_dp2_zero1", 2, ["--dp", "2", "--zero", "1"]),
    ("vlm_pp2", 2, ["--pp", "2"]),
    ("vlm_pp2_bubbles", 2, ["--pp", "2", "--vision-schedule", "bubbles"]),
    ("vlm_tp2_sp", 2, ["--tp", "2", "--sequence-parallel"]),
    ("vlm_dp2_freeze", 2, ["--dp", "2", "--freeze", "vision,projector"]),
    ("vlm_dp2_zero3_freeze", 2, ["--dp", "2", "--zero", "3", "--freeze", "vision,llm"]),
    ("vlm_pp2_zb_freeze_llm", 2, ["--pp", "2", "--pp-schedule", "zb", "--freeze", "llm"]),
]
# --precision bf16: the arena keeps the norms' outputs, the MLP's activation and (one tp
# rank) the logits in bf16; the plan sizes the run's own arena, so its figures follow
BF16_LAYOUTS = [
    ("bf16_single", 1, []),
    ("bf16_dp2_zero1", 2, ["--dp", "2", "--zero", "1"]),
    ("bf16_pp2", 2, ["--pp", "2"]),
    ("bf16_tp2_sp", 2, ["--tp", "2", "--sequence-parallel"]),
]

# --grad-accum sharded: the local gradient as the largest pair of adjacent ranges (plus a
# pipeline stage's tied embedding, and under zb every block's norm pages) and the shard's sum
SHARDED_LAYOUTS = [
    ("pp2_dp2_zero2_1f1b_sharded", 4, ["--pp", "2", "--dp", "2", "--zero", "2", "--pp-schedule",
                                       "1f1b", "--grad-accum", "sharded"]),
    ("pp2_dp2_zero3_zb_sharded", 4, ["--pp", "2", "--dp", "2", "--zero", "3", "--pp-schedule",
                                     "zb", "--grad-accum", "sharded"]),
]

# one micro-batch a step (--global-batch = dp x --micro-batch) at ZeRO 2/3 with local
# accumulation (ZeRO-3's default is sharded: asked for here): the local gradient counted
# as resident at the worst layer boundary (parallel/zero_resident.c)
ONE_MICRO_LAYOUTS = [
    ("dp2_zero2_one_micro_batch", 2, ["--dp", "2", "--zero", "2", "--global-batch", "4",
                                    "--bucket-mb", "0.01"]),
    ("dp4_zero3_one_micro_batch", 4, ["--dp", "4", "--zero", "3", "--global-batch", "8",
                                    "--bucket-mb", "0.01", "--grad-accum", "local"]),
]


EMA_LAYOUTS = [  # --ema-decay: the weights' moving average, one per rank's optimizer range
    ("dp2_zero1_ema", 2, ["--dp", "2", "--zero", "1", "--ema-decay", "0.9"], "lm"),
    ("vlm_dp2_zero3_freeze_ema", 2,
     ["--dp", "2", "--zero", "3", "--freeze", "vision", "--ema-decay", "0.9"], "vlm"),
]


def layouts():
    """(name, ranks, extra flags, model kind) of every layout test."""
    out = [(f"dp{dp}_zero{z}", dp, ["--dp", str(dp), "--zero", str(z)], "lm")
           for dp in (2, 4) for z in (0, 1, 2, 3)]
    out += [(n, r, e, "lm") for n, r, e, *_ in test_layouts_tp.LAYOUTS]
    out += [(n, r, e, "lm") for n, r, e, *_ in test_layouts_pp.LAYOUTS]
    out += [(n, r, e, "lm") for n, r, e, *_ in test_layouts_cp.COMMON]
    out += [(n, r, e, "moe") for n, r, e, *_ in test_layouts_moe.LAYOUTS]
    out += [(n, r, e, "moe") for n, r, e, *_ in test_layouts_cp.MOE]
    out += [(n, r, e, "image") for n, r, e, *_ in test_layouts_dit.IMAGE_LAYOUTS]
    out += [(n, r, e, "video") for n, r, e, *_ in test_layouts_dit.VIDEO_LAYOUTS]
    out += [(n, r, e, "vlm") for n, r, e in VLM_LAYOUTS]
    out += [(n, r, e, "bf16") for n, r, e in BF16_LAYOUTS]
    out += [(n, r, e, "lm") for n, r, e in SHARDED_LAYOUTS]
    out += [(n, r, e, "lm") for n, r, e in ONE_MICRO_LAYOUTS]
    out += EMA_LAYOUTS
    # --grad-accum sharded with --ep: one range of local gradient (reduced before the next)
    out += [("ep2_dp4_zero3_sharded", 4, ["--dp", "4", "--ep", "2", "--zero", "3",
                                          "--grad-accum", "sharded"], "moe")]
    return out


def vlm_flags(rng, tmp, seed):
    """A small vlm with a random encoder, on test_layouts_vlm's random shard."""
    vl = test_layouts_vlm
    data = os.path.join(tmp, "vlm_train_000000.bin")
    if not os.path.exists(data):
        vl.write_shard(data, random.Random(seed), 32)
    dv, hv = rng.choice([(16, 2), (24, 3), (32, 4)])
    return ["--family", "vlm", "--n-layer", "2", "--n-head", "4", "--n-kv-head", "2",
            "--d-model", "16", "--d-ff", "40", "--vocab-size", "260", "--seq-len", str(vl.T),
            "--vit-layers", str(rng.choice([1, 2, 3])), "--vit-d-model", str(dv), "--vit-n-head",
            str(hv), "--vit-d-ff", str(rng.choice([24, 48])), "--vit-patch", str(vl.P),
            "--height", str(vl.H), "--width", str(vl.W), "--channels", "1", "--max-images",
            str(vl.MAX_IMAGES), "--micro-batch", "2", "--global-batch", "8", "--data", data,
            "--bucket-mb", str(rng.choice([0.01, 25]))]


def vlm_parameters(flags):
    """The vlm's parameter count from its shapes (model/vlm.h, model/params.h): the ViT
    (patch embedding, blocks with LayerNorms and biased linears, final LayerNorm; fixed
    sin-cos positions), the projector (two biased linears) and the Llama decoder
    (embedding, RMSNorms, q k v o, SwiGLU, final norm, untied head)."""
    f = {flags[i][2:]: flags[i + 1] for i in range(len(flags) - 1) if flags[i].startswith("--")}
    dv, fv, vl = int(f["vit-d-model"]), int(f["vit-d-ff"]), int(f["vit-layers"])
    pin, c, ff, v = int(f["channels"]) * int(f["vit-patch"]) ** 2, int(f["d-model"]), \
        int(f["d-ff"]), int(f["vocab-size"])
    hd = c // int(f["n-head"])
    kv = int(f["n-kv-head"]) * hd
    block = 4 * dv + (3 * dv * dv + 3 * dv) + (dv * dv + dv) + (fv * dv + fv) + (dv * fv + dv)
    vision = pin * dv + dv + vl * block + 2 * dv
    projector = (c * dv + c) + (c * c + c)
    layer = 2 * c + 2 * c * c + 2 * kv * c + 3 * ff * c
    return vision + projector + 2 * v * c + int(f["n-layer"]) * layer + c


def model_flags(kind, rng, tmp, seed):
    """A random small model of the kind every listed layout accepts, and its data."""
    if kind == "vlm":
        return vlm_flags(rng, tmp, seed)
    if kind in ("image", "video"):
        frames, patch_t, channels, height, width, patch, classes = (
            (1, 1, 1, 12, 20, 4, 5) if kind == "image" else (4, 2, 3, 8, 12, 4, 3))
        data = os.path.join(tmp, f"{kind}_train_000000.bin")
        if not os.path.exists(data):
            test_layouts_dit.write_image_shard(data, np.random.default_rng(seed), 64, frames,
                                               channels, height, width, classes)
        return ["--family", "dit", "--n-layer", "4", "--n-head", "4", "--d-model",
                str(rng.choice([32, 48])), "--d-ff", "64", "--frames", str(frames), "--patch-t",
                str(patch_t), "--channels", str(channels), "--height", str(height), "--width",
                str(width), "--patch", str(patch), "--n-classes", str(classes), "--micro-batch",
                "2", "--global-batch", "8", "--data", data]
    data = os.path.join(tmp, "train.bin")
    if not os.path.exists(data):
        write_text_shard(data, seed)
    family = "llama" if kind == "moe" else rng.choice(["gpt2", "llama"])
    bf16 = ["--precision", "bf16"] if kind == "bf16" else []
    d = rng.choice([32, 48, 64])
    flags = ["--family", family, "--vocab-size", "256", "--seq-len", "24", "--n-layer", "8",
             "--d-model", str(d), "--n-head", "8", "--d-ff", str(d * rng.choice([2, 3])),
             "--micro-batch", "2", "--global-batch", "16", "--data", data,
             "--bucket-mb", str(rng.choice([0.01, 0.05, 25]))]
    if family == "llama":
        flags += ["--n-kv-head", "4"]
    flags += bf16
    if kind == "moe":
        flags += ["--n-experts", "4", "--top-k", "2", "--moe-every", "2", "--capacity-factor",
                  "0"]
    return flags


NUM = r"([\d.]+)"
FIGURES = {  # start-up report line -> the plan's JSON fields (rank 0's)
    "pipeline": (re.compile(r"(\d+) micro-batch\(es\) in flight \(activations[^)]*? \d+ x "
                            + NUM + r" MiB = " + NUM + r" MiB; message buffers " + NUM + " MiB"),
                 lambda m: [m["pp_slots"], m["activations_bytes"] / MIB,
                            m["pp_slots"] * m["activations_bytes"] / MIB,
                            m["pp_messages_bytes"] / MIB], [0, 3, 3, 1]),
    "tp": (re.compile(r"tensor parallel \d+ ranks[^:]*: activations per rank " + NUM
                      + r" MiB with sequence parallelism, " + NUM + " MiB without"),
           lambda m: [m["act_sp_bytes"] / MIB, m["act_nosp_bytes"] / MIB], [1, 1]),
    "cp": (re.compile(r"MiB holding whole sequences; attention buffers " + NUM + " MiB"),
           lambda m: [m["cp_buffers_bytes"] / MIB], [3]),
    "cp_whole": (re.compile(r"per sample\), " + NUM + " MiB holding whole"),
                 lambda m: [m["act_whole_bytes"] / MIB], [3]),
    "moe": (re.compile(r"experts per rank\), buffers " + NUM + " MiB"),
            lambda m: [m["moe_buffers_bytes"] / MIB], [1]),
    "mpi_temp": (re.compile(r"MPI all-reduce temporary: " + NUM + " MiB"),
                 lambda m: [m["mpi_temp_bytes"] / MIB], [3]),
    "dp_buffers": (re.compile(r"data-parallel buffers: " + NUM + " MiB"),
                   lambda m: [m["dp_buffers_bytes"] / MIB], [3]),
    "tp_bf16": (re.compile(r"tensor-parallel bf16 message buffers: " + NUM + " MiB"),
                lambda m: [m["tp_messages_bytes"] / MIB], [3]),
    "total": (re.compile(r"memory per rank in all: " + NUM + " MiB"),
              lambda m: [m["total_bytes"] / MIB], [3]),
}


def check(loom, name, ranks, extra, flags, threads):
    train = ([loom, "train"] + flags + extra +
             ["--dry-run", "--threads", str(threads), "--steps", "1", "--log-every", "0"])
    cmd = (MPIRUN + ["-n", str(ranks)] if ranks > 1 else []) + train
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return [f"loom train --dry-run exit {p.returncode}: {p.stderr[-1500:]}"]
    plan = subprocess.run([loom, "plan"] + flags +
                          ["--threads", str(threads), "--explain", " ".join(extra), "--json"],
                          capture_output=True, text=True)
    if plan.returncode != 0:
        return [f"loom plan exit {plan.returncode}: {plan.stderr[-1500:]}"]
    planned = json.loads(plan.stdout)
    stage0 = planned["stages"][0]
    problems = []
    most = max(s["total_bytes"] for s in planned["stages"])
    if "vlm" in flags:  # the parameter count: the shapes', the plan's, the run's
        want = vlm_parameters(flags)
        head = subprocess.run([loom, "plan"] + flags + ["--threads", str(threads), "--explain",
                                                        " ".join(extra)],
                              capture_output=True, text=True)
        got = re.search(r"vlm model, (\d+) parameters", head.stdout)
        run = re.search(r"loom: vlm model, (\d+) parameters", p.stderr)
        if not got or not run or int(got.group(1)) != want or int(run.group(1)) != want:
            problems.append(f"parameters: shapes {want}, plan {got and got.group(1)}, "
                            f"start-up report {run and run.group(1)}")
    if planned["memory"]["total_bytes"] != most:  # the stage the budget is checked against
        problems.append(f"largest stage {planned['memory']['total_bytes']}, of all stages {most}")
    line = re.search(r"loom: (memory per rank: [^\n]*)", p.stderr)
    if not line:
        return [f"no memory line in the start-up report:\n{p.stderr[-1500:]}"]
    if line.group(1) != stage0["line"]:
        problems.append(f"memory line differs:\n    report: {line.group(1)}\n    plan:   "
                        f"{stage0['line']}")
    # the gradient's accumulation: ZeRO-3's default and --grad-accum sharded (data-parallel
    # replicas at ZeRO 2/3) are sharded in every layout, pipelines of every family included
    def value(f):
        return extra[extra.index(f) + 1] if f in extra else None
    want_sharded = (int(value("--dp") or 1) > 1 and value("--zero") in ("2", "3")
                    and (value("--grad-accum") or ("sharded" if value("--zero") == "3"
                                                   else "local")) == "sharded")
    if want_sharded != ("(sharded accumulation)" in line.group(1)):
        problems.append(f"accumulation: {'sharded' if want_sharded else 'local'} expected, the "
                        f"report says {line.group(1)}")
    ema = "--ema-decay" in extra
    want_ema = stage0["optimizer_bytes"] / 2 if ema else 0
    if (stage0["ema_bytes"] != want_ema or (ema and stage0["ema_bytes"] <= 0)
            or ema != ("EMA of the weights" in line.group(1))):
        problems.append(f"EMA: plan {stage0['ema_bytes']:.0f} bytes, expected {want_ema:.0f} "
                        f"(half the optimizer's); in the report's line: "
                        f"{'EMA of the weights' in line.group(1)}")
    # --precision bf16 with tp: the linears' bf16 message buffers (tp/tp.c's send and
    # receive buffers, (2 x rows + tp) x d_model bf16 values) are in both totals, and the
    # report's line of them is there
    bf16_tp = "bf16" in flags and "--tp" in extra
    want_tp = 0
    if bf16_tp:  # (the bf16 layouts: a language model, no cp)
        def flag(f, a):
            return int(a[a.index(f) + 1])
        rows = flag("--micro-batch", flags) * flag("--seq-len", flags)
        want_tp = (2 * rows + flag("--tp", extra)) * flag("--d-model", flags) * 2
    if stage0["tp_messages_bytes"] != want_tp or (
            bf16_tp and not FIGURES["tp_bf16"][0].search(p.stderr)):
        problems.append(f"tp bf16 message buffers: plan {stage0['tp_messages_bytes']:.0f} bytes, "
                        f"expected {want_tp}; report line "
                        f"{'present' if FIGURES['tp_bf16'][0].search(p.stderr) else 'absent'}")
    for what, (rx, plan_values, digits) in FIGURES.items():
        m = rx.search(p.stderr)
        if not m:
            continue
        got = [float(x) for x in m.groups()]
        want = [round(v, d) for v, d in zip(plan_values(stage0), digits)]
        if any(abs(g - w) > 0.5 * 10 ** -d for g, w, d in zip(got, want, digits)):
            problems.append(f"{what}: report {got}, plan {want}")
    return problems


def main():
    args = parse_test_args()
    seed = args.seed
    rng = random.Random(seed)
    only = os.environ.get("LOOM_LAYOUTS")
    with tempfile.TemporaryDirectory(prefix="loom_plan_memory_") as tmp:
        for name, ranks, extra, kind in layouts():
            if only and name not in only.split(","):
                continue
            flags = model_flags(kind, rng, tmp, seed)
            problems = check(args.loom, name, ranks, extra, flags, 1)
            loomtest.check(not problems, f"  {kind:5s} {name:32s}")
            for x in problems:
                print(f"      {x}")
    print(f"each layout checked: the plan's memory equals the start-up report's (seed {seed})")


if __name__ == "__main__":
    run_test(main)
