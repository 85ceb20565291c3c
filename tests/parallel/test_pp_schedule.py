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
With --vision-encoder R (a vlm's --vision-schedule bubbles plan), on every schedule and
interleaved with 2-3 virtual stages: the output before the pieces is the plain listing's
byte for byte, and the lists with the pieces hold the plain decoder actions in the same
order; every micro-batch is encoded once forward and once backward, where the run does
it: on stage 0 inside the first virtual stage's F and embedding backward (F3+E, F3.0+E
with chunks; B or W when split) or on one later stage (E3 se3>0 ... rd3<0 e3, with re3<o
right before stage 0's F3.0 and sd3>o right after its embedding backward); the lists
replay without deadlock and their step, replayed here with the encoder's durations, is
the printed one. --virtual-stages > 1 with a schedule other than interleaved keeps its
error with --vision-encoder too.
Usage: test_pp_schedule.py --loom PATH [--seed S]
"""
import math
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


VTOKEN = re.compile(r"^(F|B|W)(\d+)(?:\.(\d+))?(\+E)?$|^(E|e)(\d+)$"
                    r"|^(sa|ra|sg|rg|se|re|sd|rd)(\d+)(?:\.(\d+))?([<>])(\d+)$")
PIECE_MOVES = ("se", "re", "sd", "rd")


def vision_tokens(rest):
    """A stage's list with the encoder's pieces: (op, mb, chunk, peer, +E) per token, None
    for one that does not parse."""
    out = []
    for t in rest.split():
        x = VTOKEN.match(t)
        if x is None:
            out.append(None)
        elif x.group(1):
            out.append((x.group(1), int(x.group(2)), int(x.group(3) or 0), None, bool(x.group(4))))
        elif x.group(5):
            out.append((x.group(5), int(x.group(6)), 0, None, False))
        else:
            out.append((x.group(7), int(x.group(8)), int(x.group(9) or 0), int(x.group(11)),
                        False))
    return out


def vision_placement(lists, m, v, eb_op):
    """Where the run encodes each micro-batch (pipeline/executor.c, vision_exec.c): on stage
    0 inside the first virtual stage's F (F3+E, F3.0+E with chunks) and its embedding
    backward (B, W when split), or on one later stage o: E3 se3>0 before e3 (after rd3<0),
    with re3<o right before stage 0's F of chunk 0 and sd3>o right after its embedding
    backward. Returns the errors and each micro-batch's owner."""
    errs, owner = [], {}
    enc_f, enc_b = {i: [] for i in range(m)}, {i: [] for i in range(m)}
    for st, acts in lists.items():
        for k, (op, mb, ch, peer, plus) in enumerate(acts):
            if plus:
                if st != 0 or ch != 0 or op not in ("F", eb_op):
                    errs.append(f"encoder inside {op}{mb}.{ch} on stage {st} (expected chunk 0 of "
                                f"stage 0, F or {eb_op})")
                (enc_f if op == "F" else enc_b)[mb].append((st, k))
            elif op in ("E", "e"):
                if st == 0:
                    errs.append(f"piece {op}{mb} on stage 0 (expected inline, +E)")
                (enc_f if op == "E" else enc_b)[mb].append((st, k))
    for i in range(m):
        # count: the run encodes each micro-batch once forward and once backward
        if len(enc_f[i]) != 1 or len(enc_b[i]) != 1:
            errs.append(f"micro-batch {i}: encoder forward at {enc_f[i]}, backward at {enc_b[i]}")
            continue
        (sf, kf), (sb, kb) = enc_f[i][0], enc_b[i][0]
        owner[i] = sf
        if sf != sb:
            errs.append(f"micro-batch {i}: forward on stage {sf}, backward on {sb}")
            continue
        if sf == 0:
            continue
        acts, first = lists[sf], lists[0]
        if kb < kf or acts[kf + 1][:2] != ("se", i) or acts[kf + 1][3] != 0 or \
                acts[kb - 1][:2] != ("rd", i) or acts[kb - 1][3] != 0:
            errs.append(f"micro-batch {i} on stage {sf}: not E{i} se{i}>0 ... rd{i}<0 e{i}")
        f0 = [k for k, a in enumerate(first) if a[:3] == ("F", i, 0)]
        b0 = [k for k, a in enumerate(first) if a[:3] == (eb_op, i, 0)]
        if len(f0) != 1 or len(b0) != 1 or first[f0[0] - 1][:2] != ("re", i) or \
                first[f0[0] - 1][3] != sf or first[b0[0] + 1][:2] != ("sd", i) or \
                first[b0[0] + 1][3] != sf:
            errs.append(f"micro-batch {i} on stage {sf}: stage 0 lacks re{i}<{sf} before "
                        f"F{i}.0 or sd{i}>{sf} after {eb_op}{i}.0")
    return errs, owner


def vision_span(lists, pp, r, split):
    """The step of the lists with the pieces, replayed here: a chunk's F = 1, B = 2 (B = W =
    1 when split), the encoder's forward r and backward 2r (inside +E actions too), moves
    free, receives wait for their send; stage 0 ends after the owners' last e (it adds
    their encoder gradients). Returns the step and per stage the (name, start, duration)
    of each compute; (None, None) on deadlock."""
    clock = {st: 0.0 for st in lists}
    ptr = {st: 0 for st in lists}
    runs = {st: [] for st in lists}
    sent, last_e, progress = {}, {}, True
    while progress:
        progress = False
        for st, acts in lists.items():
            while ptr[st] < len(acts):
                op, mb, ch, peer, plus = acts[ptr[st]]
                if op[0] in "sr" and len(op) == 2:
                    src, dst = (st, peer) if op[0] == "s" else (peer, st)
                    vs = ch * pp + st
                    if op in ("sa", "ra"):
                        vs = vs + 1 if op == "sa" else vs
                    elif op in ("sg", "rg"):
                        vs = vs - 1 if op == "sg" else vs
                    key = (op[1], mb, src, dst, vs if op in ("sa", "ra", "sg", "rg") else 0)
                    if op[0] == "r":
                        if key not in sent:
                            break
                        clock[st] = max(clock[st], sent[key])
                    else:
                        sent[key] = clock[st]
                else:
                    d = {"F": 1.0, "B": 1.0 if split else 2.0, "W": 1.0, "E": r, "e": 2 * r}[op]
                    if plus:
                        d += r if op == "F" else 2 * r
                    runs[st].append((op, mb, ch, plus, clock[st], d))
                    clock[st] += d
                    if op == "e":
                        last_e[st] = clock[st]
                ptr[st] += 1
                progress = True
    if any(ptr[st] < len(acts) for st, acts in lists.items()):
        return None, None
    clock[0] = max([clock[0]] + list(last_e.values()))
    return max(clock.values()), runs


def cell_of(t, q):
    """The timeline's cell of time t (C's lround), allowing for the last bit of rounding."""
    return {math.floor(t * q + 0.5 - 1e-9), math.floor(t * q + 0.5 + 1e-9)}


def check_vision_timeline(text, runs, span, v):
    """The timeline with the pieces: each stage's row names its computes in list order
    (F3.1, F3.0+E, E3, e3), each from the cell of its replayed start to that of its end."""
    errs = []
    head = re.search(r"timeline with the pieces \((\d+) cell\(s\) per", text)
    rows = {int(x[1]): x[2].split() for x in re.finditer(r"^stage +(\d+) \|(.*)$", text, re.M)}
    if not head or sorted(rows) != sorted(runs):
        return ["no timeline with the pieces"]
    q = int(head[1])
    for st, cells in rows.items():
        if len(cells) not in cell_of(span, q):
            errs.append(f"stage {st}: {len(cells)} cells for a step of {span} x {q}")
        for op, mb, ch, plus, t0, d in runs[st]:
            name = f"{op}{mb}" + (f".{ch}" if v > 1 and op in "FBW" else "") + ("+E" if plus else "")
            at = [c for c, x in enumerate(cells) if x == name]
            if not at or at[0] not in cell_of(t0, q) or at[-1] + 1 not in cell_of(t0 + d, q) or \
                    len(at) != at[-1] - at[0] + 1:
                errs.append(f"stage {st}: {name} at cells {at}, replayed {t0} to {t0 + d} (x {q})")
        names = [x for k, x in enumerate(cells) if x != "." and (k == 0 or cells[k - 1] != x)]
        if len(names) != len(runs[st]):
            errs.append(f"stage {st}: the timeline names {len(names)} computes, the list "
                        f"{len(runs[st])}")
    return errs


def check_vision(loom, rng):
    """--vision-encoder R on every schedule (interleaved with 2-3 virtual stages), pp 2-3:
    the placement the run makes (vision_placement), the decoder's lists and everything
    before the pieces exactly the plain listing's, the lists with the encoder's messages
    replay without deadlock, and their step replayed here is the printed one."""
    errs = []
    for _ in range(8):
        kind, pp = rng.choice(["gpipe", "1f1b", "zb", "interleaved", "interleaved"]), rng.randint(2, 3)
        v = rng.randint(2, 3) if kind == "interleaved" else 1
        m = pp * rng.randint(1, 8 // pp) if kind == "interleaved" else rng.randint(pp, 8)
        r = round(rng.uniform(0.3, 3.0), 2)
        base = [loom, "pp-schedule", "--pp", str(pp), "--micro-batches", str(m), "--schedule",
                kind, "--virtual-stages", str(v)]
        cmd = base + ["--vision-encoder", str(r)]
        name = " ".join(cmd[1:])
        p = subprocess.run(cmd, capture_output=True, text=True)
        plain = subprocess.run(base, capture_output=True, text=True)
        text = p.stdout.split("vision encoder pieces", 1)
        if p.returncode != 0 or len(text) != 2 or plain.returncode != 0:
            errs.append(f"{name}: exit {p.returncode}, no pieces section: {p.stderr}")
            continue
        if text[0] != plain.stdout:  # the plain listing (and timeline) unchanged
            errs.append(f"{name}: the listing before the pieces differs from the plain one")
        lists = {}
        for x in re.finditer(r"^stage (\d+):(.*)$", text[1], re.M):
            lists[int(x[1])] = vision_tokens(x[2])
        if len(lists) != pp or any(x is None for acts in lists.values() for x in acts):
            errs.append(f"{name}: unparsable lists")
            continue
        # the decoder's actions are the plain list's, in its order, with the same names
        stages = parse(plain.stdout)[0]
        for st, acts in lists.items():
            mine = [(op, mb, ch, peer) for op, mb, ch, peer, _ in acts
                    if op not in ("E", "e") + PIECE_MOVES]
            if mine != stages.get(st):
                errs.append(f"{name}: stage {st}'s decoder actions differ from the plain list")
        eb_op = "W" if kind == "zb" else "B"
        e, _ = vision_placement(lists, m, v, eb_op)
        errs += [f"{name}: {x}" for x in e]
        span, runs = vision_span(lists, pp, r, kind == "zb")
        printed = re.search(r"with the encoder on stage 0, ([\d.]+) with the pieces", text[1])
        if span is None:
            errs.append(f"{name}: the lists deadlock")
            continue
        if not printed or abs(float(printed[1]) - span) > 6e-4 + 1e-9 * span:
            errs.append(f"{name}: step replayed {span}, printed "
                        f"{printed[1] if printed else None}")
        timeline = text[1].split("timeline with the pieces", 1)[-1].split("\nstage 0:", 1)[0]
        errs += [f"{name}: {x}" for x in check_vision_timeline("timeline with the pieces" +
                                                               timeline, runs, span, v)]
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
                      (["--pp", "2", "--micro-batches", "4", "--schedule", "zbx"], "--pp-schedule"),
                      # virtual stages without interleaved: the same error with the encoder
                      (["--pp", "2", "--micro-batches", "4", "--schedule", "1f1b",
                        "--virtual-stages", "2", "--vision-encoder", "1.5"],
                       "--virtual-stages 2: only with --pp-schedule interleaved"),
                      (["--pp", "2", "--micro-batches", "4", "--schedule", "zb",
                        "--virtual-stages", "3", "--vision-encoder", "1"],
                       "--virtual-stages 3: only with --pp-schedule interleaved"),
                      (["--pp", "2", "--micro-batches", "4", "--schedule", "interleaved",
                        "--virtual-stages", "2", "--vision-encoder", "0"], "--vision-encoder"),
                      (["--pp", "2", "--micro-batches", "4", "--schedule", "1f1b",
                        "--vision-encoder", "x"], "--vision-encoder"),
                      (["--pp", "2", "--micro-batches", "4", "--schedule", "interleaved",
                        "--virtual-stages", "2", "--vision-encoder", "-1"], "--vision-encoder"),
                      (["--pp", "2", "--micro-batches", "4", "--schedule", "zb",
                        "--vision-encoder", "2x"], "--vision-encoder")):
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
