"""What the benchmarks that run loom beside PyTorch share (bf16_autocast.py, bench_dit.py,
bench_vlm.py, bench_train.py): PyTorch runs in a child process of the same script, started
with the hidden flag --torch-worker SPEC (a JSON object), so that torch never shares a
process, its threads or its allocator with the parent's timings of loom.

    args = torch_peer.parse_args(ap, torch_worker)       # in main(), after the flags
    cmd = torch_peer.worker_command(__file__, spec)      # the child's command line
    subprocess.run(cmd, env=torch_peer.blas_env(threads, coretype), ...)

A module, not a benchmark: it has no command line of its own.
"""
import argparse
import json
import os
import sys

WORKER_FLAG = "--torch-worker"


def parse_args(ap, worker, required=("loom",)):
    """Parses the command line of `ap` (with the hidden --torch-worker added). In the
    PyTorch child: runs worker(SPEC) and exits 0. In the parent: every flag of `required`
    (attribute names) must be given (argparse's usage error otherwise, exit 2), and --loom
    becomes an absolute path."""
    ap.add_argument(WORKER_FLAG, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_worker:
        worker(args.torch_worker)
        sys.exit(0)
    if not all(getattr(args, name) for name in required):
        flags = ["--" + name.replace("_", "-") for name in required]
        ap.error(" and ".join(flags) + (" are" if len(flags) > 1 else " is") + " required")
    args.loom = os.path.abspath(args.loom)
    return args


def worker_command(script, spec):
    """The command line of the PyTorch child of `script` (its __file__) for `spec`."""
    return [sys.executable, os.path.abspath(script), WORKER_FLAG, json.dumps(spec)]


def default_coretype():
    """The OpenBLAS kernel loom itself picks on this CPU (src/core/cpu_boot.c): SkylakeX
    where the CPU has AVX-512 F, BW, DQ and VL, Haswell where it has AVX2 and FMA, else
    None (OpenBLAS's own choice). A forced SkylakeX on a CPU without AVX-512 dies of an
    illegal instruction (measured: sgemm_peak on an AMD EPYC with AVX2 only, exit 132)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])
    except OSError:
        return None
    if {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= set(flags):
        return "SkylakeX"
    if {"avx2", "fma"} <= set(flags):
        return "Haswell"
    return None


def blas_env(threads, coretype=None):
    """The environment of every process a benchmark starts (loom, the PyTorch child, the
    peak probes): `threads` OpenBLAS/OpenMP threads that do not spin when idle, and one
    OpenBLAS kernel for all of them (OPENBLAS_CORETYPE=coretype; None: left as it is), so
    that a ratio compares the trainers and not two BLAS kernels (measured here: loom on
    Haswell against PyTorch on SkylakeX read 1.08x; both on SkylakeX 2.2x)."""
    env = dict(os.environ)
    if coretype is not None:
        env["OPENBLAS_CORETYPE"] = coretype
    env.update({"OMP_WAIT_POLICY": "PASSIVE", "OPENBLAS_NUM_THREADS": str(threads),
                "OMP_NUM_THREADS": str(threads)})
    return env
