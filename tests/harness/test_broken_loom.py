#!/usr/bin/python3
"""The guard: a test that passes while loom fails must not exist.

1. The harness's exit rule (loomtest.run_test), on small programs: a failed check then a
   `return` from inside `try:` (its `finally:` tearing down), an exception, sys.exit(3), a
   Skip after a failed check and no check at all each exit 1; a Skip alone exits 77; only
   checks that all pass exit 0.
2. Every ctest test of this build whose command takes `--loom PATH` (ctest --show-only),
   run with `--loom /bin/false`: it must exit non-zero, and 77 (skipped) only with the
   runner's "SKIP:" line (the test's own precondition, never loom's failure; the tests
   check loom first, so here none skips).
3. The same with a loom that answers `loom version` and fails every other command at once,
   for the tests that do not set up test hosts, benchmarks or PyTorch references (those
   take long before their first loom command): each gets past its loom check and must
   fail at its first real command (one still running after 10 s, trying every layout, is
   stopped and named, not judged).
4. Every Python test under tests/ that declares --loom (itself or through
   loomtest.parse_test_args) is run by some ctest test (so none escapes 2).
Usage: test_broken_loom.py --ctest CTEST --build-dir DIR
"""
import argparse
import concurrent.futures
import glob
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from loomtest import check, run_test  # noqa: E402

RUNNER_CASES = [  # (what, main's body, the exit code run_test must give)
    ("failed check, then return inside try/finally", """
    try:
        check(False, "a check that fails")
        return
    finally:
        print("teardown")""", 1),
    ("exception after a passed check", """
    check(True)
    raise RuntimeError("boom")""", 1),
    ("sys.exit(3)", """
    check(True)
    sys.exit(3)""", 1),
    ("Skip after a failed check", """
    check(False)
    raise Skip("not root")""", 1),
    ("no check at all", """
    pass""", 1),
    ("Skip", """
    raise Skip("not root")""", 77),
    ("every check passed", """
    check(True)
    check(1 == 1)""", 0),
]
FAKE_LOOM = """#!/bin/sh
# answers `loom version`, fails every other command at once
[ "$1" = version ] && echo "loom 0.0.0 (a fake that fails every command but version)" && exit 0
echo "fake loom: $*: failing on purpose" >&2
exit 1
"""
SLOW_LABELS = {"hosts", "bench", "reference"}  # long before their first loom command


def runner_rules(tmp):
    for what, body, want in RUNNER_CASES:
        prog = os.path.join(tmp, "case.py")
        with open(prog, "w") as f:
            f.write(f"import sys\nsys.path.insert(0, {HERE!r})\n"
                    "from loomtest import Skip, check, run_test\n\n\n"
                    f"def main():{body}\n\n\nrun_test(main)\n")
        p = subprocess.run([sys.executable, prog], capture_output=True, text=True, timeout=60)
        if not check(p.returncode == want, f"  run_test: {what:46s} exit {p.returncode} "
                     f"(expected {want})"):
            print(p.stdout[-1000:] + p.stderr[-1000:])


def loom_tests(ctest, build_dir):
    """(name, command, working directory, labels) of every test whose command has --loom."""
    p = subprocess.run([ctest, "--show-only=json-v1"], capture_output=True, text=True,
                       cwd=build_dir, check=True)
    found = []
    for t in json.loads(p.stdout)["tests"]:
        cmd = t.get("command") or []
        if "--loom" not in cmd[:-1]:
            continue
        props = {x["name"]: x["value"] for x in t.get("properties", [])}
        found.append((t["name"], cmd, props.get("WORKING_DIRECTORY", build_dir),
                      set(props.get("LABELS", []))))
    return found


def run_broken(cmd, cwd, loom, timeout):
    """Runs a test with --loom replaced: (exit code, output), or (None, "") when it was
    still running after timeout s (its process group is killed then)."""
    cmd = list(cmd)
    cmd[cmd.index("--loom") + 1] = loom
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         cwd=cwd, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return None, ""
    return p.returncode, out


def judge(name, loom, result, late_ok):
    """Non-zero, and 77 only with the runner's SKIP line. late_ok: a test still running at
    the timeout is named, not failed (it has not passed; it goes on through every layout)."""
    rc, out, took, timeout = result
    line = f"  {name:32s} --loom {os.path.basename(loom):9s} "
    if rc is None and late_ok:
        print(line + f"still running after {timeout} s, stopped: not judged")
        return
    skipped = re.search(r"^SKIP: .*", out, re.M) if rc == 77 else None
    ok = rc not in (0, None) and (rc != 77 or skipped)
    if not check(ok, line + f"exit {rc} in {took:4.1f} s" +
                 (f" ({skipped.group(0)})" if skipped else "")):
        print("    " + out[-1500:].replace("\n", "\n    "))


def judge_all(tests, loom, timeout, late_ok):
    """Runs the tests four at a time (each mostly waits for Python to start and for its
    loom check to fail), then judges them in order."""
    def one(test):
        t = time.time()
        rc, out = run_broken(test[1], test[2], loom, timeout)
        return rc, out, time.time() - t, timeout
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(one, tests))
    for test, result in zip(tests, results):
        judge(test[0], loom, result, late_ok)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctest", required=True)
    ap.add_argument("--build-dir", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="loom_broken_") as tmp:
        print("the runner's exit rule:")
        runner_rules(tmp)
        fake = os.path.join(tmp, "loom")
        with open(fake, "w") as f:
            f.write(FAKE_LOOM)
        os.chmod(fake, 0o755)
        tests = loom_tests(args.ctest, args.build_dir)
        print(f"{len(tests)} ctest test(s) take --loom; with /bin/false:")
        judge_all(tests, "/bin/false", 60, False)
        print("with a loom that answers `version` and fails everything else:")
        judge_all([t for t in tests if not t[3] & SLOW_LABELS], fake, 10, True)
    # Every Python test that takes --loom is one of them.
    scripts = {os.path.realpath(w) for _, cmd, _, _ in tests for w in cmd if w.endswith(".py")}
    for path in sorted(glob.glob(os.path.join(TESTS, "**", "*.py"), recursive=True)):
        if os.path.realpath(path) == os.path.realpath(os.path.join(HERE, "loomtest.py")):
            continue  # the harness: its parse_test_args declares --loom for the tests
        if re.search(r"add_argument\(\s*\"--loom\"|\bparse_test_args\(", open(path).read()):
            check(os.path.realpath(path) in scripts,
                  f"  {os.path.relpath(path, TESTS):40s} run by a ctest test")


if __name__ == "__main__":
    run_test(main)
