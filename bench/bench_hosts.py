#!/usr/bin/python3
"""Data parallelism across two test hosts over capped links (bench/README.md).

Two network-namespace hosts (tests/hosts/hosts.sh), one rank on each (1 thread), GPT-2
124M on random tokens, --dp 2 ZeRO-0 with OpenMPI's TCP transport between them; each
host's link (both ends of its veth) capped with a `tbf` qdisc at 1, 2.5 and 10 Gbit/s.
Each cap runs twice: with overlap (--bucket-mb 25: buckets reduced during backward) and
without (--bucket-mb 100000: one bucket after backward, the whole reduction exposed).
The baseline is the same two ranks on one host (shared memory, no cap).

Figures (medians over the measured steps, from the --metrics JSON lines of rank 0):
  tokens_per_s and ratio_to_one_host per cap;
  exposed_ms with and without overlap (grad_wait_ms: the training thread's wait for the
  reduced gradients);
  hidden_fraction = 1 - exposed (overlap) / exposed (no overlap);
  wire_ms = the bytes a rank sends in a 2-rank ring all-reduce of the gradients
  (2 (N-1)/N x 4P = 4P bytes) / the cap, the reduction's time on the link alone;
  model_exposed_ms = without overlap wire_ms, with overlap max(0, wire_ms - backward_ms)
  (what overlap can hide is at most the backward the buckets run under); and the measured
  exposed time's error against it. The same with the bandwidth the capped link delivers to
  MPI: link_reduce_ms, the median of 3 in-place MPI_Iallreduce calls of the gradients'
  bytes between the hosts with nothing else running (bench/mpi_tcp_probe.c, loom's libnbc
  algorithm), in place of wire_ms (model_link_exposed_ms, model_link_error; link_gbit).

Recovery after a host loss, from peer memory against from disk ("recovery" in the JSON):
`loom run -n 2 --hosts 10.231.0.1:1,10.231.0.2:1` (dp 2 ZeRO-1, AdamW, GPT-2 124M by
default: a 1.5 GB checkpoint) with --ckpt-dir every 2 steps, once with --ckpt-peer
(memory) and once without (disk). When step 2 is committed (on disk, and for --ckpt-peer
in both hosts' memory), its checkpoint files are written back (sync) and their pages
dropped from the page cache with posix_fadvise(DONTNEED) (drop_caches would drop the
whole shared machine's cache; fincore's resident bytes after the drop go into the JSON),
then host 2 dies (every process of its namespace SIGKILLed, its memory folder removed).
(--heartbeat-timeout 30: a 124M gradient all-reduce over the hosts' TCP takes seconds
here, more than a short timeout allows a collective; the host loss itself is seen at once
from mpirun's lost daemon.) Timed from the kill (wall clock) to the supervisor's events: failure_detected and
first_step_after_restart (the restarted job's first step done); kill_to_first_step_s and
detect_to_first_step_s per source, the restarted attempt's phases (launch_to_loading_s,
load_s: every rank up to every rank past the load, training_to_first_step_s), the resume line (bytes from memory / disk), and
speedup = disk / peer for both spans (target: peer >= 2x faster to the first new step).
The bf16 cell (--bf16, or --only bf16 for it alone: one host, the cap's fp32 runs and the
cell): at --bf16-cap (default 1 Gbit/s) the same model and layout with `--precision bf16`,
once with fp32 gradient reduction and once with `--grad-reduce-dtype bf16`, both with
overlap, against the same two ranks on one host in bf16; per run grad_bytes (the median of
rank 0's `dp.grad_bytes`, loom's own count of the gradient bytes it moved over dp in a
step), grad_bytes_bf16_over_fp32_reduce (0.5 expected at ZeRO-0), the tokens/s ratios to
one host and tokens_per_s_bf16_over_fp32_reduce. On a CPU without AVX512-BF16 or
AMX-BF16 loom's bf16 GEMMs are widened to fp32 (docs/precision.md): the bytes are bf16's,
the compute fp32's speed.
Needs root and network namespaces (exit 77 otherwise). The machine is shared: the load
average goes into the JSON. Prints one JSON object last.
Usage: bench_hosts.py --loom build/loom [--caps 1,2.5,10] [--steps 6] [--warmup 2]
                      [--only all|throughput|recovery|bf16] [--recovery-model gpt2-small]
                      [--bf16] [--bf16-cap 1] [--smoke]
--smoke: a tiny model (2 layers, d_model 64, vocabulary 256) everywhere, one cap (10
Gbit/s), 3 steps, the recovery's first attempt slowed (--inject slow): that the bench runs
end to end, in seconds (its figures mean nothing).
"""
import argparse
import fcntl
import glob
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_dp import write_random_shard  # noqa: E402

HOSTS_SH = os.path.join(HERE, "..", "tests", "hosts", "hosts.sh")
AGENT = os.path.join(HERE, "..", "tests", "hosts", "agent.sh")
SUBNET = "10.231.0.0/24"
MCA = ["--mca", "plm_rsh_agent", AGENT, "--mca", "btl", "tcp,vader,self",
       "--mca", "btl_tcp_if_include", SUBNET, "--mca", "oob_tcp_if_include", SUBNET,
       "--mca", "plm_rsh_no_tree_spawn", "1", "--mca", "mpi_yield_when_idle", "1",
       "--bind-to", "none"]
# (--bind-to none: the test hosts share this machine's cores, and each host's daemon binds
# its first rank to core 0, so with binding the two hosts' ranks shared one core of the two:
# compute 5.4-7.2 s a step against 2.9 s for the same two ranks on one host)
# (the collectives' per-call temporary buffers: every loom process keeps freed memory and
# sets GLIBC_TUNABLES=glibc.malloc.hugetlb=1 itself, src/core/malloc_policy.h, cpu_boot.h)
OVERLAP_MB, NO_OVERLAP_MB = 25.0, 100000.0
PARAMS = 124439808  # GPT-2 124M with the tied head (loom's start-up report)
WIRE_BYTES = 4 * PARAMS  # the fp32 gradients; 2 (N-1)/N x 4P bytes sent per rank, N = 2
TINY = ["--vocab-size", "256", "--n-layer", "2", "--d-model", "64", "--n-head", "4",
        "--d-ff", "256"]  # --smoke's model (after the preset: these win)


def sh(*cmd, check=True):
    p = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and p.returncode != 0:
        print(f"FAIL: {shlex.join(cmd)}: exit {p.returncode}\n{p.stdout}{p.stderr}", flush=True)
        sys.exit(1)
    return p


def cap_links(gbit, hosts=2):
    """tbf at gbit on both ends of the links of hosts 1..hosts (None: remove the caps)."""
    for k in range(1, hosts + 1):
        for dev, ns in ((f"loomv{k}", None), ("eth0", f"loomh{k}")):
            pre = ["ip", "netns", "exec", ns] if ns else []
            sh(*pre, "tc", "qdisc", "del", "dev", dev, "root", check=False)
            if gbit:
                rate = int(gbit * 1000)  # Mbit/s
                # 10 ms of the rate, at least two packets of the hosts' MTU (65535; tbf drops
                # a packet larger than its bucket)
                burst = max(rate * 1000 // 8 // 100, 128 * 1024)
                sh(*pre, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{rate}mbit",
                   "burst", str(burst), "latency", "100ms")


def drop_pages(folder):
    """Writes back, then drops from the page cache, every file under folder; the bytes
    still resident after (fincore), -1 when fincore is missing."""
    os.sync()
    files = [f for f in glob.glob(os.path.join(folder, "**"), recursive=True) if os.path.isfile(f)]
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    if not shutil.which("fincore") or not files:
        return -1
    p = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES"] + files,
                       capture_output=True, text=True)
    return sum(int(x) for x in p.stdout.split() if x.isdigit())


def recovery(args, data, tmp, source):
    """One host loss and its recovery (source: 'peer' or 'disk'); the figures."""
    rdir, ck = os.path.join(tmp, f"rec_{source}"), os.path.join(tmp, f"rec_{source}_ckpt")
    mem = os.path.join("/dev/shm", f"loom-bench-peer-{os.getpid()}")
    cmd = [args.loom, "run", "-n", "2", "--hosts", "10.231.0.1:1,10.231.0.2:1",
           "--heartbeat-timeout", "30", "--grace", "1", "--startup-timeout", "120",
           "--host-wait", "30", "--max-restarts", "1", "--run-dir", rdir,
           "--launcher-args", " ".join(MCA), "--",
           "--model", args.recovery_model] + (TINY if args.smoke else []) + [
           "--seq-len", str(args.recovery_seq_len),
           "--micro-batch", "1", "--global-batch", "2", "--steps", "8", "--threads", "1",
           "--data", data, "--log-every", "0", "--seed", "1234", "--dp", "2", "--zero", "1",
           "--ckpt-dir", ck, "--ckpt-every", "2"]
    if source == "peer":
        cmd += ["--ckpt-peer", "--ckpt-peer-dir", mem]
    if args.smoke:  # tiny steps: host 2 must still be training when step 2 is committed
        cmd += ["--inject", "slow@1:0:200"]
    print(f"$ {shlex.join(cmd)}", flush=True)
    err = open(rdir + ".err", "w")
    job = subprocess.Popen(cmd, stdout=err, stderr=err)
    step = os.path.join(ck, "step_00000002")

    def committed():
        if not os.path.exists(os.path.join(step, "manifest.json")):
            return False
        return source != "peer" or all(
            len(glob.glob(os.path.join(mem, h, "*", "step_00000002", "*.run.json"))) == 2
            for h in ("loomh1", "loomh2"))
    until = time.time() + args.run_timeout
    while time.time() < until and job.poll() is None and not committed():
        time.sleep(0.05)
    if job.poll() is not None or not committed():
        job.kill()
        job.wait()
        print(f"FAIL: recovery ({source}): step 2 never committed\n"
              f"{open(rdir + '.err').read()[-3000:]}", flush=True)
        sys.exit(1)
    ckpt_bytes = sum(os.path.getsize(f) for f in glob.glob(os.path.join(step, "*")))
    resident = drop_pages(step)
    pids = subprocess.run(["ip", "netns", "pids", "loomh2"], capture_output=True,
                          text=True).stdout.split()
    t_kill = time.time()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(os.path.join(mem, "loomh2"), ignore_errors=True)
    for f in glob.glob("/dev/shm/vader_segment.loomh2.*"):
        try:
            os.unlink(f)
        except OSError:
            pass
    try:
        rc = job.wait(timeout=args.run_timeout)
    except subprocess.TimeoutExpired:
        job.kill()
        rc = job.wait()
    shutil.rmtree(mem, ignore_errors=True)
    text = open(rdir + ".err").read()
    events = [json.loads(x) for x in open(os.path.join(rdir, "events.jsonl"))]
    ev = {e["event"]: e for e in events if e["event"] in ("failure_detected",
                                                           "first_step_after_restart")}
    # the restarted attempt's phases: launch -> loading (every rank up) -> training
    # (every rank past the checkpoint's load) -> its first step
    ph = {e["event"]: e["t"] for e in events
          if e["attempt"] == 1 and e["event"] in ("launch", "loading", "training")}
    if rc != 0 or len(ev) < 2 or len(ph) < 3:
        print(f"FAIL: recovery ({source}): exit {rc}\n{text[-3000:]}", flush=True)
        sys.exit(1)
    src = next((x.split("recovered from ", 1)[1] for x in text.splitlines()
                if "loom run: recovered from " in x), "")
    # rank 0's own word on what it resumed from (the resume source line is --ckpt-peer's)
    log0 = glob.glob(os.path.join(rdir, "attempt_1", "ranks", "*", "rank.0", "stderr"))
    lines0 = open(log0[0]).read().splitlines() if log0 else []
    resumed = next((x.strip() for x in lines0 if "resumed from" in x), "")
    # --ckpt-peer's account: bytes from memory and disk, the copies' and the load's seconds
    resume_source = next((x.strip() for x in lines0 if "resume source:" in x), "")
    res = {"kill_to_detect_s": round(ev["failure_detected"]["t"] - t_kill, 3),
           "detect_to_first_step_s": round(ev["first_step_after_restart"]["recovery_s"], 3),
           "kill_to_first_step_s": round(ev["first_step_after_restart"]["t"] - t_kill, 3),
           "launch_to_loading_s": round(ph["loading"] - ph["launch"], 3),
           "load_s": round(ph["training"] - ph["loading"], 3),
           "training_to_first_step_s": round(ev["first_step_after_restart"]["t"] -
                                             ph["training"], 3),
           "first_step": ev["first_step_after_restart"]["step"],
           "checkpoint_bytes": ckpt_bytes, "resident_bytes_after_drop": resident,
           "source": src or "disk (no --ckpt-peer)", "resumed": resumed,
           "resume_source": resume_source}
    print(f"  recovery ({source}): {res}", flush=True)
    return res


def link_reduce_s(args, exe, nbytes):
    """The capped link's own time for the gradients' reduction: the median of 3 in-place
    MPI_Iallreduce calls of nbytes between the hosts, as loom's engine calls it (coll/libnbc
    with loom's algorithm, glibc's huge pages), with nothing else running (mpi_tcp_probe)."""
    cmd = ["mpirun", "--allow-run-as-root", "--host", "10.231.0.1:1,10.231.0.2:1"] + MCA + [
        "--mca", "coll_libnbc_iallreduce_algorithm", "3",
        "-x", "GLIBC_TUNABLES=glibc.malloc.hugetlb=1", "-n", "2", exe, "--p2p", "4M",
        "--p2p-bytes", "4M", "--no-sendrecv", "--no-rsag", "--no-allreduce", "--iallreduce",
        "--coll-mb", f"{nbytes / 1e6:.3f}", "--coll-reps", "3"]
    print(f"$ {shlex.join(cmd)}", flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.run_timeout)
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    if p.returncode != 0 or not lines:
        print(f"FAIL: mpi_tcp_probe: exit {p.returncode}\n{p.stderr[-3000:]}", flush=True)
        sys.exit(1)
    r = json.loads(lines[-1])["iallreduce"]
    if not r["sum_ok"]:
        print("FAIL: mpi_tcp_probe: wrong sums", flush=True)
        sys.exit(1)
    print(f"  link: {r}", flush=True)
    return nbytes / (r["median_MBps"] * 1e6)


def run(args, data, tmp, name, hosts, bucket_mb, extra=()):
    metrics = os.path.join(tmp, f"{name}.jsonl")
    cmd = ["mpirun", "--allow-run-as-root", "--host", hosts] + MCA + [
        "-x", "OMP_NUM_THREADS=1", "-x", "OPENBLAS_NUM_THREADS=1", "-n", "2",
        args.loom, "train", "--model", "gpt2-small"] + (TINY if args.smoke else []) + [
        "--seq-len", str(args.seq_len),
        "--micro-batch", str(args.micro_batch), "--global-batch", str(2 * args.micro_batch),
        "--steps", str(args.steps), "--threads", "1", "--data", data, "--log-every", "0",
        "--seed", "1234", "--dp", "2", "--bucket-mb", f"{bucket_mb:g}", "--metrics", metrics
        ] + list(extra)
    print(f"$ {shlex.join(cmd)}", flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.run_timeout)
    if p.returncode != 0:
        print(f"FAIL: {name}: exit {p.returncode}\n{p.stderr[-3000:]}", flush=True)
        sys.exit(1)
    rows = [json.loads(line) for line in open(metrics)]
    measured = [r for r in rows if r["step"] > args.warmup]
    step_ms = statistics.median(r["step_ms"] for r in measured)
    med = lambda k: round(statistics.median(r["dp"].get(k, 0.0) for r in measured if "dp" in r), 1)  # noqa: E731
    res = {"step_ms": round(step_ms, 1),
           "tokens_per_s": round(rows[0]["tokens"] / (step_ms * 1e-3), 1),
           "exposed_ms": round(statistics.median(r["grad_wait_ms"] for r in measured), 1),
           "compute_ms": med("compute_ms"),
           # loom's own count of the gradient bytes this rank moved over dp in a step
           "grad_bytes": int(statistics.median(r["dp"]["grad_bytes"] for r in measured
                                               if "dp" in r)) if "dp" in measured[0] else None,
           "steps_ms": [round(r["step_ms"]) for r in rows]}
    print(f"  {name}: {res}", flush=True)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loom", default="build/loom")
    ap.add_argument("--caps", default="1,2.5,10", help="link caps in Gbit/s")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--run-timeout", type=float, default=600.0)
    ap.add_argument("--only", choices=("all", "throughput", "recovery", "bf16"), default="all",
                    help="bf16: only the bf16 cell's cap (--bf16-cap), with the bf16 cell")
    ap.add_argument("--bf16", action="store_true",
                    help="add the bf16 cell at --bf16-cap: --precision bf16 with fp32 and with "
                         "bf16 gradient reduction, and bf16 on one host")
    ap.add_argument("--bf16-cap", type=float, default=1.0, help="the bf16 cell's cap, Gbit/s")
    ap.add_argument("--recovery-model", default="gpt2-small")
    ap.add_argument("--recovery-seq-len", type=int, default=32)
    ap.add_argument("--smoke", action="store_true", help="a tiny model, one cap (seconds)")
    args = ap.parse_args()
    global WIRE_BYTES
    if args.smoke:
        args.caps, args.steps, args.warmup = "10", 3, 1
        args.bf16_cap = 10.0
        WIRE_BYTES = 4 << 20
    if args.only == "bf16":
        args.bf16, args.caps = True, f"{args.bf16_cap:g}"
    if os.geteuid() != 0:
        print("SKIP: needs root for network namespaces")
        sys.exit(77)
    loom = os.path.abspath(args.loom)
    args.loom = loom
    caps = [float(c) for c in args.caps.split(",")]
    if args.bf16 and args.bf16_cap not in caps:
        print(f"--bf16-cap {args.bf16_cap:g}: expected one of --caps {args.caps}")
        sys.exit(2)
    tmp = tempfile.mkdtemp(prefix="loom_bench_hosts_")
    data = os.path.join(tmp, "random.bin")
    write_random_shard(data, 1 << 18, 256 if args.smoke else 50257, 7)
    lock = open("/run/loom-hosts.lock", "w")  # the hosts are shared with the tests
    fcntl.flock(lock, fcntl.LOCK_EX)
    load = [os.getloadavg()[0]]
    results, rec, one, link_s, bf = {}, {}, None, {}, {}
    bf16 = ["--precision", "bf16"]
    if args.only == "recovery":
        caps = []
    try:
        sh(HOSTS_SH, "up", "2")
        cap_links(None)
        if args.only not in ("throughput", "bf16"):
            for source in ("peer", "disk"):
                rec[source] = recovery(args, data, tmp, source)
                load.append(os.getloadavg()[0])
        if args.only != "recovery":
            one = run(args, data, tmp, "one_host", "10.231.0.1:2", OVERLAP_MB)
        if args.bf16:  # the same two ranks on one host, bf16 (the cell's baseline)
            bf["one_host"] = run(args, data, tmp, "one_host_bf16", "10.231.0.1:2", OVERLAP_MB,
                                 bf16)
        if caps:
            probe = os.path.join(tmp, "mpi_tcp_probe")
            sh("mpicc", "-O2", "-o", probe, os.path.join(HERE, "mpi_tcp_probe.c"))
        for gbit in caps:
            cap_links(gbit)
            link_s[gbit] = link_reduce_s(args, probe, WIRE_BYTES)
            results[gbit] = {
                "overlap": run(args, data, tmp, f"cap{gbit:g}_overlap",
                               "10.231.0.1:1,10.231.0.2:1", OVERLAP_MB),
                "no_overlap": run(args, data, tmp, f"cap{gbit:g}_no_overlap",
                                  "10.231.0.1:1,10.231.0.2:1", NO_OVERLAP_MB)}
            if args.bf16 and gbit == args.bf16_cap:
                for red in ("fp32", "bf16"):
                    bf[red] = run(args, data, tmp, f"cap{gbit:g}_bf16_reduce_{red}",
                                  "10.231.0.1:1,10.231.0.2:1", OVERLAP_MB,
                                  bf16 + ["--grad-reduce-dtype", red])
            load.append(os.getloadavg()[0])
    finally:
        cap_links(None)
        sh(HOSTS_SH, "down", check=False)
    out = {"bench": "hosts", "model": "smoke: gpt2 L2 C64 V256" if args.smoke else "gpt2-small",
           "seq_len": args.seq_len,
           "micro_batch": args.micro_batch, "openblas_coretype":
           os.environ.get("OPENBLAS_CORETYPE") or "unset: loom's own (src/core/cpu_boot.c)",
           "loadavg": load, "one_host": one,
           "caps": {}}
    if rec:
        speed = {k: round(rec["disk"][k] / rec["peer"][k], 2) if rec["peer"][k] > 0 else None
                 for k in ("kill_to_first_step_s", "detect_to_first_step_s")}
        out["recovery"] = {"model": args.recovery_model, "seq_len": args.recovery_seq_len,
                           "ranks": 2, "cold_pages": "posix_fadvise DONTNEED after sync",
                           "peer": rec["peer"], "disk": rec["disk"], "speedup": speed,
                           "target_speedup": 2.0}
    for gbit, r in results.items():
        ov, no = r["overlap"], r["no_overlap"]
        wire_ms = WIRE_BYTES * 8 / (gbit * 1e9) * 1e3
        backward_ms = 2.0 / 3.0 * ov["compute_ms"]  # backward ~ 2/3 of forward + backward
        model = {"no_overlap": wire_ms, "overlap": max(0.0, wire_ms - backward_ms)}
        err = {k: round((r[k]["exposed_ms"] - v) / v, 3) if v > 0 else None
               for k, v in model.items()}
        # the same with the bandwidth the link delivers to MPI (the probe's reduction alone)
        link_ms = link_s[gbit] * 1e3
        model_link = {"no_overlap": link_ms, "overlap": max(0.0, link_ms - backward_ms)}
        err_link = {k: round((r[k]["exposed_ms"] - v) / v, 3) if v > 0 else None
                    for k, v in model_link.items()}
        out["caps"][f"{gbit:g}gbit"] = {
            "tokens_per_s": ov["tokens_per_s"],
            "ratio_to_one_host": round(ov["tokens_per_s"] / one["tokens_per_s"], 3),
            "exposed_ms": {"overlap": ov["exposed_ms"], "no_overlap": no["exposed_ms"]},
            "hidden_fraction": round(1 - ov["exposed_ms"] / no["exposed_ms"], 3)
            if no["exposed_ms"] > 0 else None,
            "wire_ms": round(wire_ms, 1), "model_exposed_ms":
            {k: round(v, 1) for k, v in model.items()}, "model_error": err,
            "link_reduce_ms": round(link_ms, 1),
            "link_gbit": round(WIRE_BYTES * 8 / link_s[gbit] / 1e9, 2),
            "model_link_exposed_ms": {k: round(v, 1) for k, v in model_link.items()},
            "model_link_error": err_link,
            "runs": r}
    if bf:
        out["bf16"] = bf16_cell(args, one, results, bf)
    print(json.dumps(out))


def bf16_cell(args, one, results, bf):
    """The bf16 cell: bf16 compute with fp32 and with bf16 gradient reduction at the cap,
    against the same two ranks on one host in bf16 (and the fp32 run at the cap)."""
    base, f32, b16 = bf["one_host"], bf["fp32"], bf["bf16"]
    fp = results[args.bf16_cap]["overlap"]
    cell = {"cap_gbit": args.bf16_cap, "bucket_mb": OVERLAP_MB,
            "one_host_bf16": base, "fp32_compute_fp32_reduce": fp,
            "bf16_compute_fp32_reduce": f32, "bf16_compute_bf16_reduce": b16,
            "one_host_fp32_tokens_per_s": one["tokens_per_s"]}
    for k, r in (("fp32_reduce", f32), ("bf16_reduce", b16)):
        cell[f"ratio_to_one_host_{k}"] = round(r["tokens_per_s"] / base["tokens_per_s"], 3)
    cell["ratio_to_one_host_fp32_compute"] = round(fp["tokens_per_s"] / one["tokens_per_s"], 3)
    if f32["grad_bytes"] and b16["grad_bytes"] is not None:
        cell["grad_bytes_bf16_over_fp32_reduce"] = round(b16["grad_bytes"] / f32["grad_bytes"], 4)
    cell["tokens_per_s_bf16_over_fp32_reduce"] = round(b16["tokens_per_s"] / f32["tokens_per_s"], 3)
    # the wire alone: loom's count / the cap (with 2 ranks the bytes a rank sends: its
    # reduce-scatter's out plus its all-gather's in, which equals its all-gather's out)
    cell["wire_ms"] = {k: round(r["grad_bytes"] * 8 / (args.bf16_cap * 1e9) * 1e3, 1)
                       for k, r in (("fp32_reduce", f32), ("bf16_reduce", b16))
                       if r["grad_bytes"]}
    return cell


if __name__ == "__main__":
    main()
