#!/usr/bin/python3
"""Proof of `loom ckpt export` and `loom train --init-from` against the PyTorch reference.

For both families (Llama with grouped-query attention):
1. loom trains 6 steps with a validation loss at step 6 (--val-data, 2 eval batches) and
   its final checkpoint; `loom ckpt export DIR --format safetensors -o model.safetensors`
   writes one file of Hugging Face-named global tensors.
2. The file is loaded into the PyTorch reference model (tests/reference/torch_model.py,
   float64), which computes the validation loss on the same sequences loom evaluated:
   loom draws validation window i of eval batch b as philox_u64(seed, "data", -1 - b, i)
   mod the number of windows (src/data/dataset.c); that draw is re-implemented here and
   first checked against the training sequences loom dumped (--dump-dir tokens), which
   come from the same function with step s >= 0. Must equal loom's val_loss to 1e-5 rel.
3. Import: `loom train --init-from model.safetensors` (optimizer state fresh, step 0) runs
   3 steps; its step-1 loss must equal the exported model's loss (PyTorch) on the batch
   that run trained on (its dumped tokens), to 1e-5. The same import under mpirun
   (dp 2 x ZeRO-3, and tp 2 x dp 2 ZeRO-1: each rank reads only its shard of the file)
   must give the single-process import's losses to 1e-5.
Usage: test_export.py --loom PATH [--seed S]
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
sys.path.insert(0, os.path.join(HERE, "..", "harness"))
import safetensors_io  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_model as tm  # noqa: E402
import loomtest  # noqa: E402
from loomtest import MPIRUN, keep_or_remove, parse_test_args, run, run_test, write_text_shard  # noqa: E402

TOL = 1e-5
MASK32, MASK64 = (1 << 32) - 1, (1 << 64) - 1
DATA_STREAM = 0x64617461  # "data" (src/data/dataset.h)
SHARD_HEADER_BYTES = 1024


def philox_u64(seed, stream, a, b):
    """core/philox.c: Philox4x32-10 of counter (a lo, a hi, b, 1), key (seed lo, seed hi ^ stream)."""
    c = [a & MASK32, (a >> 32) & MASK32, b & MASK32, 1]
    k0, k1 = seed & MASK32, ((seed >> 32) ^ stream) & MASK32
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k0) & MASK32, p1 & MASK32, ((p0 >> 32) ^ c[3] ^ k1) & MASK32,
             p0 & MASK32]
        k0, k1 = (k0 + 0x9E3779B9) & MASK32, (k1 + 0xBB67AE85) & MASK32
    return (c[1] << 32) | c[0]


def shard_tokens(path):
    with open(path, "rb") as f:
        f.seek(SHARD_HEADER_BYTES)
        return np.frombuffer(f.read(), dtype="<u2").astype(np.int64)


def windows(tokens, T, seed, step, n):
    """The n sequences (T + 1 tokens) loom samples for `step` from one shard."""
    W = len(tokens) - T
    rows = []
    for i in range(n):
        w = philox_u64(seed, DATA_STREAM, step & MASK64, i) % W
        rows.append(tokens[w:w + T + 1])
    return np.stack(rows)


def metrics(path):
    return [json.loads(line) for line in open(path)]


def mean_loss(model, seqs):
    with torch.no_grad():
        x = torch.as_tensor(seqs).long()
        logits = model(x[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(),
                               x[:, 1:].reshape(-1), reduction="mean").item()


def main():
    args = parse_test_args()
    seed = args.seed
    tmp = tempfile.mkdtemp(prefix="loom_ckpt_export_")

    def check(ok, what):
        loomtest.check(ok, f"  {what}:")

    try:
        data, val = os.path.join(tmp, "train.bin"), os.path.join(tmp, "val.bin")
        write_text_shard(data, seed)
        write_text_shard(val, seed + 1)
        T, G, M, E = 16, 4, 2, 2
        # The MoE case (dropless, so PyTorch's one batch of all sequences routes as loom's
        # micro-batches do; aux and z losses off, so the training loss is the CE) exports
        # the manifest's MoE settings; its import runs single-process only.
        for family, moe in (("gpt2", 0), ("llama", 0), ("llama", 1)):
            n_kv = 2 if family == "llama" else 4
            E, K = 4, 1 + seed % 2
            cfg = tm.Config(family=family, n_layer=2, n_head=4, n_kv_head=n_kv, d_model=32,
                            d_ff=64, vocab_size=256, seq_len=T, n_experts=E if moe else 0,
                            top_k=K, moe_every=1, shared_expert=bool(seed // 2 % 2))
            base = [args.loom, "train", "--family", family, "--vocab-size", "256", "--seq-len",
                    str(T), "--n-layer", "2", "--d-model", "32", "--n-head", "4", "--n-kv-head",
                    str(n_kv), "--d-ff", "64", "--micro-batch", str(M), "--global-batch", str(G),
                    "--lr", "3e-3", "--warmup-steps", "2", "--seed", str(seed), "--log-every",
                    "0", "--threads", "1", "--data", data]
            if moe:
                base += ["--n-experts", str(E), "--top-k", str(K), "--capacity-factor", "0",
                         "--aux-loss-coef", "0", "--z-loss-coef", "0"]
                base += ["--shared-expert"] if cfg.shared_expert else []
                family = f"{family}_moe"
            out = os.path.join(tmp, family)
            ck = out + "_ck"
            run(base + ["--steps", "6", "--val-data", val, "--eval-every", "6", "--eval-batches",
                        str(E), "--ckpt-dir", ck, "--metrics", out + ".jsonl", "--dump-dir", out],
                f"{family} train")
            val_loss = [r["val_loss"] for r in metrics(out + ".jsonl") if "val_loss" in r][-1]
            exported = os.path.join(tmp, f"{family}.safetensors")
            p = subprocess.run([args.loom, "ckpt", "export", ck, "--format", "safetensors", "-o",
                                exported], capture_output=True, text=True)
            check(p.returncode == 0, f"{family}: loom ckpt export (exit {p.returncode})")
            if p.returncode:
                print(p.stderr[-2000:])
                continue
            # The re-implemented sampler reproduces loom's training sequences.
            dumped = safetensors_io.load(os.path.join(out, "tokens.safetensors"))["tokens"]
            train_tok = shard_tokens(data)
            same = all(np.array_equal(dumped[s], windows(train_tok, T, seed, s, G))
                       for s in range(dumped.shape[0]))
            check(same, f"{family}: sampler port = loom's dumped training sequences "
                  f"({dumped.shape[0]} steps)")
            # The exported file in PyTorch: validation loss on loom's validation sequences.
            model = tm.build_model(cfg, torch.float64)
            tensors = safetensors_io.load(exported)
            tm.load_params(model, tensors)
            final = safetensors_io.load(os.path.join(out, "params_final.safetensors"))
            check(all(np.array_equal(tensors[k], final[k]) for k in final),
                  f"{family}: exported tensors = loom's final weights, bitwise")
            val_tok = shard_tokens(val)
            seqs = np.concatenate([windows(val_tok, T, seed, -1 - b, G) for b in range(E)])
            ref = mean_loss(model, seqs)
            err = abs(val_loss - ref) / abs(ref)
            check(err <= TOL, f"{family}: PyTorch val loss of the export {ref:.7f} vs loom "
                  f"{val_loss:.7f}, rel err {err:.1e}")
            # Import: step 1 of a run started from the file = the file's loss on its batch.
            imp = {}
            layouts = (("dp1", [], 1), ("dp2z3", ["--dp", "2", "--zero", "3"], 2),
                       ("tp2dp2z1", ["--tp", "2", "--dp", "2", "--zero", "1"], 4))
            for name, layout, n in layouts[:1] if moe else layouts:
                o = os.path.join(tmp, f"{family}_import_{name}")
                log = run((MPIRUN + ["-n", str(n)] if n > 1 else []) + base +
                          ["--steps", "3", "--init-from", exported, "--metrics", o + ".jsonl",
                           "--dump-dir", o] + layout, f"{family} import {name}")
                check("parameters from" in log, f"{family} {name}: --init-from reported")
                imp[name] = ([r["loss"] for r in metrics(o + ".jsonl")],
                             safetensors_io.load(os.path.join(o, "tokens.safetensors"))["tokens"])
            losses, tok = imp["dp1"]
            ref1 = mean_loss(model, tok[0])
            err = abs(losses[0] - ref1) / abs(ref1)
            check(err <= TOL, f"{family}: import step-1 loss {losses[0]:.7f} vs PyTorch "
                  f"{ref1:.7f} on that batch, rel err {err:.1e}")
            for name in () if moe else ("dp2z3", "tp2dp2z1"):
                other = imp[name][0]
                err = max(abs(a - b) / abs(b) for a, b in zip(other, losses))
                check(len(other) == len(losses) and err <= TOL,
                      f"{family}: import under {name} = single-process import, 3 losses, "
                      f"rel err {err:.1e}")
    finally:
        keep_or_remove(tmp, seed)


if __name__ == "__main__":
    run_test(main)
