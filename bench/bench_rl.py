"""loom rl's speed, one run (docs/rl.md):
1. Rollout: 64 sampled completions of 64 prompts (G x P = 64 sequences) decoded batched
   (`loom generate --prompt-file --batch 64`) against one sequence at a time (`--batch 1`,
   the same binary, the same tokens: sampling is per-sequence, so both write the same
   completions, checked); the process's fixed cost (`--max-tokens 0`: start, weights,
   prompts) is subtracted from both. Target >= 5x. Threads: OMP_NUM_THREADS.
2. Each phase's share of an iteration (`loom rl` metrics: rollout, reward, log-probs,
   update, reshard), one process.
3. Reshard (--train-layout "--tp 2", --gen-layout "--dp 2", 2 ranks): its time against the
   bytes it moves over the pair's measured bandwidth (an all-to-all of the same bytes
   between the two ranks, timed by the same run's first iterations is not separable, so
   the bandwidth is measured by `loom rl`'s reshard of a 2x larger model: bytes / time of
   both, the ratio reported).
Not measured: one GRPO iteration against a PyTorch implementation (not written), and the
reshard against saving and loading a checkpoint.
Prints one JSON object last. Usage: bench_rl.py --loom PATH [--smoke]"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1"]


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, encoding="latin-1", **kw)  # bytes as chars
    if p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)}: exit {p.returncode}\n{p.stderr[-2000:]}")
    return p


def model_flags(L, C):
    return ["--family", "llama", "--vocab-size", "256", "--seq-len", "64", "--n-layer", str(L),
            "--d-model", str(C), "--n-head", "4", "--n-kv-head", "2", "--d-ff", str(4 * C)]


def weights(loom, tmp, data, L, C, name):
    path = os.path.join(tmp, name)
    run([loom, "train"] + model_flags(L, C) + ["--micro-batch", "4", "--global-batch", "4",
        "--steps", "1", "--threads", "2", "--log-every", "0", "--data", data,
        "--save-weights", path])
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", required=True)
    ap.add_argument("--smoke", action="store_true", help="a tiny model, few tokens (seconds)")
    a = ap.parse_args()
    L, C, new = (2, 32, 8) if a.smoke else (4, 128, 32)
    out = {"bench": "rl", "smoke": a.smoke}
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "d")
        run([a.loom, "data", "arith", "--out", d, "--digits", "3", "--train", "2000", "--val",
             "64"])
        w = weights(a.loom, tmp, d + "/train_*.bin", L, C, "w.safetensors")
        prompts = os.path.join(d, "val_prompts.txt")
        t0 = time.time()  # the process's fixed cost: start, load the weights, read the prompts
        run([a.loom, "generate", "--weights", w, "--prompt-file", prompts, "--max-tokens", "0"])
        fixed = time.time() - t0
        times, outs = {}, {}
        for batch in (64, 1):
            t0 = time.time()
            p = run([a.loom, "generate", "--weights", w, "--prompt-file", prompts, "--batch",
                     str(batch), "--max-tokens", str(new), "--temperature", "1", "--seed", "1"])
            times[batch] = max(1e-6, time.time() - t0 - fixed)
            outs[batch] = p.stdout
        lines = outs[64].split("\n")[:-1]
        tokens = sum(min(new, len(x) + 1) for x in lines)  # a stop token ends a short line
        out["rollout"] = {"sequences": 64, "tokens": tokens,
                          "batched_tokens_per_s": tokens / times[64],
                          "one_at_a_time_tokens_per_s": tokens / times[1],
                          "speedup": times[1] / times[64],
                          "process_fixed_s": fixed,
                          "same_completions": outs[64] == outs[1]}
        print(f"rollout: batched {tokens / times[64]:.0f} tok/s, one at a time "
              f"{tokens / times[1]:.0f} tok/s: {times[1] / times[64]:.2f}x", file=sys.stderr)

        base = ["rl", "--init-from", w, "--prompts", os.path.join(d, "train_prompts.txt"),
                "--iterations", "2" if a.smoke else "4", "--prompts-per-iter", "8",
                "--group-size", "8", "--ppo-micro-batch", "8", "--max-new-tokens", str(new),
                "--threads", "1", "--lr", "1e-4"]
        m = os.path.join(tmp, "one.jsonl")
        run([a.loom] + base + ["--metrics", m])
        rows = [json.loads(x) for x in open(m) if "rollout_ms" in x]
        phases = ("rollout_ms", "reward_ms", "logprob_ms", "update_ms", "reshard_ms")
        total = sum(r["iteration_ms"] for r in rows)
        out["phase_share"] = {k[:-3]: sum(r[k] for r in rows) / total for k in phases}
        reshard = {}
        for L2, C2 in ((L, C), (L, 2 * C)):
            w2 = weights(a.loom, tmp, d + "/train_*.bin", L2, C2, f"w{C2}.safetensors")
            m2 = os.path.join(tmp, f"tp{C2}.jsonl")
            base2 = list(base)
            base2[base2.index("--init-from") + 1] = w2
            p = run(MPIRUN + ["-n", "2", a.loom] + base2 + [
                "--train-layout", "--tp 2", "--gen-layout", "--dp 2", "--metrics", m2])
            mib = float(re.search(r"reshard moves ([0-9.]+) MiB", p.stderr).group(1))
            rows2 = [json.loads(x) for x in open(m2) if "reshard_ms" in x]
            ms = min(r["reshard_ms"] for r in rows2)
            reshard[C2] = (mib * 1048576, ms)
        (b1, t1), (b2, t2) = reshard[C], reshard[2 * C]
        bw = (b2 - b1) / max(1e-9, (t2 - t1) * 1e-3)  # bytes/s from the difference
        out["reshard"] = {"bytes": b1, "ms": t1, "bytes_2x_model": b2, "ms_2x_model": t2,
                          "bandwidth_bytes_per_s": bw,
                          "predicted_ms": b1 / bw * 1e3 if bw > 0 else None}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
