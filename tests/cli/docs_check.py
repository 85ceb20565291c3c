#!/usr/bin/python3
"""The docs keep up with the command line (ctest docs_check, label cli):

1. every flag that the `--help` of each command `loom --help` lists (train, run, data, ...)
   prints appears somewhere in docs/*.md, so a new flag comes with its documentation (a
   new page counts: all of docs/*.md is scanned), and every docs page a help names exists;
2. every command in README.md's code blocks and in its tables' inline code that runs
   `loom` (./build/loom, under mpirun or after a pipe) parses: it is run with `--help`
   added after its own flags, so an unknown flag or a missing value fails it without
   training (for `loom run`, its own options and then the train options after `--`);
   every `bash scripts/X.sh` names a script that exists and `bash -n` accepts; every
   configs/*.ini a command names exists.

usage: docs_check.py --loom PATH [--root DIR]
"""
import argparse
import glob
import os
import re
import shlex
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import loomtest  # noqa: E402
from loomtest import check  # noqa: E402

ROOT = [None]  # set by main
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*")


def last_line(out):
    lines = out.strip().splitlines()
    return lines[-1] if lines else "(no output)"


def run(loom, args):
    p = subprocess.run([loom] + args, capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


def commands(loom):
    """The commands `loom --help` lists (the first word of each indented line)."""
    rc, out = run(loom, ["--help"])
    check(rc == 0, f"loom --help: exit {rc}")
    names = []
    for line in out.splitlines():
        m = re.match(r"^  ([a-z][a-z-]*)\s{2,}", line)
        if m and m.group(1) not in ("version",):
            names.append(m.group(1))
    check(len(names) >= 10, f"loom --help lists {len(names)} commands: {names}")
    pages = sorted(set(re.findall(r"docs/[\w.-]+\.md", out)))
    absent = [pg for pg in pages if not os.path.isfile(os.path.join(ROOT[0], pg))]
    check(pages and not absent, f"loom --help: the pages it names exist ({' '.join(pages)})"
          + (f"; missing: {' '.join(absent)}" if absent else ""))
    return names


def docs_text(root):
    pages = sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    check(len(pages) >= 5, f"docs/*.md: {len(pages)} pages")
    return "\n".join(open(p, encoding="utf-8").read() for p in pages)


def check_flags(loom, root):
    text = docs_text(root)
    documented = set(FLAG.findall(text))
    for cmd in commands(loom):
        rc, out = run(loom, [cmd, "--help"])
        check(rc == 0, f"loom {cmd} --help: exit {rc}" + (f": {out.strip()[-200:]!r}" if rc else ""))
        pages = sorted(set(re.findall(r"docs/[\w.-]+\.md", out)))
        absent = [pg for pg in pages if not os.path.isfile(os.path.join(root, pg))]
        check(not absent, f"loom {cmd} --help: the pages it names exist ({' '.join(pages) or 'none'})"
              + (f"; missing: {' '.join(absent)}" if absent else ""))
        missing = sorted(set(FLAG.findall(out)) - documented)
        check(not missing, f"loom {cmd} --help: every flag it lists is in docs/*.md"
              + (f"; not found: {' '.join(missing)}" if missing else ""))


def readme_commands(root):
    """Shell lines from README.md's fenced code blocks (continuations joined) and the
    inline code of its table rows."""
    lines, fence, out = open(os.path.join(root, "README.md"), encoding="utf-8").read().split("\n"), None, []
    pending = ""
    for line in lines:
        if line.lstrip().startswith("```"):
            fence = None if fence is not None else line.strip()[3:]
            continue
        if fence is not None:
            if fence not in ("sh", "bash"):  # plain ``` blocks are output
                continue
            s = pending + line.strip()
            if s.endswith("\\"):
                pending = s[:-1] + " "
                continue
            pending = ""
            out.append(s)
        elif line.startswith("|"):
            out += [c for c in re.findall(r"`([^`]+)`", line)
                    if re.match(r"(\./build/loom|mpirun|bash scripts/)", c)]
    return out


def loom_words(line):
    """The `loom ...` part of a shell line (None if it runs no loom): comments dropped,
    the segment of a pipe that runs loom, mpirun's own words dropped."""
    line = re.sub(r"\s+#.*$", "", line)
    for seg in line.split("|"):
        try:
            words = shlex.split(seg)
        except ValueError:
            continue
        for i, w in enumerate(words):
            if w in ("./build/loom", "build/loom", "loom") and i + 1 < len(words):
                if i == 0 or words[0] == "mpirun":
                    return words[i + 1:]
    return None


def check_config_files(root, words, line):
    for i, w in enumerate(words[:-1]):
        if w == "--config":
            path = os.path.join(root, words[i + 1])
            check(os.path.isfile(path), f"README: `{line}`: --config {words[i + 1]} exists")


def check_parses(loom, root, words, line):
    check_config_files(root, words, line)
    if words[0] == "run" and "--" in words:
        k = words.index("--")
        rc, out = run(loom, words[:k] + ["--help"])
        check(rc == 0, f"README: `{line}`: loom run's options parse (exit {rc}"
              + (f": {last_line(out)})" if rc else ")"))
        rc, out = run(loom, ["train"] + words[k + 1:] + ["--help"])
        check(rc == 0, f"README: `{line}`: its train options parse (exit {rc}"
              + (f": {last_line(out)})" if rc else ")"))
        return
    rc, out = run(loom, words + ["--help"])
    check(rc == 0, f"README: `{line}`: parses (exit {rc}" + (f": {last_line(out)})" if rc else ")"))


def check_readme(loom, root):
    n = 0
    for line in readme_commands(root):
        m = re.match(r"^bash (scripts/[\w.-]+\.sh)", line)
        if m:
            path = os.path.join(root, m.group(1))
            ok = os.path.isfile(path) and subprocess.run(["bash", "-n", path]).returncode == 0
            check(ok, f"README: `{line}`: {m.group(1)} exists and bash -n accepts it")
            n += 1
            continue
        words = loom_words(line)
        if words:
            check_parses(loom, root, words, line)
            n += 1
    check(n >= 8, f"README: {n} commands checked")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loom", required=True)
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   "..", ".."))
    a = ap.parse_args()
    ROOT[0] = a.root
    loom = loomtest.check_loom(a.loom)
    check_flags(loom, a.root)
    check_readme(loom, a.root)


if __name__ == "__main__":
    loomtest.run_test(main)
