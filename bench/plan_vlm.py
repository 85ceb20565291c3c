#!/usr/bin/python3
"""loom plan --explain against the measured step time of vlm layouts (issue 33's Speed item).

For each layout (vlm-tiny on `loom data vlm` 2 x 2 Fashion-MNIST grids, one image a sample,
one thread a rank; pp 2 with 1f1b and zb also with --vision-schedule bubbles):
`loom plan --explain LAYOUT --json` on a profile (calibrated with
`loom calibrate --quick` at the start unless --profile), then `loom train` under mpirun
with --metrics; the measurement is the median step_ms over the steps after the first
--warmup (default 24 steps, 4 left out: with 10 a single 2-rank layout swung by up to 39%
between passes on a quiet machine). With --control, each layout is also run, right after the vlm, as a Llama of the
vlm decoder's shape on a text shard (no encoder): the planner's error on the same machine
at the same moment, to tell the encoder's modelling from the machine's load. Prints each
layout's predicted and measured ms and relative error, then one JSON object (median and
worst absolute error) as the last line.
Usage: plan_vlm.py --loom build/loom [--profile P] [--steps N] [--warmup W] [--only a,b]
                   [--control]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "harness"))
from loomtest import write_text_shard  # noqa: E402

MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1"]
LAYOUTS = [  # name, ranks, layout flags
    ("dp1", 1, "--dp 1"),
    ("dp2", 2, "--dp 2"),
    ("tp2", 2, "--tp 2"),
    ("pp2", 2, "--pp 2"),
    ("dp2_zero1", 2, "--dp 2 --zero 1"),
    ("cp2", 2, "--cp 2"),
    ("pp2_bubbles", 2, "--pp 2 --vision-schedule bubbles"),
    ("pp2_zb_bubbles", 2, "--pp 2 --pp-schedule zb --vision-schedule bubbles"),
]
BUBBLES = " --vision-schedule bubbles"  # the Llama control has no encoder: its layout without


def run(cmd, what):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{what}: exit {p.returncode}\n{p.stderr[-2000:]}")
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", required=True)
    ap.add_argument("--profile")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--only")
    ap.add_argument("--control", action="store_true")
    args = ap.parse_args()
    loom = os.path.abspath(args.loom)
    with tempfile.TemporaryDirectory(prefix="loom_plan_vlm_") as work:
        profile = args.profile
        if not profile:
            profile = os.path.join(work, "profile.json")
            run([loom, "calibrate", "--quick", "-o", profile], "loom calibrate --quick")
        data = os.path.join(work, "grids")
        run([loom, "data", "vlm", "--input", "fashion-mnist", "--out", data, "--samples", 512,
             "--val-samples", 0], "loom data vlm")
        shard = os.path.join(data, "train_000000.bin")
        batch = ["--global-batch", args.global_batch, "--micro-batch", args.micro_batch,
                 "--threads", 1]
        models = [("vlm", ["--model", "vlm-tiny"] + batch, shard)]
        if args.control:
            text = os.path.join(work, "text.bin")
            write_text_shard(text, 1)
            models.append(("llama", ["--family", "llama", "--n-layer", 2, "--n-head", 4,
                                     "--n-kv-head", 2, "--d-model", 128, "--d-ff", 352,
                                     "--vocab-size", 264, "--seq-len", 192] + batch, text))
        rows = {k: [] for k, _, _ in models}
        for name, ranks, layout in LAYOUTS:
            if args.only and name not in args.only.split(","):
                continue
            for kind, model, data in models:
                if kind == "llama":
                    layout = layout.replace(BUBBLES, "")
                plan = run([loom, "plan"] + model + ["--explain", layout, "--profile", profile,
                                                     "--json"], f"loom plan {kind} {name}")
                planned = json.loads(plan.stdout)
                predicted = planned["time"]["step_ms"]
                m = os.path.join(work, f"{kind}_{name}.jsonl")
                train = [loom, "train"] + model + layout.split() + [
                    "--data", data, "--steps", args.steps, "--log-every", 0, "--metrics", m]
                run((MPIRUN + ["-n", ranks] if ranks > 1 else []) + train,
                    f"loom train {kind} {name}")
                steps = [json.loads(x) for x in open(m) if x.strip()]
                steps = [s for s in steps if "step_ms" in s]
                measured = statistics.median(s["step_ms"] for s in steps[args.warmup:])
                err = (predicted - measured) / measured
                rows[kind].append({"layout": name, "flags": layout,
                                   "predicted_ms": round(predicted, 2),
                                   "measured_ms": round(measured, 2), "error": round(err, 4)})
                if BUBBLES in layout:  # the micro-batches the plan has each stage encode
                    rows[kind][-1]["pieces"] = planned["vision_schedule"]["pieces"]
                print(f"  {kind:5s} {name:10s} predicted {predicted:8.2f} ms  measured "
                      f"{measured:8.2f} ms  error {100 * err:+6.1f}%", flush=True)

    def summary(r):
        errs = [abs(x["error"]) for x in r]
        return {"layouts": r,
                "median_abs_error": round(statistics.median(errs), 4) if errs else None,
                "worst_abs_error": round(max(errs), 4) if errs else None}

    out = {"model": "vlm-tiny", "global_batch": args.global_batch,
           "micro_batch": args.micro_batch, "threads_per_rank": 1}
    out.update(summary(rows["vlm"]))
    by = {x["layout"]: x for x in rows["vlm"]}
    for first, bub in (("pp2", "pp2_bubbles"),):  # bubbles over first: predicted, measured
        if first in by and bub in by:
            out["pp2_bubbles_over_first"] = {
                "predicted": round(by[bub]["predicted_ms"] / by[first]["predicted_ms"], 4),
                "measured": round(by[bub]["measured_ms"] / by[first]["measured_ms"], 4)}
    if args.control:
        out["control_llama_decoder"] = summary(rows["llama"])
    out["loadavg"] = list(os.getloadavg())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
