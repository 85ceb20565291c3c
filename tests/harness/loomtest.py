"""The shared harness of the Python tests that run `loom train` in layouts and compare runs.

Import it with `sys.path.insert(0, <tests>/harness); import loomtest` (it puts
tests/reference on the path for safetensors_io). What it holds:
- MPIRUN (root allowed, oversubscribed, yielding), run(cmd, what) (exits 1 naming the
  command and the stderr tail), losses(metrics) (training losses, then validation),
  write_text_shard (a byte-token shard of English-like words, llm.c format).
- The criterion "equal to one process": TOL, ADAM_EPS (the tests' AdamW epsilon),
  rel_err, comparable (GPT-2's key bias left out), weights_error (whole model, worst
  tensor), loss_error; same_tensors and bitwise ("the same layout twice is bitwise").
- Layouts(base, tmp): runs one base command in named layouts (mpirun -n ranks when
  ranks > 1) with --metrics and --dump-dir per run; a Run gives losses, params (final),
  init and stderr. Each test keeps its own layouts, tolerances and messages.
"""
import functools
import json
import os
import random
import subprocess
import sys

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
