#!/usr/bin/python3
"""Self-check of the PyTorch reference itself (no loom needed).

test_vs_torch.py is only as good as torch_model.py, so this recomputes the forward pass
of both families with a second, deliberately naive float64 numpy implementation written
straight from the spec (loops over positions and heads, the GELU-tanh and RoPE formulas
spelled out) and checks the two agree. Also checks the micro-batch accumulation (loss
and gradients independent of the micro-batch split) and the LR schedule endpoints.
Run: /usr/bin/python3 tests/reference/check_torch_model.py
"""

import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch_model as tm  # noqa: E402


def naive_norm(x, w, b, eps, rms):
    if rms:
        return x / np.sqrt(np.mean(x * x) + eps) * w
    mu = x.mean()
    return (x - mu) / np.sqrt(np.mean((x - mu) ** 2) + eps) * w + b


def naive_rope(v, pos, theta):
    hd = v.shape[0]
    out = np.empty_like(v)
    for i in range(hd // 2):  # pairs (i, i + hd/2) rotate by pos * theta^(-2i/hd)
        ang = pos * theta ** (-2.0 * i / hd)
        c, s = math.cos(ang), math.sin(ang)
        out[i] = v[i] * c - v[i + hd // 2] * s
        out[i + hd // 2] = v[i + hd // 2] * c + v[i] * s
    return out


def naive_logits(cfg, P, idx):
    """Logits [T, V] of one sequence, position by position."""
    gpt2 = cfg.family == "gpt2"
    T, C, H, KV, hd = len(idx), cfg.d_model, cfg.n_head, cfg.n_kv_head, cfg.head_dim
    if gpt2:
        x = np.stack([P["transformer.wte.weight"][t] + P["transformer.wpe.weight"][p]
                      for p, t in enumerate(idx)])
    else:
        x = np.stack([P["model.embed_tokens.weight"][t] for t in idx])
    for li in range(cfg.n_layer):
        pre = f"transformer.h.{li}." if gpt2 else f"model.layers.{li}."

        def norm(v, name):
            if gpt2:
                return naive_norm(v, P[pre + name + ".weight"], P[pre + name + ".bias"],
                                  cfg.norm_eps, False)
            return naive_norm(v, P[pre + name + ".weight"], None, cfg.norm_eps, True)

        qs, ks, vs = [], [], []
        for p in range(T):
            h = norm(x[p], "ln_1" if gpt2 else "input_layernorm")
            if gpt2:
                qkv = P[pre + "attn.c_attn.weight"] @ h + P[pre + "attn.c_attn.bias"]
                q, k, v = qkv[:C], qkv[C:2 * C], qkv[2 * C:]
            else:
                q = P[pre + "self_attn.q_proj.weight"] @ h
                k = P[pre + "self_attn.k_proj.weight"] @ h
                v = P[pre + "self_attn.v_proj.weight"] @ h
            q, k, v = q.reshape(H, hd), k.reshape(KV, hd), v.reshape(KV, hd)
            if not gpt2:
                q = np.stack([naive_rope(q[j], p, cfg.rope_theta) for j in range(H)])
                k = np.stack([naive_rope(k[j], p, cfg.rope_theta) for j in range(KV)])
            qs.append(q), ks.append(k), vs.append(v)
        att_out = np.zeros((T, H * hd))
        for p in range(T):
            for j in range(H):
                g = j // (H // KV)  # grouped-query: kv head of query head j
                s = np.array([qs[p][j] @ ks[u][g] / math.sqrt(hd) for u in range(p + 1)])
                w = np.exp(s - s.max())
                w /= w.sum()
                att_out[p, j * hd:(j + 1) * hd] = sum(w[u] * vs[u][g] for u in range(p + 1))
        for p in range(T):
            if gpt2:
                x[p] = x[p] + P[pre + "attn.c_proj.weight"] @ att_out[p] + P[pre + "attn.c_proj.bias"]
                h = norm(x[p], "ln_2")
                a = P[pre + "mlp.c_fc.weight"] @ h + P[pre + "mlp.c_fc.bias"]
                a = 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3)))
                x[p] = x[p] + P[pre + "mlp.c_proj.weight"] @ a + P[pre + "mlp.c_proj.bias"]
            else:
                x[p] = x[p] + P[pre + "self_attn.o_proj.weight"] @ att_out[p]
                h = norm(x[p], "post_attention_layernorm")
                gate = P[pre + "mlp.gate_proj.weight"] @ h
                up = P[pre + "mlp.up_proj.weight"] @ h
                x[p] = x[p] + P[pre + "mlp.down_proj.weight"] @ (gate / (1 + np.exp(-gate)) * up)
    out = []
    for p in range(T):
        if gpt2:
            h = naive_norm(x[p], P["transformer.ln_f.weight"], P["transformer.ln_f.bias"],
                           cfg.norm_eps, False)
            out.append(P["transformer.wte.weight"] @ h)
        else:
            h = naive_norm(x[p], P["model.norm.weight"], None, cfg.norm_eps, True)
            out.append(P["lm_head.weight"] @ h)
    return np.stack(out)


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():  # non-trivial norms/biases too
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.3
                    + (1.0 if p.ndim == 1 else 0.0))


def main():
    torch.set_num_threads(2)
    failures = 0
    cfgs = [tm.Config("gpt2", 2, 3, 3, 15, 37, 41, 9, norm_eps=1e-5),
            tm.Config("llama", 2, 6, 2, 36, 50, 43, 11, rope_theta=500.0, norm_eps=1e-6)]
    for cfg in cfgs:
        model = tm.build_model(cfg, torch.float64)
        randomize(model, 3)
        P = {n: p.detach().numpy() for n, p in model.named_parameters()}
        idx = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, cfg.seq_len))
        got = model(torch.from_numpy(idx)).detach().numpy()
        want = np.stack([naive_logits(cfg, P, row) for row in idx])
        err = np.abs(got - want).max() / np.abs(want).max()
        ok = err < 1e-10
        failures += not ok
        print(f"{cfg.family}: forward vs naive numpy, max rel err {err:.2e} "
              f"{'ok' if ok else 'FAIL'}")

        # Loss and gradients must not depend on how the global batch is split.
        tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, (1, 6, cfg.seq_len + 1))
        grads = []
        for micro in (1, 2, 6):
            m2 = tm.build_model(cfg, torch.float64)
            m2.load_state_dict(model.state_dict())
            tc = tm.TrainConfig(steps=1, micro_batch=micro, global_batch=6)
            snap = {}
            hist = tm.train(m2, tc, tokens, lambda s, info: snap.update(
                {n: p.grad.clone() for n, p in m2.named_parameters()}))
            grads.append((hist[0]["loss"], snap))
        err = max(abs(g[0] - grads[0][0]) for g in grads)
        err = max([err] + [float((g[1][n] - grads[0][1][n]).abs().max())
                           for g in grads for n in g[1]])
        ok = err < 1e-12
        failures += not ok
        print(f"{cfg.family}: micro-batch split 1/2/6 invariance, max abs diff {err:.1e} "
              f"{'ok' if ok else 'FAIL'}")

    tc = tm.TrainConfig(steps=10, micro_batch=1, global_batch=1, lr=1.0, min_lr=0.1,
                        warmup_steps=2)
    lrs = [tm.lr_at(tc, s) for s in range(10)]
    want = [0.5, 1.0, 1.0] + [0.1 + 0.45 * (1 + math.cos(math.pi * k / 8)) for k in range(1, 8)]
    ok = np.allclose(lrs, want)
    failures += not ok
    print(f"lr schedule {['%.3f' % v for v in lrs]} {'ok' if ok else 'FAIL'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
