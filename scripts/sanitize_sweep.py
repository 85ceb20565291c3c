#!/usr/bin/python3
"""The suite's tests that CI runs only on the release build (layouts, DiLoCo, checkpoints,
faults, RL: labels parallel, ckpt, ft by default), run against the ASan + UBSan build
(docs/testing.md, "Sanitizers beyond CI"). CI runs only the unit and CLI tests under the
sanitizers, for time; this sweep takes 20-30 minutes on 2 cores and is run by hand.

Each test's command comes from ctest in the release build folder; the loom binary and the
C test executables in it are replaced by build-asan's (those that exist there). A test
fails here when it exits non-zero or when its output holds a sanitizer report; UBSan halts
at the first report (as the sanitized unit tests do: -fno-sanitize-recover), and leak
checks are off (OpenMPI's own allocations at exit would drown the report).

Known to differ under the sanitizers, not defects: ft_segv (loom's crash report is not
compiled under ASan, whose own report the test does not look for) and diloco's slow
withdraw check (its LD_PRELOADed shim cannot load before the ASan runtime); with
--labels hosts, hosts_faults' slow-link detection (timed: the sanitized compute is slower).

Usage: scripts/sanitize_sweep.py [--labels parallel|ckpt|ft] [--only NAME ...]
                                 [--logs DIR] [--timeout S]
Prints one line per test and exits 1 when any failed (0 otherwise)."""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELEASE, ASAN = os.path.join(ROOT, "build"), os.path.join(ROOT, "build-asan")


def asan_command(command):
    """command with every build/X replaced by build-asan/X where that exists."""
    out = []
    for c in command:
        if c.startswith(RELEASE + os.sep):
            a = os.path.join(ASAN, os.path.relpath(c, RELEASE))
            c = a if os.path.exists(a) else c
        out.append(c)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--labels", default="parallel|ckpt|ft", help="ctest -L regex")
    ap.add_argument("--only", nargs="*", default=[], help="these tests only")
    ap.add_argument("--logs", default="/tmp/loom_sanitize_sweep", help="one log per test")
    ap.add_argument("--timeout", type=int, default=1500, help="seconds per test")
    args = ap.parse_args()
    for d, what in ((RELEASE, "bash scripts/build.sh"),
                    (ASAN, "BUILD_DIR=build-asan bash scripts/build.sh -DLOOM_SANITIZE=ON "
                           "-DCMAKE_BUILD_TYPE=RelWithDebInfo")):
        if not os.path.exists(os.path.join(d, "loom")):
            sys.exit(f"sanitize_sweep: {d}/loom: not built (expected: {what})")
    listing = subprocess.run(["ctest", "--show-only=json-v1", "-L", args.labels, "-LE", "large"],
                             cwd=RELEASE, capture_output=True, text=True, check=True)
    tests = json.loads(listing.stdout)["tests"]
    os.makedirs(args.logs, exist_ok=True)
    failed = []
    for t in tests:
        name = t["name"]
        if args.only and name not in args.only:
            continue
        env = dict(os.environ)
        cwd = RELEASE
        for p in t.get("properties", []):
            if p["name"] == "WORKING_DIRECTORY":
                cwd = p["value"]
            elif p["name"] == "ENVIRONMENT":
                env.update(kv.split("=", 1) for kv in p["value"])
        env["ASAN_OPTIONS"] = "detect_leaks=0"
        env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1"
        cmd = asan_command(t["command"])
        t0 = time.time()
        try:
            p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                               timeout=args.timeout)
            rc, out = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired as e:
            rc = "timeout"
            out = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
                          for x in (e.stdout, e.stderr))
        report = "runtime error:" in out or "ERROR: AddressSanitizer" in out
        with open(os.path.join(args.logs, name + ".log"), "w") as f:
            f.write(" ".join(cmd) + "\n" + out)
        bad = rc not in (0, 77) or report
        if bad:
            failed.append(name)
        print(f"{name}: exit {rc}{', sanitizer report' if report else ''} "
              f"({time.time() - t0:.0f} s){'  FAIL' if bad else ''}", flush=True)
    print(f"sanitize_sweep: {len(failed)} failed{': ' + ' '.join(failed) if failed else ''} "
          f"(logs in {args.logs})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
