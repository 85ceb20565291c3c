"""The GRPO loss (src/rl/grpo.c) and its gradient against PyTorch in float64, on random
logits, masks, advantages and old/reference log-probabilities drawn each run (the seed is
printed): loss, log-probabilities and d loss / d logits within 1e-5, for both
normalisations, with and without the KL term, and with ratios on both sides of the clip
range. Usage: test_grpo_vs_torch.py --check PATH_TO_grpo_check"""
import argparse
import os
import random
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
from loomtest import check, run_test  # noqa: E402


def torch_grpo(logits, targets, weight, adv, old, ref, eps, beta):
    x = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    logp_all = torch.log_softmax(x, dim=-1)
    logp = logp_all.gather(1, torch.tensor(targets, dtype=torch.int64)[:, None])[:, 0]
    # loom rounds the log-probability to fp32 once (the bits old_logp was computed with)
    logp = logp + (logp.detach().float().double() - logp.detach())
    A = torch.tensor(adv, dtype=torch.float64)
    ratio = torch.exp(logp - torch.tensor(old, dtype=torch.float64))
    surr = torch.minimum(ratio * A, torch.clamp(ratio, 1 - eps, 1 + eps) * A)
    tok = -surr
    if beta != 0:
        d = torch.tensor(ref, dtype=torch.float64) - logp
        tok = tok + beta * (torch.exp(d) - d - 1)
    loss = (torch.tensor(weight, dtype=torch.float64) * tok).sum()
    loss.backward()
    return loss.item(), logp.detach().numpy(), x.grad.numpy()


def one_case(tool, tmp, rng, N, V, norm, beta, eps):
    logits = (rng.standard_normal((N, V)) * 2).astype(np.float32)
    targets = rng.integers(0, V, N).astype(np.int32)
    S = max(1, N // 7)  # sequences of about 7 tokens, some masked
    seq = np.sort(rng.integers(0, S, N))
    mask = (rng.random(N) < 0.7).astype(np.float64)
    weight = np.zeros(N)
    if norm == "sequence":
        for s in range(S):
            idx = (seq == s) & (mask > 0)
            if idx.sum():
                weight[idx] = 1.0 / (S * idx.sum())
    else:
        weight = mask / max(1.0, mask.sum())
    weight = weight.astype(np.float32)
    adv = rng.standard_normal(N).astype(np.float32)
    # true log-probs, moved by up to +-0.5 so that ratios fall on both sides of the clip range
    x = logits.astype(np.float64)
    lse = np.log(np.exp(x - x.max(1, keepdims=True)).sum(1)) + x.max(1)
    true = x[np.arange(N), targets] - lse
    old = (true + rng.uniform(-0.5, 0.5, N)).astype(np.float32)
    # a few exactly on-policy tokens (ratio 1: a tie in the min)
    on = rng.random(N) < 0.2
    old[on] = true[on].astype(np.float32)
    ref = (true + rng.uniform(-0.5, 0.5, N)).astype(np.float32)
    path_in, path_out = os.path.join(tmp, "in.bin"), os.path.join(tmp, "out.bin")
    with open(path_in, "wb") as f:
        np.array([N, V, 1 if beta != 0 else 0], np.int32).tofile(f)
        np.array([eps, beta], np.float32).tofile(f)
        for a in (logits, targets, weight, adv, old, ref):
            a.tofile(f)
    subprocess.run([tool, path_in, path_out], check=True)
    with open(path_out, "rb") as f:
        loss = np.fromfile(f, np.float64, 1)[0]
        logp = np.fromfile(f, np.float32, N)
        dlogits = np.fromfile(f, np.float32, N * V).reshape(N, V)
        tokens, kl, clipped = np.fromfile(f, np.float64, 3)
    t_loss, t_logp, t_grad = torch_grpo(logits, targets, weight, adv, old, ref, eps, beta)
    scale = max(1.0, abs(t_loss))
    e_loss = abs(loss - t_loss) / scale
    e_logp = np.abs(logp - t_logp).max()
    e_grad = np.abs(dlogits - t_grad).max() / max(1e-12, np.abs(t_grad).max())
    what = f"N={N} V={V} norm={norm} kl={beta} eps={eps}"
    check(e_loss <= 1e-5, f"{what}: loss {loss:.8g} vs torch {t_loss:.8g} (rel {e_loss:.2e})")
    check(e_logp <= 1e-5, f"{what}: log-probs max error {e_logp:.2e}")
    check(e_grad <= 1e-5, f"{what}: d loss/d logits max error {e_grad:.2e} of the largest")
    check(tokens == (weight != 0).sum(), f"{what}: {tokens:.0f} tokens counted")
    return clipped


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", required=True)
    a = ap.parse_args()
    seed = random.randrange(2**31)
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        clipped = 0
        for N, V in ((40, 17), (96, 256)):
            for norm in ("sequence", "token"):
                for beta in (0.0, 0.04):
                    clipped += one_case(a.check, tmp, rng, N, V, norm, beta, 0.2)
        check(clipped > 0, f"{clipped:.0f} clipped tokens over the cases (both branches ran)")


if __name__ == "__main__":
    run_test(main)
