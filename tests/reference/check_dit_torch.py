#!/usr/bin/python3
"""Self-check of the DiT reference (dit_torch.py) itself; no loom needed, a few seconds.

test_dit_vs_torch.py is only as good as dit_torch.py, so this checks it against
independent code written straight from the spec:
- the forward pass of a tiny random model (image, video and a one-temporal-token video)
  against a naive float64 numpy version (loops over tokens and heads, patches gathered
  by the spec's index formulas, LayerNorm / GELU-tanh / SiLU / softmax spelled out);
- patchify == Conv2d/Conv3d with the 2-D x_embedder weight viewed as the conv weight,
  unpatchify == the spec's index formula, and the two orders composing to the identity;
- the 2-D sin-cos embedding == DiT's get_2d_sincos_pos_embed (numpy, meshgrid form,
  reimplemented here, extended to non-square grids as the spec says), the 3-D one ==
  CogVideoX's get_3d_sincos_pos_embed form with the spec's concat order;
- autograd gradients of the flow-matching loss vs central finite differences (float64);
- the loss / gradients independent of the micro-batch split, and the EMA recursion;
- the sampler on an analytic flow (Gaussian data: the exact ODE endpoint is known):
  Euler converges at order 1, Heun at order 2 and beats Euler; CFG's combination.
Run: /usr/bin/python3 tests/reference/check_dit_torch.py   (exit 0 ok, 1 on a failure)
"""

import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dit_torch as dt  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

FAILURES = []


def check(name, ok, detail):
    print(f"  {name:<62} {detail} {'ok' if ok else 'FAIL'}")
    if not ok:
        FAILURES.append(name)


# ---------------------------------------------------------------- DiT's published numpy code

def dit_1d_from_grid(embed_dim, pos):
    """DiT models.py get_1d_sincos_pos_embed_from_grid."""
    assert embed_dim % 2 == 0
    omega = np.arange(embed_dim // 2, dtype=np.float64)
    omega /= embed_dim / 2.0
    omega = 1.0 / 10000 ** omega
    pos = pos.reshape(-1)
    out = np.einsum("m,d->md", pos, omega)
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)


def dit_2d_from_grid(embed_dim, grid):
    assert embed_dim % 2 == 0
    emb_h = dit_1d_from_grid(embed_dim // 2, grid[0])  # grid[0] holds the w coordinates
    emb_w = dit_1d_from_grid(embed_dim // 2, grid[1])
    return np.concatenate([emb_h, emb_w], axis=1)


def dit_2d(embed_dim, grid_hw):
    """get_2d_sincos_pos_embed(embed_dim, grid_size) with grid_size = (h, w) (DiT uses h == w)."""
    gh, gw = grid_hw
    grid_h = np.arange(gh, dtype=np.float32)
    grid_w = np.arange(gw, dtype=np.float32)
    grid = np.meshgrid(grid_w, grid_h)  # here w goes first
    grid = np.stack(grid, axis=0).reshape([2, 1, gh, gw])
    return dit_2d_from_grid(embed_dim, grid)


def cogvideox_3d(embed_dim, gt, gh, gw, temporal_first):
    """CogVideoX's get_3d_sincos_pos_embed (interpolation scales 1); the concat order is
    the spec's unless temporal_first (CogVideoX's own)."""
    assert embed_dim % 4 == 0
    ds, dtm = embed_dim // 4 * 3, embed_dim // 4
    grid = np.meshgrid(np.arange(gw, dtype=np.float32), np.arange(gh, dtype=np.float32))
    grid = np.stack(grid, axis=0).reshape([2, 1, gh, gw])
    spatial = dit_2d_from_grid(ds, grid)
    temporal = dit_1d_from_grid(dtm, np.arange(gt, dtype=np.float32))
    spatial = np.repeat(spatial[np.newaxis], gt, axis=0)
    temporal = np.repeat(temporal[:, np.newaxis], gh * gw, axis=1)
    parts = [temporal, spatial] if temporal_first else [spatial, temporal]
    return np.concatenate(parts, axis=-1).reshape(-1, embed_dim)


# ---------------------------------------------------------------- naive numpy forward

def silu(x):
    return x / (1 + np.exp(-x))


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def ln(x):
    mu = x.mean()
    return (x - mu) / math.sqrt(((x - mu) ** 2).mean() + 1e-6)


def naive_patch_in(x, cfg, f, h, w):
    """The spec: vec[((c*pt+dt)*p+dy)*p+dx] = x[f*pt+dt][c][h*p+dy][w*p+dx]."""
    p, pt, C = cfg.patch, cfg.patch_t, cfg.channels
    vec = np.empty(cfg.patch_dim)
    for c in range(C):
        for d_t in range(pt):
            for dy in range(p):
                for dx in range(p):
                    vec[((c * pt + d_t) * p + dy) * p + dx] = x[f * pt + d_t, c, h * p + dy, w * p + dx]
    return vec


def naive_patch_out(vec, cfg, f, h, w, out):
    """The spec: vec[((dt*p+dy)*p+dx)*C+c] -> x[f*pt+dt][c][h*p+dy][w*p+dx]."""
    p, pt, C = cfg.patch, cfg.patch_t, cfg.channels
    for d_t in range(pt):
        for dy in range(p):
            for dx in range(p):
                for c in range(C):
                    out[f * pt + d_t, c, h * p + dy, w * p + dx] = vec[((d_t * p + dy) * p + dx) * C + c]


def naive_pos(cfg):
    """Per token and channel from the formulas (independent of both helpers above)."""
    gt, gh, gw = cfg.grid
    D = cfg.d_model

    def one_d(E, pos, j):
        half = E // 2
        return math.sin(pos / 10000 ** (j / half)) if j < half else \
            math.cos(pos / 10000 ** ((j - half) / half))

    out = np.zeros((cfg.n_tokens, D))
    for f in range(gt):
        for h in range(gh):
            for w in range(gw):
                i = (f * gh + h) * gw + w
                if gt == 1:
                    row = [one_d(D // 2, w, j) for j in range(D // 2)] + \
                          [one_d(D // 2, h, j) for j in range(D // 2)]
                else:
                    Ds, Dt = 3 * D // 4, D // 4
                    sp = [one_d(Ds // 2, w, j) for j in range(Ds // 2)] + \
                         [one_d(Ds // 2, h, j) for j in range(Ds // 2)]
                    tm_ = [one_d(Dt, f, j) for j in range(Dt)]
                    row = tm_ + sp if dt.VIDEO_TEMPORAL_FIRST else sp + tm_
                out[i] = row
    return out


def naive_forward(cfg, P, x, t, y):
    """v-hat [F, C, H, W] of one sample."""
    D, Hn, hd = cfg.d_model, cfg.n_head, cfg.head_dim
    gt, gh, gw = cfg.grid
    N = cfg.n_tokens
    pos = naive_pos(cfg)
    tok = np.zeros((N, D))
    for f in range(gt):
        for h in range(gh):
            for w in range(gw):
                i = (f * gh + h) * gw + w
                tok[i] = P["x_embedder.proj.weight"] @ naive_patch_in(x, cfg, f, h, w) \
                    + P["x_embedder.proj.bias"] + pos[i]
    half = 128
    args = [t * 1000.0 * math.exp(-math.log(10000.0) * j / half) for j in range(half)]
    temb = np.array([math.cos(a) for a in args] + [math.sin(a) for a in args])
    c = P["t_embedder.mlp.2.weight"] @ silu(P["t_embedder.mlp.0.weight"] @ temb
                                            + P["t_embedder.mlp.0.bias"]) \
        + P["t_embedder.mlp.2.bias"] + P["y_embedder.embedding_table.weight"][y]
    sc = silu(c)
    for li in range(cfg.n_layer):
        pre = f"blocks.{li}."
        mod = P[pre + "adaLN_modulation.1.weight"] @ sc + P[pre + "adaLN_modulation.1.bias"]
        sh_a, sc_a, g_a, sh_m, sc_m, g_m = (mod[k * D:(k + 1) * D] for k in range(6))
        qkv = np.stack([P[pre + "attn.qkv.weight"] @ (ln(tok[i]) * (1 + sc_a) + sh_a)
                        + P[pre + "attn.qkv.bias"] for i in range(N)])
        att = np.zeros((N, D))
        for i in range(N):
            for hh in range(Hn):
                q = qkv[i, hh * hd:(hh + 1) * hd]
                s = np.array([q @ qkv[j, D + hh * hd:D + (hh + 1) * hd] / math.sqrt(hd)
                              for j in range(N)])
                wts = np.exp(s - s.max())
                wts /= wts.sum()
                att[i, hh * hd:(hh + 1) * hd] = sum(wts[j] * qkv[j, 2 * D + hh * hd:2 * D + (hh + 1) * hd]
                                                    for j in range(N))
        for i in range(N):
            tok[i] = tok[i] + g_a * (P[pre + "attn.proj.weight"] @ att[i] + P[pre + "attn.proj.bias"])
            hmid = ln(tok[i]) * (1 + sc_m) + sh_m
            a = gelu_tanh(P[pre + "mlp.fc1.weight"] @ hmid + P[pre + "mlp.fc1.bias"])
            tok[i] = tok[i] + g_m * (P[pre + "mlp.fc2.weight"] @ a + P[pre + "mlp.fc2.bias"])
    fm = P["final_layer.adaLN_modulation.1.weight"] @ sc + P["final_layer.adaLN_modulation.1.bias"]
    shift, scale = fm[:D], fm[D:]
    out = np.zeros(cfg.sample_shape)
    for f in range(gt):
        for h in range(gh):
            for w in range(gw):
                i = (f * gh + h) * gw + w
                vec = P["final_layer.linear.weight"] @ (ln(tok[i]) * (1 + scale) + shift) \
                    + P["final_layer.linear.bias"]
                naive_patch_out(vec, cfg, f, h, w, out)
    return out


def random_model(cfg, seed):
    model = dt.build_model(cfg, torch.float64)
    dt.load_params(model, dt.random_weights(cfg, seed))
    with torch.no_grad():  # in float64, off the float32 grid
        g = torch.Generator().manual_seed(seed + 1)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 1e-3)
    return model


def random_inputs(cfg, B, seed):
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.standard_normal((B,) + cfg.sample_shape))
    t = torch.from_numpy(rng.uniform(0.02, 0.98, B))
    y = torch.from_numpy(rng.integers(0, cfg.n_classes + 1, B))
    return x, t, y


CFGS = {
    "image 2x3 tokens": dt.DiTConfig(n_layer=2, n_head=4, d_model=20, d_ff=37, patch=2,
                                     height=4, width=6, channels=3, n_classes=3),
    "image 3x1 tokens, C=1, p=3": dt.DiTConfig(n_layer=1, n_head=2, d_model=12, d_ff=25,
                                               patch=3, height=9, width=3, channels=1,
                                               n_classes=5),
    "video F=4 pt=2": dt.DiTConfig(n_layer=2, n_head=2, d_model=32, d_ff=40, patch=2,
                                   height=4, width=6, channels=2, n_classes=2, patch_t=2,
                                   frames=4),
    "video F=2 pt=2 (one temporal token)": dt.DiTConfig(n_layer=1, n_head=4, d_model=16, d_ff=20,
                                                        patch=2, height=4, width=4, channels=1,
                                                        n_classes=2, patch_t=2, frames=2),
    "video F=3 pt=1": dt.DiTConfig(n_layer=1, n_head=1, d_model=16, d_ff=16, patch=2,
                                   height=2, width=4, channels=1, n_classes=2, frames=3),
}


def check_forward():
    print("forward vs naive numpy (float64):")
    for i, (label, cfg) in enumerate(CFGS.items()):
        model = random_model(cfg, 10 + i)
        P = {n: p.detach().numpy() for n, p in model.named_parameters()}
        x, t, y = random_inputs(cfg, 2, 20 + i)
        got = model(x, t, y).detach().numpy()
        want = np.stack([naive_forward(cfg, P, x[b].numpy(), float(t[b]), int(y[b]))
                         for b in range(2)])
        err = np.abs(got - want).max() / np.abs(want).max()
        check(label, err < 1e-10 and np.abs(want).max() > 1e-3, f"max rel err {err:.1e}")
    # The model's parameter set is exactly the spec's list (and its count formula).
    cfg = CFGS["image 2x3 tokens"]
    names = dt.param_names(cfg)
    want = (["x_embedder.proj.weight", "x_embedder.proj.bias", "t_embedder.mlp.0.weight",
             "t_embedder.mlp.0.bias", "t_embedder.mlp.2.weight", "t_embedder.mlp.2.bias",
             "y_embedder.embedding_table.weight"]
            + [f"blocks.{i}.{s}" for i in range(cfg.n_layer) for s in
               ("attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
                "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias",
                "adaLN_modulation.1.weight", "adaLN_modulation.1.bias")]
            + ["final_layer.linear.weight", "final_layer.linear.bias",
               "final_layer.adaLN_modulation.1.weight", "final_layer.adaLN_modulation.1.bias"])
    n = sum(p.numel() for p in dt.DiT(cfg).parameters())
    check("parameter names and count", sorted(names) == sorted(want) and n == cfg.n_params(),
          f"{len(names)} tensors, {n} values")


def check_patches():
    print("patchify / unpatchify:")
    for label, cfg in CFGS.items():
        x = torch.from_numpy(np.random.default_rng(1).standard_normal((2,) + cfg.sample_shape))
        tok = dt.patchify(x, cfg)
        gt, gh, gw = cfg.grid
        naive = np.stack([[naive_patch_in(x[b].numpy(), cfg, f, h, w)
                           for f in range(gt) for h in range(gh) for w in range(gw)]
                          for b in range(2)])
        e1 = np.abs(tok.numpy() - naive).max()
        # The 2-D weight is the conv weight [D, C, (pt,) p, p] flattened.
        W = torch.from_numpy(np.random.default_rng(2).standard_normal((5, cfg.patch_dim)))
        if cfg.frames == 1:
            conv = F.conv2d(x[:, 0], W.view(5, cfg.channels, cfg.patch, cfg.patch),
                            stride=cfg.patch)  # [B, 5, gh, gw]
        else:
            conv = F.conv3d(x.transpose(1, 2), W.view(5, cfg.channels, cfg.patch_t, cfg.patch,
                                                        cfg.patch),
                            stride=(cfg.patch_t, cfg.patch, cfg.patch))  # [B, 5, gt, gh, gw]
        e2 = (conv.flatten(2).transpose(1, 2) - tok @ W.t()).abs().max().item()
        y = torch.from_numpy(np.random.default_rng(3).standard_normal((2, cfg.n_tokens,
                                                                       cfg.patch_dim)))
        img = dt.unpatchify(y, cfg).numpy()
        want = np.zeros((2,) + cfg.sample_shape)
        for b in range(2):
            i = 0
            for f in range(gt):
                for h in range(gh):
                    for w in range(gw):
                        naive_patch_out(y[b, i].numpy(), cfg, f, h, w, want[b])
                        i += 1
        e3 = np.abs(img - want).max()
        # (c, dt, dy, dx) -> (dt, dy, dx, c) then unpatchify: the identity.
        p, pt, C = cfg.patch, cfg.patch_t, cfg.channels
        perm = tok.reshape(2, cfg.n_tokens, C, pt, p, p).permute(0, 1, 3, 4, 5, 2)
        e4 = (dt.unpatchify(perm.reshape(2, cfg.n_tokens, -1), cfg) - x).abs().max().item()
        check(label, max(e1, e3, e4) == 0 and e2 < 1e-12,
              f"index {e1:.0e}/{e3:.0e}, conv {e2:.0e}, inverse {e4:.0e}")


def check_pos_embed():
    print("sin-cos position embeddings:")
    for D, gh, gw in ((8, 4, 4), (20, 3, 5), (64, 7, 2), (12, 1, 9)):
        got = dt.sincos_2d(D, gh, gw)
        want = dit_2d(D, (gh, gw))
        e = np.abs(got - want).max()
        check(f"2-D D={D} grid {gh}x{gw} == DiT numpy", e < 1e-12, f"max err {e:.0e}")
    for D, gt, gh, gw in ((16, 2, 3, 3), (48, 4, 5, 3)):
        for first in (False, True):
            got = dt.sincos_3d(D, gt, gh, gw, temporal_first=first)
            want = cogvideox_3d(D, gt, gh, gw, temporal_first=first)
            e = np.abs(got - want).max()
            check(f"3-D D={D} grid {gt}x{gh}x{gw} {'t|s' if first else 's|t'} == CogVideoX form",
                  e < 1e-12, f"max err {e:.0e}")
    for label in ("image 2x3 tokens", "video F=4 pt=2", "video F=2 pt=2 (one temporal token)"):
        cfg = CFGS[label]
        e = np.abs(dt.pos_embed(cfg) - naive_pos(cfg)).max()
        check(f"model embedding == per-token formula: {label}", e < 1e-12, f"max err {e:.0e}")
    # timestep embedding vs the formula (t*1000, cos then sin)
    t = torch.tensor([0.0, 0.37, 1.0], dtype=torch.float64)
    got = dt.timestep_embedding(t).numpy()
    j = np.arange(128)
    args = t.numpy()[:, None] * 1000 * np.exp(-math.log(10000) * j / 128)[None]
    e = np.abs(got - np.concatenate([np.cos(args), np.sin(args)], 1)).max()
    check("timestep embedding", e < 1e-12, f"max err {e:.0e}")


def check_gradients():
    print("autograd vs central finite differences (float64, flow-matching loss):")
    rng = np.random.default_rng(7)
    for label in ("image 2x3 tokens", "video F=4 pt=2"):
        cfg = CFGS[label]
        model = random_model(cfg, 30)
        x0, t, y = random_inputs(cfg, 3, 31)
        noise = torch.from_numpy(rng.standard_normal(x0.shape))
        model.zero_grad()
        loss, _ = dt.flow_loss(model, x0, noise, t, y)
        loss.backward()
        worst, n = 0.0, 0
        for name, p in model.named_parameters():
            for _ in range(2):
                idx = tuple(int(rng.integers(s)) for s in p.shape)
                old = p.data[idx].item()
                vals = []
                for sgn in (1, -1):
                    p.data[idx] = old + sgn * 1e-6
                    with torch.no_grad():
                        vals.append(dt.flow_loss(model, x0, noise, t, y)[0].item())
                p.data[idx] = old
                fd = (vals[0] - vals[1]) / 2e-6
                g = p.grad[idx].item()
                worst = max(worst, abs(fd - g) / max(abs(g), 1e-4))
                n += 1
        check(f"{label}: {n} elements over every tensor", worst < 1e-5, f"worst rel {worst:.1e}")


def check_training():
    print("training loop:")
    cfg = CFGS["image 2x3 tokens"]
    rng = np.random.default_rng(11)
    steps, G = 3, 6
    flow = {"x0": rng.uniform(-1, 1, (steps, G) + cfg.sample_shape),
            "noise": rng.standard_normal((steps, G) + cfg.sample_shape),
            "t": rng.uniform(0, 1, (steps, G)),
            "labels": rng.integers(0, cfg.n_classes + 1, (steps, G))}
    base = random_model(cfg, 40)
    runs = []
    for micro in (1, 2, 6):
        m = dt.build_model(cfg, torch.float64)
        m.load_state_dict(base.state_dict())
        tc = dt.DiTTrainConfig(steps=steps, micro_batch=micro, global_batch=G, lr=3e-3,
                               warmup_steps=1, ema_decay=0.7)
        snap = {}

        def on_step(s, info, m=m, snap=snap):
            if s == 0:
                snap.update({n: p.grad.clone() for n, p in m.named_parameters()})

        hist, ema = dt.train(m, tc, flow, on_step)
        runs.append((hist, snap, {n: p.detach().clone() for n, p in m.named_parameters()}, ema))
    h0, g0, p0, _ = runs[0]
    e0 = runs[2][3]  # the EMA of the one-micro-batch run (replayed by hand below)
    diff = 0.0
    for h, g, p, e in runs[1:]:
        diff = max(diff, max(abs(a["loss"] - b["loss"]) for a, b in zip(h, h0)))
        diff = max(diff, max(float((g[n] - g0[n]).abs().max()) for n in g0))
        diff = max(diff, max(float((p[n] - p0[n]).abs().max()) for n in p0))
    check("micro-batch split 1/2/6 invariance (3 steps)", diff < 1e-11, f"max abs diff {diff:.1e}")
    # The loss is the plain mean over every element of the global batch.
    m = dt.build_model(cfg, torch.float64)
    m.load_state_dict(base.state_dict())
    x0, noise, t, y = dt.as_batch(flow, 0, torch.float64)
    with torch.no_grad():
        xt = (1 - t)[:, None, None, None, None] * x0 + t[:, None, None, None, None] * noise
        want = ((m(xt, t, y) - (noise - x0)) ** 2).mean().item()
    check("step-1 loss == mean squared error", abs(want - h0[0]["loss"]) < 1e-12 * want,
          f"{h0[0]['loss']:.6f}")
    # EMA recursion by hand: replay the 3 steps, averaging the weights after each.
    m = dt.build_model(cfg, torch.float64)
    m.load_state_dict(base.state_dict())
    tc = dt.DiTTrainConfig(steps=steps, micro_batch=6, global_batch=G, lr=3e-3,
                           warmup_steps=1, ema_decay=0.7)
    opt = dt.make_optimizer(m, tc)
    hand = {n: p.detach().clone() for n, p in m.named_parameters()}
    junk = {n: p.detach().clone() for n, p in m.named_parameters()}
    for s in range(steps):
        dt.train_step(m, opt, junk, tc, dt.as_batch(flow, s, torch.float64), s)
        hand = {n: 0.7 * hand[n] + 0.3 * p.detach() for n, p in m.named_parameters()}
    e = max(float((hand[n] - e0[n]).abs().max()) for n in hand)
    moved = max(float((e0[n] - base.state_dict()[n]).abs().max()) for n in hand)
    check("EMA = d*ema + (1-d)*param after each step", e < 1e-14 and moved > 1e-4,
          f"max abs diff {e:.1e}")
    decay = {n for g in opt.param_groups if g["weight_decay"] > 0 for n, p in m.named_parameters()
             if any(p is q for q in g["params"])}
    check("decay set = every 2-D tensor", decay == {n for n, p in m.named_parameters()
                                                   if p.ndim == 2}, f"{len(decay)} tensors")


def check_sampler():
    print("sampler on an analytic flow (data N(mu, s^2), noise N(0, 1)):")
    # x_t = (1-t) x0 + t eps -> x_t ~ N((1-t) mu, sig_t^2), sig_t^2 = (1-t)^2 s^2 + t^2; the
    # ODE velocity is v = -mu + sig_t'/sig_t (x - (1-t) mu) and x(1) = z -> x(0) = mu + s z.
    s2 = 0.3 ** 2

    def vel(mu):
        def v(x, t):
            sig2 = (1 - t) ** 2 * s2 + t ** 2
            return -mu + (t - (1 - t) * s2) / sig2 * (x - (1 - t) * mu)
        return v

    z = torch.from_numpy(np.random.default_rng(5).standard_normal(64))
    mu = torch.from_numpy(np.random.default_rng(6).uniform(-1, 1, 64))
    exact = mu + 0.3 * z
    errs = {}
    for solver in ("euler", "heun"):
        errs[solver] = [float((dt.integrate(vel(mu), z.clone(), n, solver) - exact).abs().max())
                        for n in (8, 16, 32, 64)]
    oe = [math.log2(a / b) for a, b in zip(errs["euler"], errs["euler"][1:])]
    oh = [math.log2(a / b) for a, b in zip(errs["heun"], errs["heun"][1:])]
    check("Euler converges at order 1", 0.8 < oe[-1] < 1.2,
          f"errors {['%.1e' % e for e in errs['euler']]}")
    check("Heun converges at order 2", 1.8 < oh[-1] < 2.2,
          f"errors {['%.1e' % e for e in errs['heun']]}")
    check("Heun beats Euler at every step count",
          all(h < e / 4 for h, e in zip(errs["heun"], errs["euler"])), "")
    # CFG: the velocity is affine in mu, so guiding between mu_u and mu_c samples the
    # Gaussian around mu_u + w (mu_c - mu_u).
    mu_u = torch.zeros(64, dtype=torch.float64)

    class Fake:
        """Stands in for the model: class label n_classes (= 1 here) is the null class."""
        cfg = type("C", (), {"null_class": 1})()

        def __call__(self, x, t, y):
            rows = [vel(mu if int(y[b]) == 0 else mu_u)(x[b], float(t[b])) for b in range(len(y))]
            return torch.stack(rows)

    v = dt.guided_velocity(Fake(), torch.zeros(2, dtype=torch.long), 1, 3.0)
    x = dt.integrate(v, torch.stack([z, z]), 256, "heun")
    e = float((x - (mu_u + 3.0 * (mu - mu_u) + 0.3 * z)).abs().max())
    check("CFG v = vu + w (vc - vu), vu from the null class", e < 1e-4, f"max err {e:.1e}")


def main():
    torch.set_num_threads(2)
    FAILURES.clear()
    check_forward()
    check_patches()
    check_pos_embed()
    check_gradients()
    check_training()
    check_sampler()
    print(f"check_dit_torch: {len(FAILURES)} failed" + (f": {FAILURES}" if FAILURES else ""))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
