#!/usr/bin/python3
"""What survives a peer's death between MPI jobs here (OpenMPI 4.1, no ULFM), across two
test hosts: the ground for elastic DiLoCo workers (docs/diloco.md, "Elastic workers").

bench/mpi_join_probe.c (its header says what each role does) in two jobs joined by
MPI_Comm_connect / MPI_Comm_accept through an ompi-server on this machine (the hosts reach
it at the bridge's address): the "stay" job (2 ranks on test host 1) steps every 0.2 s and
exchanges with the "join" job (1 rank on test host 2) every step, dropping it after an
exchange that does not complete in --timeout seconds. Each job's mpirun runs inside its
own host (two mpiruns started together from this machine with the rsh agent and
--ompi-server both stopped at once: "ORTE has lost communication with a remote daemon").
Scenarios:
  kill  1 s after the first join every process of host 2 is SIGKILLed (the host dies, its
        mpirun too); 2 s later a new join job starts on host 2
  cut   1 s after the first join host 2's link goes down (ip link set loomv2 down), 4 s
        later up again; the join job lives on and publishes itself again after its own
        lost exchange
2 s after the stay job's second join (or --seconds without it) a stop file ends every job.
For each: joined_before_fault, rejoined, the exit codes, the stay job's events (joins,
losses, the longest step), the join jobs' events, and what is still running in the hosts
when the jobs have ended. Needs root (exit 77 otherwise); prints one JSON object last.
Usage: probe_elastic.py [--seconds 60] [--timeout 2]
"""
import argparse
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_hosts  # noqa: E402 (MCA settings, hosts.sh)


def events(text):
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def scenario(name, exe, uri, args, tmp):
    def mpirun(host):  # each job's mpirun inside its own host (its ranks local to it)
        return [bench_hosts.HOSTS_SH, "exec", str(host), "mpirun", "--allow-run-as-root",
                "--ompi-server", f"file:{uri}", "--mca", "btl", "tcp,vader,self",
                "--mca", "btl_tcp_if_include", bench_hosts.SUBNET, "--mca", "oob_tcp_if_include",
                bench_hosts.SUBNET, "--mca", "mpi_yield_when_idle", "1", "--bind-to", "none"]
    stay_cmd = mpirun(1) + ["-n", "2", exe, "stay", str(args.seconds), str(args.timeout)]
    # (every job also ends once the stop file exists: the driver makes it after the rejoin)
    join_cmd = mpirun(2) + ["-n", "1", exe, "join"]
    logs, jobs = [], []

    def start(cmd, tag):
        f = open(os.path.join(tmp, f"{name}_{tag}.log"), "w+")
        logs.append((tag, f))
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        jobs.append((tag, p))
        return p

    def joins(tag, n, limit):  # wait until the job's log shows n joins (False on timeout)
        until = time.time() + limit
        while time.time() < until:
            f = dict(logs)[tag]
            f.flush()
            with open(f.name) as g:
                if sum(e.get("event") == "joined" for e in events(g.read())) >= n:
                    return True
            time.sleep(0.1)
        return False

    stop = os.path.join(tmp, f"{name}.stop")
    stay = start(stay_cmd + [stop], "stay")
    first = start(join_cmd + [str(args.seconds), str(args.timeout), stop], "join1")
    res = {"joined_before_fault": joins("stay", 1, args.seconds)}
    time.sleep(1)
    if name == "kill":
        pids = subprocess.run(["ip", "netns", "pids", "loomh2"], capture_output=True,
                              text=True).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(2)
        start(join_cmd + [str(args.seconds), str(args.timeout), stop], "join2")
    else:
        bench_hosts.sh("ip", "link", "set", "loomv2", "down")
        time.sleep(4)
        bench_hosts.sh("ip", "link", "set", "loomv2", "up")
    res["rejoined"] = joins("stay", 2, args.seconds)
    time.sleep(2)  # exchanges after the rejoin
    open(stop, "w").close()
    res["exit"] = {}
    deadline = time.time() + 30
    for tag, p in jobs:
        try:
            res["exit"][tag] = p.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            res["exit"][tag] = f"hung (killed), {p.wait()}"
    del first, stay
    res["left_running"] = {h: subprocess.run(["ip", "netns", "pids", h], capture_output=True,
                                             text=True).stdout.split()
                           for h in ("loomh1", "loomh2")}
    for tag, f in logs:
        f.seek(0)
        text = f.read()
        res[tag] = [{k: v for k, v in e.items() if k != "role"} for e in events(text)]
        if "failed to TCP connect" in text:
            res[tag + "_warning"] = "Open MPI: failed to TCP connect to a peer MPI process"
    print(f"  {name}: {res}", flush=True)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60, help="the longest a job runs")
    ap.add_argument("--timeout", type=float, default=2)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("SKIP: needs root for network namespaces")
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="loom_probe_elastic_")
    exe = os.path.join(tmp, "mpi_join_probe")
    bench_hosts.sh("mpicc", "-O2", "-o", exe, os.path.join(HERE, "mpi_join_probe.c"))
    uri = os.path.join(tmp, "ompi_server.uri")
    lock = open("/run/loom-hosts.lock", "w")  # the hosts are shared with the tests
    fcntl.flock(lock, fcntl.LOCK_EX)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = {"bench": "probe_elastic", "mpi": subprocess.run(
        ["mpirun", "--version"], capture_output=True, text=True).stdout.splitlines()[0],
        "seconds": args.seconds, "timeout_s": args.timeout}
    server = None
    try:
        bench_hosts.sh(bench_hosts.HOSTS_SH, "up", "2")
        # after the hosts' bridge exists, on its address only (the hosts reach nothing else:
        # a URI with this machine's other addresses first made the hosts' daemons fail)
        server = subprocess.Popen(["ompi-server", "--no-daemonize", "-r", uri, "--mca",
                                   "oob_tcp_if_include", bench_hosts.SUBNET],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not (os.path.exists(uri) and open(uri).read().strip()):  # created, then written
            time.sleep(0.05)
        time.sleep(0.5)
        for name in ("kill", "cut"):
            out[name] = scenario(name, exe, uri, args, tmp)
    finally:
        subprocess.run(["ip", "link", "set", "loomv2", "up"], capture_output=True)
        bench_hosts.sh(bench_hosts.HOSTS_SH, "down", check=False)
        lock.close()
        if server:
            server.terminate()
            server.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
