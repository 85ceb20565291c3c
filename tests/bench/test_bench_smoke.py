#!/usr/bin/python3
"""Smoke run of one benchmark of bench/: its smallest configuration (seconds), so that a
refactor cannot break a benchmark silently. Checks that it exits 0 and that the last line
it prints is one JSON object; its figures are not judged (they mean nothing at these
sizes). The C helpers the benchmarks run (sgemm_peak, cp_attention, moe_grouped) are taken
from --loom's folder (the build). Skipped (77) where the benchmark's own precondition is
missing: root and network namespaces (bench_hosts, bench_mpi_tcp), PyTorch, the
Fashion-MNIST files, the GPT-2 tokenizer files, node, Debian's bible-kjv. The GPU
benchmarks (bench_gpu*.py) are not run here: they need a GPU.
Usage: test_bench_smoke.py --loom PATH --bench NAME (NAME: a key of BENCHES)
"""
import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(HERE, "..", "harness"))
sys.path.insert(0, os.path.join(HERE, "..", "hosts"))
from loomtest import Skip, check, check_loom, run_test  # noqa: E402

FASHION = "/usr/share/datasets/fashion-mnist"
TOKENIZER = os.path.join(ROOT, "third_party", "gpt2")


def benches(build):
    """Each benchmark's smallest run: (its arguments after the program, what it needs)."""
    return {
        "bench_ckpt": (["--smoke"], ()),
        "bench_cp": (["--cp-attention", os.path.join(build, "cp_attention"), "--seq-len", "256",
                      "--balance-seq-len", "256", "--d-model", "32", "--budget-mib", "16",
                      "--steps", "2", "--warmup", "0"], ()),
        "bench_dit": (["--batch", "8", "--micro-batch", "8", "--steps", "1", "--warmup", "1",
                       "--shard-images", "64", "--sample-n", "2", "--sample-batch", "2",
                       "--sample-steps", "2"], ("torch", "fashion")),
        "bench_diloco": (["--smoke", "--outer-start-step", "6", "--diloco-dtypes", "fp32,bf16"],
                         ("bible",)),
        "bench_diloco_hosts": (["--hosts", "--smoke"], ("bible", "hosts")),
        "bench_dp": (["--model", "gpt2-tiny", "--seq-len", "32", "--steps", "3", "--warmup", "1",
                      "--rounds", "1"], ()),
        "bench_ft": (["--smoke"], ()),
        "bench_hosts": (["--smoke"], ("hosts",)),
        "bench_moe": (["--steps", "3"], ()),
        "bench_mpi_tcp": (["--settings", "stock", "--p2p", "4M", "--p2p-bytes", "16M",
                           "--coll-mb", "4", "--coll-reps", "1"], ("hosts", "no_loom")),
        "bench_plan": (["--profile", os.path.join(ROOT, "profiles", "h100_nvlink_ib.json"),
                        "--only", "gpt2 dp2 z1", "--steps", "3", "--repeat-fastest", "0"], ()),
        "bench_pp": (["--smoke"], ()),
        "bench_tp": (["--smoke"], ()),
        "bench_rl": (["--smoke"], ()),
        "bench_rl_hosts": (["--only", "hosts", "--smoke"], ("hosts",)),
        "bench_vlm": (["--steps", "1", "--warmup", "1", "--batch", "2", "--mixed-batch", "4", "--rounds", "1",
                       "--mixed-micro", "2"], ("torch", "fashion")),
        "bench_train": (["--sgemm-peak", os.path.join(build, "sgemm_peak"), "--only",
                         "gpt2-small-L4C256", "--steps", "1", "--warmup", "1"], ("torch",)),
        "dit_quality": (["--validate", "--epochs", "1", "--per-class", "20"],
                        ("torch", "fashion", "no_loom")),
        "plan_published": ([], ()),
        "plan_vlm": (["--profile", os.path.join(ROOT, "profiles", "h100_nvlink_ib.json"),
                      "--steps", "3", "--warmup", "1", "--global-batch", "4", "--only",
                      "dp1,pp2_bubbles", "--control"], ("fashion",)),
        "probe_elastic": ([], ("hosts", "no_loom")),
        "bench_tokenizer": ([], ("tokenizer",)),
        "bf16_autocast": (["--quick"], ("torch",)),
        "bf16_demo_quality": (["--quick", "--data", os.path.join(build, "smoke_bf16_demo", "kjv"),
                               "--out", os.path.join(build, "smoke_bf16_demo", "runs")],
                              ("bible",)),
    }


def skip_unless(needs):
    if "torch" in needs and importlib.util.find_spec("torch") is None:
        raise Skip("no PyTorch (python3-torch)")
    if "fashion" in needs and not os.path.isdir(FASHION):
        raise Skip(f"no {FASHION} (Debian's Fashion-MNIST files)")
    if "tokenizer" in needs:
        if not os.path.exists(os.path.join(TOKENIZER, "encoder.json")):
            raise Skip(f"no {TOKENIZER}/encoder.json (scripts/fetch_gpt2_tokenizer.sh)")
        for tool in ("node", "bible"):
            if not shutil.which(tool):
                raise Skip(f"no '{tool}'")
    if "bible" in needs and not shutil.which("bible"):
        raise Skip("no 'bible' (Debian's bible-kjv)")
    if "hosts" in needs:
        from test_hosts import skip_unless_possible  # root, network namespaces, mpirun
        skip_unless_possible()
        if not shutil.which("mpicc"):
            raise Skip("no mpicc")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", required=True)
    ap.add_argument("--bench", required=True)
    ap.add_argument("--timeout", type=float, default=240)
    args = ap.parse_args()
    loom = os.path.abspath(check_loom(args.loom))
    table = benches(os.path.dirname(loom))
    if args.bench not in table:
        raise SystemExit(f"--bench {args.bench}: one of {', '.join(sorted(table))}")
    words, needs = table[args.bench]
    skip_unless(needs)
    if args.bench == "bench_tokenizer":
        cmd = ["bash", os.path.join(ROOT, "bench", "bench_tokenizer.sh"), loom]
    else:
        script = {"bench_diloco_hosts": "bench_diloco",
                  "bench_rl_hosts": "bench_rl"}.get(args.bench, args.bench)
        cmd = ([sys.executable, os.path.join(ROOT, "bench", script + ".py")] +
               ([] if "no_loom" in needs else ["--loom", loom]) + words)
    print("$ " + " ".join(cmd), flush=True)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = f"none: killed after {args.timeout:.0f} s", e.stdout or "", e.stderr or ""
        out, err = (x.decode(errors="replace") if isinstance(x, bytes) else x for x in (out, err))
    lines = [x for x in out.splitlines() if x.strip()]
    try:
        last = json.loads(lines[-1]) if lines else None
    except ValueError:
        last = None
    ok = check(rc == 0 and isinstance(last, dict),
               f"  {args.bench}: exit {rc}, last line "
               f"{'one JSON object' if isinstance(last, dict) else 'NOT one JSON object'}")
    if not ok:
        print(f"stdout (end):\n{out[-2000:]}\nstderr (end):\n{err[-3000:]}")


if __name__ == "__main__":
    run_test(main)
