#!/usr/bin/python3
"""MPI bandwidth between two test hosts over OpenMPI's TCP BTL (bench/README.md).

Builds bench/mpi_tcp_probe.c with mpicc, brings up two network-namespace hosts
(tests/hosts/hosts.sh up 2), and for each setting runs the probe with one rank per host:
point-to-point MB/s one way (MPI_Send/MPI_Recv) and both ways at once (MPI_Sendrecv, MB/s
per direction) for 4 MiB, 64 MiB and 1 GiB messages (1 GiB per size), a 2-rank
MPI_Allreduce of 512 MB of floats and MPI_Reduce_scatter_block + MPI_Allgather of the same
buffer (best of --coll-reps, MB/s = buffer bytes / time). A setting is a link MTU (set on
both ends of each host's veth and on the bridge before it runs) and launcher words added
to bench_hosts.py's base MCA list (mpirun --mca / -x). The hosts go down at the end.
Needs root (exit 77 otherwise). The machine is shared: the load average goes into the
JSON. Prints one JSON object last: per setting, the probe's figures.
Usage: bench_mpi_tcp.py [--settings stock,tuned] [--p2p 4M,64M,1G] [--p2p-bytes 1G]
                        [--coll-mb 512] [--coll-reps 2]
"""
import argparse
import fcntl
import json
import os
import shlex
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# the hosts, the shell helper and bench_hosts.py's launcher arguments (the base of every
# setting below)
from bench_hosts import HOSTS_SH, MCA as BASE, sh  # noqa: E402
# glibc malloc: madvise(MADV_HUGEPAGE) on its mmap'd chunks; fresh 4 KiB pages are slow
# to fault in on this VM (~0.3 GB/s first touch), and OpenMPI's collectives malloc (and
# free) temporary buffers the size of the message on every call
HUGE = ["-x", "GLIBC_TUNABLES=glibc.malloc.hugetlb=1"]
# glibc malloc: never mmap, never give the heap back: a freed temporary buffer is reused
# by the next call, already faulted in (the process keeps its peak heap)
HEAP = ["-x", "GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"]
SETTINGS = {  # name: (MTU, launcher words after BASE)
    "stock": (1500, []),
    "mtu64k": (65535, []),
    "mtu64k_links2": (65535, ["--mca", "btl_tcp_links", "2"]),
    "mtu64k_hugetlb": (65535, HUGE),
    "mtu64k_heap": (65535, HEAP),
    "mtu64k_hugetlb_noput": (65535, HUGE + ["--mca", "btl_tcp_flags",
                                            "send,inplace,need-ack,need-csum"]),
    "mtu64k_hugetlb_frag4m": (65535, HUGE + ["--mca", "btl_tcp_rdma_pipeline_frag_size",
                                             "4194304"]),
    "mtu64k_hugetlb_allreduce2": (65535, HUGE + [  # tuned's reduce + bcast, segmented
        "--mca", "coll_tuned_use_dynamic_rules", "1",
        "--mca", "coll_tuned_allreduce_algorithm", "2"]),
    "tuned": (65535, HUGE),  # what loom's ranks get on hosts.sh's links (loom sets it)
}


def set_mtu(mtu):
    """mtu on both ends of each host's veth and on the bridge."""
    for k in (1, 2):
        sh("ip", "link", "set", f"loomv{k}", "mtu", str(mtu))
        sh("ip", "netns", "exec", f"loomh{k}", "ip", "link", "set", "eth0", "mtu", str(mtu))
    sh("ip", "link", "set", "loombr0", "mtu", str(mtu))


def probe(args, exe, name):
    mtu, extra = SETTINGS[name]
    set_mtu(mtu)
    cmd = ["mpirun", "--allow-run-as-root", "--host", "10.231.0.1:1,10.231.0.2:1"] + BASE + \
        extra + ["-n", "2", exe, "--p2p", args.p2p, "--p2p-bytes", args.p2p_bytes,
                 "--coll-mb", str(args.coll_mb), "--coll-reps", str(args.coll_reps)]
    print(f"$ {shlex.join(cmd)}", flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.run_timeout)
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    if p.returncode != 0 or not lines:
        print(f"FAIL: {name}: exit {p.returncode}\n{p.stdout[-2000:]}{p.stderr[-3000:]}",
              flush=True)
        sys.exit(1)
    res = json.loads(lines[-1])
    res.update({"mtu": mtu, "launcher_args": extra, "loadavg": os.getloadavg()[0]})
    print(f"  {name}: {json.dumps(res)}", flush=True)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--settings", default=",".join(SETTINGS),
                    help=f"comma-separated, of: {', '.join(SETTINGS)}")
    ap.add_argument("--p2p", default="4M,64M,1G", help="message sizes")
    ap.add_argument("--p2p-bytes", default="1G", help="bytes sent per size")
    ap.add_argument("--coll-mb", type=float, default=512.0)
    ap.add_argument("--coll-reps", type=int, default=2)
    ap.add_argument("--run-timeout", type=float, default=300.0)
    args = ap.parse_args()
    names = args.settings.split(",")
    bad = [n for n in names if n not in SETTINGS]
    if bad:
        ap.error(f"unknown setting(s) {bad}; known: {list(SETTINGS)}")
    if os.geteuid() != 0:
        print("SKIP: needs root for network namespaces")
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="loom_bench_mpi_tcp_")
    exe = os.path.join(tmp, "mpi_tcp_probe")
    sh("mpicc", "-O2", "-o", exe, os.path.join(HERE, "mpi_tcp_probe.c"))
    lock = open("/run/loom-hosts.lock", "w")  # the hosts are shared with the tests
    fcntl.flock(lock, fcntl.LOCK_EX)
    out = {"bench": "mpi_tcp", "base_launcher_args": BASE, "p2p_bytes": args.p2p_bytes,
           "loadavg_start": os.getloadavg()[0], "settings": {}}
    try:
        sh(HOSTS_SH, "up", "2")
        for name in names:
            out["settings"][name] = probe(args, exe, name)
    finally:
        sh(HOSTS_SH, "down", check=False)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
