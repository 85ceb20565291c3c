#!/usr/bin/python3
"""The DiT demo's sample quality in bf16 against fp32 (issue 31's quality item: within 2
points of fp32 in bench/dit_quality.py).

Packs Fashion-MNIST (`loom data images`, once, under --data), then for each precision
trains the demo's image DiT (configs/dit.ini: 800 steps, dp 2 under mpirun like the demo's
`loom run -n 2`, the same seed) with `--precision fp32|bf16`, draws --per-class samples of
every class from the EMA weights as the demo does (Euler, 50 steps, guidance 3, seed 1,
`loom sample --precision` the same), and judges them with bench/dit_quality.py (the
classifier's accuracy on the intended classes and its Frechet distance; the classifier is
trained once and cached under --data). The two precisions share the data, seed and
sampler: the difference is the precision only. Prints each run's final training and
validation loss and its scores, then one JSON object as the last line.

Usage: /usr/bin/python3 bench/dit_bf16_quality.py --loom build/loom [--data DIR]
           [--steps N] [--per-class N] [--threads T]
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1"]


def last_json(text):
    return json.loads(text.strip().splitlines()[-1])


def final_losses(metrics):
    rows = [json.loads(line) for line in open(metrics)]
    train = [r["loss"] for r in rows if "loss" in r]
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    return (sum(train[-10:]) / len(train[-10:]) if train else None), (val[-1] if val else None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loom", required=True)
    ap.add_argument("--data", default="/tmp/loom_dit_bf16", help="shards, runs and classifier")
    ap.add_argument("--steps", type=int, default=800, help="training steps (the demo's 800)")
    ap.add_argument("--per-class", type=int, default=100, help="samples of every class")
    ap.add_argument("--threads", type=int, default=1, help="threads a rank")
    a = ap.parse_args()
    loom = os.path.abspath(a.loom)
    os.makedirs(a.data, exist_ok=True)
    shards = os.path.join(a.data, "fmnist")
    if not os.path.exists(os.path.join(shards, "val_000.bin")):
        subprocess.run([loom, "data", "images", "--input", "fashion-mnist", "--out", shards],
                       check=True)
    t0 = time.time()
    out = {"bench": "dit_bf16_quality", "steps": a.steps, "per_class": a.per_class,
           "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "")}
    for prec in ("fp32", "bf16"):
        run = os.path.join(a.data, prec)
        os.makedirs(run, exist_ok=True)
        metrics = os.path.join(run, "metrics.jsonl")
        t = time.time()
        subprocess.run(MPIRUN + ["-n", "2", loom, "train", "--config",
                                 os.path.join(ROOT, "configs", "dit.ini"), "--dp", "2",
                                 "--precision", prec, "--steps", str(a.steps), "--threads",
                                 str(a.threads), "--data", os.path.join(shards, "train_*.bin"),
                                 "--val-data", os.path.join(shards, "val_*.bin"), "--metrics",
                                 metrics, "--save-weights",
                                 os.path.join(run, "weights.safetensors"), "--save-ema",
                                 os.path.join(run, "ema.safetensors")],
                       check=True, stdout=subprocess.DEVNULL, cwd=run)  # the config's
        train_s = time.time() - t
        raw = os.path.join(run, "samples.safetensors")
        subprocess.run([loom, "sample", "--weights", os.path.join(run, "ema.safetensors"), "--n",
                        str(a.per_class), "--steps", "50", "--cfg", "3", "--seed", "1",
                        "--precision", prec, "-o", os.path.join(run, "samples.png"), "--raw",
                        raw], check=True, stdout=subprocess.DEVNULL)
        judged = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "dit_quality.py"),
                                 "--cache", os.path.join(a.data, "fmnist_cnn.pt"), "--samples",
                                 raw], check=True, capture_output=True, text=True)
        s = last_json(judged.stdout)["samples"]
        tr, va = final_losses(metrics)
        out[prec] = {"accuracy": s["accuracy"], "frechet_distance": s["frechet_distance"],
                     "train_loss_last10": tr, "val_loss": va, "train_s": round(train_s, 1)}
        print(f"{prec}: accuracy {s['accuracy']:.4f}, Frechet distance "
              f"{s['frechet_distance']:.3f}, train loss {tr:.4f}, val loss {va:.4f} "
              f"({train_s:.0f} s training)", flush=True)
    diff = 100.0 * (out["bf16"]["accuracy"] - out["fp32"]["accuracy"])
    out["accuracy_points_bf16_minus_fp32"] = round(diff, 2)
    out["within_2_points"] = abs(diff) <= 2.0
    out["val_loss_rel"] = round(out["bf16"]["val_loss"] / out["fp32"]["val_loss"] - 1.0, 4)
    out["load"] = list(os.getloadavg())
    out["wall_s"] = round(time.time() - t0, 1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
