#!/usr/bin/python3
"""Multimodal LLM (family vlm) speed: loom against the PyTorch reference, and --balance-dp.

1. One process, one thread each, the same OpenBLAS kernel (OPENBLAS_CORETYPE, thread
   counts and OMP_WAIT_POLICY=PASSIVE set before BLAS loads, as bench_dit.py): `loom train
   --model vlm-tiny` on `loom data vlm` 2 x 2 Fashion-MNIST grids (one image a sample)
   against tests/reference/vlm_torch.py's model in float32 (the tests' reference: ViT
   encoder, projector, Llama decoder, the masked loss) trained with torch.optim.AdamW on
   the same records (read from the same shard, expanded as docs/vlm.md says), both at a
   constant learning rate (loom: no warm-up, --min-lr = --lr); the initialisations differ
   (loom's and PyTorch's defaults), so the losses are printed, not compared. Steady
   state: the median step after --warmup steps; samples/s = global batch / step time.
2. --balance-dp at dp 2 (one thread a rank) on `loom data vlm --mixed-images 3` samples
   (0 to 3 grids each) with an encoder worth a large share of a sample (--vit-d-model 256,
   4 blocks), without and with --balance-dp: the mean over the measured steps of the
   metrics' "dp_balance": the cost model's slowest rank over the mean ("predicted") and
   the measured forward + backward time of the slowest rank over the mean, in wall time
   and in each rank's thread CPU time (one thread a rank: its compute; wall time also
   counts the time other processes on a shared machine take the core). The losses of
   both runs are printed side by side (the same function: they agree to fp32 noise).

3. --vision-schedule at pp 2 (two ranks, one thread each, MPI yielding while it waits, so
   that a waiting stage leaves its core): vlm-tiny's decoder with a wider encoder
   (BUBBLES: 4 blocks of width 128, measured as "encoder_share", the vision spans' share
   of a one-process step in a --trace) on the 2 x 2 grids, 8 micro-batches a step, runs
   with `first` (the encoder on stage 0) and `bubbles` alternating, --rounds each: the
   median step time of each (target: bubbles >= 15% shorter), each stage's idle share
   (1 - compute wall time / step span, --pp-stats) next to the schedule simulator's
   prediction (the start-up line), and the losses of both (the same function).

The last line of output is one JSON object.
Usage: /usr/bin/python3 bench/bench_vlm.py --loom build/loom [--steps 8] [--coretype Haswell]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

import torch_peer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "reference"))

MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe"]
# vlm-tiny (src/model/config.c)
TINY = {"n_layer": 2, "n_head": 4, "n_kv_head": 2, "d_model": 128, "d_ff": 352,
        "vocab_size": 264, "seq_len": 192, "vit_layers": 2, "vit_d_model": 64, "vit_n_head": 4,
        "vit_d_ff": 256, "patch": 7, "height": 56, "width": 56, "channels": 1}
OPT = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
# the mixed-images run: a heavy encoder, three image slots, room for three captions
MIXED = ["--family", "vlm", "--max-images", "3", "--seq-len", "512", "--vit-layers", "4",
         "--vit-d-model", "256", "--vit-n-head", "4", "--vit-d-ff", "1024"]


def run(cmd, env, what):
    cmd = [str(c) for c in cmd]
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"{what} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return proc


def metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def read_shard(path, max_images):
    """docs/vlm.md's shard -> [(tokens, mask, images u8 [n, C, H, W])]."""
    raw = open(path, "rb").read()
    h = np.frombuffer(raw[:1024], dtype="<i4")
    n, C, H, W, n_tok = int(h[2]), int(h[3]), int(h[4]), int(h[5]), int(h[9])
    off = 1024
    ent = np.frombuffer(raw[off:off + 16 * n], dtype="<i4").reshape(n, 4)
    off += 16 * n
    tok = np.frombuffer(raw[off:off + 4 * n_tok], dtype="<i4")
    off += 4 * n_tok
    mask = np.frombuffer(raw[off:off + n_tok], dtype=np.uint8)
    off += n_tok
    px = np.frombuffer(raw[off:], dtype=np.uint8).reshape(-1, C, H, W)
    return [(tok[a:a + k].tolist(), mask[a:a + k].tolist(), px[i0:i0 + m])
            for a, k, i0, m in ent]


def torch_worker(spec_json):
    """In a child process, so the BLAS environment is in place before torch loads."""
    import torch
    import torch_model as tm
    import vlm_torch as vt
    spec = json.loads(spec_json)
    torch.set_num_threads(spec["threads"])
    torch.manual_seed(1)
    c = spec["config"]
    cfg = tm.Config(family="llama", n_layer=c["n_layer"], n_head=c["n_head"],
                    n_kv_head=c["n_kv_head"], d_model=c["d_model"], d_ff=c["d_ff"],
                    vocab_size=c["vocab_size"], seq_len=c["seq_len"])
    vc = vt.VitConfig(patch=c["patch"], height=c["height"], width=c["width"],
                      channels=c["channels"], n_layer=c["vit_layers"], n_head=c["vit_n_head"],
                      d_model=c["vit_d_model"], d_ff=c["vit_d_ff"])
    model = vt.VLM(cfg, vc).to(torch.float32)
    o = spec["opt"]
    opt = torch.optim.AdamW(model.parameters(), lr=o["lr"], betas=(o["beta1"], o["beta2"]),
                            eps=o["eps"], weight_decay=o["weight_decay"])
    T, P, G = cfg.seq_len, vc.image_tokens, spec["batch"]
    S = vc.channels * vc.height * vc.width
    samples = read_shard(spec["shard"], 1)
    recs = []
    for tok, mask, imgs in samples:
        r = vt.expand(tok, mask, imgs, 256, 257, T, P, 1, S)
        if r is not None:
            recs.append((r[0], r[1], len(imgs), r[2]))
    rng = np.random.default_rng(1)
    secs, losses = [], []
    for s in range(spec["steps"]):
        batch = [recs[i] for i in rng.integers(0, len(recs), G)]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = vt.loss_of(model, batch, T, P, vc, G)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        secs.append(time.perf_counter() - t0)
        print(f"  torch step {s + 1}: loss {losses[-1]:.4f} {secs[-1] * 1000:.0f} ms",
              file=sys.stderr, flush=True)
    print(json.dumps({"step_seconds": secs, "losses": losses}))


def speed(args, work):
    data = os.path.join(work, "grids")
    env = torch_peer.blas_env(1, args.coretype)
    run([args.loom, "data", "vlm", "--input", "fashion-mnist", "--out", data, "--samples",
         1024, "--val-samples", 0], env, "loom data vlm")
    shard = os.path.join(data, "train_000000.bin")
    steps = args.warmup + args.steps
    m = os.path.join(work, "speed.jsonl")
    run([args.loom, "train", "--model", "vlm-tiny", "--data", shard, "--micro-batch",
         args.batch, "--global-batch", args.batch, "--steps", steps, "--threads", 1,
         "--log-every", 0, "--metrics", m, "--lr", OPT["lr"], "--warmup-steps", 0,
         "--min-lr", OPT["lr"], "--beta2", OPT["beta2"],
         "--weight-decay", OPT["weight_decay"]], env, "loom train (one process)")
    rows = metrics(m)
    loom_s = float(np.median([r["step_ms"] / 1000.0 for r in rows[args.warmup:]]))
    spec = {"threads": 1, "config": TINY, "opt": OPT, "batch": args.batch, "steps": steps,
            "shard": shard}
    proc = run(torch_peer.worker_command(__file__, spec),
               env, "torch worker")
    tr = json.loads(proc.stdout.strip().splitlines()[-1])
    torch_s = float(np.median(tr["step_seconds"][args.warmup:]))
    out = {"config": "vlm-tiny", "batch": args.batch, "threads": 1,
           "loom_samples_per_s": round(args.batch / loom_s, 2),
           "torch_samples_per_s": round(args.batch / torch_s, 2),
           "loom_vs_torch": round(torch_s / loom_s, 3),
           "loom_loss": [round(rows[0]["loss"], 4), round(rows[-1]["loss"], 4)],
           "torch_loss": [round(tr["losses"][0], 4), round(tr["losses"][-1], 4)]}
    print(f"  one process: loom {out['loom_samples_per_s']} samples/s, torch "
          f"{out['torch_samples_per_s']} samples/s: {out['loom_vs_torch']}x", flush=True)
    return out


def balance(args, work):
    data = os.path.join(work, "mixed")
    env = torch_peer.blas_env(1, args.coretype)
    run([args.loom, "data", "vlm", "--input", "fashion-mnist", "--out", data, "--samples",
         2048, "--val-samples", 0, "--mixed-images", 3], env, "loom data vlm --mixed-images")
    steps = args.warmup + args.steps
    out = {}
    losses = {}
    for name, extra in (("without", []), ("with", ["--balance-dp"])):
        m = os.path.join(work, f"balance_{name}.jsonl")
        run(MPIRUN + ["-n", 2, "-x", "OPENBLAS_CORETYPE", "-x", "OMP_WAIT_POLICY",
                      "-x", "OPENBLAS_NUM_THREADS", "-x", "OMP_NUM_THREADS",
                      args.loom, "train"] + MIXED +
            ["--data", os.path.join(data, "train_000000.bin"), "--dp", 2, "--micro-batch",
             args.mixed_micro, "--global-batch", args.mixed_batch, "--steps", steps,
             "--threads", 1, "--log-every", 0, "--metrics", m] + extra, env,
            f"loom train --dp 2 ({name} --balance-dp)")
        rows = metrics(m)
        losses[name] = [r["loss"] for r in rows]
        b = [r["dp_balance"] for r in rows[args.warmup:]]
        out[name] = {
            "predicted_max_over_mean": round(float(np.mean([x["predicted"] for x in b])), 4),
            "measured_max_over_mean": round(float(np.mean([x["compute_max_over_mean"]
                                                            for x in b])), 4),
            "measured_cpu_max_over_mean": round(float(np.mean([x["compute_cpu_max_over_mean"]
                                                                for x in b])), 4),
            "step_ms_median": round(float(np.median([r["step_ms"] for r in rows[args.warmup:]])),
                                    1)}
        print(f"  dp 2 {name} --balance-dp: predicted {out[name]['predicted_max_over_mean']}, "
              f"measured {out[name]['measured_max_over_mean']} (wall), "
              f"{out[name]['measured_cpu_max_over_mean']} (CPU) (slowest rank / mean), step "
              f"{out[name]['step_ms_median']} ms", flush=True)
    rel = max(abs(a - b) / abs(b) for a, b in zip(losses["with"], losses["without"]))
    out["loss_rel_diff"] = float(f"{rel:.3g}")
    out["batch"], out["micro_batch"] = args.mixed_batch, args.mixed_micro
    out["model"] = " ".join(MIXED)
    return out


BUBBLES = ["--model", "vlm-tiny", "--vit-layers", "4", "--vit-d-model", "128",
           "--vit-d-ff", "512"]


def encoder_share(args, shard, work, env):
    """The vision spans' share of the steps after warm-up, one process, one thread."""
    tr = os.path.join(work, "share.json")
    run([args.loom, "train"] + BUBBLES +
        ["--data", shard, "--micro-batch", 2, "--global-batch", 16, "--steps",
         args.warmup + 2, "--threads", 1, "--log-every", 0, "--trace", tr], env,
        "loom train --trace (encoder share)")
    ev = [e for e in json.load(open(tr))["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e for e in ev if e["name"] == "step"), key=lambda e: e["ts"])[args.warmup:]
    t0 = steps[0]["ts"]
    vision = sum(e["dur"] for e in ev if e["name"] == "vision" and e["ts"] >= t0)
    return vision / sum(e["dur"] for e in steps)


def bubbles(args, work):
    data = os.path.join(work, "grids")
    env = torch_peer.blas_env(1, args.coretype)
    shard = os.path.join(data, "train_000000.bin")
    if not os.path.exists(shard):
        run([args.loom, "data", "vlm", "--input", "fashion-mnist", "--out", data, "--samples",
             1024, "--val-samples", 0], env, "loom data vlm")
    out = {"model": " ".join(BUBBLES), "pp": 2, "micro_batch": 2, "global_batch": 16,
           "encoder_share": round(encoder_share(args, shard, work, env), 3)}
    steps = args.warmup + args.steps
    times = {"first": [], "bubbles": []}
    idle = {"first": [], "bubbles": []}
    predicted, losses = {}, {}
    for k in range(args.rounds):
        for name in ("first", "bubbles"):
            m = os.path.join(work, f"bubbles_{name}_{k}.jsonl")
            st = os.path.join(work, f"bubbles_{name}_{k}.stats")
            proc = run(MPIRUN + ["--mca", "mpi_yield_when_idle", "1", "-n", 2,
                                 "-x", "OPENBLAS_CORETYPE", "-x", "OMP_WAIT_POLICY",
                                 "-x", "OPENBLAS_NUM_THREADS", "-x", "OMP_NUM_THREADS",
                                 args.loom, "train"] + BUBBLES +
                       ["--data", shard, "--pp", 2, "--micro-batch", 2, "--global-batch", 16,
                        "--steps", steps, "--threads", 1, "--log-every", 0, "--metrics", m,
                        "--pp-stats", st, "--vision-schedule", name], env,
                       f"loom train --pp 2 --vision-schedule {name}")
            rows = metrics(m)
            losses[name] = [r["loss"] for r in rows]
            times[name] += [r["step_ms"] for r in rows[args.warmup:]]
            per_stage = []
            for r in range(2):
                s = [json.loads(x) for x in open(f"{st}.rank{r}")][args.warmup:]
                per_stage.append(float(np.median([1 - x["busy_wall_ms"] / x["span_ms"]
                                                  for x in s])))
            idle[name].append(per_stage)
            for line in proc.stderr.splitlines():
                if "simulated idle share per stage" in line:
                    a, b = line.split("per stage ")[1].split(" -> ")
                    predicted = {"first": [float(x) for x in a.split(",")],
                                 "bubbles": [float(x) for x in b.split(",")]}
                if "micro-batches encoded per stage" in line:
                    out["encoded_per_stage"] = [int(x) for x in
                                                line.split("per stage ")[1].split(" ")[0]
                                                .split(",")]
                    pct = float(line.split("(")[-1].split("%")[0])
                    out["simulated_shorter"] = round(pct / 100, 3)
    for name in ("first", "bubbles"):
        out[name] = {"step_ms_median": round(float(np.median(times[name])), 1),
                     "idle_measured": [round(float(np.median([x[r] for x in idle[name]])), 3)
                                       for r in range(2)],
                     "idle_simulated": predicted.get(name)}
    out["bubbles_shorter"] = round(1 - out["bubbles"]["step_ms_median"] /
                                   out["first"]["step_ms_median"], 3)
    rel = max(abs(a - b) / abs(b) for a, b in zip(losses["bubbles"], losses["first"]))
    out["loss_rel_diff"] = float(f"{rel:.3g}")
    out["rounds"], out["steps_measured_per_round"] = args.rounds, args.steps
    print(f"  pp 2: step {out['first']['step_ms_median']} ms (first) vs "
          f"{out['bubbles']['step_ms_median']} ms (bubbles): {100 * out['bubbles_shorter']:.1f}% "
          f"shorter (encoder share {out['encoder_share']})", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loom", help="path to the loom binary")
    ap.add_argument("--steps", type=int, default=8, help="measured steps")
    ap.add_argument("--warmup", type=int, default=2, help="steps excluded from timing")
    ap.add_argument("--batch", type=int, default=16, help="samples a step (one process)")
    ap.add_argument("--mixed-batch", type=int, default=8, help="samples a step (dp 2)")
    ap.add_argument("--mixed-micro", type=int, default=2, help="micro-batch (dp 2)")
    ap.add_argument("--coretype", default=torch_peer.default_coretype(),
                    help="OPENBLAS_CORETYPE for loom and PyTorch alike (default: loom's own "
                         "choice for this CPU)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="--vision-schedule: alternating runs of each")
    ap.add_argument("--only", choices=["speed", "balance", "bubbles"], help="run one part")
    args = torch_peer.parse_args(ap, torch_worker)
    t0 = time.time()
    result = {"openblas_coretype": args.coretype,
              "load_avg_start": [round(x, 2) for x in os.getloadavg()]}
    with tempfile.TemporaryDirectory(prefix="loom_bench_vlm_") as work:
        if args.only in (None, "speed"):
            result["one_process"] = speed(args, work)
        if args.only in (None, "balance"):
            result["balance_dp"] = balance(args, work)
        if args.only in (None, "bubbles"):
            result["vision_schedule"] = bubbles(args, work)
    result["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    result["wall_s"] = round(time.time() - t0, 1)
    print()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
