#!/usr/bin/env python3
"""loom plan at scale: predict published training configurations and compare.

For each published run (Megatron-LM's GPT-3 175B on A100s, MegaScale's 175B on 12,288
A100s, torchtitan's Llama 3.1 8B on 8 H100s) this runs

    build/loom plan --explain "<layout flags>" --profile P --world N --json <model>

with the layout and the precision as published (PREC_*: all three trained with 2-byte
floats, priced as `--precision bf16`), reads the predicted step (step_ms, tokens_per_s, mfu and
the terms), converts it to the metric the publication reports (TFLOP/s per GPU in
Megatron's accounting, MFU, tokens/s per GPU) and prints predicted vs published, the
relative error and whether it is within 15%. The model's parameters come from the GPU
profiles (profiles/*.json, public specifications and measurements); nothing here is
fitted to the published numbers. The published numbers and their sources are listed in
CASES and in docs/PLAN.md ("At scale: published configurations").

The last line of stdout is one JSON object. Usage:

    python3 bench/plan_published.py [--loom build/loom] [--only NAME] [--timeout S]
"""
import argparse
import configparser
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
A100 = "profiles/a100_nvlink_ib.json"
H100 = "profiles/h100_nvlink_ib.json"
MEGATRON = "configs/published/gpt3_175b_megatron.ini"
MEGASCALE = "configs/published/gpt3_175b_megascale.ini"
TITAN = "configs/published/llama3_8b_torchtitan.ini"

SRC_MEGATRON = ("D. Narayanan et al., Efficient Large-Scale Language Model Training on GPU "
                "Clusters Using Megatron-LM, SC'21, arXiv:2104.04473, Table 2 (PTD-P, 175B, "
                "batch 1536, tp 8 x pp 12); reproduced in "
                "github.com/cli99/llm-analysis examples/megatron-lm/run_train.sh")
SRC_MEGATRON_1024 = ("Narayanan et al. SC'21 section 5.1: GPT-3 175B, 300B tokens, 1024 A100s, "
                     "batch 1536: 34 days by Eq. 4 (8TP/nX), i.e. X = 140 TFLOP/s per GPU; "
                     "the layout of this estimate is not published")
SRC_MEGASCALE = ("Z. Jiang et al., MegaScale, NSDI'24, arXiv:2402.15627: 55.2% MFU on 12,288 "
                 "GPUs (abstract); tp 8 pp 8 dp 192, batch 6144, iteration 6.34 s, 1,984k "
                 "tokens/s (its strong-scaling table as transcribed in "
                 "github.com/JaneLiCC/Notes eos.md)")
SRC_TITAN = ("torchtitan docs/performance.md Table 1 (commit 9dec370, 2024-12): Llama 3.1 8B, "
             "8 H100 (96 GB HBM2e, 500 W), FSDP, local batch 2, global 16, seq 8192, "
             "selective (op) AC: 5,762 TPS/GPU, 82.4 GiB")

# The precision each publication trained in, as loom's --precision (the plan prices the
# linear GEMMs from the profile's gemm_bf16, which on these GPU profiles is the same dense
# BF16 tensor-core rate as gemm, and the tp/pp messages at 2 bytes an element; gradients
# are reduced in fp32 as Megatron and torchtitan's FSDP default do). Megatron-LM (SC'21)
# trained in fp16 mixed precision: loom has no fp16; bf16 has the same 2-byte messages
# and, on the A100, the same 312 TFLOP/s tensor-core peak.
PREC_MEGATRON = ("bf16", "fp16 mixed precision (SC'21 section 5); priced as loom's bf16: "
                 "the same bytes and A100 tensor-core rate")
PREC_MEGASCALE = ("bf16", "bf16 mixed precision (MegaScale section 3)")
PREC_TITAN = ("bf16", "bf16 parameters (FSDP2 MixedPrecisionPolicy param_dtype bf16, "
              "reduce_dtype fp32: torchtitan's default)")

# What the plan leaves out for each publication that moves its prediction most (docs/PLAN.md,
# "Why it is where it is"), named before the comparison; the summary lists it for each
# primary row outside 15%.
TERM_MEGATRON = ("compute priced at FlashAttention-2's attention rate and the best shape's "
                 "matmul rate (MAMF); Megatron-LM (2021) ran unfused attention, its score "
                 "matrices through memory")
TERM_MEGASCALE = ("tp/sp and dp communication exposed on the critical path; MegaScale "
                  "overlaps both with compute")
TERM_TITAN = ("compute priced at the 700 W SXM H100's matmul rate (MAMF, 80.3% of the "
              "dense peak); torchtitan's H100s run at 500 W, in eager PyTorch "
              "(torch.compile alone adds 15.7%)")

# name, config, profile, world, precision, --explain flags, the published metric and its value,
# flags of what is assumed where the publication does not say, sensitivity: not a
# published layout (a variant to show which term moves the prediction).
CASES = [
    dict(name="megatron-175b-384", config=MEGATRON, profile=A100, world=384,
         precision=PREC_MEGATRON,
         term=TERM_MEGATRON,
         flags="--dp 4 --tp 8 --pp 12 --pp-schedule interleaved --virtual-stages 2 "
               "--micro-batch 1 --global-batch 1536 --recompute",
         metric="tflops_per_gpu", published=153.0, source=SRC_MEGATRON,
         assumed="micro-batch 1 and the interleaved schedule with 2 chunks per rank (the "
                 "paper's end-to-end runs use it; the stored sources do not give Table 2's "
                 "micro-batch or schedule)"),
    dict(name="megatron-175b-768", config=MEGATRON, profile=A100, world=768,
         precision=PREC_MEGATRON,
         term=TERM_MEGATRON,
         flags="--dp 8 --tp 8 --pp 12 --pp-schedule interleaved --virtual-stages 2 "
               "--micro-batch 1 --global-batch 1536 --recompute",
         metric="tflops_per_gpu", published=149.0, source=SRC_MEGATRON,
         assumed="micro-batch and schedule as above"),
    dict(name="megatron-175b-1536", config=MEGATRON, profile=A100, world=1536,
         precision=PREC_MEGATRON,
         term=TERM_MEGATRON,
         flags="--dp 16 --tp 8 --pp 12 --pp-schedule interleaved --virtual-stages 2 "
               "--micro-batch 1 --global-batch 1536 --recompute",
         metric="tflops_per_gpu", published=141.0, source=SRC_MEGATRON,
         assumed="micro-batch and schedule as above"),
    dict(name="megatron-175b-1024", config=MEGATRON, profile=A100, world=1024,
         precision=PREC_MEGATRON,
         term=TERM_MEGATRON,
         flags="--dp 8 --tp 8 --pp 16 --pp-schedule interleaved --virtual-stages 2 "
               "--micro-batch 1 --global-batch 1536 --recompute",
         metric="tflops_per_gpu", published=140.0, source=SRC_MEGATRON_1024,
         assumed="layout tp 8 x pp 16 x dp 8 and the schedule (1024 is not a multiple of "
                 "the published tp 8 x pp 12)"),
    dict(name="megascale-175b-12288", config=MEGASCALE, profile=A100, world=12288,
         precision=PREC_MEGASCALE,
         term=TERM_MEGASCALE,
         flags="--dp 192 --tp 8 --pp 8 --sequence-parallel --pp-schedule interleaved "
               "--virtual-stages 2 --micro-batch 1 --global-batch 6144",
         metric="mfu", published=0.552, published_step_ms=6340.0, source=SRC_MEGASCALE,
         assumed="micro-batch 1, interleaved schedule with 2 chunks, sequence parallelism, "
                 "no full recomputation"),
    dict(name="torchtitan-llama3-8b-8xh100", config=TITAN, profile=H100, world=8,
         precision=PREC_TITAN,
         term=TERM_TITAN,
         flags="--dp 8 --zero 3 --micro-batch 2 --global-batch 16",
         metric="tokens_per_s_per_gpu", published=5762.0, source=SRC_TITAN,
         assumed="no recomputation (torchtitan's selective 'op' AC recomputes every second "
                 "matmul of the forward: between this run and the next)"),
    dict(name="torchtitan-llama3-8b-8xh100-recompute", config=TITAN, profile=H100, world=8,
         precision=PREC_TITAN,
         term=TERM_TITAN,
         flags="--dp 8 --zero 3 --micro-batch 2 --global-batch 16 --recompute",
         metric="tokens_per_s_per_gpu", published=5762.0, source=SRC_TITAN,
         assumed="full recomputation (the other bound of selective AC)"),
    dict(name="torchtitan-llama3-8b-8xh100-selective", config=TITAN, profile=H100, world=8,
         precision=PREC_TITAN,
         term=TERM_TITAN,
         flags="--dp 8 --zero 3 --micro-batch 2 --global-batch 16 --recompute selective",
         metric="tokens_per_s_per_gpu", published=5762.0, source=SRC_TITAN,
         assumed="loom's selective recomputation (attention and activations again; "
                 "torchtitan's op policy recomputes every second matmul too)",
         sensitivity=True),
    # sensitivity (not the published layouts): which term moves the prediction, and
    # layouts next to the published ones (loom refused these before 64-bit shards)
    dict(name="megatron-175b-1536-1f1b", config=MEGATRON, profile=A100, world=1536,
         precision=PREC_MEGATRON,
         term=TERM_MEGATRON,
         flags="--dp 16 --tp 8 --pp 12 --pp-schedule 1f1b --micro-batch 1 "
               "--global-batch 1536 --recompute",
         metric="tflops_per_gpu", published=141.0, source=SRC_MEGATRON,
         assumed="1F1B instead of interleaved", sensitivity=True),
    dict(name="megascale-175b-12288-pp16", config=MEGASCALE, profile=A100, world=12288,
         precision=PREC_MEGASCALE,
         term=TERM_MEGASCALE,
         flags="--dp 96 --tp 8 --pp 16 --sequence-parallel --pp-schedule interleaved "
               "--virtual-stages 2 --micro-batch 1 --global-batch 6144",
         metric="mfu", published=0.552, published_step_ms=6340.0, source=SRC_MEGASCALE,
         assumed="pp 16 x dp 96 instead of the published pp 8 x dp 192 (2.8e9 parameters "
                 "per rank at pp 8)", sensitivity=True),
    dict(name="megascale-175b-12288-pp16-1f1b", config=MEGASCALE, profile=A100, world=12288,
         precision=PREC_MEGASCALE,
         term=TERM_MEGASCALE,
         flags="--dp 96 --tp 8 --pp 16 --sequence-parallel --pp-schedule 1f1b "
               "--micro-batch 1 --global-batch 6144",
         metric="mfu", published=0.552, published_step_ms=6340.0, source=SRC_MEGASCALE,
         assumed="as above with 1F1B", sensitivity=True),
    dict(name="torchtitan-llama3-8b-tp4-dp2", config=TITAN, profile=H100, world=8,
         precision=PREC_TITAN,
         term=TERM_TITAN,
         flags="--dp 2 --tp 4 --sequence-parallel --zero 3 --micro-batch 2 --global-batch 16",
         metric="tokens_per_s_per_gpu", published=5762.0, source=SRC_TITAN,
         assumed="tp 4 (sequence parallel) x dp 2 ZeRO-3 instead of FSDP over 8; same "
                 "GPUs, batch and sequence, no recomputation", sensitivity=True),
    dict(name="torchtitan-llama3-8b-tp4-dp2-recompute", config=TITAN, profile=H100, world=8,
         precision=PREC_TITAN,
         term=TERM_TITAN,
         flags="--dp 2 --tp 4 --sequence-parallel --zero 3 --micro-batch 2 --global-batch 16 "
               "--recompute",
         metric="tokens_per_s_per_gpu", published=5762.0, source=SRC_TITAN,
         assumed="as above with full recomputation", sensitivity=True),
]


def model_flags(path):
    """The [model] section of a config as loom flags (key_name -> --key-name)."""
    cp = configparser.ConfigParser(inline_comment_prefixes=("#",))
    cp.read(os.path.join(ROOT, path))
    out = []
    for k, v in cp["model"].items():
        out += ["--" + k.replace("_", "-"), v]
    return out, cp


def megatron_flops(cp, batch):
    """Megatron-LM's Eq. 3 (SC'21): FLOPs of one iteration with full recomputation,
    96 B s l h^2 (1 + s/(6h) + V/(16 l h)); the paper's TFLOP/s per GPU is this over
    (iteration time x GPUs)."""
    m = cp["model"]
    l, h, s, v = (int(m[k]) for k in ("n_layer", "d_model", "seq_len", "vocab_size"))
    return 96.0 * batch * s * l * h * h * (1 + s / (6.0 * h) + v / (16.0 * l * h))


def last_json(text):
    """The last JSON object in text (the whole text, else the last line that parses)."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def run_plan(loom, case, timeout):
    """Runs loom plan for one case: the model as --config FILE, falling back to the
    [model] keys as flags if the CLI does not take --config."""
    mflags, _ = model_flags(case["config"])
    flags = case["flags"] + " --precision " + case["precision"][0]
    base = [loom, "plan", "--explain", flags, "--profile", case["profile"],
            "--world", str(case["world"]), "--json"]
    tries = [base + ["--config", case["config"]], base + mflags]
    last = None
    for cmd in tries:
        t0 = time.time()
        try:
            p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, {"cmd": shlex.join(cmd), "error": f"timed out after {timeout} s"}
        wall = time.time() - t0
        out = last_json(p.stdout) if p.returncode == 0 else None
        info = {"cmd": shlex.join(cmd), "rc": p.returncode, "wall_s": round(wall, 2),
                "stderr": p.stderr.strip()[-600:]}
        if out is not None and "time" in out:
            return out, info
        last = info
    return None, last


def convert(case, cp, out):
    """The predicted value of the case's published metric."""
    t = out["time"]
    step_s = t["step_ms"] / 1e3
    if case["metric"] == "tflops_per_gpu":
        batch = int(case["flags"].split("--global-batch")[1].split()[0])
        return megatron_flops(cp, batch) / (step_s * case["world"]) / 1e12
    if case["metric"] == "mfu":
        # loom's `mfu`: model FLOPs against the profile's datasheet dense peak, as the
        # publications define it
        return t["mfu"]
    if case["metric"] == "tokens_per_s_per_gpu":
        return t["tokens_per_s"] / case["world"]
    raise ValueError(case["metric"])


def fmt(metric, v):
    if v is None:
        return "-"
    return f"{100 * v:.1f}%" if metric == "mfu" else f"{v:,.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loom", default=os.path.join(ROOT, "build", "loom"))
    ap.add_argument("--only", action="append", default=[], help="case name (repeatable)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per loom plan")
    args = ap.parse_args()
    cases = [c for c in CASES if not args.only or c["name"] in args.only]
    t_start = time.time()
    runs = []
    print(f"{'run':40s} {'metric':22s} {'published':>10s} {'predicted':>10s} {'error':>8s}  "
          f"dominant term")
    for c in cases:
        _, cp = model_flags(c["config"])
        out, info = run_plan(args.loom, c, args.timeout)
        r = {"name": c["name"], "config": c["config"], "profile": c["profile"],
             "world": c["world"], "flags": c["flags"] + " --precision " + c["precision"][0],
             "precision": c["precision"][1], "term": c["term"], "metric": c["metric"],
             "published": c["published"], "source": c["source"], "assumed": c["assumed"],
             "sensitivity": bool(c.get("sensitivity")), "plan": info}
        if out is None:
            r.update(predicted=None, rel_err=None, within_15pct=None,
                     refused=(info or {}).get("error") or (info or {}).get("stderr"))
            print(f"{c['name']:40s} {c['metric']:22s} {fmt(c['metric'], c['published']):>10s} "
                  f"{'not run':>10s}           ({(info or {}).get('error') or (info or {}).get('stderr', '')[-120:]})")
            runs.append(r)
            continue
        t = out["time"]
        pred = convert(c, cp, out)
        err = (pred - c["published"]) / c["published"]
        terms = t.get("terms", [])
        dom = max(terms, key=lambda x: x.get("ms", 0.0)) if terms else {}
        r.update(predicted=round(pred, 4), rel_err=round(err, 4),
                 within_15pct=abs(err) <= 0.15, step_ms=t["step_ms"],
                 tokens_per_s=t.get("tokens_per_s"), mfu_loom=t.get("mfu"),
                 model_flops=t.get("model_flops"), terms=terms,
                 dominant=t.get("dominant") or dom.get("name"), memory=out.get("memory"),
                 memory_gib=(out.get("memory") or {}).get("total_gib"),
                 plan_world=out.get("world"))
        if "published_step_ms" in c:
            r["published_step_ms"] = c["published_step_ms"]
            r["step_rel_err"] = round((t["step_ms"] - c["published_step_ms"])
                                      / c["published_step_ms"], 4)
        runs.append(r)
        tag = " (sensitivity)" if r["sensitivity"] else ""
        if "step_rel_err" in r:
            tag += (f"; step {t['step_ms'] / 1e3:.2f} s vs {c['published_step_ms'] / 1e3:.2f} s "
                    f"published ({100 * r['step_rel_err']:+.1f}%)")
        print(f"{c['name']:40s} {c['metric']:22s} {fmt(c['metric'], c['published']):>10s} "
              f"{fmt(c['metric'], pred):>10s} {100 * err:+7.1f}%  {dom.get('name', '-')}{tag}")
        print("    " + ", ".join(f"{x['name']} {x['ms']:.1f} ms" for x in terms)
              + f" = step {t['step_ms']:.1f} ms; loom's MFU {100 * t.get('mfu', 0):.1f}% "
              + "(of the datasheet peak); "
              + f"memory {r['memory_gib'] or 0:.1f} GiB per rank (--precision "
              + f"{c['precision'][0]})")
    primary = [r for r in runs if not r["sensitivity"] and r["rel_err"] is not None]
    errs = [abs(r["rel_err"]) for r in primary]
    sens = [r for r in runs if r["sensitivity"] and r["rel_err"] is not None]
    summary = {
        "bench": "plan_published",
        "n_primary": len([r for r in runs if not r["sensitivity"]]),
        "n_run": len(primary),
        "within_15pct": sum(1 for r in primary if r["within_15pct"]),
        "median_abs_err": round(statistics.median(errs), 4) if errs else None,
        "worst_abs_err": round(max(errs), 4) if errs else None,
        "refused": [r["name"] for r in runs if r["predicted"] is None],
        "outside_15pct": {r["name"]: r["term"] for r in primary if not r["within_15pct"]},
        "sensitivity_within_15pct": {r["name"]: r["within_15pct"] for r in sens},
        "table": [{"name": r["name"], "published": r["published"],
                   "predicted": r["predicted"], "rel_err": r["rel_err"],
                   "sensitivity": r["sensitivity"]} for r in runs],
        "runs": runs,
        "wall_s": round(time.time() - t_start, 1),
    }
    print(json.dumps(summary))
    return 0 if primary else 1


if __name__ == "__main__":
    sys.exit(main())
