#!/usr/bin/python3
"""A stand-in for `loom train`, built on torch_model.py in float32.

It exists to test the test: test_vs_torch.py --loom tests/reference/fake_loom.py must
pass (this shows the harness, the dump formats and the tolerances work, and that fp32
arithmetic fits in them), and it lets one check that the harness notices injected bugs
(--inject lr|grad|clip|logits). Only the flags the test uses are accepted.
"""

import argparse
import glob
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402
import torch  # noqa: E402
import torch_model as tm  # noqa: E402


def main():
    if len(sys.argv) < 2 or sys.argv[1] != "train":
        print("usage: fake_loom.py train [flags]", file=sys.stderr)
        return 2
    ap = argparse.ArgumentParser(prog="fake_loom.py train")
    for name, typ in [("model", str), ("n-layer", int), ("n-head", int), ("n-kv-head", int),
                      ("d-model", int), ("d-ff", int), ("vocab-size", int), ("seq-len", int),
                      ("rope-theta", float), ("norm-eps", float), ("data", str),
                      ("micro-batch", int), ("global-batch", int), ("steps", int),
                      ("lr", float), ("min-lr", float), ("warmup-steps", int),
                      ("weight-decay", float), ("grad-clip", float), ("beta1", float),
                      ("beta2", float), ("adam-eps", float), ("seed", int), ("threads", int),
                      ("metrics", str), ("dump-dir", str), ("log-every", int),
                      ("inject", str)]:
        ap.add_argument("--" + name, type=typ)
    a = ap.parse_args(sys.argv[2:])
    family = "gpt2" if a.model.startswith("gpt2") else "llama"
    m = tm.Config(family, a.n_layer, a.n_head, a.n_kv_head or a.n_head, a.d_model, a.d_ff,
                  a.vocab_size, a.seq_len, a.rope_theta or 10000.0, a.norm_eps or 1e-5)
    t = tm.TrainConfig(a.steps, a.micro_batch, a.global_batch, a.lr, a.min_lr,
                       a.warmup_steps, a.weight_decay, a.grad_clip, a.beta1, a.beta2,
                       a.adam_eps)
    torch.set_num_threads(a.threads or 1)
    torch.manual_seed(a.seed)
    model = tm.build_model(m, torch.float32)
    tm.init_gpt2_style(model, seed=a.seed)

    # Data: random windows of the (first) shard, fixed by the seed.
    path = sorted(glob.glob(a.data))[0]
    raw = np.fromfile(path, dtype="<u2", offset=1024).astype(np.int32)
    rng = np.random.default_rng(a.seed)
    starts = rng.integers(0, len(raw) - m.seq_len - 1, size=(t.steps, t.global_batch))
    tokens = np.stack([[raw[s:s + m.seq_len + 1] for s in row] for row in starts])

    dump = a.dump_dir
    os.makedirs(dump, exist_ok=True)
    named = dict(model.named_parameters())
    safetensors_io.save(os.path.join(dump, "tokens.safetensors"), {"tokens": tokens})
    safetensors_io.save(os.path.join(dump, "params_init.safetensors"),
                        {n: p.detach().numpy() for n, p in named.items()})

    if a.inject == "lr":
        t.lr *= 1.001

    def on_step(s, info):
        if s == 0:
            logits = info["logits0"].numpy()
            if a.inject == "logits":
                logits = logits + 1e-3 * np.abs(logits).max()
            safetensors_io.save(os.path.join(dump, "logits_step1.safetensors"),
                                {"logits": logits})
            grads = {n: p.grad.numpy().copy() for n, p in named.items()}
            if a.inject == "grad":
                name = sorted(grads)[-1]
                grads[name].flat[0] += 1e-3 * np.abs(grads[name]).max()
            safetensors_io.save(os.path.join(dump, "grads_step1.safetensors"), grads)

    if a.inject == "clip":
        t.grad_clip = 0.0
    t0 = time.time()
    hist = tm.train(model, t, tokens, on_step)
    ms = (time.time() - t0) * 1000 / t.steps
    with open(a.metrics, "w") as f:
        for s, h in enumerate(hist):
            f.write(json.dumps({"step": s + 1, "loss": h["loss"], "lr": h["lr"],
                                "grad_norm": h["grad_norm"], "step_ms": ms,
                                "tokens_per_s": t.global_batch * m.seq_len / ms * 1000})
                    + "\n")
    safetensors_io.save(os.path.join(dump, "params_final.safetensors"),
                        {n: p.detach().numpy() for n, p in named.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
