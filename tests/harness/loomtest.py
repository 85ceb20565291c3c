"""The shared harness of the Python tests that run `loom train` in layouts and compare runs.

Import it with `sys.path.insert(0, <tests>/harness); import loomtest` (it puts
tests/reference on the path for safetensors_io). What it holds:
- The exit of every test, in one place: run_test(main) runs main() and exits 0 only when at
  least one check ran and none failed; 77 when main raised Skip("why") (the test's own
  precondition is missing: not root, no mpirun) before any check failed; 1 otherwise,
  whatever way main ended (a failed check, then a `return` from inside `try:`; an
  exception, its traceback printed; a timeout; sys.exit(non-zero)). check(ok, line)
  counts one check (prints line with ok/FAIL), report(name, ok, text) is check with the
  hosts tests' layout, failed() the failures so far; check_loom(path) first: a --loom
  that does not run fails the test at once.
- MPIRUN (root allowed, oversubscribed, yielding), run(cmd, what) (exits 1 naming the
  command and the stderr tail), losses(metrics) (training losses, then validation),
  write_text_shard (a byte-token shard of English-like words, llm.c format).
- The criterion "equal to one process": TOL, ADAM_EPS (the tests' AdamW epsilon),
  rel_err, comparable (GPT-2's key bias left out), weights_error (whole model, worst
  tensor), loss_error; same_tensors and bitwise ("the same layout twice is bitwise").
- Layouts(base, tmp): runs one base command in named layouts (mpirun -n ranks when
  ranks > 1) with --metrics and --dump-dir per run; a Run gives losses, params (final),
  init and stderr. Each test keeps its own layouts, tolerances and messages.
- check_resume(layouts, ...): the layout tests' checkpoint check: one layout saves at a
  step, resumes there bitwise, and other layouts resumed from it end as the reference.
"""
import argparse
import functools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import safetensors_io  # noqa: E402

TOL = 1e-5
# AdamW's epsilon in every test that compares layouts with one process (loom's default is
# 1e-8). Where a gradient coordinate is about epsilon in size, AdamW's step moves by up to
# lr / epsilon times that coordinate's rounding noise, and the difference spreads to every
# tensor from there. Seed 97998347 in test_layouts_dit.py: after step 1 one element of the
# final linear layer's gradient was -1.665e-8 on one process and -1.647e-8 under tp 2 (the
# tensor's gradients agreed to 1.1e-7), its weight moved 0.4% differently, and after 8 steps
# one qkv bias differed by 3.3e-4 of its norm. tp and cp hit the same with other seeds
# (their docstrings). With 1e-6 the amplification is 100 times smaller; a real error is as
# large as before.
ADAM_EPS = "1e-6"
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1"]


class Skip(Exception):
    """Raised by a test whose own precondition is missing (not root, no mpirun, no network
    namespaces): run_test exits 77 with the reason. Never for a failure of loom's."""


_checks = {"ran": 0, "failed": 0}


def bf16_gemms(stderr):
    """Which bf16 GEMMs a loom run's start-up line names: "onednn", "widened" (widened to
    fp32 for OpenBLAS on a CPU without AVX512-BF16 or AMX-BF16, docs/precision.md), or None
    (no such line)."""
    if "loom: precision bf16: oneDNN" in stderr:
        return "onednn"
    if "loom: precision bf16: bf16 matmul widened to fp32" in stderr:
        return "widened"
    return None


def check(ok, line=None):
    """One check, counted for run_test; prints line followed by ok or FAIL when given.
    Returns ok (as a bool)."""
    ok = bool(ok)
    _checks["ran"] += 1
    _checks["failed"] += not ok
    if line is not None:
        print(f"{line}  {'ok' if ok else 'FAIL'}", flush=True)
    return ok


def report(name, ok, text):
    """check() of one named step, as the hosts tests print it: "  NAME  TEXT  ok"."""
    return check(ok, f"  {name:28s} {text}")


def failed():
    """How many checks have failed so far."""
    return _checks["failed"]


def keep_or_remove(tmp, seed):
    """A test's teardown of its folder (its `finally:`): kept, and named with the seed to
    rerun it, when a check failed; removed otherwise."""
    if failed():
        print(f"kept {tmp} (seed {seed})")
    else:
        shutil.rmtree(tmp, ignore_errors=True)


def check_loom(path):
    """Fails the test at once (exit 1) when `path version` does not run: a broken --loom
    must never reach a test's teardown or its skip rules."""
    try:
        p = subprocess.run([path, "version"], capture_output=True, text=True, timeout=60)
        rc, out = p.returncode, p.stdout + p.stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        rc, out = None, str(e)
    if rc != 0 or "loom" not in out:
        check(False, f"--loom {path}: `{path} version` exit {rc}: {out.strip()[-300:]!r}: "
              "not a loom that runs")
        raise SystemExit(1)
    return path


def run_test(main, expect=None):
    """Runs main() and exits, the one exit of a test: 0 when at least one check ran (with
    expect: exactly that many) and none failed; 77 when main raised Skip before any check
    failed; 1 for everything else: a failed check (also when main went on, or returned
    early), an exception (its traceback printed), sys.exit with a non-zero code, SIGTERM
    (a ctest timeout: the test's `finally:` teardown runs), no check at all."""
    if {"-h", "--help"} & set(sys.argv[1:]):
        main()  # argparse prints the usage and exits 0: not a run of the test
    signal.signal(signal.SIGTERM, lambda sig, frame: sys.exit(128 + sig))
    t0, code, why = time.time(), 0, ""
    try:
        main()
    except Skip as e:
        code, why = 77, f"SKIP: {e}"
    except SystemExit as e:
        if e.code not in (None, 0):
            code, why = 1, f"stopped: exit {e.code}"
    except BaseException:  # an exception, KeyboardInterrupt: a failure, with its traceback
        traceback.print_exc()
        code, why = 1, "stopped by an exception (traceback above)"
    ran, bad = _checks["ran"], _checks["failed"]
    if code == 0 and not ran:
        code, why = 1, "no check ran"
    elif code == 0 and expect is not None and ran != expect:
        code, why = 1, f"{ran} check(s) ran, expected {expect}"
    if code == 77 and not bad:
        print(why, flush=True)
        sys.exit(77)
    code = 1 if bad or code else 0
    print(f"{'FAIL' if code else 'ok'}: {ran - bad} of {ran} check(s) passed"
          f"{', ' + why if why else ''} in {time.time() - t0:.0f} s", flush=True)
    sys.exit(code)


def descendants(pid):
    """pid's children, their children, ... (from /proc): a job's processes, to pause them."""
    kids = {}
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def write_text_shard(path, seed):
    """Byte tokens of English-like text (words drawn from a fixed list), llm.c format."""
    rng = random.Random(seed)
    words = ("the of and to in is was that for on with as by at from his her they "
             "which one all were we when there can an your said each she do how their "
             "if will up other about out many then them these so some would make").split()
    text = " ".join(rng.choice(words) for _ in range(40000)).encode()
    header = np.zeros(256, dtype="<i4")
    header[:3] = [20240520, 1, len(text)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.frombuffer(text, dtype=np.uint8).astype("<u2").tobytes())


def run(cmd, what):
    """Runs cmd; on a non-zero exit prints the command and stderr's tail and exits 1."""
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        print(f"FAIL: {what}: exit {p.returncode}\n$ {' '.join(cmd)}\n{p.stderr[-3000:]}")
        sys.exit(1)
    return p.stderr


def losses(path):
    """Training loss of every step, then the validation losses (every --eval-every steps)."""
    rows = [json.loads(line) for line in open(path)]
    return [r["loss"] for r in rows] + [r["val_loss"] for r in rows if "val_loss" in r]


def seed_of(args):
    """--seed, or a random one; printed so that a failure can be repeated."""
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    print(f"seed {seed}")
    return seed


def parse_test_args(extra=None):
    """The command line of a test that runs loom: --loom PATH (required, and checked at once
    with check_loom: a broken loom fails the test, exit 1) and --seed S; extra(parser), when
    given, adds the test's own flags. Returns the parsed arguments with args.seed resolved
    (seed_of: --seed, or a random one, printed)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", required=True)
    ap.add_argument("--seed", type=int, default=None)
    if extra:
        extra(ap)
    args = ap.parse_args()
    check_loom(args.loom)
    args.seed = seed_of(args)
    return args


def rel_err(a, b):
    return float(np.linalg.norm(a.astype(np.float64) - b) / max(np.linalg.norm(b), 1e-30))


def loss_error(got, ref):
    """Largest relative difference of the losses, step by step."""
    return max(abs(a - b) / abs(b) for a, b in zip(got, ref))


def comparable(name, w, d_model):
    """GPT-2's key bias (rows C..2C of c_attn.bias) has an exactly zero gradient (adding a
    constant to every key's score leaves the softmax unchanged), so in any implementation
    its values are AdamW-amplified rounding noise; it is left out, as in tests/reference."""
    if name.endswith("attn.c_attn.bias"):
        return np.concatenate([w[:d_model], w[2 * d_model:]])
    return w


def weights_error(got, ref, d_model, whole_raw=False):
    """(error of all weights together, worst single tensor's error, its name); (1.0, 1.0,
    "missing tensors") when the names differ. Layouts are held to <= TOL on the first and
    <= 10 * TOL on the second: AdamW turns the rounding noise of a near-zero gradient
    coordinate into an O(lr) step (m / sqrt(v) ~ +-1), so one element of a small tensor (a
    norm bias, a tp-sharded projection) can move by ~1e-6 absolute, 1-3e-5 of that tensor's
    norm (measured: tests/parallel/test_layouts_tp.py's docstring), while a real bug in any
    tensor moves the whole model's error far above TOL. whole_raw: the whole model's error
    over the raw tensors (key bias included), as test_layouts_pp.py has it."""
    if set(got) != set(ref):
        return 1.0, 1.0, "missing tensors"
    names = sorted(ref)
    worst, name = max((rel_err(comparable(k, got[k], d_model), comparable(k, ref[k], d_model)), k)
                      for k in names)
    pick = (lambda k, w: w) if whole_raw else (lambda k, w: comparable(k, w, d_model))
    whole = rel_err(np.concatenate([pick(k, got[k]).ravel() for k in names]),
                    np.concatenate([pick(k, ref[k]).ravel() for k in names]))
    return whole, worst, name


def same_tensors(a, b):
    """The same names and bitwise the same values."""
    return set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)


def bitwise(a, b):
    """Two runs (Run, or (losses, params)) are bitwise the same: losses and final weights."""
    la, wa = (a.losses, a.params) if isinstance(a, Run) else a
    lb, wb = (b.losses, b.params) if isinstance(b, Run) else b
    return la == lb and same_tensors(wa, wb)


class Run:
    """One finished `loom train` run: its output folder (--dump-dir) and OUT.jsonl."""

    def __init__(self, out, stderr=""):
        self.out, self.stderr = out, stderr

    def load(self, name):
        return safetensors_io.load(os.path.join(self.out, name))

    @functools.cached_property
    def losses(self):
        return losses(self.out + ".jsonl")

    @functools.cached_property
    def rows(self):
        return [json.loads(x) for x in open(self.out + ".jsonl") if x.strip()]

    @functools.cached_property
    def params(self):
        return self.load("params_final.safetensors")

    def losses_after(self, step):
        """losses after step: the training losses of the later steps, then the validation
        losses at them (what a run resumed at step reports)."""
        later = [r for r in self.rows if r["step"] > step]
        return [r["loss"] for r in later] + [r["val_loss"] for r in later if "val_loss" in r]

    @functools.cached_property
    def init(self):
        return self.load("params_init.safetensors")


class Layouts:
    """Runs one base `loom train` command in named layouts: run(name, ranks, flags) adds the
    flags, --metrics TMP/PREFIX+NAME.jsonl and --dump-dir TMP/PREFIX+NAME, launches it under
    mpirun -n ranks (with -x for each mpi_env entry) when ranks > 1, and returns a Run
    (also kept in self.runs[name]). mpirun: the launcher's words (default MPIRUN; e.g.
    across test hosts, tests/hosts/test_hosts.py)."""

    def __init__(self, base, tmp, prefix="", mpirun=None):
        self.base, self.tmp, self.prefix = list(base), tmp, prefix
        self.mpirun = list(mpirun) if mpirun else MPIRUN
        self.runs = {}

    def path(self, name):
        return os.path.join(self.tmp, self.prefix + name)

    def run(self, name, ranks, flags=(), mpi_env=()):
        out = self.path(name)
        cmd = self.base + list(flags) + ["--metrics", out + ".jsonl", "--dump-dir", out]
        launch = self.mpirun + [a for kv in mpi_env for a in ("-x", kv)] + ["-n", str(ranks)]
        stderr = run((launch if ranks > 1 else []) + cmd, f"{self.prefix}{name}")
        self.runs[name] = Run(out, stderr)
        return self.runs[name]


def check_resume(layouts, desc, ranks, flags, step, others=(), ref=None, d_model=None, also=()):
    """A checkpoint resumed in its own layout and in others (invariant 2 through a
    checkpoint, invariant 1 across layouts). layouts runs "saving" (ranks, flags, with
    --ckpt-dir layouts.path("ckpt") --ckpt-every step), then resumes its step_<step> as
    "resumed_same" in the same layout: it must say it resumed, and its losses after step
    and final weights (and each file of also, e.g. "ema_final.safetensors") must be
    bitwise the saving run's. Then as "resumed_NAME" in each of others ((name, ranks,
    flags)): losses after step (loss_error) and weights (weights_error at d_model) within
    TOL of ref, the uninterrupted reference Run, worst tensor within 10 TOL, and each file
    of also within TOL (whole model). One check and one printed line each (desc names the
    saving layout); returns the saving Run."""
    ckpt = layouts.path("ckpt")
    saver = layouts.run("saving", ranks, list(flags) + ["--ckpt-dir", ckpt, "--ckpt-every",
                                                       str(step)])
    at = ["--resume", os.path.join(ckpt, f"step_{step:08d}")]
    same = layouts.run("resumed_same", ranks, list(flags) + at)
    ok = ("resumed from" in same.stderr and same.losses == saver.losses_after(step)
          and same_tensors(same.params, saver.params)
          and all(same_tensors(same.load(f), saver.load(f)) for f in also))
    check(ok)
    print(f"  resumed at step {step} in the saving layout ({desc}): "
          f"{'bitwise identical' if ok else 'FAIL: differs from the uninterrupted run'}")
    for name, rranks, rflags in others:
        res = layouts.run("resumed_" + name, rranks, list(rflags) + at)
        all_err, w_err, _ = weights_error(res.params, ref.params, d_model)
        loss_err = loss_error(res.losses, ref.losses_after(step))
        errs = [(f.split("_")[0], weights_error(res.load(f), ref.load(f), d_model)[0]) for f in also]
        ok = (loss_err <= TOL and all_err <= TOL and w_err <= 10 * TOL
              and all(e <= TOL for _, e in errs))
        check(ok)
        print(f"  resumed at step {step} ({desc} -> {name}): losses {loss_err:.2e}  weights "
              f"{all_err:.2e}" + "".join(f"  {n} {e:.2e}" for n, e in errs)
              + f"  {'ok' if ok else 'FAIL'}")
    return saver
