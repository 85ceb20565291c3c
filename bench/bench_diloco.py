#!/usr/bin/python3
"""DiLoCo against synchronous data parallelism on one host (docs/diloco.md).

The KJV demo data (scripts/demo.sh's preparation: Debian's bible-kjv, a 4096-token
byte-level BPE, 2% of the paragraphs for validation), a small GPT-2 (4 layers, d_model 128,
T 64), --workers W ranks, the same global batch and steps (so the same tokens), three runs
side by side in one invocation:
  sync_dp    --dp W: every step all-reduces every gradient
  diloco     --outer diloco --workers W --inner-steps H (fp32 outer gradients, Nesterov
             momentum 0.9, outer lr 0.7)
  streaming  the same with --outer-fragments F --outer-dtype int4 (one scale per 64 values)
For each: tokens/s (all tokens over the summed step times), validation loss at the end (and
every --eval-every steps: the curves, and a PNG through `loom plot` when gnuplot is there),
and bytes on the wire per token. DiLoCo's bytes are counted by loom (the metrics' "outer"
object: what each rank sends to the other workers, summed over ranks). Synchronous dp's are
the ring all-reduce's (what MPI's ring and NCCL send): each of n ranks sends
2 (n - 1) / n x 4 P bytes per step (P parameters), n times that over the ranks, divided by
the step's tokens. The ratios are against sync_dp's, measured in the same invocation.
On one host the links are shared memory: tokens/s says what the outer sync costs in
compute, not what a slow link would (tests/hosts and bench_hosts need root for that).
The last line of output is one JSON object.
Speed separately: --rounds rounds, each running every configuration in turn for
--speed-outer-rounds x H steps without evaluation (the load of a shared machine drifts;
each round's ratios are against that round's sync_dp), tokens/s over the steps after the
first H.
Usage: bench_diloco.py --loom build/loom [--steps 300] [--inner-steps 50] [--workers 4]
                       [--fragments 4] [--global-batch 16] [--rounds 3] [--smoke]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1"]


def prepare(loom, work):
    """scripts/demo.sh's KJV data: the text, a 4096-token BPE, train/val shards."""
    txt = os.path.join(work, "kjv.txt")
    with open(txt, "w") as f:
        subprocess.run(["bible", "gen1:1-rev22:21"], stdout=f, check=True)
    subprocess.run([loom, "tokenizer", "train", "--input", txt, "--vocab-size", "4096", "--out",
                    os.path.join(work, "tok")], check=True, capture_output=True)
    subprocess.run([loom, "data", "prepare", "--input", txt, "--tokenizer",
                    os.path.join(work, "tok"), "--out", os.path.join(work, "bpe"),
                    "--doc-separator", "blank-line", "--val-fraction", "0.02"], check=True,
                   capture_output=True)
    return os.path.join(work, "bpe")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--inner-steps", type=int, default=50)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--fragments", type=int, default=4)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved speed rounds (every config once per round, no eval)")
    ap.add_argument("--speed-outer-rounds", type=int, default=2,
                    help="each speed run: this many outer rounds (x --inner-steps steps)")
    ap.add_argument("--smoke", action="store_true", help="20 steps, H 6, F 2 (seconds)")
    args = ap.parse_args()
    if args.smoke:
        args.steps, args.inner_steps, args.fragments, args.eval_every = 24, 12, 2, 12
        args.rounds = 1
    if shutil.which("bible") is None or shutil.which("mpirun") is None:
        print("bench_diloco: needs bible-kjv (the `bible` command) and mpirun")
        sys.exit(77)
    work = tempfile.mkdtemp(prefix="loom_bench_diloco_")
    try:
        data = prepare(args.loom, work)
        W, H, F, G, T = args.workers, args.inner_steps, args.fragments, args.global_batch, 64
        base = [args.loom, "train", "--family", "gpt2", "--n-layer", "4", "--n-head", "4",
                "--d-model", "128", "--d-ff", "512", "--vocab-size", "4096", "--seq-len", str(T),
                "--micro-batch", "4", "--global-batch", str(G), "--steps", str(args.steps),
                "--lr", "2e-3", "--min-lr", "2e-4", "--warmup-steps", "20", "--threads", "1",
                "--log-every", "0", "--seed", "1337",
                "--data", os.path.join(data, "train_*.bin"),
                "--val-data", os.path.join(data, "val_*.bin"),
                "--eval-every", str(args.eval_every), "--eval-batches", "8"]
        outer = ["--outer", "diloco", "--workers", str(W), "--inner-steps", str(H),
                 "--outer-lr", "0.7", "--outer-momentum", "0.9", "--outer-nesterov"]
        configs = {
            "sync_dp": ["--dp", str(W)],
            "diloco": outer,
            "streaming": outer + ["--outer-fragments", str(F), "--outer-dtype", "int4",
                                  "--outer-block", "64"],
        }
        result = {"bench": "bench_diloco", "host": "one host (shared memory)", "workers": W,
                  "inner_steps": H, "fragments": F, "steps": args.steps, "global_batch": G,
                  "seq_len": T, "model": "gpt2 4 layers d_model 128 vocab 4096 (KJV BPE)",
                  "runs": {}}
        params = None
        for name, flags in configs.items():
            metrics = os.path.join(work, name + ".jsonl")
            p = subprocess.run(MPIRUN + ["-n", str(W)] + base + flags + ["--metrics", metrics],
                               capture_output=True, text=True)
            if p.returncode != 0:
                print(f"bench_diloco: {name} failed (exit {p.returncode}):\n{p.stderr[-2000:]}")
                sys.exit(1)
            m = re.search(r"gpt2 model, (\d+) parameters", p.stderr)
            params = params or (int(m.group(1)) if m else None)
            rows = [json.loads(x) for x in open(metrics) if x.strip()]
            tokens = rows[-1]["tokens"]
            ms = sum(r["step_ms"] for r in rows)
            run = {"tokens": tokens, "tokens_per_s": tokens / (ms / 1e3),
                   "val_loss": rows[-1].get("val_loss"),
                   "val_curve": [[r["step"], r["val_loss"]] for r in rows if "val_loss" in r],
                   "train_loss_last": rows[-1]["loss"]}
            if "outer" in rows[-1]:
                o = rows[-1]["outer"]
                run["bytes_per_token"] = o["bytes_total"] / tokens
                run["outer_exposed_ms_total"] = sum(r["outer"]["exposed_ms"] for r in rows)
                run["outer_hidden_ms_total"] = sum(r["outer"]["hidden_ms"] for r in rows)
                run["outer_grad_norm_last"] = o["grad_norm"]
            result["runs"][name] = run
            shutil.copy(metrics, os.path.join(work, "keep_" + name + ".jsonl"))
        # speed: every config in turn, --rounds times (the machine's load drifts), each run
        # as long as two outer rounds; tokens/s over the steps after the first round
        speed = {name: [] for name in configs}
        sp_steps = max(args.speed_outer_rounds, 2) * H
        for _ in range(args.rounds):
            for name, flags in configs.items():
                metrics = os.path.join(work, "speed_" + name + ".jsonl")
                cmd = list(base)
                cmd[cmd.index("--steps") + 1] = str(sp_steps)
                i = cmd.index("--eval-every")
                del cmd[i:i + 2]
                p = subprocess.run(MPIRUN + ["-n", str(W)] + cmd + flags + ["--metrics", metrics],
                                   capture_output=True, text=True)
                if p.returncode != 0:
                    print(f"bench_diloco: speed {name} failed:\n{p.stderr[-2000:]}")
                    sys.exit(1)
                rows = [json.loads(x) for x in open(metrics) if x.strip()][H:]
                speed[name].append(sum(G * T for _ in rows) / (sum(r["step_ms"] for r in rows)
                                                               / 1e3))
        for name in configs:
            result["runs"][name]["tokens_per_s_rounds"] = speed[name]
            result["runs"][name]["tokens_per_s_speed"] = sorted(speed[name])[len(speed[name]) // 2]
        sync = result["runs"]["sync_dp"]
        sync["bytes_per_token"] = W * 2 * (W - 1) / W * 4 * params / (G * T)
        sync["bytes_note"] = "ring all-reduce: 2 (n-1)/n x 4P bytes per rank per step"
        result["params"] = params
        for name in ("diloco", "streaming"):
            r = result["runs"][name]
            r["fewer_bytes_than_sync"] = sync["bytes_per_token"] / r["bytes_per_token"]
            r["tokens_per_s_vs_sync"] = r["tokens_per_s"] / sync["tokens_per_s"]
            r["tokens_per_s_speed_vs_sync"] = [a / b for a, b in
                                               zip(r["tokens_per_s_rounds"],
                                                   sync["tokens_per_s_rounds"])]
            r["val_loss_vs_sync"] = r["val_loss"] / sync["val_loss"] - 1.0
        png = os.path.join(os.getcwd(), "bench_diloco.png")
        if shutil.which("gnuplot") and not args.smoke:
            q = subprocess.run([args.loom, "plot"] +
                               [os.path.join(work, n + ".jsonl") for n in configs] +
                               ["-o", png, "--title", "sync dp vs DiLoCo vs streaming int4"],
                               capture_output=True, text=True)
            if q.returncode == 0:
                result["plot"] = png
        print(json.dumps(result))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
