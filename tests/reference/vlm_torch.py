"""PyTorch reference of loom's multimodal LLM (family vlm, docs/vlm.md), independent of
loom's code: a ViT encoder (patches, DiT's 2-D sin-cos positions, pre-norm bidirectional
blocks, final LayerNorm), a 2-layer GELU projector and torch_model.py's Llama decoder; the
image tokens replace the `<image>` slots of the sequence; the loss is the cross-entropy
weighted per target (T / answer targets of the sample on answer targets, 0 elsewhere),
summed over the batch and divided by batch x T. Parameter names are loom's."""

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_model as tm

SLOT = -1


class VitConfig:
    def __init__(self, **kw):
        self.__dict__.update(kw)

    @property
    def grid(self):
        return self.height // self.patch, self.width // self.patch

    @property
    def image_tokens(self):
        gh, gw = self.grid
        return gh * gw

    @property
    def patch_floats(self):
        return self.channels * self.patch * self.patch


def sincos_1d(E, pos):
    half = E // 2
    omega = 1.0 / 10000.0 ** (np.arange(half, dtype=np.float64) / half)
    a = pos * omega
    return np.concatenate([np.sin(a), np.cos(a)])


def positions(D, gh, gw):
    """DiT's 2-D table: token (i, j) -> [sincos(D/2, j) | sincos(D/2, i)]."""
    out = np.zeros((gh * gw, D))
    for i in range(gh):
        for j in range(gw):
            out[i * gw + j] = np.concatenate([sincos_1d(D // 2, j), sincos_1d(D // 2, i)])
    return out


def patchify(x, p):
    """x [n, C, H, W] -> [n, gh*gw, C*p*p], patches row-major, each flattened (c, dy, dx)."""
    n, C, H, W = x.shape
    gh, gw = H // p, W // p
    return x.reshape(n, C, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5).reshape(n, gh * gw, C * p * p)


class ViTAttention(nn.Module):
    def __init__(self, D, H):
        super().__init__()
        self.H, self.hd = H, D // H
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)

    def forward(self, x):
        n, P, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        q, k, v = (t.view(n, P, self.H, self.hd).transpose(1, 2) for t in (q, k, v))
        s = q @ k.transpose(-1, -2) / math.sqrt(self.hd)
        y = torch.softmax(s, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(n, P, D))


class ViTMLP(nn.Module):
    def __init__(self, D, F_):
        super().__init__()
        self.fc1 = nn.Linear(D, F_)
        self.fc2 = nn.Linear(F_, D)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class ViTBlock(nn.Module):
    def __init__(self, D, H, F_, eps):
        super().__init__()
        self.norm1 = nn.LayerNorm(D, eps=eps)
        self.attn = ViTAttention(D, H)
        self.norm2 = nn.LayerNorm(D, eps=eps)
        self.mlp = ViTMLP(D, F_)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VLM(nn.Module):
    def __init__(self, lm_cfg, vc):
        super().__init__()
        self.cfg, self.vc = lm_cfg, vc
        eps = lm_cfg.norm_eps
        self.vision = nn.Module()
        self.vision.patch_embed = nn.Linear(vc.patch_floats, vc.d_model)
        self.vision.blocks = nn.ModuleList(ViTBlock(vc.d_model, vc.n_head, vc.d_ff, eps)
                                           for _ in range(vc.n_layer))
        self.vision.norm = nn.LayerNorm(vc.d_model, eps=eps)
        self.projector = nn.Module()
        self.projector.fc1 = nn.Linear(vc.d_model, lm_cfg.d_model)
        self.projector.fc2 = nn.Linear(lm_cfg.d_model, lm_cfg.d_model)
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(lm_cfg.vocab_size, lm_cfg.d_model)
        self.model.layers = nn.ModuleList(tm.LlamaBlock(lm_cfg, i) for i in range(lm_cfg.n_layer))
        self.model.norm = tm.RMSNorm(lm_cfg.d_model, lm_cfg.norm_eps)
        self.lm_head = nn.Linear(lm_cfg.d_model, lm_cfg.vocab_size, bias=False)

    def encode(self, images):
        """images [n, C, H, W] -> projector output [n, P, d_model]."""
        vc = self.vc
        gh, gw = vc.grid
        x = self.vision.patch_embed(patchify(images, vc.patch))
        x = x + torch.as_tensor(positions(vc.d_model, gh, gw), dtype=x.dtype)
        for b in self.vision.blocks:
            x = b(x)
        x = self.vision.norm(x)
        return self.projector.fc2(F.gelu(self.projector.fc1(x), approximate="tanh"))

    def forward(self, inputs, images, starts):
        """inputs [B, T] (SLOT at image rows), images [n, C, H, W], starts [(b, t)] of the
        n images' first rows -> logits [B, T, V]."""
        x = self.model.embed_tokens(inputs.clamp(min=0))
        if len(starts):
            img = self.encode(images)
            P = self.vc.image_tokens
            rows = [x[b] for b in range(x.shape[0])]
            for j, (b, t) in enumerate(starts):
                rows[b] = torch.cat([rows[b][:t], img[j], rows[b][t + P:]])
            x = torch.stack(rows)
        cos, sin = tm.rope_tables(x.shape[1], self.cfg.head_dim, self.cfg.rope_theta, x.dtype)
        for blk in self.model.layers:
            x = blk(x, cos, sin)
        return self.lm_head(self.model.norm(x))


def expand(tokens, mask, images, image_token, eot, T, P, max_images, S):
    """A shard sample -> (record tokens [T+1] with SLOT, weights [T], images [max, S] float
    pixels) exactly as docs/vlm.md says; None when it does not fit."""
    seq, ans = [], []
    for t, m in zip(tokens, mask):
        if t == image_token:
            seq += [SLOT] * P
            ans += [0] * P
        else:
            seq.append(int(t))
            ans.append(int(m))
    if len(seq) > T + 1:
        return None
    slots = [i for i, t in enumerate(seq) if t == SLOT]
    if slots and slots[-1] >= T:
        return None
    n_ans = sum(ans[1:])
    w = np.zeros(T)
    for i in range(1, len(seq)):
        if ans[i]:
            w[i - 1] = T / n_ans
    seq = seq + [eot] * (T + 1 - len(seq))
    px = np.zeros((max_images, S))
    for k, im in enumerate(images):
        px[k] = im.reshape(-1).astype(np.float64) / 127.5 - 1.0
    return np.array(seq, dtype=np.int64), w, px


def loss_of(model, records, T, P, vc, G):
    """records: list of (tokens [T+1], weights [T], n_images, pixels [max, S]) -> the loss
    (a scalar tensor) over the batch, normalised by G * T."""
    inputs = torch.as_tensor(np.stack([r[0][:T] for r in records]))
    targets = torch.as_tensor(np.stack([np.maximum(r[0][1:], 0) for r in records]))
    w = torch.as_tensor(np.stack([r[1] for r in records]))
    imgs, starts = [], []
    for b, (tok, _, n, px) in enumerate(records):
        runs, t = [], 0  # groups of P slots, which may touch
        while t < T:
            if tok[t] == SLOT:
                runs.append(t)
                t += P
            else:
                t += 1
        for k in range(n):
            starts.append((b, runs[k]))
            imgs.append(px[k].reshape(vc.channels, vc.height, vc.width))
    dtype = next(model.parameters()).dtype
    images = torch.as_tensor(np.stack(imgs) if imgs else np.zeros((0, vc.channels, vc.height,
                                                                   vc.width)), dtype=dtype)
    logits = model(inputs, images, starts)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                         reduction="none")
    return (ce * w.reshape(-1).to(dtype)).sum() / (G * T)
