"""PyTorch reference for loom's `dit` family: DiT + rectified-flow training + the sampler.

Written from /work/dit_spec.md (which follows facebookresearch/DiT models.py), with
parameter names exactly DiT's, so loom's safetensors dumps load by name:
  x_embedder.proj.{weight [D, Cin*pt*p*p] (the conv weight flattened), bias}
  t_embedder.mlp.{0,2}.{weight,bias}, y_embedder.embedding_table.weight [K+1, D]
  blocks.i.adaLN_modulation.1.*, blocks.i.attn.{qkv,proj}.*, blocks.i.mlp.{fc1,fc2}.*
  final_layer.adaLN_modulation.1.*, final_layer.linear.*
The position embedding is a fixed buffer (not a parameter, not exported).

Tensors are [B, F, C, H, W] (F frames, 1 for images). Linear weights are [out, in] as in
nn.Linear. Attention is written out explicitly (softmax over all keys, no mask). Every
function takes the dtype of its inputs; build_model(cfg, torch.float64) is the ground truth.
The optimizer, LR schedule, clipping and decay set are torch_model.py's (loom's LM rules:
every 2-D tensor decays, 1-D ones do not), plus an EMA of the weights.
Nothing here depends on loom's code.
"""

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_model as tm

# The spec: video embedding = concat(spatial (3D/4 channels), temporal (D/4)). CogVideoX's
# get_3d_sincos_pos_embed concatenates [temporal, spatial] instead; flip this to follow it.
VIDEO_TEMPORAL_FIRST = True  # CogVideoX: concat(temporal, spatial), as loom does
# Heun: the correction is applied on every step, also the last one (to t = 0), since the
# flow-matching velocity is defined at t = 0. k-diffusion / diffusers' Heun take a plain
# Euler step into t = 0 instead; set this to follow them.
HEUN_LAST_STEP_EULER = False

FREQ_DIM = 256
T_SCALE = 1000.0
MAX_PERIOD = 10000.0
NORM_EPS = 1e-6


@dataclass
class DiTConfig:
    n_layer: int
    n_head: int
    d_model: int
    d_ff: int
    patch: int
    height: int
    width: int
    channels: int
    n_classes: int
    patch_t: int = 1
    frames: int = 1

    @property
    def head_dim(self):
        return self.d_model // self.n_head

    @property
    def grid(self):
        """Tokens along (frames, height, width)."""
        return (self.frames // self.patch_t, self.height // self.patch,
                self.width // self.patch)

    @property
    def n_tokens(self):
        gt, gh, gw = self.grid
        return gt * gh * gw

    @property
    def patch_dim(self):
        return self.channels * self.patch_t * self.patch * self.patch

    @property
    def is_video(self):
        return self.grid[0] > 1

    @property
    def sample_shape(self):
        return (self.frames, self.channels, self.height, self.width)

    @property
    def null_class(self):
        return self.n_classes

    def validate(self):
        D = self.d_model
        assert D % self.n_head == 0, "d_model must be a multiple of n_head"
        assert self.height % self.patch == 0 and self.width % self.patch == 0, \
            "height and width must be multiples of the patch"
        assert self.frames % self.patch_t == 0, "frames must be a multiple of patch_t"
        assert self.n_classes >= 1
        if self.is_video:
            assert D % 16 == 0, "video (3-D sin-cos) needs d_model % 16 == 0"
        else:
            assert D % 4 == 0, "2-D sin-cos needs d_model % 4 == 0"
        return self

    def n_params(self):
        D, P, Fh = self.d_model, self.patch_dim, self.d_ff
        blk = 6 * D * D + 6 * D + 3 * D * D + 3 * D + D * D + D + 2 * D * Fh + Fh + D
        return (P * D + D + FREQ_DIM * D + D + D * D + D + (self.n_classes + 1) * D
                + self.n_layer * blk + 2 * D * D + 2 * D + D * P + P)


# ---------------------------------------------------------------- patches

def patchify(x, cfg):
    """[B, F, C, H, W] -> [B, N, C*pt*p*p]; token (f', h', w') row-major, vector in the
    conv weight's order (c, dt, dy, dx)."""
    B = x.shape[0]
    p, pt, C = cfg.patch, cfg.patch_t, cfg.channels
    gt, gh, gw = cfg.grid
    x = x.reshape(B, gt, pt, C, gh, p, gw, p)
    x = x.permute(0, 1, 4, 6, 3, 2, 5, 7)  # B, f', h', w', c, dt, dy, dx
    return x.reshape(B, gt * gh * gw, C * pt * p * p)


def unpatchify(y, cfg):
    """[B, N, pt*p*p*C] in DiT's output order (dt, dy, dx, c) -> [B, F, C, H, W]."""
    B = y.shape[0]
    p, pt, C = cfg.patch, cfg.patch_t, cfg.channels
    gt, gh, gw = cfg.grid
    y = y.reshape(B, gt, gh, gw, pt, p, p, C)
    y = y.permute(0, 1, 4, 7, 2, 5, 3, 6)  # B, f', dt, c, h', dy, w', dx
    return y.reshape(B, gt * pt, C, gh * p, gw * p)


# ---------------------------------------------------------------- fixed embeddings

def sincos_1d(E, pos):
    """[len(pos), E]: channel j < E/2 is sin(pos * w_j), channel E/2 + j is cos(pos * w_j),
    w_j = 10000^(-j / (E/2)) (DiT's get_1d_sincos_pos_embed_from_grid)."""
    assert E % 2 == 0
    half = E // 2
    pos = np.asarray(pos, dtype=np.float64).reshape(-1)
    out = np.empty((pos.size, E))
    for j in range(half):
        w = 1.0 / 10000.0 ** (j / half)
        out[:, j] = np.sin(pos * w)
        out[:, half + j] = np.cos(pos * w)
    return out


def sincos_2d(D, gh, gw):
    """[gh*gw, D], token h*gw + w: [1d(D/2, w) | 1d(D/2, h)] (DiT's order: the meshgrid's
    first coordinate is w)."""
    hh, ww = np.divmod(np.arange(gh * gw), gw)
    return np.concatenate([sincos_1d(D // 2, ww), sincos_1d(D // 2, hh)], axis=1)


def sincos_3d(D, gt, gh, gw, temporal_first=None):
    """[gt*gh*gw, D], token (f*gh + h)*gw + w: spatial = 2-D with 3D/4 channels, temporal =
    1-D(D/4, f); concat(temporal, spatial) as CogVideoX and loom (see VIDEO_TEMPORAL_FIRST)."""
    if temporal_first is None:
        temporal_first = VIDEO_TEMPORAL_FIRST
    Ds, Dt = 3 * D // 4, D // 4
    spatial = np.tile(sincos_2d(Ds, gh, gw), (gt, 1))
    temporal = np.repeat(sincos_1d(Dt, np.arange(gt)), gh * gw, axis=0)
    parts = [temporal, spatial] if temporal_first else [spatial, temporal]
    return np.concatenate(parts, axis=1)


def pos_embed(cfg):
    gt, gh, gw = cfg.grid
    if gt == 1:
        return sincos_2d(cfg.d_model, gh, gw)
    return sincos_3d(cfg.d_model, gt, gh, gw)


def timestep_embedding(t, dim=FREQ_DIM, max_period=MAX_PERIOD):
    """t [B] in [0, 1] -> [B, dim]: DiT's embedding of t*1000 (cos first, then sin)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period)
                      * torch.arange(half, dtype=torch.float64) / half).to(t.dtype)
    args = (t * T_SCALE)[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


# ---------------------------------------------------------------- modules

def layer_norm(x, eps=NORM_EPS):
    """LayerNorm over the last dim, no affine (biased variance, as nn.LayerNorm)."""
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps)


def modulate(x, shift, scale):
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class PatchEmbed(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.proj = nn.Linear(cfg.patch_dim, cfg.d_model)


class TimestepEmbedder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(FREQ_DIM, cfg.d_model), nn.SiLU(),
                                 nn.Linear(cfg.d_model, cfg.d_model))

    def forward(self, t):
        return self.mlp(timestep_embedding(t))


class LabelEmbedder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embedding_table = nn.Embedding(cfg.n_classes + 1, cfg.d_model)

    def forward(self, y):
        return self.embedding_table(y)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)  # rows: q heads | k heads | v heads
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x):
        B, N, D = x.shape
        H = self.n_head
        q, k, v = self.qkv(x).split(D, dim=-1)
        q, k, v = (z.view(B, N, H, D // H).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D // H))
        att = att.softmax(dim=-1)  # bidirectional: every query sees every key
        y = (att @ v).transpose(1, 2).reshape(B, N, D)
        return self.proj(y)


class Mlp(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.fc2 = nn.Linear(cfg.d_ff, cfg.d_model)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class DiTBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attn = Attention(cfg)
        self.mlp = Mlp(cfg)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(cfg.d_model, 6 * cfg.d_model))

    def forward(self, x, c):
        sh_a, sc_a, g_a, sh_m, sc_m, g_m = self.adaLN_modulation(c).chunk(6, dim=1)
        x = x + g_a.unsqueeze(1) * self.attn(modulate(layer_norm(x), sh_a, sc_a))
        return x + g_m.unsqueeze(1) * self.mlp(modulate(layer_norm(x), sh_m, sc_m))


class FinalLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.linear = nn.Linear(cfg.d_model, cfg.patch_dim)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(cfg.d_model, 2 * cfg.d_model))

    def forward(self, x, c):
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(layer_norm(x), shift, scale))


class DiT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.x_embedder = PatchEmbed(cfg)
        self.t_embedder = TimestepEmbedder(cfg)
        self.y_embedder = LabelEmbedder(cfg)
        self.blocks = nn.ModuleList(DiTBlock(cfg) for _ in range(cfg.n_layer))
        self.final_layer = FinalLayer(cfg)
        self.register_buffer("pos_embed", torch.from_numpy(pos_embed(cfg)), persistent=False)

    def forward(self, x, t, y):
        """x [B, F, C, H, W], t [B] in [0, 1], y [B] long (n_classes = null) -> v [B, F, C, H, W]."""
        cfg = self.cfg
        h = self.x_embedder.proj(patchify(x, cfg)) + self.pos_embed.to(x.dtype)
        c = self.t_embedder(t.to(x.dtype)) + self.y_embedder(y)
        for block in self.blocks:
            h = block(h, c)
        return unpatchify(self.final_layer(h, c), cfg)


def build_model(cfg, dtype=torch.float64):
    model = DiT(cfg).to(dtype)
    model.pos_embed = model.pos_embed.to(dtype)
    return model


def param_names(cfg):
    return [n for n, _ in DiT(cfg).named_parameters()]


# ---------------------------------------------------------------- initialisation

def init_kind(name):
    """DiT's initialize_weights: 'zero', 'xavier' or ('normal', std)."""
    if "adaLN_modulation" in name or name.startswith("final_layer.linear."):
        return "zero"
    if name == "y_embedder.embedding_table.weight":
        return ("normal", 0.02)
    if name.startswith("t_embedder.mlp.") and name.endswith(".weight"):
        return ("normal", 0.02)
    if name.endswith(".bias"):
        return "zero"
    return "xavier"


def xavier_bound(shape):
    fan_out, fan_in = shape
    return math.sqrt(6.0 / (fan_in + fan_out))


def init_dit(model, seed=0):
    """DiT's initialisation (for runs that do not load loom's weights)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            kind = init_kind(name)
            if kind == "zero":
                p.zero_()
            elif kind == "xavier":
                b = xavier_bound(p.shape)
                p.copy_((torch.rand(p.shape, generator=g, dtype=torch.float64) * 2 - 1) * b)
            else:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * kind[1])


def random_weights(cfg, seed):
    """{name: float32 array}: every tensor random and non-zero (adaLN and the final layer
    too), scaled so activations stay O(1): weights ~ N(0, 1/fan_in) (adaLN 0.3/fan_in^0.5,
    so modulations are O(0.3)), biases ~ N(0, 0.05^2), the label table ~ N(0, 0.5^2)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, p in DiT(cfg).named_parameters():
        shape = tuple(p.shape)
        if len(shape) == 2:
            std = 0.5 if "embedding_table" in name else 1.0 / math.sqrt(shape[1])
            if "adaLN_modulation" in name:
                std *= 0.3
            w = rng.standard_normal(shape) * std
        else:
            w = rng.standard_normal(shape) * 0.05
        out[name] = w.astype(np.float32)
    return out


load_params = tm.load_params


# ---------------------------------------------------------------- flow matching

def flow_terms(x0, noise, t):
    """x_t = (1-t) x0 + t noise, target v = noise - x0 (t [B] broadcast per sample)."""
    tb = t.reshape(-1, *([1] * (x0.dim() - 1)))
    return (1 - tb) * x0 + tb * noise, noise - x0


def flow_loss(model, x0, noise, t, labels, denom=None):
    """Mean squared error over every element ((sum / denom) when denom is given). -> (loss, pred)."""
    xt, v = flow_terms(x0, noise, t)
    pred = model(xt, t, labels)
    sq = ((pred - v) ** 2).sum()
    return sq / (denom if denom is not None else v.numel()), pred


# ---------------------------------------------------------------- training

@dataclass
class DiTTrainConfig(tm.TrainConfig):
    ema_decay: float = 0.9999


def make_optimizer(model, tc):
    """torch.optim.AdamW; every 2-D tensor decays (loom's rule), 1-D tensors do not."""
    return tm.make_optimizer(model, tc)


def ema_init(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def ema_update(ema, model, decay):
    with torch.no_grad():
        for n, p in model.named_parameters():
            ema[n].mul_(decay).add_(p.detach(), alpha=1.0 - decay)


def as_batch(flow, s, dtype):
    """Step s of {x0, noise [steps, G, F, C, H, W], t [steps, G], labels [steps, G]}."""
    return (torch.as_tensor(np.asarray(flow["x0"][s], dtype=np.float64)).to(dtype),
            torch.as_tensor(np.asarray(flow["noise"][s], dtype=np.float64)).to(dtype),
            torch.as_tensor(np.asarray(flow["t"][s], dtype=np.float64)).to(dtype),
            torch.as_tensor(np.asarray(flow["labels"][s])).long())


def train_step(model, opt, ema, tc, batch, s, on_step=None):
    """One optimizer step (0-based s). batch = (x0, noise, t, labels) of the global batch.

    Each micro-batch's loss is its sum of squared errors over the global element count,
    so the accumulated gradient is that of the global mean. on_step(s, info) runs after
    backward and before clipping, info = {"pred0": v-hat of micro-batch 0}.
    Returns {loss, lr, grad_norm} (grad_norm before clipping); then updates ema.
    """
    x0, noise, t, labels = batch
    G, M = tc.global_batch, tc.micro_batch
    assert G % M == 0 and x0.shape[0] == G
    denom = float(x0.numel())
    params = [p for group in opt.param_groups for p in group["params"]]
    opt.zero_grad(set_to_none=False)
    loss_sum, pred0 = 0.0, None
    for k in range(G // M):
        sl = slice(k * M, (k + 1) * M)
        loss, pred = flow_loss(model, x0[sl], noise[sl], t[sl], labels[sl], denom)
        loss.backward()
        loss_sum += loss.item()
        if k == 0:
            pred0 = pred.detach()
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if on_step is not None:
        on_step(s, {"pred0": pred0})
    if tc.grad_clip > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, tc.grad_clip).item()
    else:
        norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params)).item()
    lr = tm.lr_at(tc, s)
    for group in opt.param_groups:
        group["lr"] = lr
    opt.step()
    ema_update(ema, model, tc.ema_decay)
    return {"loss": loss_sum, "lr": lr, "grad_norm": norm}


def train(model, tc, flow, on_step=None):
    """loom's DiT training loop over the recorded draws flow (see as_batch).
    Returns (per-step history, ema {name: tensor}); ema starts at the initial weights."""
    dtype = next(model.parameters()).dtype
    assert np.asarray(flow["t"]).shape[0] >= tc.steps
    opt = make_optimizer(model, tc)
    ema = ema_init(model)
    hist = [train_step(model, opt, ema, tc, as_batch(flow, s, dtype), s, on_step)
            for s in range(tc.steps)]
    return hist, ema


# ---------------------------------------------------------------- sampling

def guided_velocity(model, labels, null_class, cfg_scale):
    """v(x, t) = vu + w (vc - vu), vu with the null class; w = 1: the conditional alone."""
    labels = torch.as_tensor(labels).long()
    null = torch.full_like(labels, null_class)

    def v(x, t):
        tt = torch.full((x.shape[0],), float(t), dtype=x.dtype)
        vc = model(x, tt, labels)
        if cfg_scale == 1.0:
            return vc
        vu = model(x, tt, null)
        return vu + cfg_scale * (vc - vu)

    return v


def time_grid(steps):
    return [1.0 - i / steps for i in range(steps + 1)]


def integrate(velocity, x, steps, solver="euler", last_step_euler=None):
    """From t = 1 (x = noise) to t = 0 over `steps` uniform steps: Euler
    x <- x + (t' - t) v(x, t), or Heun (v averaged with v at the Euler prediction)."""
    if last_step_euler is None:
        last_step_euler = HEUN_LAST_STEP_EULER
    assert solver in ("euler", "heun"), solver
    ts = time_grid(steps)
    for i in range(steps):
        t, tn = ts[i], ts[i + 1]
        d1 = velocity(x, t)
        pred = x + (tn - t) * d1
        if solver == "euler" or (last_step_euler and i == steps - 1):
            x = pred
        else:
            x = x + (tn - t) * 0.5 * (d1 + velocity(pred, tn))
    return x


@torch.no_grad()
def sample(model, noise, labels, steps, cfg_scale, solver="euler"):
    """loom sample's math: noise [N, F, C, H, W] -> samples in model space (no clamping)."""
    dtype = next(model.parameters()).dtype
    x = torch.as_tensor(np.asarray(noise, dtype=np.float64)).to(dtype)
    v = guided_velocity(model, labels, model.cfg.null_class, cfg_scale)
    return integrate(v, x, steps, solver)


def to_u8(x):
    """Model space [-1, 1] -> u8 = clamp(round((x+1)*127.5), 0, 255) (round half to even
    as numpy; ties are measure-zero for real samples)."""
    return np.clip(np.rint((np.asarray(x, dtype=np.float64) + 1) * 127.5), 0, 255).astype(np.uint8)
