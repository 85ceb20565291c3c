"""PyTorch reference for loom: the GPT-2 and Llama model families and loom's training math.

Modules are laid out so that named_parameters() yields exactly loom's (Hugging Face)
parameter names, so loom's safetensors dumps load by name without a mapping table.
Linear weights are [out, in] as in nn.Linear. Nothing here depends on loom's code.
"""

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    family: str  # "gpt2" or "llama"
    n_layer: int
    n_head: int
    n_kv_head: int
    d_model: int
    d_ff: int
    vocab_size: int
    seq_len: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    # mixture of experts (n_experts 0: dense MLP everywhere)
    n_experts: int = 0
    top_k: int = 2
    moe_every: int = 1
    shared_expert: bool = False
    capacity_factor: float = 0.0
    aux_loss_coef: float = 0.0
    z_loss_coef: float = 0.0

    def is_moe(self, layer):
        return self.n_experts > 0 and layer % self.moe_every == self.moe_every - 1

    @property
    def head_dim(self):
        return self.d_model // self.n_head

    def validate(self):
        assert self.family in ("gpt2", "llama"), self.family
        assert self.d_model % self.n_head == 0, "d_model must be a multiple of n_head"
        assert self.n_head % self.n_kv_head == 0, "n_head must be a multiple of n_kv_head"
        if self.family == "gpt2":
            assert self.n_kv_head == self.n_head, "gpt2 has no grouped-query attention"
        else:
            assert self.head_dim % 2 == 0, "RoPE needs an even head dim"
        return self

    def matmul_params(self):
        """Parameters that take part in matmuls (incl. the lm head, tied or not)."""
        C, F_, hd = self.d_model, self.d_ff, self.head_dim
        attn = C * self.n_head * hd * 2 + C * self.n_kv_head * hd * 2  # q, o, k, v
        mlp = (2 if self.family == "gpt2" else 3) * C * F_
        return self.n_layer * (attn + mlp) + self.vocab_size * C

    def flops_per_token(self):
        """6 * matmul params (forward + backward) + attention scores/values (12*L*T*C)."""
        return 6 * self.matmul_params() + 12 * self.n_layer * self.seq_len * self.d_model


# ---------------------------------------------------------------- shared pieces

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def causal_attention(q, k, v):
    """q: [B, H, T, hd]; k, v: [B, H, T, hd] (kv heads already expanded)."""
    T, hd = q.shape[-2], q.shape[-1]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
    return att @ v


def rope_tables(T, hd, theta, dtype):
    # Hugging Face convention: frequencies repeated over both halves, rotate_half below.
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


# ---------------------------------------------------------------- GPT-2

class GPT2Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C = cfg.d_model
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(C, 3 * C)  # rows: q heads, k heads, v heads
        self.c_proj = nn.Linear(C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=-1)
        shape = (B, T, self.n_head, C // self.n_head)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        return self.c_proj(y)


class GPT2MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.d_model, cfg.d_ff)
        self.c_proj = nn.Linear(cfg.d_ff, cfg.d_model)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class GPT2Block(nn.Module):
    def __init__(self, cfg, layer=0):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = GPT2Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        if cfg.is_moe(layer):
            self.moe = MoE(cfg, GPT2MLP)
        else:
            self.mlp = GPT2MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + (self.moe if hasattr(self, "moe") else self.mlp)(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.transformer = nn.Module()
        self.transformer.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.transformer.wpe = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.transformer.h = nn.ModuleList(GPT2Block(cfg, i) for i in range(cfg.n_layer))
        self.transformer.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)

    def forward(self, idx):
        t = self.transformer
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = t.wte(idx) + t.wpe(pos)
        for block in t.h:
            x = block(x)
        return t.ln_f(x) @ t.wte.weight.t()  # LM head tied to wte


# ---------------------------------------------------------------- Llama

class LlamaAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, hd = cfg.d_model, cfg.head_dim
        self.n_head, self.n_kv_head, self.hd = cfg.n_head, cfg.n_kv_head, hd
        self.q_proj = nn.Linear(C, cfg.n_head * hd, bias=False)
        self.k_proj = nn.Linear(C, cfg.n_kv_head * hd, bias=False)
        self.v_proj = nn.Linear(C, cfg.n_kv_head * hd, bias=False)
        self.o_proj = nn.Linear(cfg.n_head * hd, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_head, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_head, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_head, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.n_head // self.n_kv_head  # query head h reads kv head h // rep
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, self.n_head * self.hd)
        return self.o_proj(y)


class LlamaMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down_proj = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    def __init__(self, cfg, layer=0):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        if cfg.is_moe(layer):
            self.block_sparse_moe = MoE(cfg, MixtralExpert)
        else:
            self.mlp = LlamaMLP(cfg)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        ff = self.block_sparse_moe if hasattr(self, "block_sparse_moe") else self.mlp
        return x + ff(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.model.layers = nn.ModuleList(LlamaBlock(cfg, i) for i in range(cfg.n_layer))
        self.model.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, idx):
        x = self.model.embed_tokens(idx)
        cos, sin = rope_tables(idx.shape[1], self.cfg.head_dim, self.cfg.rope_theta, x.dtype)
        for block in self.model.layers:
            x = block(x, cos, sin)
        return self.lm_head(self.model.norm(x))


# ---------------------------------------------------------------- mixture of experts

class MixtralExpert(nn.Module):
    """Hugging Face Mixtral's expert: w2(silu(w1 x) * w3 x)."""

    def __init__(self, cfg):
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.w3 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.w2 = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoE(nn.Module):
    """loom's MoE block: softmax router, top-k renormalised, per-micro-batch capacity
    ceil(cf * N * K / E) with slot-major dropping, optional shared expert; after forward,
    aux_terms holds aux_coef * aux * N + z_coef * sum of lse^2 (see model/moe.h)."""

    def __init__(self, cfg, expert_cls):
        super().__init__()
        self.cfg = cfg
        self.gate = nn.Linear(cfg.d_model, cfg.n_experts, bias=False)
        self.experts = nn.ModuleList(expert_cls(cfg) for _ in range(cfg.n_experts))
        if cfg.shared_expert:
            self.shared_expert = expert_cls(cfg)
        self.aux_terms = 0.0

    def forward(self, x):
        cfg, shape = self.cfg, x.shape
        E, K = cfg.n_experts, cfg.top_k
        xf = x.reshape(-1, shape[-1])
        N = xf.shape[0]
        logits = self.gate(xf)
        probs = logits.softmax(-1)
        top_p, top_i = probs.topk(K, dim=-1)
        w = top_p / top_p.sum(-1, keepdim=True)
        keep = torch.ones(N, K, dtype=torch.bool)
        if cfg.capacity_factor > 0:
            cf = float(np.float32(cfg.capacity_factor))
            cap = math.ceil(cf * N * K / E)
            kept = [0] * E
            for j in range(K):  # slot-major: all first choices in token order, then ...
                for t in range(N):
                    e = int(top_i[t, j])
                    if kept[e] < cap:
                        kept[e] += 1
                    else:
                        keep[t, j] = False
        out = torch.zeros_like(xf)
        for e in range(E):
            t, j = torch.nonzero((top_i == e) & keep, as_tuple=True)
            if t.numel():
                out = out.index_add(0, t, w[t, j, None] * self.experts[e](xf[t]))
        if cfg.shared_expert:
            out = out + self.shared_expert(xf)
        load = torch.stack([(top_i == e).sum() for e in range(E)]).to(probs.dtype)
        aux = E * (load / (N * K) * probs.mean(0)).sum()
        z = (torch.logsumexp(logits, -1) ** 2).sum()
        self.aux_terms = cfg.aux_loss_coef * aux * N + cfg.z_loss_coef * z
        return out.reshape(shape)


def aux_terms(model):
    """Sum of the MoE blocks' auxiliary terms of the last forward (0 without MoE)."""
    return sum(m.aux_terms for m in model.modules() if isinstance(m, MoE))


def build_model(cfg, dtype=torch.float32):
    cfg.validate()
    model = GPT2(cfg) if cfg.family == "gpt2" else Llama(cfg)
    return model.to(dtype)


def init_gpt2_style(model, seed=0, std=0.02):
    """A plain init for runs that do not load loom's weights (benchmarks, self-checks)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * std)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.fill_(1.0)


def load_params(model, tensors):
    """Copy {name: array} into the model; names and shapes must match exactly."""
    own = dict(model.named_parameters())
    missing = sorted(set(own) - set(tensors))
    extra = sorted(set(tensors) - set(own))
    if missing or extra:
        raise ValueError(f"parameter names differ: missing in file {missing}, "
                         f"unexpected in file {extra}")
    with torch.no_grad():
        for name, p in own.items():
            src = torch.as_tensor(tensors[name])
            if tuple(src.shape) != tuple(p.shape):
                raise ValueError(f"{name}: shape {list(src.shape)} in file, "
                                 f"{list(p.shape)} expected")
            p.copy_(src.to(p.dtype))


# ---------------------------------------------------------------- training math

@dataclass
class TrainConfig:
    steps: int
    micro_batch: int
    global_batch: int
    lr: float = 6e-4
    min_lr: float = 0.0
    warmup_steps: int = 0
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    beta1: float = 0.9
    beta2: float = 0.95
    adam_eps: float = 1e-8


def lr_at(tc, s):
    """LR at 0-based step s: linear warmup, then cosine from lr down to min_lr."""
    if s < tc.warmup_steps:
        return tc.lr * (s + 1) / tc.warmup_steps
    ratio = (s - tc.warmup_steps) / max(1, tc.steps - tc.warmup_steps)
    return tc.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (tc.lr - tc.min_lr)


def make_optimizer(model, tc):
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": tc.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=tc.lr, betas=(tc.beta1, tc.beta2), eps=tc.adam_eps)


def train_step(model, opt, tc, batch, s, on_step=None):
    """One optimizer step (0-based step s) on batch [global_batch, T+1] (long).

    on_step(s, info) runs after backward and before clipping, with
    info = {"logits0": logits of micro-batch 0}, so callers can snapshot raw gradients.
    Returns {loss, lr, grad_norm} with grad_norm measured before clipping.
    """
    G, M = tc.global_batch, tc.micro_batch
    assert G % M == 0, "global batch must be a multiple of the micro-batch"
    n_tokens = G * (batch.shape[1] - 1)
    params = [p for group in opt.param_groups for p in group["params"]]
    opt.zero_grad(set_to_none=False)
    loss_sum, logits0 = 0.0, None
    for k in range(G // M):
        mb = batch[k * M:(k + 1) * M]
        logits = model(mb[:, :-1])
        # Sum over the micro-batch, divided by the global token count: each
        # micro-batch is weighted by its token share of the global mean.
        loss = (F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                mb[:, 1:].reshape(-1), reduction="sum")
                + aux_terms(model)) / n_tokens
        loss.backward()
        loss_sum += loss.item()
        if k == 0:
            logits0 = logits.detach()
    # An expert that received no token has no gradient yet: loom's is zero (and AdamW
    # still decays it), so make torch's a zero tensor too instead of skipping it.
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if on_step is not None:
        on_step(s, {"logits0": logits0})
    if tc.grad_clip > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, tc.grad_clip).item()
    else:
        norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params)).item()
    lr = lr_at(tc, s)
    for group in opt.param_groups:
        group["lr"] = lr
    opt.step()
    return {"loss": loss_sum, "lr": lr, "grad_norm": norm}


def train(model, tc, tokens, on_step=None):
    """Replicate loom's training loop on tokens [steps, global_batch, T+1].

    Returns a list of per-step dicts {loss, lr, grad_norm}; on_step as in train_step.
    """
    tokens = torch.as_tensor(tokens).long()
    assert tokens.shape[0] >= tc.steps and tokens.shape[1] == tc.global_batch
    opt = make_optimizer(model, tc)
    return [train_step(model, opt, tc, tokens[s], s, on_step) for s in range(tc.steps)]
