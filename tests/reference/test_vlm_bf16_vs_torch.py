#!/usr/bin/python3
"""loom's `vlm` family under --precision bf16 against a PyTorch reference that rounds to
bf16 at the same places.

The vlm counterpart of test_bf16_vs_torch.py (GPT-2 / Llama in bf16): read its docstring
for the rounding, the error measure (||loom - ref|| / ||ref|| per tensor), the two fp32
"draws" of the rounding-flip noise and the tolerance rules, which this test takes
unchanged (its constants and pieces, imported). The model is vlm_torch.py (ViT encoder,
2-layer GELU projector, torch_model's Llama decoder, the answer-masked loss), the shard
format and the command line test_vlm_vs_torch.py's. The reference is vlm_torch in float64
with, inside `rounding()`:
 - every linear layer (the encoder's patch embedding, each encoder block's qkv, out-proj,
   fc1 and fc2, the projector's fc1 and fc2, every decoder linear: q/k/v, o_proj, gate,
   up, down, and the lm_head) through test_bf16_vs_torch's BF16Linear: bf16-rounded
   operands (float64 -> fp32 -> bf16, nearest even) in each of its three GEMMs, sums in
   float64, the bias gradient the sum of the unrounded output gradient; outputs fp32;
 - the decoder as test_bf16_vs_torch's llama: q, k, v rounded after RoPE, attention's
   backward taking D = rowsum(dO * O) from the rounded O (AttentionBF16), [gate | up]
   rounded before SiLU(gate) * up; but the logits are NOT rounded: loom keeps a vlm's
   logits in fp32 (src/model/tp_linear.c, loom_model_bf16_logits is 0 for a vlm), and its
   masked loss is fp32 over them (checked: the dumped logits are not all bf16 values);
 - each encoder block: qkv's output rounded before attention (the 2-D positions are added
   to the patch embedding before the blocks, no RoPE); bidirectional attention of the
   rounded q, k, v whose backward takes D from the rounded O (BidirAttentionBF16, the
   non-causal twin of AttentionBF16, whose backward it inherits); fc1's output rounded
   before GELU (tanh), whose forward and backward read the rounded value;
 - the projector: only its two linears round; its GELU reads fc1's fp32 output;
 - each rounding's backward passes the gradient through unchanged; everything else
   (LayerNorm, RMSNorm, residuals, softmax, positions, the token embedding, the masked
   loss, AdamW on fp32 master weights) unrounded.
These are the places src/model/vlm.c rounds (encoder_forward: loom_model_round_pre after
the qkv GEMM (widened: attention reads the rounded values), after attention and after fc1
(the bf16 GELU kernels read the kept bits); the projector's GELU reads h1 in fp32), with
the decoder of src/model/transformer.c; the patch embedding is the backend's fp32-signature
linear, which under bf16 rounds its operands like every other (src/kernels/cpu/
backend_cpu_bf16.c: linear_forward, linear_backward_weight; its input gradient is not
computed). The GEMMs here run widened on a CPU without AVX512-BF16 (the start-up line
says which): the same rounding places.

Self-check first: with bf16() made the identity the rounding reference must equal the
plain vlm_torch model (logits, loss and gradients to 1e-12), so the patched attention's
hand-written backward and the wiring are right.

Data: a shard of 0-, 1- and 2-image samples (up to max_images) with random answer masks
(test_vlm_vs_torch.make_samples), and a loom seed chosen so that step 1 trains on samples
with 0, 1 and 2 images: loom draws record k of step s as sample philox_u64(seed, "data",
s, k) mod n (src/data/vlm_shard.c), re-implemented in tests/ckpt/test_export.py; the
dumped records (tokens.safetensors) are the reference's input and the check that step 1
held all three kinds.

Checks, for three drawn configurations (0: test_vlm_vs_torch.draw's sizes; 1 and 2 wider,
draw_wide: more rows per sum and more roundings, so rounding flips occur; each 3 steps,
warmup + cosine, weight decay, clipping (sometimes off), 1-3 accumulated micro-batches):
the step-1 logits of micro-batch 1 (fp32: not all bf16 values), the step-1 loss, every
step-1 parameter gradient (per tensor) and the whole step-1 gradient, the loss of every
step, with test_bf16_vs_torch's tolerances: max(1e-3, 5 x the larger of the two fp32
draws' errors) for logits, losses and the whole gradient, max(1e-3, 8 x the draws) per
tensor, and each gradient bound also admits 3/4 of the rounding's effect on that tensor
(plain float64 against the rounding reference). Then the sensitivity checks:
 - loom's step-1 gradients are further from the plain float64 reference (no rounding)
   than from the rounding one (the worst tensor, and the whole gradient);
 - the encoder's own roundings are seen: against a reference that rounds everything but
   the encoder blocks' qkv, attention-output and fc1 places ("without them"), on the
   encoder's gradients (vision.*);
 - the projector's GELU input is not rounded: against a reference that rounds it too.
Distances alone do not separate these reliably once flips occur. The encoder's roundings
move the encoder's gradients (as one vector) by 3.5e-5 to 6.1e-3 (seeds 1-32): in the
small configurations most of that vector's norm is the gradients of the patch embedding,
of the residual-stream biases (patch embedding, out-proj, fc2) and of the final norm,
which they barely move (1e-8 to 1e-6: the next rounding absorbs their change). Yet a run
with a flip or two puts loom up to 5e-4 from the float64 reference, and a flip of the
float64 reference's own (a rounding where its value and fp32's straddle a bf16 midpoint)
can move it by 2.2e-3 from every fp32 computation (seed 17, configuration 2: loom 2.19e-3
from the float64 reference and 2.25e-3 from the one without the encoder's roundings, a
ratio of 1.03; loom and both fp32 draws within 1.3e-4 of each other). So each is checked
by where loom lies along the line between the two references: the least-squares c in
loom - ref = c (alt - ref), every tensor scaled by 1 / ||ref|| (0: at the full rounding
reference, 1: at the alternative), on three lines, both ends computed alike in each:
float64, fp32, fp32 with every rounding linear's sum reversed; the median of the three c
must be < 0.5 (one line whose reference had a flip of its own does not decide). Flip
noise is spread over every direction and has little component along one line. Each check
also shows it can fail: the alternative computed by PyTorch in fp32 with a fourth sum
order (each rounding linear's contraction in two halves) put in loom's place must give a
median c >= 0.5. (The no-rounding alternative has no such control: its fp32 runs use
torch's own linear, whatever the order; its distance check is test_bf16_vs_torch's.)
Over seeds 1-32 (three configurations each) loom's median c was at most 0.097 (the
encoder's roundings), 0.053 (the projector's GELU) and 0.007 (no rounding); single lines
reached 0.515 (seed 17, configuration 2, the float64 line; its fp32 lines 0.005); the
control's median was at least 0.835 (the encoder's roundings) and 0.804 (the projector's).

Usage: /usr/bin/python3 tests/reference/test_vlm_bf16_vs_torch.py --loom build/loom
       [--seed S] [--keep]
Exit 0 when every check passed, 1 otherwise (the seed is printed at the start and on a
failure; --seed S repeats a run).
"""

import argparse
import math
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "harness"))
sys.path.insert(0, os.path.join(HERE, "..", "ckpt"))
import loomtest  # noqa: E402
import safetensors_io  # noqa: E402
import test_bf16_vs_torch as b16  # noqa: E402  (BF16Linear, AttentionBF16, RoundOut, bf16, mm)
import test_export  # noqa: E402  (philox_u64: loom's data order)
import test_vlm_vs_torch as tvt  # noqa: E402  (samples, shard, command line)
import test_vs_torch as lm  # noqa: E402  (rel_norm, rel_scalar, read_metrics)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_model as tm  # noqa: E402
import vlm_torch as vt  # noqa: E402

TOL = b16.TOL
FP32_SLACK = b16.FP32_SLACK
TENSOR_SLACK = b16.TENSOR_SLACK
EFFECT_SHARE = b16.EFFECT_SHARE
STEPS = 3
CONFIGS = 3  # 0: test_vlm_vs_torch.draw's sizes; 1, 2: draw_wide's
ALONG_MAX = 0.5  # loom nearer the rounding reference than an alternative (the docstring)
LOOM_TIMEOUT = 300


# ---------------------------------------------------------------- the rounding reference

def vit_attention_bf16(self, x):
    """vlm_torch.ViTAttention.forward with attention through BidirAttentionBF16."""
    n, P, D = x.shape
    q, k, v = self.qkv(x).split(D, dim=-1)
    q, k, v = (t.reshape(n, P, self.H, self.hd).transpose(1, 2) for t in (q, k, v))
    y = b16.BidirAttentionBF16.apply(q, k, v)
    return self.proj(y.transpose(1, 2).reshape(n, P, D))


def vit_mlp_bf16(self, x):
    """vlm_torch.ViTMLP.forward with fc1's output rounded before GELU."""
    return self.fc2(F.gelu(b16.RoundOut.apply(self.fc1(x)), approximate="tanh"))


def encode_round_projector(self, images):
    """vlm_torch.VLM.encode with the projector's GELU input rounded too (not loom's: the
    alternative of the projector's sensitivity check)."""
    vc = self.vc
    gh, gw = vc.grid
    x = self.vision.patch_embed(vt.patchify(images, vc.patch))
    x = x + torch.as_tensor(vt.positions(vc.d_model, gh, gw), dtype=x.dtype)
    for b in self.vision.blocks:
        x = b(x)
    x = self.vision.norm(x)
    h = b16.RoundOut.apply(self.projector.fc1(x))
    return self.projector.fc2(F.gelu(h, approximate="tanh"))


_plain = {"linear": F.linear, "attention": tm.causal_attention,
          "llama_attention": tm.LlamaAttention.forward,
          "llama_mlp": tm.LlamaMLP.forward, "vit_attention": vt.ViTAttention.forward,
          "vit_mlp": vt.ViTMLP.forward, "encode": vt.VLM.encode}


class rounding:
    """Inside: loom's bf16 rounding places (the docstring). encoder=False leaves out the
    encoder blocks' own places (qkv, attention's output, fc1's output; its linears still
    round); projector_gelu=True also rounds the projector's GELU input (not loom's)."""

    def __init__(self, encoder=True, projector_gelu=False):
        self.encoder, self.projector_gelu = encoder, projector_gelu

    def __enter__(self):
        F.linear = b16.bf16_linear
        tm.causal_attention = b16.attention_bf16
        tm.LlamaAttention.forward = b16.llama_attention_forward_bf16
        tm.LlamaMLP.forward = b16.llama_mlp_forward_bf16
        if self.encoder:
            vt.ViTAttention.forward = vit_attention_bf16
            vt.ViTMLP.forward = vit_mlp_bf16
        if self.projector_gelu:
            vt.VLM.encode = encode_round_projector

    def __exit__(self, *exc):
        F.linear = _plain["linear"]
        tm.causal_attention = _plain["attention"]
        tm.LlamaAttention.forward = _plain["llama_attention"]
        tm.LlamaMLP.forward = _plain["llama_mlp"]
        vt.ViTAttention.forward = _plain["vit_attention"]
        vt.ViTMLP.forward = _plain["vit_mlp"]
        vt.VLM.encode = _plain["encode"]


def split_mm(a, b):
    """a @ b as two half contractions added: the same products, other fp32 partial sums."""
    h = a.shape[-1] // 2
    return a @ b if h == 0 else a[..., :h] @ b[:h] + a[..., h:] @ b[h:]


class order:
    """Inside: every rounding linear's sum in another order: "r" reversed (test_bf16_vs_
    torch's second draw), "s" split in two halves (a third draw), None as is."""

    def __init__(self, how):
        self.how = how

    def __enter__(self):
        self.mm = b16.mm
        b16.REVERSE_SUMS[0] = self.how == "r"
        if self.how == "s":
            b16.mm = split_mm

    def __exit__(self, *exc):
        b16.REVERSE_SUMS[0] = False
        b16.mm = self.mm


# arithmetic name -> (dtype, order): the references' three, and a fourth for the control
ARITHMETIC = {"64": (torch.float64, None), "32": (torch.float32, None),
              "32r": (torch.float32, "r"), "32s": (torch.float32, "s")}
LINES = ("64", "32", "32r")


# ---------------------------------------------------------------- training (loom's math)

def train(model, t, batches, dims, steps, on_step):
    """tm.train_step's loop on vlm records: batches[s] is step s's list of G records
    (tokens, weights, n_images, pixels); each micro-batch's loss is vlm_torch.loss_of
    (normalised by G x T). on_step(s, logits0) after backward, before clipping."""
    T, P, vc = dims
    G, M = t.global_batch, t.micro_batch
    opt = tm.make_optimizer(model, t)
    params = [p for group in opt.param_groups for p in group["params"]]
    seen = []
    hook = model.register_forward_hook(lambda mod, inp, out: seen.append(out.detach()))
    hist = []
    try:
        for s in range(steps):
            opt.zero_grad(set_to_none=False)
            loss_sum, logits0 = 0.0, None
            for k in range(G // M):
                seen.clear()
                loss = vt.loss_of(model, batches[s][k * M:(k + 1) * M], T, P, vc, G)
                loss.backward()
                loss_sum += loss.item()
                if k == 0:
                    logits0 = seen[0]
            for p in params:  # an encoder without an image in the step: zero, as loom's
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            on_step(s, logits0)
            if t.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, t.grad_clip)
            lr = tm.lr_at(t, s)
            for group in opt.param_groups:
                group["lr"] = lr
            opt.step()
            hist.append(loss_sum)
    finally:
        hook.remove()
    return hist


def reference(cfg, vc, t, init, batches, emulate, dtype=torch.float64, steps=STEPS,
              **round_kw):
    """-> (losses per step, {"logits": step-1 micro-batch-1 logits, "grads": step 1})."""
    model = vt.VLM(cfg, vc).to(dtype)
    tm.load_params(model, init)
    snap = {}

    def on_step(s, logits0):
        if s == 0:
            snap["logits"] = logits0.double().numpy().copy()
            snap["grads"] = {n: p.grad.double().numpy().copy()
                             for n, p in model.named_parameters()}

    dims = (cfg.seq_len, vc.image_tokens, vc)
    if emulate:
        with rounding(**round_kw):
            hist = train(model, t, batches, dims, steps, on_step)
    else:
        hist = train(model, t, batches, dims, steps, on_step)
    return hist, snap


def self_check(cfg, vc, t, init, batches):
    """With bf16() the identity the rounding reference is the plain model (to 1e-12)."""
    plain = reference(cfg, vc, t, init, batches, emulate=False, steps=1)
    saved = b16.bf16
    b16.bf16 = lambda x: x
    try:
        ident = reference(cfg, vc, t, init, batches, emulate=True, steps=1)
    finally:
        b16.bf16 = saved
    err = max([lm.rel_norm(ident[1]["logits"], plain[1]["logits"]),
               lm.rel_scalar(ident[0][0], plain[0][0])] +
              [lm.rel_norm(ident[1]["grads"][n], plain[1]["grads"][n])
               for n in plain[1]["grads"] if np.any(plain[1]["grads"][n])])
    loomtest.check(err <= 1e-12, f"  self-check: the rounding reference with bf16() the "
                                 f"identity is the plain model ({err:.1e} <= 1e-12)")


# ---------------------------------------------------------------- configurations and data

def draw_wide(rng):
    """test_vlm_vs_torch.draw's shape, wider: 2x2 to 4x4 patch grids, encoder width 8-64,
    decoder width 16-64, longer sequences (more rows a sum, more roundings a step)."""
    p = rng.choice([2, 3, 4])
    Hv = rng.randint(1, 4)
    vc = vt.VitConfig(patch=p, height=p * rng.randint(2, 4), width=p * rng.randint(2, 4),
                      channels=rng.choice([1, 3]), n_layer=rng.randint(1, 2), n_head=Hv,
                      d_model=Hv * rng.choice([8, 12, 16]), d_ff=rng.randint(24, 100))
    H = rng.choice([2, 4])
    KV = rng.choice([k for k in (1, 2, 4) if H % k == 0])
    max_images = rng.randint(2, 3)
    cfg = tm.Config(family="llama", n_layer=rng.randint(1, 2), n_head=H, n_kv_head=KV,
                    d_model=H * rng.choice([8, 10, 14, 16]), d_ff=rng.randint(30, 120),
                    vocab_size=rng.randint(258, 300),
                    seq_len=max_images * vc.image_tokens + rng.randint(8, 24))
    return cfg, vc, {"max_images": max_images, "freeze": "", "seed": 0}


def draw_config(rng, index):
    """Configuration 0: test_vlm_vs_torch.draw's model; else draw_wide's. No freezing, 2-3
    image slots, >= 3 records a step (0, 1 and 2 images in step 1), and test_vs_torch's
    training draw."""
    cfg, vc, o = tvt.draw(rng) if index == 0 else draw_wide(rng)
    o["freeze"] = ""
    if o["max_images"] < 2:  # the sequence grows by the added slots' tokens
        cfg.seq_len += (2 - o["max_images"]) * vc.image_tokens
        o["max_images"] = 2
    o["micro"], accum = rng.choice([(3, 1), (1, 3), (2, 2), (3, 2)])
    o["G"] = o["micro"] * accum
    o["n_samples"] = rng.randint(6, 10)
    lr = 10 ** rng.uniform(-3, -2.3)
    t = tm.TrainConfig(
        steps=STEPS, micro_batch=o["micro"], global_batch=o["G"], lr=lr,
        min_lr=lr * rng.choice([0.0, 0.1]), warmup_steps=rng.randint(0, 2),
        weight_decay=rng.choice([0.01, 0.1]),
        grad_clip=0.0 if rng.random() < 0.2 else round(10 ** rng.uniform(-0.8, 0.3), 4),
        beta1=rng.choice([0.9, 0.8]), beta2=rng.choice([0.95, 0.999]),
        adam_eps=rng.choice([1e-6, 1e-5]))
    return cfg, vc, o, t


def kind(tokens, weights, n):
    """A record's image count when the loss sees all of its images (an answer target read
    at or after its last image row), else None."""
    slots = np.flatnonzero(np.asarray(tokens[:len(weights)]) == vt.SLOT)
    last = int(slots[-1]) if n and len(slots) else 0
    return n if np.any(np.asarray(weights)[last:]) else None


def sample_kind(sample, cfg, vc, o):
    T, P, S = cfg.seq_len, vc.image_tokens, vc.channels * vc.height * vc.width
    seq, w, _ = vt.expand(sample[0], sample[1], sample[2], tvt.IMAGE, tvt.EOT, T, P,
                          o["max_images"], S)
    return kind(seq, w, len(sample[2]))


def make_samples(rng, cfg, vc, o):
    """test_vlm_vs_torch's random samples (random answer masks), drawn again until samples
    with 0, 1 and 2 images occur whose loss sees their images."""
    while True:
        samples = tvt.make_samples(rng, cfg, vc, o)
        if {0, 1, 2} <= {sample_kind(x, cfg, vc, o) for x in samples}:
            return samples


def loom_seed_for(rng, samples, cfg, vc, o):
    """A --seed whose step-1 records (philox_u64(seed, "data", 0, k) mod n) hold samples
    with 0, 1 and 2 images (whose loss sees their images)."""
    kinds = [sample_kind(x, cfg, vc, o) for x in samples]
    while True:
        seed = rng.randint(1, 2**31 - 1)
        idx = [test_export.philox_u64(seed, test_export.DATA_STREAM, 0, k) % len(samples)
               for k in range(o["G"])]
        if {0, 1, 2} <= {kinds[i] for i in idx}:
            return seed


def command(loom, cfg, vc, o, t, data, out):
    """test_vlm_vs_torch.command with STEPS steps, the drawn training flags and bf16."""
    cmd = tvt.command(loom, cfg, vc, o, data, out)
    flags = {"--steps": t.steps, "--lr": repr(t.lr), "--warmup-steps": t.warmup_steps,
             "--min-lr": repr(t.min_lr), "--weight-decay": t.weight_decay,
             "--grad-clip": t.grad_clip, "--beta1": t.beta1, "--beta2": t.beta2,
             "--adam-eps": t.adam_eps, "--precision": "bf16"}
    for flag, value in flags.items():
        if flag in cmd:
            cmd[cmd.index(flag) + 1] = str(value)
        else:
            cmd += [flag, str(value)]
    return cmd


def read_records(path, cfg, vc, o, steps):
    """tokens.safetensors -> per step, the G records (tokens, weights, n_images, pixels)
    as loom trained on them (its fp32 pixels and weights)."""
    T, S = cfg.seq_len, vc.channels * vc.height * vc.width
    words = 2 * T + 2 + o["max_images"] * S
    recs = safetensors_io.load(path)["tokens"].reshape(steps, o["G"], words)
    out = []
    for s in range(steps):
        step = []
        for r in recs[s]:
            r = np.ascontiguousarray(r)
            step.append((r[:T + 1].astype(np.int64),
                         r[T + 1:2 * T + 1].view(np.float32).astype(np.float64),
                         int(r[2 * T + 1]),
                         r[2 * T + 2:].view(np.float32).reshape(o["max_images"], S)
                         .astype(np.float64)))
        out.append(step)
    return out


# ---------------------------------------------------------------- one configuration

def whole(g, names):
    return np.concatenate([np.asarray(g[n], dtype=np.float64).ravel() for n in names])


def along(g, ref, alt, names):
    """Where g lies along the line from ref (0) to alt (1): the least-squares c of
    g - ref = c (alt - ref), each tensor scaled by 1 / ||ref||."""
    names = [n for n in names if np.any(ref[n])]
    if not names:  # nothing to place (no gradient reached these tensors): fails the check
        return math.inf

    def rel(x):
        return np.concatenate([(np.asarray(x[n], dtype=np.float64) - ref[n]).ravel() /
                               np.linalg.norm(ref[n]) for n in names])

    a, b = rel(g), rel(alt)
    return float(a @ b / max(b @ b, 1e-300))


def run_config(args, cfg, vc, o, t, rng, work):
    samples = make_samples(rng, cfg, vc, o)
    o["seed"] = loom_seed_for(rng, samples, cfg, vc, o)
    data = os.path.join(work, "train_000000.bin")
    tvt.write_shard(data, samples, vc)
    out = os.path.join(work, "out")
    os.makedirs(out)
    cmd = command(args.loom, cfg, vc, o, t, data, out)
    print(f"  {shlex.join(cmd)}", flush=True)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=LOOM_TIMEOUT)
    except OSError as e:  # not runnable (a binary being relinked): a failure, said so
        loomtest.check(False, f"  loom train runs ({e})")
        return
    if not loomtest.check(p.returncode == 0, f"  loom train --family vlm --precision bf16 "
                          f"exits 0 (exit {p.returncode}: {p.stderr.strip().splitlines()[-3:]})"):
        return
    loomtest.check(loomtest.bf16_gemms(p.stderr) is not None,
                   f"  the start-up line names the bf16 GEMM implementation "
                   f"({loomtest.bf16_gemms(p.stderr)})")
    batches = read_records(os.path.join(out, "tokens.safetensors"), cfg, vc, o, t.steps)
    kinds = {kind(r[0], r[1], r[2]) for r in batches[0]} - {None}
    loomtest.check({0, 1, 2} <= kinds, f"  step 1 trains on samples with {sorted(kinds)} "
                                       f"images whose loss sees them (0, 1 and 2 wanted)")
    init = safetensors_io.load(os.path.join(out, "params_init.safetensors"))
    logits_l = safetensors_io.load(os.path.join(out, "logits_step1.safetensors"))["logits"]
    grads_l = safetensors_io.load(os.path.join(out, "grads_step1.safetensors"))
    metrics = lm.read_metrics(os.path.join(out, "metrics.jsonl"))

    self_check(cfg, vc, t, init, batches)
    hist, snap = reference(cfg, vc, t, init, batches, emulate=True)
    with order(None):
        hist32, snap32 = reference(cfg, vc, t, init, batches, emulate=True,
                                   dtype=torch.float32)
    with order("r"):
        hist32r, snap32r = reference(cfg, vc, t, init, batches, emulate=True,
                                     dtype=torch.float32)
    # the sensitivity checks' alternatives (step 1) in the full reference's three
    # arithmetics (LINES), and dec and proj in a fourth (the control, "32s")
    full, alts = {"64": snap, "32": snap32, "32r": snap32r}, {}
    for a, (dtype, how) in ARITHMETIC.items():
        with order(how):
            alts[a] = {"dec": reference(cfg, vc, t, init, batches, True, dtype, steps=1,
                                        encoder=False)[1],
                       "proj": reference(cfg, vc, t, init, batches, True, dtype, steps=1,
                                         projector_gelu=True)[1]}
            if a in LINES:
                alts[a]["plain"] = reference(cfg, vc, t, init, batches, False, dtype,
                                             steps=1)[1]
    plain = alts["64"]["plain"]

    def placed(g, alt, names):
        """along() on each line: g between the full reference (0) and alt (1)."""
        return {a: along(g, full[a]["grads"], alts[a][alt]["grads"], names) for a in LINES}

    def said(c):
        return ", ".join(f"{a} {v:.3f}" for a, v in c.items())

    def tol(err32):
        return max(TOL, FP32_SLACK * err32)

    def draws(get):  # the larger of the two fp32 draws' errors
        return max(get(snap32, hist32), get(snap32r, hist32r))

    # logits: fp32 (not rounded), within tolerance
    lg = np.asarray(logits_l, dtype=np.float32)
    widened = torch.from_numpy(lg).to(torch.bfloat16).to(torch.float32).numpy()
    share = float(np.mean(widened == lg))
    loomtest.check(share < 0.5, f"  the logits are fp32, not rounded to bf16 ({share:.1%} of "
                                f"them bf16 values)")
    e_logits = lm.rel_norm(logits_l, snap["logits"])
    t_logits = tol(draws(lambda s, h: lm.rel_norm(s["logits"], snap["logits"])))
    loomtest.check(e_logits <= t_logits, f"  logits step 1: {e_logits:.2e} <= {t_logits:.1e}")
    e_loss1 = lm.rel_scalar(metrics[0]["loss"], hist[0])
    t_loss1 = tol(draws(lambda s, h: lm.rel_scalar(h[0], hist[0])))
    loomtest.check(e_loss1 <= t_loss1, f"  loss step 1: loom {metrics[0]['loss']:.7f} ref "
                                       f"{hist[0]:.7f} ({e_loss1:.2e} <= {t_loss1:.1e})")

    # gradients of step 1: per tensor and whole
    names = sorted(snap["grads"])
    loomtest.check(set(grads_l) == set(names), f"  loom's gradients are the reference's "
                                               f"{len(names)} tensors")
    if set(grads_l) != set(names):
        return
    ref_g = snap["grads"]
    errs = {n: lm.rel_norm(grads_l[n], ref_g[n]) for n in names}

    def effect(n):  # how far rounding moves tensor n at all
        return lm.rel_norm(plain["grads"][n], ref_g[n])

    tols = {n: max(TOL, TENSOR_SLACK * draws(lambda s, h: lm.rel_norm(s["grads"][n], ref_g[n])),
                   EFFECT_SHARE * effect(n)) for n in names}
    e_whole = lm.rel_norm(whole(grads_l, names), whole(ref_g, names))
    d_whole = draws(lambda s, h: lm.rel_norm(whole(s["grads"], names), whole(ref_g, names)))
    eff_whole = lm.rel_norm(whole(plain["grads"], names), whole(ref_g, names))
    t_whole = max(tol(d_whole), EFFECT_SHARE * eff_whole)
    loomtest.check(e_whole <= t_whole, f"  the whole step-1 gradient: {e_whole:.2e} <= "
                                       f"{t_whole:.1e} (fp32 draws {d_whole:.1e}, rounding's "
                                       f"effect {eff_whole:.1e})")
    worst = max(names, key=lambda n: errs[n] / tols[n])
    loomtest.check(errs[worst] <= tols[worst],
                   f"  gradients step 1 ({len(names)} tensors): worst {worst} "
                   f"{errs[worst]:.2e} <= {tols[worst]:.1e}")
    for part in ("vision.", "projector.", "model.", "lm_head"):
        pn = [n for n in names if n.startswith(part)]
        w = max(pn, key=lambda n: errs[n])
        print(f"    {part:10s} worst {w} {errs[w]:.2e} (tol {tols[w]:.1e})")

    # losses of every step
    e_losses = [lm.rel_scalar(float(metrics[s]["loss"]), hist[s]) for s in range(t.steps)]
    t_losses = [tol(draws(lambda sn, h: lm.rel_scalar(h[s], hist[s]))) for s in range(t.steps)]
    s = max(range(t.steps), key=lambda i: e_losses[i] / t_losses[i])
    loomtest.check(len(metrics) == t.steps and e_losses[s] <= t_losses[s],
                   f"  losses of {t.steps} steps: worst step {s + 1} {e_losses[s]:.2e} "
                   f"<= {t_losses[s]:.1e}")

    # sensitivity: the rounding is seen
    p_errs = {n: lm.rel_norm(grads_l[n], plain["grads"][n]) for n in names}
    p_worst = max(p_errs.values())
    loomtest.check(p_worst > errs[worst],
                   f"  sensitivity: against the reference without rounding the worst gradient "
                   f"error is {p_worst:.2e} (> {errs[worst]:.2e})")
    p_whole = lm.rel_norm(whole(grads_l, names), whole(plain["grads"], names))
    c = placed(grads_l, "plain", names)
    loomtest.check(p_whole > e_whole and np.median(list(c.values())) < ALONG_MAX,
                   f"  sensitivity: the whole gradient against the reference without rounding "
                   f"{p_whole:.2e} (> {e_whole:.2e}); along the line from the rounding "
                   f"reference to it at {said(c)} (median < {ALONG_MAX:g})")

    def placed_check(alt, names, line):
        c, f = placed(grads_l, alt, names), placed(alts["32s"][alt]["grads"], alt, names)
        loomtest.check(np.median(list(c.values())) < ALONG_MAX <= np.median(list(f.values())),
                       f"{line}; along that line at {said(c)} (median < {ALONG_MAX:g}; PyTorch "
                       f"fp32 that way, 4th sum order: {said(f)}, median >= {ALONG_MAX:g})")

    enc = [n for n in names if n.startswith("vision.")]
    e_enc = lm.rel_norm(whole(grads_l, enc), whole(ref_g, enc))
    d_enc = lm.rel_norm(whole(grads_l, enc), whole(alts["64"]["dec"]["grads"], enc))
    eff_enc = lm.rel_norm(whole(alts["64"]["dec"]["grads"], enc), whole(ref_g, enc))
    placed_check("dec", enc, f"  sensitivity: the encoder's own roundings (qkv, O, fc1) are "
                             f"seen: on the encoder's {len(enc)} gradients loom is {d_enc:.2e} "
                             f"from a reference without them and {e_enc:.2e} from the full one "
                             f"(they move it by {eff_enc:.2e})")
    j_all = lm.rel_norm(whole(grads_l, names), whole(alts["64"]["proj"]["grads"], names))
    placed_check("proj", names, f"  the projector's GELU reads fp32 (not rounded): the whole "
                                f"gradient is {j_all:.2e} from a reference that rounds it, "
                                f"{e_whole:.2e} from loom's")


def describe(cfg, vc, o, t):
    return (f"vit p{vc.patch} {vc.channels}x{vc.height}x{vc.width} L{vc.n_layer} "
            f"D{vc.d_model} H{vc.n_head} F{vc.d_ff} | llama L{cfg.n_layer} "
            f"H{cfg.n_head}/{cfg.n_kv_head} D{cfg.d_model} F{cfg.d_ff} V{cfg.vocab_size} "
            f"T{cfg.seq_len} | images<={o['max_images']} M{t.micro_batch} G{t.global_batch} "
            f"lr{t.lr:.2e} min{t.min_lr:.1e} wu{t.warmup_steps} wd{t.weight_decay} "
            f"clip{t.grad_clip} b{t.beta1}/{t.beta2} eps{t.adam_eps}")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loom", required=True)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the work folders")
    args = ap.parse_args()
    args.loom = os.path.abspath(args.loom)
    loomtest.check_loom(args.loom)
    seed = loomtest.seed_of(args)
    torch.set_num_threads(1)
    rng = random.Random(seed)
    for i in range(CONFIGS):
        cfg, vc, o, t = draw_config(rng, i)
        crng = random.Random(rng.randint(0, 2**31))
        print(f"\n[config {i}] {describe(cfg, vc, o, t)}", flush=True)
        work = tempfile.mkdtemp(prefix=f"loom_vlm_bf16_ref_{i}_")
        before = loomtest.failed()
        try:
            run_config(args, cfg, vc, o, t, crng, work)
        finally:
            if loomtest.failed() > before or args.keep:
                print(f"  kept {work} (seed {seed})")
            else:
                shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    loomtest.run_test(main)
