#!/usr/bin/python3
"""The printed pipeline schedules (`loom pp-schedule`) obey the dependency order.

For every schedule and a random sample of (pp, micro-batches, virtual stages), parses the
action lists and checks, independently of loom's own simulator: each (chunk, micro-batch)
has its F, B (and W when split) exactly once per stage; no B before its F, no W before
its B; every receive has exactly one matching send on the peer; executing the lists with
blocking receives and non-blocking sends terminates (no deadlock), so every send comes
before its matching receive completes; 1F1B holds at most pp micro-batches on stage 0,
zb (ZB-H1) at most pp on every stage; the bubble (loom's simulation, and a unit-time
replay here) is the theoretical one for gpipe/1f1b, (p-1)/(3m+p-1) for zb (F = B = W),
below 1F1B's; and `loom train` allocates on stage 0 exactly the activation slots the
schedule holds in flight (pp for 1f1b and zb, m for gpipe), as its start-up line says.
Bad input (micro-batches < pp, virtual stages without interleaved) exits 2 naming the flag.
With --vision-encoder R (a vlm's --vision-schedule bubbles plan): every micro-batch is
encoded once, on stage 0 inside its F and embedding backward (F3+E) or on one later stage
(E3 before e3), and the lists with the image rows and their gradients (se/re, sd/rd)
replayed with blocking receives terminate.
Usage: test_pp_schedule.py --loom PATH [--seed S]
"""
import os
import random
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import loomtest  # noqa: E402
from loomtest import MPIRUN, parse_test_args, run_test, write_text_shard  # noqa: E402

TOKEN = re.compile(r"^(F|B|W)(\d+)(?:\.(\d+))?$|^(sa|ra|sg|rg)(\d+)(?:\.(\d+))?([<>])(\d+)$")


def parse(text):
    stages, bubble, flight = {}, None, None
    section = None
    for line in text.splitlines():
        if line.startswith("bubble"):
            bubble = [float(x) for x in line.split(":")[1].split()]
        elif line.startswith("max micro-batches in flight"):
            flight = [int(x) for x in line.split(":")[1].split()]
        elif line.startswith("actions:"):
            section = "actions"
        elif section == "actions" and line.startswith("stage"):
            head, rest = line.split(":", 1)
            acts = []
            for tok in rest.split():
                m = TOKEN.match(tok)
                if not m:
                    raise ValueError(f"unparsable action {tok!r}")
                if m.group(1):
                    acts.append((m.group(1), int(m.group(2)), int(m.group(3) or 0), None))
                else:
                    acts.append((m.group(4), int(m.group(5)), int(m.group(6) or 0), int(m.group(8))))
            stages[int(head.split()[1])] = acts
    return stages, bubble, flight


def check(stages, pp, m, v, split):
    errs = []
    S = pp * v
    for r, acts in stages.items():
        seen = {}
        for i, (op, mb, ch, _) in enumerate(acts):
            if op in "FBW":
                key = (op, ch, mb)
                if key in seen:
                    errs.append(f"stage {r}: {op}{mb}.{ch} twice")
                seen[key] = i
        for ch in range(v):
            for mb in range(m):
                f, b, w = seen.get(("F", ch, mb)), seen.get(("B", ch, mb)), seen.get(("W", ch, mb))
                if f is None or b is None or (split and w is None) or (not split and w is not None):
                    errs.append(f"stage {r}: chunk {ch} micro-batch {mb}: missing or extra F/B/W")
                    continue
                if b < f:
                    errs.append(f"stage {r}: B{mb}.{ch} before its F")
                if split and w < b:
                    errs.append(f"stage {r}: W{mb}.{ch} before its B")
    # message matching: (kind, sender, receiver, receiving virtual stage, mb)
    sends, recvs = {}, {}
    for r, acts in stages.items():
        for op, mb, ch, peer in acts:
            vs = ch * pp + r
            if op in ("sa", "sg"):
                to_vs = vs + 1 if op == "sa" else vs - 1
                if not 0 <= to_vs < S or to_vs % pp != peer:
                    errs.append(f"stage {r}: {op}{mb}.{ch} to the wrong rank {peer}")
                key = (op[1], r, peer, to_vs, mb)
                sends[key] = sends.get(key, 0) + 1
            elif op in ("ra", "rg"):
                key = (op[1], peer, r, vs, mb)
                recvs[key] = recvs.get(key, 0) + 1
    if sends != recvs or any(c != 1 for c in sends.values()):
        errs.append("sends and receives do not match one to one")
    # run: a receive blocks until its send was executed; sends never block
    ptr = {r: 0 for r in stages}
    posted = set()
    progress = True
    while progress:
        progress = False
        for r, acts in stages.items():
            while ptr[r] < len(acts):
                op, mb, ch, peer = acts[ptr[r]]
                if op in ("ra", "rg"):
                    key = (op[1], peer, r, ch * pp + r, mb)
                    if key not in posted:
                        break
                elif op in ("sa", "sg"):
                    to_vs = ch * pp + r + (1 if op == "sa" else -1)
                    posted.add((op[1], r, peer, to_vs, mb))
                ptr[r] += 1
                progress = True
    if any(ptr[r] < len(a) for r, a in stages.items()):
        errs.append("deadlock: " + ", ".join(f"stage {r} stuck at {stages[r][ptr[r]]}"
                                              for r in stages if ptr[r] < len(stages[r])))
    return errs


def unit_bubble(stages, pp, split):
    """Stage 0's idle fraction replaying the lists with F = B = W = 1 (B = 2 when W is
    inside it), moves free: computed here, independently of loom's simulator."""
    clock = {r: 0.0 for r in stages}
    busy = {r: 0.0 for r in stages}
    ptr = {r: 0 for r in stages}
    sent = {}
    progress = True
    while progress:
        progress = False
        for r, acts in stages.items():
            while ptr[r] < len(acts):
                op, mb, ch, peer = acts[ptr[r]]
                vs = ch * pp + r
                if op in ("ra", "rg"):
                    if (op[1], vs, mb) not in sent:
                        break
                    clock[r] = max(clock[r], sent[(op[1], vs, mb)])
                elif op in ("sa", "sg"):
                    sent[(op[1], vs + (1 if op == "sa" else -1), mb)] = clock[r]
                else:
                    d = 2.0 if op == "B" and not split else 1.0
                    clock[r] += d
                    busy[r] += d
                ptr[r] += 1
                progress = True
    span = max(clock.values())
    return 1 - busy[0] / span


FLIGHT_LINE = re.compile(r"stage 0: layers.*?, (\d+) micro-batch\(es\) in flight \(activations "
                         r"(\d+) x ([\d.]+) MiB = ([\d.]+) MiB")


def check_trainer_slots(loom, seed):
    """The trainer's stage 0 holds the schedule's in-flight count of activation slots."""
    errs = []
    with tempfile.TemporaryDirectory(prefix="loom_pp_slots_") as tmp:
        data = os.path.join(tmp, "train.bin")
        write_text_shard(data, seed)
        pp, m = 4, 8
        for kind, v, want in (("gpipe", 1, m), ("1f1b", 1, pp), ("zb", 1, pp),
                              ("interleaved", 2, None)):
            sched = subprocess.run([loom, "pp-schedule", "--pp", str(pp), "--micro-batches", str(m),
                                    "--schedule", kind, "--virtual-stages", str(v)],
                                   capture_output=True, text=True, check=True).stdout
            flight = parse(sched)[2][0]
            cmd = MPIRUN + ["-n", str(pp), loom, "train", "--family", "gpt2", "--vocab-size", "128",
                            "--seq-len", "16", "--n-layer", "8", "--d-model", "32", "--n-head", "2",
                            "--micro-batch", "1", "--global-batch", str(m), "--steps", "1",
                            "--threads", "1", "--data", data, "--pp", str(pp), "--pp-schedule", kind,
                            "--virtual-stages", str(v), "--seed", str(seed)]
            p = subprocess.run(cmd, capture_output=True, text=True)
            found = FLIGHT_LINE.search(p.stdout + p.stderr)
            if p.returncode != 0 or not found:
                errs.append(f"{kind}: exit {p.returncode}, no in-flight line: {p.stderr[-500:]}")
                continue
            slots, times, one, total = (int(found[1]), int(found[2]), float(found[3]),
                                        float(found[4]))
            if slots != flight or (want is not None and slots != want) or times != slots:
                errs.append(f"{kind} pp {pp} m {m}: stage 0 allocates {slots} slots, the schedule "
                            f"holds {flight} in flight (expected {want})")
            if abs(slots * one - total) > 2e-3:
                errs.append(f"{kind}: activations {slots} x {one} MiB != {total} MiB")
    return errs


VTOKEN = re.compile(r"^(F|B|W)(\d+)(\+E)?$|^(E|e)(\d+)$|^(sa|ra|sg|rg|se|re|sd|rd)(\d+)([<>])(\d+)$")


def check_vision(loom, rng):
    """--vision-encoder R on gpipe/1f1b/zb, pp 2-3: each micro-batch encoded once, EF before
    EB, and the lists with the encoder's messages replay without deadlock."""
    errs = []
    for _ in range(6):
        kind, pp = rng.choice(["gpipe", "1f1b", "zb"]), rng.randint(2, 3)
        m, r = rng.randint(pp, 8), round(rng.uniform(0.3, 3.0), 2)
        cmd = [loom, "pp-schedule", "--pp", str(pp), "--micro-batches", str(m), "--schedule",
               kind, "--vision-encoder", str(r)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        text = p.stdout.split("vision encoder pieces", 1)
        if p.returncode != 0 or len(text) != 2:
            errs.append(f"{' '.join(cmd)}: exit {p.returncode}, no pieces section")
            continue
        lists = {}
        for line in text[1].splitlines():
            if line.startswith("stage"):
                head, rest = line.split(":", 1)
                lists[int(head.split()[1])] = [VTOKEN.match(t) for t in rest.split()]
        if len(lists) != pp or any(x is None for acts in lists.values() for x in acts):
            errs.append(f"{' '.join(cmd)}: unparsable lists")
            continue
        where = {i: [] for i in range(m)}
        for st, acts in lists.items():
            for x in acts:
                if x.group(1) == "F" and x.group(3):
                    where[int(x.group(2))].append((st, "F+E"))
                if x.group(4):
                    where[int(x.group(5))].append((st, x.group(4)))
        for i, w in where.items():
            later = len(w) == 2 and w[0][0] > 0 and w == [(w[0][0], "E"), (w[0][0], "e")]
            if w != [(0, "F+E")] and not later:
                errs.append(f"{' '.join(cmd)}: micro-batch {i} encoded as {w}")
        # replay: sends post at once, receives block until posted
        posted, ptr, progress = set(), {st: 0 for st in lists}, True
        while progress:
            progress = False
            for st, acts in lists.items():
                while ptr[st] < len(acts):
                    x = acts[ptr[st]]
                    if x.group(6):
                        op, mb, peer = x.group(6), int(x.group(7)), int(x.group(9))
                        key = (op[1], mb, st if op[0] == "s" else peer, peer if op[0] == "s" else st)
                        if op[0] == "r" and key not in posted:
                            break
                        posted.add(key)
                    ptr[st] += 1
                    progress = True
        if any(ptr[st] < len(acts) for st, acts in lists.items()):
            errs.append(f"{' '.join(cmd)}: the lists deadlock at {ptr}")
    return errs


def main():
    args = parse_test_args()
    seed = args.seed
    rng = random.Random(seed)
    cases = [(k, p, m, 1) for k in ("gpipe", "1f1b", "zb") for p in (2, 4) for m in (4, 8, 16)]
    cases += [("interleaved", p, m, v) for p in (2, 4) for m in (4, 8, 16) for v in (2, 3)
              if m % p == 0]
    for _ in range(12):  # random shapes too
        k = rng.choice(["gpipe", "1f1b", "zb", "interleaved"])
        p = rng.randint(2, 8)
        v = rng.randint(2, 4) if k == "interleaved" else 1
        m = p * rng.randint(1, 4) if k == "interleaved" else rng.randint(p if k != "gpipe" else 1, 20)
        cases.append((k, p, m, v))
    bubbles = {}
    for kind, pp, m, v in cases:
        cmd = [args.loom, "pp-schedule", "--pp", str(pp), "--micro-batches", str(m), "--schedule",
               kind, "--virtual-stages", str(v)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if not loomtest.check(p.returncode == 0):
            print(f"FAIL: {' '.join(cmd)}: exit {p.returncode}: {p.stderr}")
            continue
        stages, bubble, flight = parse(p.stdout)
        errs = check(stages, pp, m, v, kind == "zb") if len(stages) == pp else ["stages missing"]
        theory = (pp - 1) / (v * m + pp - 1)
        if kind in ("gpipe", "1f1b") and abs(bubble[0] - theory) > 1e-3:
            errs.append(f"bubble {bubble[0]:.3f} != theory {theory:.3f}")
        if kind == "interleaved" and bubble[0] > theory + 1e-3:
            errs.append(f"bubble {bubble[0]:.3f} above theory {theory:.3f}")
        if kind == "1f1b" and flight[0] > pp:
            errs.append(f"stage 0 holds {flight[0]} micro-batches (> pp {pp})")
        if kind == "zb" and max(flight) > pp:  # ZB-H1: 1F1B's bound, on every stage
            errs.append(f"zb holds {flight} micro-batches per stage (> pp {pp})")
        if kind == "zb" and not errs:  # ZB-H1 at F = B = W: (p-1)/(3m+p-1), a third of 1F1B's
            zb_theory = (pp - 1) / (3 * m + pp - 1)
            mine = unit_bubble(stages, pp, True)
            if abs(mine - zb_theory) > 1e-9 or abs(bubble[0] - zb_theory) > 1e-3:
                errs.append(f"zb bubble {mine:.4f} (loom: {bubble[0]:.3f}) != ZB-H1's "
                            f"{zb_theory:.4f}")
        if kind in ("gpipe", "1f1b") and not errs and abs(unit_bubble(stages, pp, False) - theory) > 1e-9:
            errs.append(f"replayed bubble != theory {theory:.4f}")
        bubbles[(kind, pp, m, v)] = bubble[0]
        loomtest.check(not errs)
        for e in errs:
            print(f"FAIL {kind} pp {pp} m {m} v {v}: {e}")
    for (kind, pp, m, v), b in bubbles.items():
        if kind == "zb" and ("1f1b", pp, m, 1) in bubbles and \
                not loomtest.check(b < bubbles[("1f1b", pp, m, 1)]):
            print(f"FAIL zb pp {pp} m {m}: bubble {b:.3f} not below 1f1b's")
    for bad, flag in ((["--pp", "4", "--micro-batches", "2", "--schedule", "1f1b"], "--pp"),
                      (["--pp", "2", "--micro-batches", "4", "--schedule", "1f1b",
                        "--virtual-stages", "2"], "--virtual-stages"),
                      (["--pp", "2", "--micro-batches", "3", "--schedule", "interleaved",
                        "--virtual-stages", "2"], "--pp"),
                      (["--pp", "2", "--micro-batches", "4", "--schedule", "zbx"], "--pp-schedule")):
        p = subprocess.run([args.loom, "pp-schedule"] + bad, capture_output=True, text=True)
        lines = p.stderr.strip().splitlines()
        if not loomtest.check(p.returncode == 2 and len(lines) == 1 and flag in lines[0]):
            print(f"FAIL bad input {bad}: exit {p.returncode}, {p.stderr!r}")
    errs = check_vision(args.loom, rng)
    loomtest.check(not errs)
    for e in errs:
        print(f"FAIL vision pieces: {e}")
    errs = check_trainer_slots(args.loom, seed)
    loomtest.check(not errs)
    for e in errs:
        print(f"FAIL trainer slots: {e}")
    print(f"{len(cases)} schedules checked")


if __name__ == "__main__":
    run_test(main)
