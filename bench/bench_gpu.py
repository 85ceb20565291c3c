#!/usr/bin/env python3
"""GPU kernel benchmark, prepared for a session with a GPU (never run yet): loom's bf16
GEMM (cuBLASLt through loom_cuda_linear_forward_bf16) and fused attention against, in the
same run, PyTorch's cuBLAS bf16 matmul (the measured peak MFU is quoted against) and
torch's scaled_dot_product_attention (causal), same shapes. The last line is one JSON
object. Without a GPU, the loom binary or torch with CUDA, it says so in that JSON
("skipped") and exits 0; no number is ever made up.

  python3 bench/bench_gpu.py --build build-cuda [--gemm 8192] [--seq 1024]
"""
import argparse
import json
import os
import subprocess
import sys


def torch_side(args):
    try:
        import torch
    except ImportError:
        return {"skipped": "torch not importable"}
    if not torch.cuda.is_available():
        return {"skipped": "torch has no CUDA device"}
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    G = args.gemm
    a = torch.randn(G, G, device=dev, dtype=torch.bfloat16)
    b = torch.randn(G, G, device=dev, dtype=torch.bfloat16)

    def timed(fn, reps):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(reps):
            fn()
        e1.record()
        torch.cuda.synchronize()
        return e0.elapsed_time(e1) / reps

    gemm_ms = timed(lambda: a @ b.t(), args.reps)
    B, T, H, hd = args.batch, args.seq, args.heads, args.head_dim
    q, k, v = (torch.randn(B, H, T, hd, device=dev, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    fwd_ms = timed(lambda: sdpa(q, k, v, is_causal=True), args.reps)
    go = torch.randn(B, H, T, hd, device=dev, dtype=torch.bfloat16)

    def fwd_bwd():
        sdpa(q, k, v, is_causal=True).backward(go)
    fb_ms = timed(fwd_bwd, args.reps)
    # fp32, for loom's fp32 cuBLAS attention (attention_gemm.cu)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    go32 = go.float()
    fwd32_ms = timed(lambda: sdpa(q32, k32, v32, is_causal=True), args.reps)

    def fwd_bwd32():
        sdpa(q32, k32, v32, is_causal=True).backward(go32)
    fb32_ms = timed(fwd_bwd32, args.reps)
    flop = 2.0 * 2.0 * B * H * T * T * hd / 2.0
    return {"torch": torch.__version__, "gemm_ms": gemm_ms,
            "gemm_tflops": 2.0 * G ** 3 / (gemm_ms * 1e9),
            "attn_fwd_ms": fwd_ms, "attn_fwd_tflops": flop / (fwd_ms * 1e9),
            "attn_fwdbwd_ms": fb_ms, "attn_fwdbwd_tflops": 3.5 * flop / (fb_ms * 1e9),
            "attn_fp32_fwd_ms": fwd32_ms, "attn_fp32_fwdbwd_ms": fb32_ms}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build-cuda")
    p.add_argument("--gemm", type=int, default=8192)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    result = {"bench": "gpu_kernels", "loadavg": os.getloadavg(),
              "shapes": {"gemm": args.gemm, "attn": [args.batch, args.seq, args.heads, args.head_dim]}}
    exe = os.path.join(args.build, "bench_gpu_kernels")
    if not os.path.exists(exe):
        result["skipped"] = f"{exe} not built (configure with -DLOOM_CUDA=ON)"
        print(json.dumps(result))
        return 0
    cmd = [exe, "--gemm", str(args.gemm), "--batch", str(args.batch), "--seq", str(args.seq),
           "--heads", str(args.heads), "--head-dim", str(args.head_dim), "--reps", str(args.reps)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    lines = run.stdout.strip().splitlines()
    loom = json.loads(lines[-1]) if lines else {"error": run.stderr.strip()[-500:]}
    if run.returncode not in (0, 77):
        loom["error"] = f"exit {run.returncode}: {run.stderr.strip()[-500:]}"
    result["loom"] = loom
    if "skipped" in loom or "error" in loom:
        result["skipped"] = loom.get("skipped") or loom.get("error")
        print(json.dumps(result))
        return 0
    t = torch_side(args)
    result["torch"] = t
    if "skipped" not in t:
        # Ratios measured in the same run: loom GEMM vs cuBLAS peak via torch, attention vs SDPA.
        result["loom_gemm_vs_torch_cublas"] = loom["gemm_tflops"] / t["gemm_tflops"]
        result["loom_attn_fwd_vs_sdpa"] = t["attn_fwd_ms"] / loom["attn_fwd_ms"]
        result["loom_attn_fwdbwd_vs_sdpa"] = t["attn_fwdbwd_ms"] / loom["attn_fwdbwd_ms"]
        if "attn_gemm_fp32_fwdbwd_ms" in loom:
            result["loom_attn_gemm_fp32_fwdbwd_vs_sdpa_fp32"] = (
                t["attn_fp32_fwdbwd_ms"] / loom["attn_gemm_fp32_fwdbwd_ms"])
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
