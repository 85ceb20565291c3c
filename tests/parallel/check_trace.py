#!/usr/bin/python3
"""Checks a trace file written by `loom train --trace FILE` (src/core/trace.c).

Properties, each violation printed, exit status 1 if any:
  - the file is valid JSON: {"traceEvents": [...], "displayTimeUnit": "ms", ...};
  - every event is well-formed: complete events ("ph": "X") have a string name and cat,
    numeric ts, numeric dur >= 0 and integer pid and tid; metadata events ("ph": "M")
    have a string name, integer pid and an args object; no other phases;
  - within each (pid, tid), spans nest properly (never partially overlap), and on the
    communication lanes ("comm k") spans do not overlap at all;
  - every track with spans is named (thread_name), every process is named "rank <pid>";
  - with --ranks N: the processes are exactly pids 0..N-1, each with at least one span;
  - with --expect-names a,b,...: each name occurs as a span name (exactly, or as the first
    word of it: "allreduce" matches "allreduce #12 dp"); with --every-rank, on each rank;
  - with --max-dropped K: no rank dropped more than K events (default: drops are only
    reported).
Times are compared in integer nanoseconds (the writer prints microseconds with three
decimals), so there is no float tolerance.

Usage: check_trace.py FILE [--ranks N] [--expect-names forward,backward,...]
                           [--every-rank] [--max-dropped K]
"""
import argparse
import collections
import json
import sys


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def name_matches(want, name):
    return name == want or name.startswith(want + " ")


class Checker:
    def __init__(self):
        self.violations = []

    def bad(self, msg):
        self.violations.append(msg)
        if len(self.violations) <= 50:
            print("VIOLATION: " + msg)


def check_events(chk, events):
    """Well-formedness; returns (spans by (pid, tid), process args, thread names)."""
    spans = collections.defaultdict(list)  # (pid, tid) -> [(start_ns, end_ns, name, i)]
    procs = {}  # pid -> process_name args
    threads = {}  # (pid, tid) -> name
    for i, e in enumerate(events):
        where = "event %d" % i
        if not isinstance(e, dict):
            chk.bad("%s: expected an object, got %r" % (where, e))
            continue
        ph = e.get("ph")
        if ph not in ("X", "M"):
            chk.bad("%s: phase %r, expected \"X\" or \"M\"" % (where, ph))
            continue
        name, pid, tid = e.get("name"), e.get("pid"), e.get("tid")
        if not isinstance(name, str):
            chk.bad("%s: name %r, expected a string" % (where, name))
            continue
        if not is_int(pid) or not is_int(tid):
            chk.bad("%s (%s): pid %r tid %r, expected integers" % (where, name, pid, tid))
            continue
        if ph == "M":
            args = e.get("args")
            if not isinstance(args, dict):
                chk.bad("%s (%s): args %r, expected an object" % (where, name, args))
            elif name == "process_name":
                if pid in procs:
                    chk.bad("%s: pid %d named twice" % (where, pid))
                procs[pid] = args
                if args.get("name") != "rank %d" % pid:
                    chk.bad("%s: pid %d is named %r, expected \"rank %d\""
                            % (where, pid, args.get("name"), pid))
            elif name == "thread_name":
                threads[(pid, tid)] = args.get("name")
            continue
        cat, ts, dur = e.get("cat"), e.get("ts"), e.get("dur")
        if not isinstance(cat, str):
            chk.bad("%s (%s): cat %r, expected a string" % (where, name, cat))
        if not is_num(ts) or not is_num(dur) or dur < 0:
            chk.bad("%s (%s): ts %r dur %r, expected numbers with dur >= 0"
                    % (where, name, ts, dur))
            continue
        start = round(ts * 1000)
        spans[(pid, tid)].append((start, start + round(dur * 1000), name, i))
    return spans, procs, threads


def check_nesting(chk, spans, threads):
    for (pid, tid), lst in sorted(spans.items()):
        track = threads.get((pid, tid))
        if not isinstance(track, str):
            chk.bad("pid %d tid %d: %d spans on a track without a thread_name"
                    % (pid, tid, len(lst)))
            track = "?"
        comm = track.startswith("comm")
        lst.sort(key=lambda s: (s[0], -s[1]))  # enclosing span first on equal starts
        stack = []
        for s in lst:
            while stack and stack[-1][1] <= s[0]:
                stack.pop()
            if stack and s[1] > stack[-1][1]:
                p = stack[-1]
                chk.bad("rank %d %s: %r [%d, %d] ns partially overlaps %r [%d, %d] ns"
                        % (pid, track, s[2], s[0], s[1], p[2], p[0], p[1]))
            elif stack and comm:
                p = stack[-1]
                chk.bad("rank %d %s: %r [%d, %d] ns overlaps %r [%d, %d] ns on a comm lane"
                        % (pid, track, s[2], s[0], s[1], p[2], p[0], p[1]))
            stack.append(s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--ranks", type=int, help="expected number of ranks (pids 0..N-1)")
    ap.add_argument("--expect-names", default="", help="comma-separated span names")
    ap.add_argument("--every-rank", action="store_true",
                    help="each expected name must occur on every rank")
    ap.add_argument("--max-dropped", type=int, help="most dropped events allowed per rank")
    a = ap.parse_args()
    chk = Checker()
    try:
        with open(a.file, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        print("VIOLATION: %s: not a readable JSON file: %s" % (a.file, exc))
        return 1
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        print("VIOLATION: %s: expected an object with a \"traceEvents\" list" % a.file)
        return 1
    if doc.get("displayTimeUnit") != "ms":
        chk.bad("displayTimeUnit %r, expected \"ms\"" % doc.get("displayTimeUnit"))
    spans, procs, threads = check_events(chk, doc["traceEvents"])
    check_nesting(chk, spans, threads)

    pids = set(procs) | {pid for pid, _ in spans} | {pid for pid, _ in threads}
    for pid in sorted(pids - set(procs)):
        chk.bad("pid %d has events but no process_name" % pid)
    per_rank = collections.Counter()
    for (pid, _), lst in spans.items():
        per_rank[pid] += len(lst)
    if a.ranks is not None:
        want = set(range(a.ranks))
        if pids != want:
            chk.bad("pids %s, expected one per rank: 0..%d"
                    % (sorted(pids), a.ranks - 1))
        for r in sorted(want - {p for p in per_rank if per_rank[p] > 0}):
            chk.bad("rank %d has no spans" % r)

    names = collections.Counter()
    names_by_rank = collections.defaultdict(set)
    for (pid, _), lst in spans.items():
        for s in lst:
            names[s[2]] += 1
            names_by_rank[pid].add(s[2])
    ranks = sorted(range(a.ranks) if a.ranks is not None else pids)
    for want in [n for n in a.expect_names.split(",") if n]:
        have = [r for r in ranks if any(name_matches(want, n) for n in names_by_rank[r])]
        if not have:
            chk.bad("no span named %r (or %r followed by a space)" % (want, want))
        elif a.every_rank and len(have) < len(ranks):
            chk.bad("span %r missing on ranks %s" % (want, sorted(set(ranks) - set(have))))

    print("%s: %d events, %d spans on %d ranks, %d tracks"
          % (a.file, len(doc["traceEvents"]), sum(per_rank.values()), len(pids), len(spans)))
    for pid in sorted(pids):
        args = procs.get(pid, {})
        dropped = args.get("dropped_events", 0)
        lanes = sum(1 for (p, t), n in threads.items()
                    if p == pid and isinstance(n, str) and n.startswith("comm"))
        print("  rank %d: %d spans, %d comm lanes, dropped %s, unfinished %s, unmatched ends %s"
              % (pid, per_rank[pid], lanes, dropped, args.get("unfinished_spans", "?"),
                 args.get("unmatched_ends", "?")))
        if a.max_dropped is not None and is_int(dropped) and dropped > a.max_dropped:
            chk.bad("rank %d dropped %d events, at most %d allowed"
                    % (pid, dropped, a.max_dropped))
    top = ", ".join("%s x%d" % kv for kv in names.most_common(12))
    print("  most common spans: " + (top or "(none)"))
    if chk.violations:
        print("FAILED: %d violations" % len(chk.violations))
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
