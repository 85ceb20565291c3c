#!/usr/bin/python3
"""The text demo's losses in bf16 against fp32 (issue 31's quality item: the demo's 300 steps
in bf16 end within 1% (relative) of fp32's final training and validation loss).

Prepares the demo's data as scripts/demo.sh does, under --data (default data/kjv, the
demo's own folder; reused when its shards are there): the King James Bible from Debian's
bible-kjv (`bible`), a 4096-token byte-level BPE (`loom tokenizer train`), llm.c shards with
paragraphs as documents and 2% of them for validation (`loom data prepare`). Then trains
configs/demo.ini's model twice, `--precision fp32` and `--precision bf16`, on --ranks ranks
under the supervisor as the demo does (`loom run -n 2 -- --config configs/demo.ini`), the
config's seed, schedule and evaluation (every 50 steps, 4 batches) for both: the
difference is the precision only. Each run's metrics, TensorBoard files, weights and rank
logs go under --out/<precision>.

Reports for each run the final training loss (the mean of the last 10 steps' losses, and
the final step's) and the final validation loss, the relative differences bf16 / fp32 - 1,
and `within_1pct` for each (|difference| <= 1%); every evaluation's validation loss of
both runs and their largest relative difference; the bf16 run's GEMM implementation as
its start-up line names it (oneDNN's bf16 matmul, or "widened to fp32" for OpenBLAS where
the CPU has no AVX512-BF16 or AMX-BF16: docs/precision.md), and the load average before
and after each run. Prints each run's result as it ends, then one JSON object last.

--quick: a smoke run (3 steps, evaluated at step 3 on 1 batch); its figures mean nothing.

Usage: /usr/bin/python3 bench/bf16_demo_quality.py --loom build/loom [--data DIR]
           [--out DIR] [--steps N] [--ranks N] [--threads T] [--quick]
"""
import argparse
import configparser
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CONFIG = os.path.join(ROOT, "configs", "demo.ini")


def prepare(loom, data):
    """scripts/demo.sh's steps 1-3 (text, BPE, shards) where their outputs are missing."""
    os.makedirs(data, exist_ok=True)
    txt = os.path.join(data, "kjv.txt")
    if not (os.path.exists(txt) and os.path.getsize(txt) > 0):
        with open(txt + ".part", "w") as f:
            subprocess.run(["bible", "gen1:1-rev22:21"], stdout=f, check=True)
        os.replace(txt + ".part", txt)
    tok = os.path.join(data, "tok")
    if not os.path.exists(os.path.join(tok, "vocab.bpe")):
        subprocess.run([loom, "tokenizer", "train", "--input", txt, "--vocab-size", "4096",
                        "--out", tok], check=True, stdout=subprocess.DEVNULL)
    bpe = os.path.join(data, "bpe")
    if not (glob.glob(os.path.join(bpe, "train_*.bin")) and
            glob.glob(os.path.join(bpe, "val_*.bin"))):
        subprocess.run([loom, "data", "prepare", "--input", txt, "--tokenizer", tok, "--out",
                        bpe, "--doc-separator", "blank-line", "--val-fraction", "0.02"],
                       check=True, stdout=subprocess.DEVNULL)
    return bpe


def losses(metrics):
    """(training losses by step, validation losses by step) from a --metrics file."""
    rows = [json.loads(line) for line in open(metrics) if line.strip()]
    train = {r["step"]: r["loss"] for r in rows if "loss" in r}
    val = {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}
    return train, val


def gemm_line(run_dir):
    """The bf16 start-up line of the ranks' logs: (the GEMM implementation, the whole line)."""
    for path in sorted(glob.glob(os.path.join(run_dir, "**", "*"), recursive=True)):
        if not os.path.isfile(path):
            continue
        with open(path, errors="replace") as f:
            for line in f:
                m = re.match(r"loom: precision bf16: (.*?)(, \d+ shapes prepared.*)?$",
                             line.rstrip("\n"))
                if m and "matmul" in m.group(1):
                    return m.group(1), line.strip()
    return None, None


def rel(a, b):
    return a / b - 1.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loom", required=True)
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "kjv"),
                    help="the demo's data folder (kjv.txt, tok/, bpe/), made if missing")
    ap.add_argument("--out", default="/tmp/loom_bf16_demo_quality", help="the runs' folders")
    ap.add_argument("--steps", type=int, default=None, help="training steps (the config's 300)")
    ap.add_argument("--ranks", type=int, default=2, help="ranks (the demo's loom run -n 2)")
    ap.add_argument("--threads", type=int, default=0, help="threads a rank (0: loom's default)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 3 steps")
    a = ap.parse_args()
    loom = os.path.abspath(a.loom)
    cfg = configparser.ConfigParser()
    cfg.read(CONFIG)
    train_cfg = cfg["train"]
    steps = a.steps or (3 if a.quick else int(train_cfg["steps"]))
    eval_every = steps if a.quick else int(train_cfg["eval_every"])
    eval_batches = 1 if a.quick else int(train_cfg["eval_batches"])
    bpe = prepare(loom, os.path.abspath(a.data))
    t0 = time.time()
    m = cfg["model"]
    out = {"bench": "bf16_demo_quality", "config": "configs/demo.ini",
           "model": f"gpt2 L{m['n_layer']} H{m['n_head']} C{m['d_model']} F{m['d_ff']} "
                    f"V{m['vocab_size']} T{m['seq_len']}",
           "steps": steps, "ranks": a.ranks, "threads": a.threads, "seed": int(train_cfg["seed"]),
           "eval_every": eval_every, "eval_batches": eval_batches, "quick": a.quick,
           "data": os.path.join(bpe, "train_*.bin"),
           "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "")}
    curves = {}
    for prec in ("fp32", "bf16"):
        run = os.path.join(os.path.abspath(a.out), prec)
        shutil.rmtree(run, ignore_errors=True)
        os.makedirs(run)
        metrics = os.path.join(run, "metrics.jsonl")
        cmd = [loom, "run", "-n", str(a.ranks), "--run-dir", os.path.join(run, "run"), "--",
               "--config", CONFIG, "--precision", prec, "--steps", str(steps),
               "--eval-every", str(eval_every), "--eval-batches", str(eval_batches),
               "--data", os.path.join(bpe, "train_*.bin"),
               "--val-data", os.path.join(bpe, "val_*.bin"), "--metrics", metrics,
               "--tensorboard", os.path.join(run, "tensorboard"),
               "--save-weights", os.path.join(run, "weights.safetensors")]
        if a.threads:
            cmd += ["--threads", str(a.threads)]
        load0, t = os.getloadavg()[0], time.time()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=run)
        wall = time.time() - t
        train, val = losses(metrics)
        if len(train) != steps or not val:
            raise SystemExit(f"bf16_demo_quality: {metrics}: {len(train)} training losses of "
                             f"{steps}, {len(val)} validation losses")
        last = [train[s] for s in sorted(train)[-10:]]
        curves[prec] = val
        out[prec] = {"train_loss_last10": round(sum(last) / len(last), 6),
                     "train_loss_final": round(train[steps], 6),
                     "val_loss": round(val[max(val)], 6), "val_step": max(val), "wall_s": round(wall, 1),
                     "load": [round(load0, 2), round(os.getloadavg()[0], 2)]}
        if prec == "bf16":
            out["bf16_gemm"], out["bf16_startup_line"] = gemm_line(os.path.join(run, "run"))
        r = out[prec]
        print(f"{prec}: train loss {r['train_loss_last10']:.4f} (last 10 steps), "
              f"{r['train_loss_final']:.4f} (step {steps}), val loss {r['val_loss']:.4f} "
              f"({wall:.0f} s, load {r['load'][0]} -> {r['load'][1]})", flush=True)
    f, b = out["fp32"], out["bf16"]
    diffs = {k: round(rel(b[k], f[k]), 6)
             for k in ("train_loss_last10", "train_loss_final", "val_loss")}
    out["rel_bf16_vs_fp32"] = diffs
    out["within_1pct"] = {k: abs(v) <= 0.01 for k, v in diffs.items()}
    common = sorted(set(curves["fp32"]) & set(curves["bf16"]))
    out["val_curve"] = {str(s): [round(curves["fp32"][s], 6), round(curves["bf16"][s], 6)]
                        for s in common}
    out["val_max_abs_rel"] = round(max(abs(rel(curves["bf16"][s], curves["fp32"][s]))
                                       for s in common), 6)
    out["load"] = list(os.getloadavg())
    out["wall_s"] = round(time.time() - t0, 1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
