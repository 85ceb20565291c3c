#!/usr/bin/python3
"""`loom ckpt export --dtype bf16` against PyTorch, and BF16 files read back by loom.

1. loom trains a tiny Llama 3 steps (random seed) with a checkpoint; the checkpoint is
   exported twice: `--dtype f32` (the default) and `--dtype bf16`.
2. PyTorch reads both files (torch.frombuffer on the safetensors data section; Debian has
   no safetensors package): every tensor of the bf16 file has the header dtype BF16 and
   the torch dtype bfloat16, and its bits equal the f32 export rounded by PyTorch itself
   (`.to(torch.bfloat16)`, round to nearest even). loom flushes fp32 subnormals to zero
   where PyTorch keeps them (docs/precision.md): the test first checks the f32 export has
   none, so every element is compared.
3. `loom train --init-from` the bf16 file and from an F32 file holding PyTorch's exact
   widening of the same bf16 values (with the same metadata): the same losses and final
   weights, bitwise; so does the same under tp 2 (each rank reads a box of each tensor).
   `loom generate --weights` of both files: the same text.
4. Bad input: `--dtype fp16` is one line naming the flag and the choices, exit 2.
Usage: test_export_bf16.py --loom PATH [--seed S]
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
sys.path.insert(0, os.path.join(HERE, "..", "harness"))
import safetensors_io  # noqa: E402
import torch  # noqa: E402
from loomtest import MPIRUN, check, keep_or_remove, parse_test_args, run, run_test, write_text_shard  # noqa: E402

TORCH_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16}


def torch_load(path):
    """{name: (header dtype, torch tensor)} and the metadata, read with PyTorch."""
    blob = bytearray(open(path, "rb").read())
    (hlen,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + hlen].decode())
    meta = header.pop("__metadata__", {})
    data = memoryview(blob)[8 + hlen:]
    out = {}
    for name, e in header.items():
        a, b = e["data_offsets"]
        t = torch.frombuffer(data[a:b], dtype=TORCH_DTYPES[e["dtype"]]).reshape(e["shape"])
        out[name] = (e["dtype"], t.clone())
    return out, meta


def losses(path):
    return [json.loads(line)["loss"] for line in open(path)]


def main():
    args = parse_test_args()
    seed = args.seed
    tmp = tempfile.mkdtemp(prefix="loom_export_bf16_")
    try:
        data = os.path.join(tmp, "train.bin")
        write_text_shard(data, seed)
        base = [args.loom, "train", "--family", "llama", "--vocab-size", "256", "--seq-len", "16",
                "--n-layer", "2", "--d-model", "32", "--n-head", "4", "--n-kv-head", "2",
                "--d-ff", "64", "--micro-batch", "2", "--global-batch", "4", "--lr", "3e-3",
                "--seed", str(seed), "--log-every", "0", "--threads", "1", "--data", data]
        ck = os.path.join(tmp, "ck")
        run(base + ["--steps", "3", "--ckpt-dir", ck], "train")
        f32, bf16 = os.path.join(tmp, "f32.safetensors"), os.path.join(tmp, "bf16.safetensors")
        run([args.loom, "ckpt", "export", ck, "--format", "safetensors", "-o", f32], "export f32")
        err = run([args.loom, "ckpt", "export", ck, "--format", "safetensors", "--dtype", "bf16",
                   "-o", bf16], "export bf16")
        check("(bf16)" in err, "  export names the dtype")

        a, meta_a = torch_load(f32)
        b, meta_b = torch_load(bf16)
        check(sorted(a) == sorted(b) and len(a) > 0 and meta_a == meta_b,
              f"  same {len(a)} tensor names and metadata in both files")
        check(all(d == "F32" for d, _ in a.values()), "  f32 export: every tensor F32")
        check(all(d == "BF16" and t.dtype == torch.bfloat16 for d, t in b.values()),
              "  bf16 export: every tensor BF16, loaded by PyTorch as torch.bfloat16")
        tiny = torch.finfo(torch.float32).tiny
        subnormal = sum(int(((t != 0) & (t.abs() < tiny)).sum()) for _, t in a.values())
        check(subnormal == 0, f"  f32 export has no fp32 subnormals ({subnormal})")
        bad = [k for k in a if not torch.equal(a[k][1].to(torch.bfloat16).view(torch.int16),
                                               b[k][1].view(torch.int16))]
        n = sum(t.numel() for _, t in a.values())
        check(not bad, f"  bf16 export = PyTorch's rounding of the f32 export, bitwise, {n} "
              f"values ({len(bad)} tensors differ: {bad[:3]})")
        diff = sum(int((a[k][1] != b[k][1].float()).sum()) for k in a)
        check(diff > n // 2, f"  the rounding changed {diff} of {n} values")

        # PyTorch's widening of the bf16 values as an F32 file with the same metadata.
        wide = os.path.join(tmp, "wide.safetensors")
        safetensors_io.save(wide, {k: t.float().numpy() for k, (_, t) in b.items()}, meta_b)
        runs = {}
        for name, f, ranks, layout in (("bf16", bf16, 1, []), ("wide", wide, 1, []),
                                       ("bf16_tp2", bf16, 2, ["--tp", "2"]),
                                       ("wide_tp2", wide, 2, ["--tp", "2"])):
            o = os.path.join(tmp, name)
            err = run((MPIRUN + ["-n", str(ranks)] if ranks > 1 else []) + base +
                      ["--steps", "2", "--init-from", f, "--metrics", o + ".jsonl",
                       "--save-weights", o + ".safetensors"] + layout, f"import {name}")
            check(f"parameters from {f}" in err, f"  import {name}: --init-from reported")
            runs[name] = losses(o + ".jsonl")
        for x, y in (("bf16", "wide"), ("bf16_tp2", "wide_tp2")):
            same = open(os.path.join(tmp, x + ".safetensors"), "rb").read() == \
                open(os.path.join(tmp, y + ".safetensors"), "rb").read()
            check(runs[x] == runs[y] and len(runs[x]) == 2 and same,
                  f"  --init-from the bf16 file = from its exact fp32 widening ({x}): losses "
                  f"{runs[x]} vs {runs[y]}, final weights bitwise: {same}")
        gen = {}
        for name, f in (("bf16", bf16), ("wide", wide)):
            p = subprocess.run([args.loom, "generate", "--weights", f, "--prompt", "the ",
                                "--max-tokens", "16", "--temperature", "0"],
                               capture_output=True)  # bytes: a byte-level model's text
            check(p.returncode == 0, f"  generate --weights {name} exits 0 "
                  f"({p.stderr[-300:].decode(errors='replace')})")
            gen[name] = p.stdout
        check(gen["bf16"] == gen["wide"] and gen["bf16"],
              f"  generate: bf16 file = its widening: {gen['bf16']!r}")

        p = subprocess.run([args.loom, "ckpt", "export", ck, "--dtype", "fp16", "-o",
                            os.path.join(tmp, "x.safetensors")], capture_output=True, text=True)
        lines = p.stderr.strip().splitlines()
        check(p.returncode == 2 and len(lines) == 1 and
              "--dtype 'fp16': expected f32 or bf16" in lines[0],
              f"  --dtype fp16: one line, exit 2 (exit {p.returncode}: {p.stderr.strip()!r})")
    finally:
        keep_or_remove(tmp, seed)


if __name__ == "__main__":
    run_test(main)
