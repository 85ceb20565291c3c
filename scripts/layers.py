#!/usr/bin/env python3
"""Include graph of a C tree: cycles between units and includes that run up the layers.

A unit is a source and its header (x.c + x.h); a header-only x_impl.h is the private
part of the unit that includes it, so it closes no cycle. An include of "dir/name.h" is resolved
against the tree's root (default: src/). The layer order, lowest first, comes from
--order or from the file LAYERS at the root (one layer a line; a line may name several
folders that sit side by side, e.g. "kernels comm data"). Folders on one line may not
include each other either.

    python3 scripts/layers.py            # from anywhere: the tree is this checkout's src/
    python3 scripts/layers.py --root src --order "core" "kernels comm data" "model"

Prints each cycle and each upward include with file:line, then one summary line;
exits 1 where it found either, 0 where the tree is clean."""
import argparse, os, re, sys
from collections import defaultdict

INC = re.compile(r'^\s*#\s*include\s+"([^"]+)"')

def units(root):
    found = {}
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith((".c", ".h", ".cu", ".cuh")):
                p = os.path.relpath(os.path.join(d, f), root)
                found.setdefault(os.path.splitext(p)[0], []).append(p)
    return found

def edges(root, found):
    out = defaultdict(dict)  # unit -> {unit: "file:line"}
    for u, files in found.items():
        for p in files:
            for n, line in enumerate(open(os.path.join(root, p), errors="replace"), 1):
                m = INC.match(line)
                if not m:
                    continue
                target = os.path.normpath(os.path.join(os.path.dirname(p), m.group(1)))
                for cand in (m.group(1), target):
                    v = os.path.splitext(os.path.normpath(cand))[0]
                    if v in found and v != u:
                        out[u].setdefault(v, f"{p}:{n}")
                        break
    return out

def cycles(graph, nodes):
    """Tarjan's strongly connected components of size > 1."""
    index, low, stack, on, res, i = {}, {}, [], set(), [], [0]
    def visit(v):
        index[v] = low[v] = i[0]; i[0] += 1; stack.append(v); on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: res.append(sorted(comp))
    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index: visit(v)
    return res

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.normpath(
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")))
    ap.add_argument("--order", nargs="*", help="layers, lowest first; each one string of folders")
    a = ap.parse_args()
    found = units(a.root)
    graph = edges(a.root, found)
    order = a.order
    lf = os.path.join(a.root, "LAYERS")
    if order is None and os.path.exists(lf):
        order = [l.split("#")[0].strip() for l in open(lf)]
        order = [l for l in order if l]
    level = {}
    for k, line in enumerate(order or []):
        for folder in line.split():
            level[folder] = (k, line)
    bad = 0
    private = {u for u, files in found.items()  # a header with no source of its own,
               if all(f.endswith((".h", ".cuh")) for f in files) and u.endswith("_impl")}
    for comp in cycles({u: {v: w for v, w in g.items() if v not in private}
                        for u, g in graph.items()}, found):
        bad += 1
        print("cycle: " + " -> ".join(comp))
        for u in comp:
            for v, where in graph[u].items():
                if v in comp: print(f"    {where}: {u} includes {v}")
    ups = 0
    for u in sorted(graph):
        fu = u.split(os.sep)[0]
        for v, where in sorted(graph[u].items()):
            fv = v.split(os.sep)[0]
            if fu == fv or fu not in level or fv not in level: continue
            if level[fv][0] > level[fu][0] or (level[fv][0] == level[fu][0]):
                ups += 1
                print(f"up: {where}: {fu}/ includes {v} ({fv}/ is "
                      f"{'above' if level[fv][0] > level[fu][0] else 'beside'} it)")
    unplaced = sorted({u.split(os.sep)[0] for u in found} - set(level)) if level else []
    print(f"layers: {len(found)} units, {sum(len(g) for g in graph.values())} includes, "
          f"{bad} cycle(s), {ups} upward include(s)"
          + (f"; no layer order (give --order or {lf})" if not level else "")
          + (f"; folders in no layer: {' '.join(unplaced)}" if unplaced else ""))
    return 1 if bad or ups else 0

if __name__ == "__main__":
    sys.exit(main())
