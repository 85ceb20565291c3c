#!/usr/bin/python3
"""Pipeline bubble per schedule: measured next to theory.

Trains a small GPT-2 (8 layers, d_model 128, T 64, micro-batch 2, one thread per rank)
with --pp-stats for every schedule (gpipe, 1f1b, interleaved with v = 2, zb) at pp 2 and
4 and m = 4, 8, 16 micro-batches, and reads each stage's recorded timers.

Measured bubble ("cpu"): each compute action's thread CPU time
(CLOCK_THREAD_CPUTIME_ID, median over the timed steps) replayed through the stage's
action list and the cross-stage dependencies (transfers taken as free); bubble =
mean over stages of idle / step. Thread CPU time does not count the time a rank waits
for a core, so this is valid with more ranks than cores (pp 4 on 2 cores).
At pp 2 (2 ranks, 2 cores) also the wall-clock bubble: 1 - busy wall time / step span
(stages start together at a barrier), noisy when other jobs share the machine.
Theory: (p-1)/(m+p-1) for gpipe and 1f1b, (p-1)/(v m+p-1) interleaved, and for ZB-H1
(p-1)(F+B-W)/(m(F+B+W)+(p-1)(F+B-W)) with the measured mean F, B, W times (F = B = W:
a third of 1F1B's idle time). Last line: one JSON object.
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "parallel"))
from test_layouts import MPIRUN, write_text_shard  # noqa: E402
from test_pp_schedule import parse  # noqa: E402

LOOM = os.environ.get("LOOM", os.path.join(HERE, "..", "build", "loom"))
STEPS = 4  # the first is not timed


def replay(stages, pp, durs):
    """Makespan and per-stage busy time of the lists with these compute durations."""
    clock = [0.0] * pp
    busy = [0.0] * pp
    ptr = [0] * pp
    sent = {}
    progress = True
    while progress:
        progress = False
        for r in range(pp):
            acts = stages[r]
            while ptr[r] < len(acts):
                op, mb, ch, peer = acts[ptr[r]]
                vs = ch * pp + r
                if op in ("ra", "rg"):
                    key = (op[1], vs, mb)
                    if key not in sent:
                        break
                    clock[r] = max(clock[r], sent[key])
                elif op in ("sa", "sg"):
                    sent[(op[1], vs + (1 if op == "sa" else -1), mb)] = clock[r]
                else:
                    d = durs[r][ptr[r]]
                    clock[r] += d
                    busy[r] += d
                ptr[r] += 1
                progress = True
    span = max(clock)
    return span, busy


def main():
    tmp = tempfile.mkdtemp(prefix="loom_bench_pp_")
    data = os.path.join(tmp, "train.bin")
    write_text_shard(data, 7)
    t_start = time.time()
    results = {}
    for pp in (2, 4):
        for kind, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb", 1)):
            for m in (4, 8, 16):
                stats = os.path.join(tmp, f"{kind}_{pp}_{m}")
                cmd = MPIRUN + ["-n", str(pp), LOOM, "train", "--family", "gpt2", "--vocab-size",
                                "256", "--seq-len", "64", "--n-layer", "8", "--d-model", "128",
                                "--n-head", "4", "--d-ff", "512", "--micro-batch", "2",
                                "--global-batch", str(2 * m), "--steps", str(STEPS),
                                "--threads", "1", "--log-every", "0", "--data", data,
                                "--pp", str(pp), "--pp-schedule", kind, "--virtual-stages",
                                str(v), "--pp-stats", stats]
                p = subprocess.run(cmd, capture_output=True, text=True)
                if p.returncode != 0:
                    print(f"FAIL {' '.join(cmd)}\n{p.stderr[-2000:]}")
                    sys.exit(1)
                sched = subprocess.run([LOOM, "pp-schedule", "--pp", str(pp), "--micro-batches",
                                        str(m), "--schedule", kind, "--virtual-stages", str(v)],
                                       capture_output=True, text=True, check=True).stdout
                stages, _, _ = parse(sched)
                rows = {r: [json.loads(x) for x in open(f"{stats}.rank{r}")][1:] for r in range(pp)}
                durs = {r: [statistics.median(row["cpu_ms"][j] for row in rows[r])
                            for j in range(len(stages[r]))] for r in range(pp)}
                span, busy = replay(stages, pp, durs)
                cpu_bubble = statistics.mean(1 - b / span for b in busy)
                mean_of = lambda op: statistics.mean(  # noqa: E731
                    d for r in range(pp) for (a, _, _, _), d in zip(stages[r], durs[r]) if a == op)
                tf, tb = mean_of("F"), mean_of("B")
                tw = mean_of("W") if kind == "zb" else 0.0
                if kind == "zb":
                    theory = (pp - 1) * (tf + tb - tw) / (m * (tf + tb + tw) + (pp - 1) * (tf + tb - tw))
                else:
                    theory = (pp - 1) / (v * m + pp - 1)
                entry = {"cpu_bubble": round(cpu_bubble, 4), "theory": round(theory, 4),
                         "ratio": round(cpu_bubble / theory, 3),
                         "f_ms": round(tf, 3), "b_ms": round(tb, 3), "w_ms": round(tw, 3)}
                if kind == "zb":
                    entry["theory_equal_fbw"] = round((pp - 1) / (3 * m + pp - 1), 4)
                if pp == 2:
                    walls = []
                    for step in range(len(rows[0])):
                        st = [rows[r][step] for r in range(pp)]
                        t0 = min(s["start_ms"] for s in st)
                        t1 = max(s["start_ms"] + s["span_ms"] for s in st)
                        walls.append(statistics.mean(1 - s["busy_wall_ms"] / (t1 - t0) for s in st))
                    entry["wall_bubble"] = round(statistics.median(walls), 4)
                key = f"{kind}_pp{pp}_m{m}"
                results[key] = entry
                print(f"{key:22s} bubble {cpu_bubble:.3f} (theory {theory:.3f}, x{cpu_bubble / theory:.2f})"
                      + (f", wall {entry['wall_bubble']:.3f}" if pp == 2 else "")
                      + f"  F {tf:.2f} B {tb:.2f} W {tw:.2f} ms", flush=True)
    within = all(e["ratio"] <= 1.25 for e in results.values())
    zb_below = all(results[f"zb_pp{p}_m{m}"]["cpu_bubble"] < results[f"1f1b_pp{p}_m{m}"]["cpu_bubble"]
                   for p in (2, 4) for m in (4, 8, 16))
    print(json.dumps({"timing": "thread CPU time replayed through the action lists; wall at pp 2",
                      "model": "gpt2 L8 C128 T64 micro-batch 2, 1 thread/rank",
                      "results": results, "all_within_1.25x_theory": within,
                      "zb_below_1f1b": zb_below, "loadavg": os.getloadavg(),
                      "wall_s": round(time.time() - t_start, 1)}))


if __name__ == "__main__":
    main()
