#!/usr/bin/python3
"""Recovery speed of `loom run` for the 124M GPT-2 (sequence length cut to 64 so a step
stays short on a small machine), and the heartbeats' cost.

1. Crash: 2 ranks, a checkpoint after every step in the memory tier (/dev/shm, keep 2),
   rank 1 SIGKILLs itself at the start of step 4. From the rank's own log line (its wall
   time just before the kill) and the supervisor's events.jsonl: death -> detection, detection -> every rank stopped
   (teardown), -> the new ranks past start-up (relaunch: mpirun, MPI init, model
   allocation; a resuming rank initialises no weights), -> checkpoint opened and loaded
   (load: includes the first touch of the weights and optimizer state it fills, and the
   first step's batch and gradient clearing, until a rank enters the forward), ->
   the steps lost redone (replay), and death to the first new step. "breakdown": rank 0's
   start-up timeline of the restart and of the first launch (MPI init, allocation,
   initialisation, checkpoint load, the parts of the first two steps: loom train prints
   it), and the checkpoint's read rate.
2. Hang: rank 1 stops before a collective of step 2 with --heartbeat-timeout 3: hang ->
   detection (target: timeout + 1 s). --max-restarts 0, so the job ends there.
3. Heartbeat overhead: the same training with and without heartbeats (a socket of this
   script receives them), alternating runs; per mode the 20th percentile of all step
   times (robust to other jobs' bursts), and the spread between runs of the same mode
   as the noise floor; the 124M model (1 rank)
   and a tiny model (4 ranks, 1-2 ms steps: the worst case for a per-step cost).
The machine is shared (load average in the JSON): compare ratios within one run.
Usage: bench_ft.py --loom PATH [--smoke]. Last line: one JSON object. --smoke: a tiny model
(2 layers, d_model 48) everywhere and fewer overhead runs: that the bench runs end to end,
in seconds (its figures mean nothing).
"""
import argparse
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "harness"))
from loomtest import MPIRUN, write_text_shard  # noqa: E402

BIG = ["--model", "gpt2-small", "--seq-len", "64", "--micro-batch", "1", "--global-batch", "2",
       "--threads", "1", "--log-every", "1"]
TINY = ["--vocab-size", "256", "--seq-len", "24", "--n-layer", "2", "--d-model", "48",
        "--n-head", "4", "--d-ff", "96"]


def events(run_dir):
    return [json.loads(line) for line in open(os.path.join(run_dir, "events.jsonl"))]


def first(evs, name, attempt=None):
    for e in evs:
        if e["event"] == name and (attempt is None or e["attempt"] == attempt):
            return e
    sys.exit(f"bench_ft: no '{name}' event (attempt {attempt}):\n{json.dumps(evs, indent=1)}")


def injected_at(run_dir, rank, what):
    path = os.path.join(run_dir, "attempt_0", "ranks", "1", f"rank.{rank}", "stderr")
    m = re.search(what + r" .*at ([\d.]+)\)", open(path).read())
    if not m:
        sys.exit(f"bench_ft: no injection time in {path}")
    return float(m.group(1))


def timeline(run_dir, attempt, rank=0):
    """A rank's start-up line ("loom: rank R start-up (ms): part ms, ...; total ms (t0 WALL)")
    and rank 0's checkpoint read ("loaded B bytes (C chunks) in MS ms")."""
    path = os.path.join(run_dir, f"attempt_{attempt}", "ranks", "1", f"rank.{rank}", "stderr")
    text = open(path).read()
    m = re.search(r"start-up \(ms\): (.*); total ([\d.]+) \(t0 ([\d.]+)\)", text)
    if not m:
        sys.exit(f"bench_ft: no start-up line in {path}")
    parts = {k: float(v) for k, v in (p.rsplit(" ", 1) for p in m.group(1).split(", "))}
    out = {"parts_ms": parts, "total_ms": float(m.group(2)), "t0": float(m.group(3))}
    r = re.search(r"rank 0 loaded (\d+) bytes \((\d+) chunks\) in ([\d.]+) ms", text)
    if r:
        out["checkpoint_read"] = {"bytes": int(r.group(1)), "ms": float(r.group(3)),
                                  "gb_per_s": round(int(r.group(1)) / float(r.group(3)) / 1e6, 3)}
    return out


def supervised(loom, run_dir, run_args, train, timeout=900):
    cmd = [loom, "run", "-n", "2", "--run-dir", run_dir] + run_args + ["--"] + train
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return p, time.time() - t0


def crash(loom, root, data):
    run_dir = os.path.join(root, "crash")
    shm = tempfile.mkdtemp(prefix="loom_bench_ft_", dir="/dev/shm")
    train = BIG + ["--data", data, "--steps", "5", "--ckpt-fast-dir", shm, "--ckpt-fast-every",
                   "1", "--ckpt-keep", "2", "--inject", "crash@4:1"]
    try:
        p, wall = supervised(loom, run_dir, [], train)
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    if p.returncode != 0:
        sys.exit(f"bench_ft: crash run failed:\n{p.stderr[-3000:]}")
    ev = events(run_dir)
    death = injected_at(run_dir, 1, "crash at step 4")
    det = first(ev, "failure_detected")["t"]
    stopped = first(ev, "stopped")["t"]
    loading = first(ev, "loading", 1)["t"]
    training = first(ev, "training", 1)["t"]
    first_step = first(ev, "first_step_after_restart", 1)
    caught = first(ev, "caught_up", 1)["t"]
    s = json.load(open(os.path.join(run_dir, "summary.json")))
    f = s["failures"][0]
    # Where the time from the relaunch to the first new step goes, by rank 0's own clock
    # (its parts follow each other; a part may include waiting for the other rank), and
    # the same for the first launch (no checkpoint to load) for comparison.
    first_launch, restart = timeline(run_dir, 0), timeline(run_dir, 1)
    breakdown = {
        "stopped_to_exec_s": round(restart["t0"] - stopped, 3),
        "restart_rank0_ms": restart["parts_ms"],
        "restart_rank1_ms": timeline(run_dir, 1, 1)["parts_ms"],
        "first_launch_rank0_ms": first_launch["parts_ms"],
        "checkpoint_read": restart.get("checkpoint_read"),
    }
    return {
        "death_to_detection_s": round(det - death, 3),
        "teardown_s": round(stopped - det, 3),
        "relaunch_s": round(loading - stopped, 3),
        "checkpoint_load_s": round(training - loading, 3),
        "replay_s": round(caught - training, 3),
        "replayed_steps": f["replayed_steps"],
        "resumed_at_step": f["resumed_at_step"],
        "death_to_first_step_after_restart_s": round(first_step["t"] - death, 3),
        "death_to_first_new_step_s": round(caught - death, 3),
        "death_to_first_new_step_minus_load_and_replay_s": round(
            (caught - death) - (training - loading) - (caught - training), 3),
        "wall_s": round(wall, 1),
        "breakdown": breakdown,
    }


def hang(loom, root, data):
    run_dir = os.path.join(root, "hang")
    train = BIG + ["--data", data, "--steps", "4", "--inject", "hang@2:1"]
    p, wall = supervised(loom, run_dir, ["--heartbeat-timeout", "3", "--max-restarts", "0",
                                         "--grace", "2"], train)
    if p.returncode != 1 or "exhausted" not in p.stderr:
        sys.exit(f"bench_ft: hang run: exit {p.returncode}:\n{p.stderr[-3000:]}")
    hung = injected_at(run_dir, 1, "hang at step 2")
    det = first(events(run_dir), "failure_detected")["t"]
    d = json.load(open(os.path.join(run_dir, "diagnosis.json")))
    # The others reach the collective (and start waiting) only after their own compute.
    waited = d["collective"]["waited_s"]
    return {"heartbeat_timeout_s": 3, "hang_to_detection_s": round(det - hung, 3),
            "first_wait_to_detection_s": round(waited, 3),
            "culprits": d["collective"]["culprits"], "collective":
            f"{d['collective']['op']} #{d['collective']['seq']} on {d['collective']['communicator']}",
            "wall_s": round(wall, 1)}


def step_ms(metrics, skip):
    rows = [json.loads(line) for line in open(metrics)]
    return [r["step_ms"] for r in rows[skip:]]


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def overhead(loom, root, data, ranks, train, skip, reps):
    """Median step time with and without heartbeats, alternating runs."""
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    sink.setblocking(False)
    env_on = dict(os.environ, LOOM_FT_ADDR=f"127.0.0.1:{sink.getsockname()[1]}",
                  LOOM_FT_TOKEN=secrets.token_hex(16))
    env_off = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_FT_")}
    times = {"on": [], "off": []}
    per_run = {"on": [], "off": []}
    beats = 0
    for i in range(reps):
        for mode in (("off", "on") if i % 2 == 0 else ("on", "off")):
            metrics = os.path.join(root, f"ovh_{ranks}_{mode}_{i}.jsonl")
            cmd = (MPIRUN + ["-n", str(ranks)] if ranks > 1 else []) + [loom, "train"] + train + [
                "--data", data, "--metrics", metrics] + (["--dp", str(ranks)] if ranks > 1 else [])
            p = subprocess.run(cmd, capture_output=True, text=True,
                               env=env_on if mode == "on" else env_off, timeout=900)
            if p.returncode:
                sys.exit(f"bench_ft: overhead run failed:\n{p.stderr[-2000:]}")
            ms = step_ms(metrics, skip)
            times[mode] += ms
            per_run[mode].append(pct(ms, 0.2))
            while True:
                try:
                    sink.recv(4096)
                    beats += mode == "on"
                except BlockingIOError:
                    break
    on, off = pct(times["on"], 0.2), pct(times["off"], 0.2)
    noise = max(per_run["off"]) / min(per_run["off"]) - 1
    return {"step_ms_with": round(on, 3), "step_ms_without": round(off, 3),
            "overhead": round(on / off - 1, 4), "noise_between_runs": round(noise, 4),
            "runs_each": reps, "steps_each_mode": len(times["on"]), "beats_received": beats}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", required=True)
    ap.add_argument("--smoke", action="store_true", help="a tiny model, fewer runs (seconds)")
    args = ap.parse_args()
    if args.smoke:  # the tiny model in place of the 124M one (later flags win)
        BIG[:] = ["--model", "gpt2-small"] + TINY + ["--micro-batch", "1", "--global-batch", "2",
                                                     "--threads", "1", "--log-every", "1"]
    loom = os.path.abspath(args.loom)
    root = tempfile.mkdtemp(prefix="loom_bench_ft_")
    load0 = os.getloadavg()
    t0 = time.time()
    try:
        data = os.path.join(root, "train.bin")
        write_text_shard(data, 1)
        out = {"model": "smoke: gpt2 L2 C48 V256, seq 24" if args.smoke else
               "gpt2-small (124M), seq 64, 2 ranks x 1 thread"}
        out["crash"] = crash(loom, root, data)
        print("crash:", json.dumps(out["crash"]), flush=True)
        out["hang"] = hang(loom, root, data)
        print("hang:", json.dumps(out["hang"]), flush=True)
        out["heartbeat_overhead_124m"] = overhead(
            loom, root, data, 1, BIG[:-4] + ["--threads", "2", "--log-every", "0", "--steps", "5"],
            1, 1 if args.smoke else 3)
        print("overhead 124M:", json.dumps(out["heartbeat_overhead_124m"]), flush=True)
        tiny = TINY + ["--micro-batch", "2", "--global-batch", "8", "--steps",
                       "30" if args.smoke else "300", "--threads", "1", "--log-every", "0"]
        out["heartbeat_overhead_tiny_4ranks"] = overhead(loom, root, data, 4, tiny, 20,
                                                         1 if args.smoke else 6)
        print("overhead tiny:", json.dumps(out["heartbeat_overhead_tiny_4ranks"]), flush=True)
        c, h = out["crash"], out["hang"]
        out["targets"] = {
            "detection_after_crash_le_2s": c["death_to_detection_s"] <= 2.0,
            "detection_after_hang_le_timeout_plus_1s": h["hang_to_detection_s"] <= 3 + 1.0,
            "detection_after_stuck_le_timeout_plus_1s": h["first_wait_to_detection_s"] <= 3 + 1.0,
            "death_to_first_new_step_le_10s_plus_load":
                c["death_to_first_new_step_s"] - c["checkpoint_load_s"] <= 10.0,
            "heartbeat_overhead_le_1pct": out["heartbeat_overhead_124m"]["overhead"] <= 0.01,
            "overhead_resolvable_at_1pct": out["heartbeat_overhead_124m"]["noise_between_runs"]
                <= 0.01,
        }
        out["loadavg_start"] = [round(x, 2) for x in load0]
        out["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        out["wall_s"] = round(time.time() - t0, 1)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
