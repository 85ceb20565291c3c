#!/usr/bin/python3
"""Pipeline bubble per schedule: measured next to theory.

Trains a small GPT-2 (16 layers, d_model 256, vocabulary 128, T 64, micro-batch 2, one
thread per rank) with --pp-stats for every schedule (gpipe, 1f1b, interleaved with v = 2,
zb) at pp 2 and 4 and m = 4, 8, 16 micro-batches, and reads each stage's recorded timers.

Why this model: the theory assumes equal stages, and at m = 16 the 1.25x target leaves
room for only ~1.5% (1f1b pp 2) or ~0.8% (zb pp 2) imbalance between stages (excess idle
~ imbalance x m/(m+p-1)). So the stages run the same code: 16 layers split evenly (8,8 /
4,4,4,4; v 2: 4 x 4 / 8 x 2), ASCII text in a vocabulary of 128 (the last stage's head is
1/24 of a layer; with 8 layers x vocabulary 256 it was 1/6 and made the last stage ~10%
slower at pp 4). And the layers are wide enough that the caches do not decide it: at
d_model 128 the stage with more micro-batches in flight is slower. In 1f1b stage 0
alternates between its pp activation slots, while the last stage reuses one slot whose
data are still in L2 (2 MiB a core here) when its B follows its F and its next F its B;
stage 0's F was ~3% and its B ~5% slower. Forcing the last stage to alternate two slots
(a temporary patch) made it as slow as stage 0, and --recompute (B refills its
activations right before use) evened the stages. More layers per stage did not dilute it
(32 layers: the same ~5% on B), wider layers did: the extra memory traffic grows with
d_model, the work with its square. At d_model 128, 1f1b pp 2 m 16 went past 1.25x in 3
of 4 runs (1.16-1.36, imbalance 1-3%); at d_model 256 (~3.7x the time per action) every
cell stayed within in 3 runs (imbalance <= 1.5%). With
unequal stages the bubble can also fall below the theory (interleaved, when the last
stage is the faster one). "stage_imbalance" (slowest stage's busy time over the mean,
-1) is reported per cell. BENCH_PP_LAYERS / BENCH_PP_DMODEL / BENCH_PP_VOCAB /
BENCH_PP_STEPS / BENCH_PP_CELLS (a substring of the cell names) / BENCH_PP_FLAGS (more
train flags) override, to repeat the study.

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
Usage: bench_pp.py [--loom build/loom] [--smoke] (--smoke: 4 layers of d_model 32, 2 steps,
the pp 2 m 4 cells only: that the bench runs end to end, in seconds; its figures mean
nothing).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "harness"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "parallel"))
from loomtest import MPIRUN, write_text_shard  # noqa: E402
from test_pp_schedule import parse  # noqa: E402

LOOM = os.environ.get("LOOM", os.path.join(HERE, "..", "build", "loom"))
STEPS = int(os.environ.get("BENCH_PP_STEPS", "6"))  # the first is not timed
# model overrides (to study the stage balance): layers, vocabulary, width; cells: a substring
N_LAYER = os.environ.get("BENCH_PP_LAYERS", "16")
VOCAB = os.environ.get("BENCH_PP_VOCAB", "128")
D_MODEL = int(os.environ.get("BENCH_PP_DMODEL", "256"))
CELLS = os.environ.get("BENCH_PP_CELLS", "")
FLAGS = os.environ.get("BENCH_PP_FLAGS", "").split()  # extra loom train flags


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
    global LOOM, STEPS, N_LAYER, D_MODEL, CELLS
    ap = argparse.ArgumentParser(description="Pipeline bubble per schedule (the environment "
                                 "overrides: this file's docstring)")
    ap.add_argument("--loom", default=LOOM, help="the loom binary (default: $LOOM or build/loom)")
    ap.add_argument("--smoke", action="store_true", help="a tiny model, pp 2 m 4 only (seconds)")
    args = ap.parse_args()
    LOOM = args.loom
    if args.smoke:
        STEPS, N_LAYER, D_MODEL, CELLS = 2, "4", 32, "_pp2_m4"
    tmp = tempfile.mkdtemp(prefix="loom_bench_pp_")
    data = os.path.join(tmp, "train.bin")
    write_text_shard(data, 7)
    t_start = time.time()
    results = {}
    for pp in (2, 4):
        for kind, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb", 1)):
            for m in (4, 8, 16):
                if CELLS and CELLS not in f"{kind}_pp{pp}_m{m}":
                    continue
                stats = os.path.join(tmp, f"{kind}_{pp}_{m}")
                cmd = MPIRUN + ["-n", str(pp), LOOM, "train", "--family", "gpt2", "--vocab-size",
                                VOCAB, "--seq-len", "64", "--n-layer", N_LAYER, "--d-model", str(D_MODEL),
                                "--n-head", "4", "--d-ff", str(4 * D_MODEL), "--micro-batch", "2",
                                "--global-batch", str(2 * m), "--steps", str(STEPS),
                                "--threads", "1", "--log-every", "0", "--data", data,
                                "--pp", str(pp), "--pp-schedule", kind, "--virtual-stages",
                                str(v), "--pp-stats", stats] + FLAGS
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
                # per stage: mean ms of its F, B, W actions and its busy time per step
                entry["stage_ms"] = [
                    {op: round(statistics.mean(d for (a, _, _, _), d in zip(stages[r], durs[r])
                                               if a == op), 3)
                     for op in ("F", "B", "W") if any(a == op for a, _, _, _ in stages[r])}
                    | {"busy": round(busy[r], 2)} for r in range(pp)]
                entry["span_ms"] = round(span, 2)
                # Where the excess over theory comes from: the same replay with each
                # action's time replaced by its stage's mean for that kind (keeps stage
                # imbalance, drops micro-batch-to-micro-batch variation), and by the mean
                # over every stage (uniform stages: what the theory assumes).
                def with_means(per_stage):
                    def mean(r, op):
                        pool = [d for q in (range(pp) if not per_stage else (r,))
                                for (a, _, _, _), d in zip(stages[q], durs[q]) if a == op]
                        return statistics.mean(pool)
                    means = {r: {op: mean(r, op) for op in "FBW"
                                 if any(a == op for a, _, _, _ in stages[r])} for r in range(pp)}
                    d2 = {r: [means[r].get(a, 0.0) for a, _, _, _ in stages[r]] for r in range(pp)}
                    sp, bz = replay(stages, pp, d2)
                    return statistics.mean(1 - b / sp for b in bz)
                entry["bubble_stage_means"] = round(with_means(True), 4)
                entry["bubble_uniform"] = round(with_means(False), 4)
                entry["stage_imbalance"] = round(max(busy) / statistics.mean(busy) - 1, 4)
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
                      + f"  F {tf:.2f} B {tb:.2f} W {tw:.2f} ms; stage means "
                      f"{entry['bubble_stage_means']:.3f}, uniform {entry['bubble_uniform']:.3f},"
                      f" imbalance {entry['stage_imbalance']:.3f}", flush=True)
    within = all(e["ratio"] <= 1.25 for e in results.values())
    zb_below = all(results[f"zb_pp{p}_m{m}"]["cpu_bubble"] < results[f"1f1b_pp{p}_m{m}"]["cpu_bubble"]
                   for p in (2, 4) for m in (4, 8, 16) if f"zb_pp{p}_m{m}" in results
                   and f"1f1b_pp{p}_m{m}" in results)
    # The excess over theory, decomposed: stage-means replay vs measured (what the
    # micro-batch-to-micro-batch variation adds) and uniform replay vs theory (what the
    # schedule itself adds); what is left between the two is the stages' imbalance.
    var_part = max(abs(e["cpu_bubble"] - e["bubble_stage_means"]) for e in results.values())
    sched_part = max(abs(e["bubble_uniform"] - e["theory"]) for e in results.values())
    misses = {k: {"ratio": e["ratio"], "stage_imbalance": e["stage_imbalance"]}
              for k, e in results.items() if e["ratio"] > 1.25}
    residual = {
        "max_abs_measured_minus_stage_means": round(var_part, 4),
        "max_abs_uniform_minus_theory": round(sched_part, 4),
        "cells_over_1.25x": misses,
        "explanation": "the replay with each stage's mean F/B/W reproduces the measured "
                       "bubble and the replay with one mean for all stages the theory, so "
                       "the excess is the stages' imbalance (stage_imbalance: slowest "
                       "stage's busy time over the mean - 1): caches (the stage with more "
                       "micro-batches in flight finds less of them in L2; small at d_model "
                       "256, 3-5% at 128) and the other jobs on the machine (loadavg). "
                       "See docs/parallelism.md, pipeline, and bench/results/pp.md."}
    print(json.dumps({"timing": "thread CPU time replayed through the action lists; wall at pp 2",
                      "model": f"gpt2 L{N_LAYER} C{D_MODEL} V{VOCAB} T64 micro-batch 2, 1 thread/rank",
                      "results": results, "all_within_1.25x_theory": within,
                      "zb_below_1f1b": zb_below, "residual": residual,
                      "loadavg": os.getloadavg(),
                      "wall_s": round(time.time() - t_start, 1)}))


if __name__ == "__main__":
    main()
