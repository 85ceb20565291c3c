#!/usr/bin/python3
"""loom plan --explain against measured steps in both precisions (issue 31's plan item).

The issue's four layouts, which bench_plan.py does not run, as a new user would run them:
llama-tiny with 8 layers, d_model 128, T 64, global batch 16, micro-batch 2, 4 ranks of one
thread (dp 4 ZeRO-1, dp 2 x tp 2, pp 4 1f1b, dp 2 x pp 2 zb). A profile is made first with
`loom calibrate` (unless --profile; --quick: its small grid, whose GEMM sizes 4x apart price
the blocks' 128-wide GEMMs 15-80% slow here, bench/results/plan_bf16.md): it measures
`gemm_bf16` as this CPU runs bf16 GEMMs (oneDNN's, or widened to fp32 without AVX512-BF16 or
AMX: docs/precision.md), so the plan prices the path the run takes. Then for each layout,
fp32 and bf16 in turn (the machine's drift hits both alike): `loom plan --explain LAYOUT
--precision P --json` and `loom train` under mpirun, the median step_ms over the steps after
--warmup. Prints each pair, then one JSON object: per precision every layout's predicted and
measured ms and error, the median and worst absolute error, and the load average before and
after (the issue's figures are for a quiet machine: 2.4-5.5%, median 4.6%, in fp32).
Usage: plan_bf16.py --loom build/loom [--profile P | --quick] [--steps 24] [--warmup 4]
                    [--only a,b]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "harness"))
from loomtest import write_text_shard  # noqa: E402
from plan_vlm import MPIRUN, run  # noqa: E402
LAYOUTS = [  # name, layout flags (4 ranks each)
    ("dp4_zero1", "--dp 4 --zero 1"),
    ("dp2_tp2", "--dp 2 --tp 2"),
    ("pp4_1f1b", "--pp 4 --pp-schedule 1f1b"),
    ("dp2_pp2_zb", "--dp 2 --pp 2 --pp-schedule zb"),
]
MODEL = ["--model", "llama-tiny", "--n-layer", 8, "--d-model", 128, "--seq-len", 64,
         "--global-batch", 16, "--micro-batch", 2, "--threads", 1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", required=True)
    ap.add_argument("--profile")
    ap.add_argument("--quick", action="store_true",
                    help="calibrate with --quick's small grid (default: the full one)")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--only", help="comma-separated layout names")
    args = ap.parse_args()
    loom = os.path.abspath(args.loom)
    load = [list(os.getloadavg())]
    rows = {"fp32": [], "bf16": []}
    with tempfile.TemporaryDirectory(prefix="loom_plan_bf16_") as work:
        profile = args.profile
        if not profile:
            profile = os.path.join(work, "profile.json")
            quick = ["--quick"] if args.quick else []
            run([loom, "calibrate"] + quick + ["-o", profile], "loom calibrate")
        data = os.path.join(work, "text.bin")
        write_text_shard(data, 1)
        for name, layout in LAYOUTS:
            if args.only and name not in args.only.split(","):
                continue
            for precision in rows:
                model = MODEL + ["--precision", precision]
                plan = run([loom, "plan"] + model + ["--explain", layout, "--profile", profile,
                                                     "--json"], f"loom plan {name} {precision}")
                predicted = json.loads(plan.stdout)["time"]["step_ms"]
                m = os.path.join(work, f"{name}_{precision}.jsonl")
                run(MPIRUN + ["-n", 4, loom, "train"] + model + layout.split() +
                    ["--data", data, "--steps", args.steps, "--log-every", 0, "--metrics", m],
                    f"loom train {name} {precision}")
                steps = [json.loads(x) for x in open(m) if x.strip()]
                measured = statistics.median(s["step_ms"] for s in steps[args.warmup:]
                                             if "step_ms" in s)
                err = (predicted - measured) / measured
                rows[precision].append({"layout": name, "flags": layout,
                                        "predicted_ms": round(predicted, 2),
                                        "measured_ms": round(measured, 2),
                                        "error": round(err, 4)})
                print(f"  {name:11s} {precision}  predicted {predicted:8.2f} ms  measured "
                      f"{measured:8.2f} ms  error {100 * err:+6.1f}%", flush=True)
    out = {"bench": "plan_bf16", "model": "llama-tiny, 8 layers, d_model 128, T 64",
           "global_batch": 16, "micro_batch": 2, "ranks": 4, "threads_per_rank": 1,
           "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE")}
    for precision, r in rows.items():
        errs = [abs(x["error"]) for x in r]
        out[precision] = {"layouts": r,
                          "median_abs_error": round(statistics.median(errs), 4) if errs else None,
                          "worst_abs_error": round(max(errs), 4) if errs else None}
    out["loadavg"] = load + [list(os.getloadavg())]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
