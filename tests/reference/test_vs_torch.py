#!/usr/bin/python3
"""loom vs PyTorch: random small configurations, 10 training steps, everything compared.

For each drawn configuration this writes a token shard, runs `loom train` with
--dump-dir/--metrics, loads loom's initial weights into the PyTorch reference
(torch_model.py, run in float64 so it is the ground truth), replays the exact
sequences loom used, and compares: micro-batch-1 logits, the step-1 loss, every
parameter gradient of step 1, the per-step loss / lr / grad-norm and the final weights.

Error measures, per tensor (every named tensor must exist in both, same shape):
- logits and gradients: max|loom - ref| / max|ref|, the worst element error relative
  to the tensor's scale (denominator floored at 1e-12: all-zero reference -> absolute).
- final weights: ||loom - ref||_2 / ||ref||_2. After 10 AdamW steps a correct fp32
  implementation can still differ in a single element by ~5e-4 of the tensor's max,
  because Adam divides by sqrt(v): a gradient element that is ~0 (fp32 noise level)
  gets an O(lr) update whose size is decided by rounding. The norm measure is
  insensitive to such isolated elements but still catches any systematic error
  (a wrong decay, bias correction or schedule moves every element).
  Excluded from it: GPT-2's key bias (rows C..2C of attn.c_attn.bias). Its exact
  gradient is zero (adding q.b_k to a whole row of scores does not change the
  softmax), so its gradient is pure rounding noise, which AdamW turns into O(lr)
  updates: the final values there are noise in any implementation.
Scalars (loss, lr, grad norm per step): |loom - ref| / |ref|.

Conditioning: the later-step checks (losses, grad norms, final weights) can be
ill-conditioned in some drawn configurations (e.g. zero-initialised biases whose
elements hover around zero while Adam takes sign-like steps), where even PyTorch in
fp32 misses the float64 answer by more than the tolerance. So the reference is also
run in fp32, and for those checks each tolerance is max(tol, FP32_SLACK * error of
fp32 PyTorch): loom must be about as close to the exact answer as PyTorch fp32 is.
The step-1 checks (logits, loss, gradients) keep their fixed tolerances.

Usage: /usr/bin/python3 tests/reference/test_vs_torch.py --loom build/loom [--seed S]
       [--configs N] [--keep]
Exit status 0 when every check passes, 1 otherwise (with the seed and loom command).
"""

import argparse
import json
import math
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import check_torch_model  # noqa: E402
import loomtest  # noqa: E402
import safetensors_io  # noqa: E402
import torch  # noqa: E402
import torch_model as tm  # noqa: E402

STEPS = 10
TOL = {"logits": 1e-4, "loss1": 1e-5, "grads": 1e-4, "losses": 1e-5, "lr": 1e-6,
       "grad_norm": 1e-4, "final": 1e-4}
FP32_SLACK = 5.0  # see "Conditioning" above
SHARD_MAGIC, SHARD_VERSION = 20240520, 1


# ---------------------------------------------------------------- configuration draw

def draw_config(rng, index):
    """A small random configuration; even indices are gpt2, odd ones llama (GQA)."""
    family = "gpt2" if index % 2 == 0 else "llama"
    if family == "gpt2":
        n_head = rng.randint(1, 4)
        n_kv = n_head
        hd = rng.choice([5, 6, 7, 10, 12])
    else:
        n_kv = rng.randint(1, 2)
        n_head = n_kv * rng.choice([2, 3, 4])  # always grouped: n_kv < n_head
        hd = rng.choice([6, 10, 14])  # RoPE needs even; hd/2 odd on purpose
    C = n_head * hd
    model = tm.Config(
        family=family, n_layer=rng.randint(1, 3), n_head=n_head, n_kv_head=n_kv,
        d_model=C, d_ff=rng.choice([2 * C, 3 * C + 2, 4 * C - 3]),
        vocab_size=rng.choice([37, 101, 250, 333, 500]) if rng.random() < 0.5
        else rng.randint(37, 500),
        seq_len=rng.choice([7, 13, 24, 33, 40]) if rng.random() < 0.5 else rng.randint(7, 40),
        rope_theta=rng.choice([10000.0, 500000.0]),
        norm_eps=rng.choice([1e-5, 1e-6]),
    ).validate()
    if model.vocab_size % 64 == 0:
        model.vocab_size += 1
    if model.seq_len & (model.seq_len - 1) == 0:
        model.seq_len += 1
    micro = rng.randint(1, 3)
    lr = 10 ** rng.uniform(-3, -2.3)
    # Clipping: mostly a small threshold (tiny models start near grad norm ~1, so this
    # clips some or all steps); sometimes disabled to test the --grad-clip 0 path.
    clip = 0.0 if rng.random() < 0.2 else round(10 ** rng.uniform(-0.8, 0.3), 4)
    train = tm.TrainConfig(
        steps=STEPS, micro_batch=micro, global_batch=micro * rng.randint(1, 3),
        lr=lr, min_lr=lr * rng.choice([0.0, 0.1]), warmup_steps=rng.randint(0, 4),
        weight_decay=rng.choice([0.01, 0.1, 0.3]), grad_clip=clip,
        beta1=rng.choice([0.9, 0.8]), beta2=rng.choice([0.95, 0.999]),
        # eps >= 1e-6 on purpose: with 1e-8, elements whose gradient is at fp32 rounding
        # level get O(lr) updates whose sign depends on rounding, in any fp32 code.
        adam_eps=rng.choice([1e-6, 1e-5]))
    loom_seed = rng.randint(1, 2**31 - 1)
    if index % 4 >= 2:  # mixture of experts (drawn last: the dense draws stay as they were)
        model.n_experts = rng.randint(2, 6)
        model.top_k = rng.randint(1, min(3, model.n_experts))
        model.moe_every = rng.randint(1, model.n_layer)
        model.shared_expert = rng.random() < 0.5
        model.capacity_factor = rng.choice([0.0, 0.75, 1.0, 1.25])
        model.aux_loss_coef = rng.choice([0.0, 0.01, 0.1])
        model.z_loss_coef = rng.choice([0.0, 0.001, 0.01])
    return model, train, loom_seed


def describe(m, t):
    moe = (f" | MoE E{m.n_experts} K{m.top_k} every{m.moe_every}"
           f"{' shared' if m.shared_expert else ''} cf{m.capacity_factor} "
           f"aux{m.aux_loss_coef} z{m.z_loss_coef}" if m.n_experts else "")
    return (f"{m.family} L{m.n_layer} H{m.n_head} KV{m.n_kv_head} C{m.d_model} "
            f"hd{m.head_dim} F{m.d_ff} V{m.vocab_size} T{m.seq_len} | M{t.micro_batch} "
            f"G{t.global_batch} lr{t.lr:.2e} min{t.min_lr:.1e} wu{t.warmup_steps} "
            f"wd{t.weight_decay} clip{t.grad_clip} b{t.beta1}/{t.beta2} eps{t.adam_eps}" + moe)


# ---------------------------------------------------------------- data and loom run

def write_shard(path, vocab, n_tokens, rng):
    """llm.c shard with learnable structure (a noisy affine chain), so losses move."""
    a, b = rng.randint(1, vocab - 1), rng.randint(0, vocab - 1)
    nrng = np.random.default_rng(rng.randint(0, 2**31))
    toks = np.empty(n_tokens, dtype=np.int64)
    toks[0] = nrng.integers(vocab)
    noise = nrng.random(n_tokens) < 0.3
    rand = nrng.integers(0, vocab, n_tokens)
    for i in range(1, n_tokens):
        toks[i] = rand[i] if noise[i] else (a * toks[i - 1] + b) % vocab
    header = np.zeros(256, dtype="<i4")
    header[:3] = [SHARD_MAGIC, SHARD_VERSION, n_tokens]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(toks.astype("<u2").tobytes())
    return toks


def loom_command(loom, m, t, seed, data, out, device="cpu"):
    preset = "gpt2-tiny" if m.family == "gpt2" else "llama-tiny"
    cmd = [loom, "train", "--model", preset,
           "--n-layer", m.n_layer, "--n-head", m.n_head, "--d-model", m.d_model,
           "--d-ff", m.d_ff, "--vocab-size", m.vocab_size, "--seq-len", m.seq_len,
           "--norm-eps", m.norm_eps]
    if m.family == "llama":
        cmd += ["--n-kv-head", m.n_kv_head, "--rope-theta", m.rope_theta]
    if m.n_experts:
        cmd += ["--n-experts", m.n_experts, "--top-k", m.top_k, "--moe-every", m.moe_every,
                f"--shared-expert={int(m.shared_expert)}", "--capacity-factor", m.capacity_factor,
                "--aux-loss-coef", m.aux_loss_coef, "--z-loss-coef", m.z_loss_coef]
    cmd += ["--data", data, "--micro-batch", t.micro_batch, "--global-batch", t.global_batch,
            "--steps", t.steps, "--lr", repr(t.lr), "--min-lr", repr(t.min_lr),
            "--warmup-steps", t.warmup_steps, "--weight-decay", t.weight_decay,
            "--grad-clip", t.grad_clip, "--beta1", t.beta1, "--beta2", t.beta2,
            "--adam-eps", t.adam_eps, "--seed", seed, "--threads", 2,
            "--metrics", os.path.join(out, "metrics.jsonl"), "--dump-dir", out,
            "--log-every", 1, "--device", device]
    return [str(c) for c in cmd]


def read_metrics(path):
    rows = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                rec = json.loads(line)
                if "step" in rec and "loss" in rec:
                    rows[int(rec["step"])] = rec
    return [rows[s] for s in sorted(rows)]


# ---------------------------------------------------------------- comparison helpers

def rel_tensor(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return math.inf
    if not np.all(np.isfinite(a)):
        return math.inf
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-12))


def rel_norm(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or not np.all(np.isfinite(a)):
        return math.inf
    return float(np.linalg.norm(a - b) / max(float(np.linalg.norm(b)), 1e-12))


def rel_scalar(a, b):
    if not math.isfinite(a):
        return math.inf
    return abs(a - b) / max(abs(b), 1e-12)


class Report:
    """Collects one row per check: name, worst error, where, tolerance."""

    def __init__(self):
        self.rows = []

    def add(self, name, err, where, tol, note=""):
        self.rows.append((name, err, where, tol, note))

    def fail(self, name, message):
        self.rows.append((name, math.inf, message, 0.0, ""))

    @property
    def ok(self):
        return all(err <= tol for _, err, _, tol, _ in self.rows)

    def print(self):
        print(f"  {'check':<12} {'worst rel err':>13} {'tol':>8}  status  where")
        for name, err, where, tol, note in self.rows:
            status = "ok" if err <= tol else "FAIL"
            e = f"{err:.3e}" if math.isfinite(err) else "inf"
            print(f"  {name:<12} {e:>13} {tol:>8.1e}  {status:<6}  {where}{note}")


def worst(pairs):
    """pairs: {key: err} -> (max err, key of max)."""
    key = max(pairs, key=lambda k: pairs[k])
    return pairs[key], key


def compare_named(report, check, loom_t, ref_t, tol, measure=rel_tensor, fp32_t=None):
    """Per-tensor comparison; with fp32_t, each tensor's tolerance is raised to
    FP32_SLACK times the fp32 PyTorch error where that is larger."""
    names_l, names_r = set(loom_t), set(ref_t)
    if names_l != names_r:
        report.fail(check, f"tensor names differ: only in loom {sorted(names_l - names_r)}, "
                           f"missing in loom {sorted(names_r - names_l)}")
        return
    shape_bad = [n for n in ref_t if tuple(loom_t[n].shape) != tuple(ref_t[n].shape)]
    if shape_bad:
        n = shape_bad[0]
        report.fail(check, f"{n}: shape {list(loom_t[n].shape)} in loom, "
                           f"{list(ref_t[n].shape)} in reference")
        return
    errs = {n: measure(loom_t[n], ref_t[n]) for n in ref_t}
    tols = {n: tol for n in ref_t}
    if fp32_t is not None:
        tols = {n: max(tol, FP32_SLACK * measure(fp32_t[n], ref_t[n])) for n in ref_t}
    _, where = worst({n: errs[n] / tols[n] for n in ref_t})
    report.add(check, errs[where], where, tols[where], f" ({len(errs)} tensors)")


def without_null_directions(tensors, m):
    """Copy of tensors with the gradient-free GPT-2 key bias zeroed (see docstring)."""
    out = dict(tensors)
    if m.family == "gpt2":
        C = m.d_model
        for name in tensors:
            if name.endswith("attn.c_attn.bias"):
                out[name] = np.array(tensors[name], dtype=np.float64)
                out[name][C:2 * C] = 0.0
    return out


def check_token_rows(rows, shard):
    """Every dumped sequence must be a contiguous window of the shard."""
    blob = shard.astype("<u2").tobytes()
    for row in rows.reshape(-1, rows.shape[-1]):
        needle = row.astype("<u2").tobytes()
        pos = blob.find(needle)
        while pos != -1 and pos % 2:
            pos = blob.find(needle, pos + 1)
        if pos == -1:
            return f"sequence {row[:8].tolist()}... is not a window of the data shard"
    return None


# ---------------------------------------------------------------- one configuration

def run_config(args, m, t, loom_seed, workdir):
    report = Report()
    rng = random.Random(loom_seed)
    data = os.path.join(workdir, "shard_000.bin")
    n_tok = max(4096, 3 * t.steps * t.global_batch * (m.seq_len + 1))
    shard = write_shard(data, m.vocab_size, n_tok, rng)
    out = os.path.join(workdir, "dump")
    os.makedirs(out, exist_ok=True)
    cmd = loom_command(args.loom, m, t, loom_seed, data, out, args.device)

    t0 = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        report.fail("loom run", "timed out after 300 s")
        return report, cmd, 0.0
    loom_s = time.time() - t0
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        report.fail("loom run", f"exit {proc.returncode}: " + " | ".join(tail))
        return report, cmd, loom_s

    try:
        tokens = safetensors_io.load(os.path.join(out, "tokens.safetensors"))["tokens"]
        init = safetensors_io.load(os.path.join(out, "params_init.safetensors"))
        logits_l = safetensors_io.load(os.path.join(out, "logits_step1.safetensors"))["logits"]
        grads_l = safetensors_io.load(os.path.join(out, "grads_step1.safetensors"))
        final_l = safetensors_io.load(os.path.join(out, "params_final.safetensors"))
        metrics = read_metrics(os.path.join(out, "metrics.jsonl"))
    except (OSError, KeyError, ValueError) as e:
        report.fail("dumps", f"{type(e).__name__}: {e}")
        return report, cmd, loom_s

    want = (t.steps, t.global_batch, m.seq_len + 1)
    if tuple(tokens.shape) != want:
        report.fail("tokens", f"shape {list(tokens.shape)}, expected {list(want)}")
        return report, cmd, loom_s
    if tokens.min() < 0 or tokens.max() >= m.vocab_size:
        report.fail("tokens", f"token ids outside [0, {m.vocab_size})")
        return report, cmd, loom_s
    msg = check_token_rows(tokens, shard)
    if msg:
        report.fail("tokens", msg)
    if len(metrics) != t.steps or [r["step"] for r in metrics] != list(range(1, t.steps + 1)):
        report.fail("metrics", f"expected steps 1..{t.steps}, got "
                               f"{[r['step'] for r in metrics]}")
        return report, cmd, loom_s

    # Reference: float64 model starting from loom's initial weights.
    model = tm.build_model(m, torch.float64)
    try:
        tm.load_params(model, init)
    except ValueError as e:
        report.fail("params_init", str(e))
        return report, cmd, loom_s
    snap = {}

    def on_step(s, info):
        if s == 0:
            snap["logits"] = info["logits0"].numpy().copy()
            snap["grads"] = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}

    hist = tm.train(model, t, tokens, on_step)
    # The same in fp32: a measure of how well-conditioned the later-step checks are.
    model32 = tm.build_model(m, torch.float32)
    tm.load_params(model32, init)
    hist32 = tm.train(model32, t, tokens)

    report.add("logits", rel_tensor(logits_l, snap["logits"]),
               f"shape {list(logits_l.shape)}", TOL["logits"])
    report.add("loss step1", rel_scalar(metrics[0]["loss"], hist[0]["loss"]),
               f"loom {metrics[0]['loss']:.8f} ref {hist[0]['loss']:.8f}", TOL["loss1"])
    compare_named(report, "grads step1", grads_l, snap["grads"], TOL["grads"])
    for key, check in (("loss", "losses"), ("lr", "lr"), ("grad_norm", "grad_norm")):
        errs = [rel_scalar(float(metrics[s][key]), hist[s][key]) for s in range(t.steps)]
        tols = [TOL[check] if key == "lr" else
                max(TOL[check], FP32_SLACK * rel_scalar(hist32[s][key], hist[s][key]))
                for s in range(t.steps)]
        s = max(range(t.steps), key=lambda i: errs[i] / tols[i])
        report.add(check, errs[s], f"step {s + 1}: loom {float(metrics[s][key]):.8g} "
                                   f"ref {hist[s][key]:.8g}", tols[s])
    final_r = {n: p.detach().numpy() for n, p in model.named_parameters()}
    final_32 = {n: p.detach().numpy() for n, p in model32.named_parameters()}
    compare_named(report, "final params", without_null_directions(final_l, m),
                  without_null_directions(final_r, m), TOL["final"], rel_norm,
                  without_null_directions(final_32, m))

    clipped = sum(1 for h in hist if t.grad_clip > 0 and h["grad_norm"] > t.grad_clip)
    print(f"  losses ref: {hist[0]['loss']:.4f} -> {hist[-1]['loss']:.4f}; "
          f"clipped steps {clipped}/{t.steps}")
    return report, cmd, loom_s


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loom", required=True, help="path to the loom binary")
    ap.add_argument("--seed", type=int, default=None, help="draw seed (random if omitted)")
    ap.add_argument("--configs", type=int, default=8, help="configurations to draw")
    ap.add_argument("--only", type=int, default=None, help="run only configuration #i")
    ap.add_argument("--keep", action="store_true", help="keep the work directories")
    ap.add_argument("--device", default="cpu",
                    help="loom train --device (cuda: a CUDA build on a GPU; MoE draws skipped, "
                         "the CUDA backend has no MoE routing kernels yet)")
    args = ap.parse_args()
    args.loom = os.path.abspath(args.loom)
    loomtest.check_loom(args.loom)

    seed = args.seed if args.seed is not None else random.SystemRandom().randint(1, 10**9)
    torch.set_num_threads(2)
    # The comparison means nothing if the reference is wrong: check it first (~2 s).
    print("reference self-check (check_torch_model.py):")
    if not loomtest.check(check_torch_model.main() == 0):
        print("the PyTorch reference failed its own self-check; not comparing")
        return
    rng = random.Random(seed)
    print(f"\ntest_vs_torch: seed {seed}, {args.configs} configurations, {STEPS} steps each")
    failures, ran, t_start = [], 0, time.time()
    for i in range(args.configs):
        m, t, loom_seed = draw_config(rng, i)  # draw all, so --only reproduces config i
        if args.only is not None and i != args.only:
            continue
        if args.device != "cpu" and m.n_experts:
            print(f"\n[config {i}] {describe(m, t)}\n  skipped: MoE on --device {args.device}")
            continue
        print(f"\n[config {i}] {describe(m, t)}")
        workdir = tempfile.mkdtemp(prefix=f"loom_ref_{i}_")
        t0 = time.time()
        report, cmd, loom_s = run_config(args, m, t, loom_seed, workdir)
        ran += 1
        report.print()
        print(f"  time: loom {loom_s:.1f} s, total {time.time() - t0:.1f} s")
        if report.ok and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"  work dir kept: {workdir}")
        if not loomtest.check(report.ok):
            failures.append((i, cmd))

    print(f"\n{ran - len(failures)} passed, {len(failures)} failed, {time.time() - t_start:.1f} s (seed {seed})")
    if failures:
        me = os.path.abspath(__file__)
        for i, cmd in failures:
            print(f"\nFAILED config {i}. Reproduce with:\n"
                  f"  /usr/bin/python3 {me} --loom {args.loom} --seed {seed} "
                  f"--configs {args.configs} --only {i} --keep\n"
                  f"  loom command: {shlex.join(cmd)}")


if __name__ == "__main__":
    loomtest.run_test(main)
