#!/usr/bin/python3
"""Elastic DiLoCo workers across two test hosts (docs/diloco.md, "Elastic workers"): two
workers, each its own one-rank mpirun job inside its own test host (worker 0 on host 1,
the coordinator; worker 1 on host 2), joined through an ompi-server on the hosts' bridge,
both hosts' links capped with tbf. In parts 1-4 the test is the launcher (no `loom run`):

1. both train and sync (an outer sync with members=2 in both logs, the same checksum);
2. every process of host 2 is SIGKILLed (its mpirun too) after worker 1's first outer
   sync: worker 0 drops it ("worker 1 lost") and goes on alone (outer syncs members=1,
   its steps continue);
3. worker 1 is started again on host 2 with --elastic-join: worker 0 connects at its next
   outer step and sends the state; at the next outer sync both print members=2 and the
   same checksum of the round-start parameters (identical parameters);
4. the run ends: both jobs exit 0, worker 0 writes its weights, and nothing is left running
   in either host;
5. `loom run --elastic --hosts` as the launcher (loom_run_across below): a crashed worker
   is restarted in its host and rejoins at a known step;
6. the same with worker 0, the coordinator, killed: loom run starts it again in its host
   from its newest checkpoint, worker 1 leaves and rejoins it, the run ends with both at
   the last sync;
7. streaming DiLoCo (F = 2, H = 6) under `loom run --elastic --hosts` (streaming_across):
   each fragment's exchange on the lead's thread over the capped link, a crashed worker
   dropped, restarted in its host and admitted when no exchange is under way, the last
   step's syncs equal on both; then hosts.sh down (nothing left).
8. With --cut, instead of 1-7: host 2's link cut for 12 s under `loom run --elastic
   --hosts` (link_cut_across; label large, not in CI: about 35 s, and its timing depends on TCP's
   retransmissions after the cut).
Skipped (77) without root, network namespaces, mpirun or ompi-server.
Usage: test_elastic.py --loom PATH [--seed S] [--cut]
"""
import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "harness"))
sys.path.insert(0, HERE)
from loomtest import Skip, parse_test_args, report, run_test, write_text_shard  # noqa: E402
from test_hosts import (HOSTS_SH, MCA, SUBNET, cap_link, hosts_down,  # noqa: E402
                        kill_host_processes, netns_pids, sh, skip_unless_possible, wait_until)

STEPS, H, TIMEOUT_S, MBIT = 300, 8, 3, 200
SYNC = re.compile(r"worker (\d+) step (\d+): (outer sync|joined|worker \d+ joined), "
                  r"members=(\d+) \[([\d,]*)\], checksum ([0-9a-f]+)")


def syncs(path):
    """The log's elastic lines: (step, what, members, checksum)."""
    text = open(path).read() if os.path.exists(path) else ""
    return [(int(m[2]), m[3], int(m[4]), m[6]) for m in SYNC.finditer(text)]


def loom_run_across(loom, tmp, train):
    """5. `loom run --elastic --hosts 10.231.0.1:1,10.231.0.2:1`: loom run is the launcher
    (an ompi-server on the hosts' subnet, each worker's mpirun run inside its host through
    the rsh agent); worker 1 crashes at step 6 and is restarted in host 2 with
    --elastic-join; worker 0 admits it at step 16 (admit@16: a known step), the last sync
    (24) is equal on both, exit 0, nothing left in the hosts."""
    run_dir = os.path.join(tmp, "loom_run")
    cmd = [loom, "run", "--elastic", "-n", "2", "--hosts", "10.231.0.1:1,10.231.0.2:1",
           "--run-dir", run_dir, "--grace", "5", "--launcher-args", " ".join(MCA), "--"] + train + [
        "--steps", "24", "--inner-steps", "4", "--elastic-timeout", str(TIMEOUT_S),
        "--inject", "crash@6:1", "--inject", "admit@16"]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    logs = [os.path.join(run_dir, f"worker_{w}.log") for w in (0, 1)]
    s0, s1 = syncs(logs[0]), syncs(logs[1])
    joined = [s for s in s0 if s[1] == "worker 1 joined"]
    end = [[s for s in x if s[0] == 24 and s[1] == "outer sync" and s[2] == 2] for x in (s0, s1)]
    ok = (p.returncode == 0 and "worker 1 ended (exit 137)" in p.stderr and
          "worker 1 started again with --elastic-join on 10.231.0.2" in p.stderr and
          [s[0] for s in joined] == [0, 16] and end[0] and end[1] and end[0][0][3] == end[1][0][3])
    report("loom run --elastic --hosts", ok,
           f"exit {p.returncode}, worker 1 restarted in host 2, joined at steps "
           f"{[s[0] for s in joined]}, last sync equal on both ({time.time() - t0:.1f} s)")
    if not ok:
        print(p.stderr[-3000:])
    left = {k: netns_pids(k) for k in (1, 2)}
    report("nothing left in the hosts after loom run", not any(left.values()), f"{left}")


def coordinator_dies_across(loom, tmp, train):
    """6. `loom run --elastic --hosts` with worker 0, the coordinator, SIGKILLed in host 1 at
    the start of step 10 (crash@10:0; checkpoints every 2 steps on the shared folder): loom
    run starts it again in host 1 with --resume auto, it founds the group again from its
    newest checkpoint, worker 1 hears no update, leaves, is started again in host 2 with
    --elastic-join and joins it; the last sync (24) has members=2 and is equal on both,
    exit 0, one coordinator (worker 1 never coordinates), nothing left in the hosts."""
    run_dir = os.path.join(tmp, "loom_run_w0")
    cmd = [loom, "run", "--elastic", "-n", "2", "--hosts", "10.231.0.1:1,10.231.0.2:1",
           "--run-dir", run_dir, "--grace", "5", "--max-restarts", "6",
           "--launcher-args", " ".join(MCA), "--"] + train + [
        "--steps", "24", "--inner-steps", "4", "--elastic-timeout", str(TIMEOUT_S),
        "--inject", "crash@10:0", "--ckpt-dir", os.path.join(tmp, "ck_w0"), "--ckpt-every", "2"]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    logs = [os.path.join(run_dir, f"worker_{w}.log") for w in (0, 1)]
    s0, s1 = syncs(logs[0]), syncs(logs[1])
    texts = [open(x).read() if os.path.exists(x) else "" for x in logs]
    end = [[s for s in x if s[0] == 24 and s[1] == "outer sync" and s[2] == 2] for x in (s0, s1)]
    founded = re.findall(r"worker 0 coordinates from step (\d+)", texts[0])
    ok = (p.returncode == 0 and "worker 0 ended (exit 137)" in p.stderr and
          "worker 0 started again (the coordinator) --resume auto (its newest checkpoint) on "
          "10.231.0.1" in p.stderr and
          "worker 1 started again with --elastic-join --resume auto (its newest checkpoint) on "
          "10.231.0.2" in p.stderr and
          len(founded) == 2 and 0 < int(founded[1]) < 10 and "coordinates" not in texts[1] and
          end[0] and end[1] and end[0][0][3] == end[1][0][3])
    report("loom run --elastic --hosts, worker 0 killed", ok,
           f"exit {p.returncode}, worker 0 restarted in host 1 from its step "
           f"{founded[1] if len(founded) > 1 else '?'}, worker 1 rejoined it, one coordinator, "
           f"last sync members=2 equal on both ({time.time() - t0:.1f} s)")
    if not ok:
        print(p.stderr[-3000:])
        print(texts[0][-2000:])
        print(texts[1][-2000:])
    left = {k: netns_pids(k) for k in (1, 2)}
    report("nothing left in the hosts after it", not any(left.values()), f"{left}")


STREAM = re.compile(r"worker (\d+) step (\d+): outer sync of fragment (\d+), members=(\d+) "
                    r"\[([\d,]*)\], checksum ([0-9a-f]+)")


def streaming_across(loom, tmp, train):
    """7. `loom run --elastic --hosts` with streaming DiLoCo, F = 2 and H = 6 (fragment 0
    synced after steps 3, 9, 15, 21, fragment 1 after 6, 12, 18, 24, each exchange during
    the two steps after): worker 1 crashes at step 5 and is dropped (at the sync of 3 or
    6), restarted in host 2 with --elastic-join and admitted at step 17 (admit@17: when
    fragment 0's sync of 15 has landed); the last step's syncs have members=2 and equal
    checksums on both, exit 0, nothing left in the hosts."""
    run_dir = os.path.join(tmp, "loom_run_streaming")
    cmd = [loom, "run", "--elastic", "-n", "2", "--hosts", "10.231.0.1:1,10.231.0.2:1",
           "--run-dir", run_dir, "--grace", "5", "--launcher-args", " ".join(MCA), "--"] + train + [
        "--steps", "24", "--inner-steps", "6", "--outer-fragments", "2", "--elastic-timeout",
        str(TIMEOUT_S), "--inject", "crash@5:1", "--inject", "admit@17"]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    logs = [os.path.join(run_dir, f"worker_{w}.log") for w in (0, 1)]
    texts = [open(x).read() if os.path.exists(x) else "" for x in logs]
    # the last step's syncs (fragment 1's own, then both fragments'), members=2, each worker
    end = [[m for m in STREAM.findall(t) if m[1] == "24" and m[3] == "2"] for t in texts]
    ok = (p.returncode == 0 and "worker 1 ended (exit 137)" in p.stderr and
          "worker 1 started again with --elastic-join on 10.231.0.2" in p.stderr and
          "worker 1 lost" in texts[0] and "worker 0 step 17: worker 1 joined, members=2" in texts[0]
          and len(end[0]) == 3 and [m[5] for m in end[0]] == [m[5] for m in end[1]])
    report("loom run --elastic --hosts, streaming", ok,
           f"exit {p.returncode}, worker 1 dropped and restarted in host 2, admitted at 17, the "
           f"last syncs equal on both ({time.time() - t0:.1f} s)")
    if not ok:
        print(p.stderr[-3000:])
        print(texts[0][-2000:])
        print(texts[1][-2000:])
    left = {k: netns_pids(k) for k in (1, 2)}
    report("nothing left in the hosts after streaming", not any(left.values()), f"{left}")


def link_cut_across(loom, tmp, train, cut_s=12):
    """7. (--cut alone: ctest hosts_elastic_cut, label large, not in CI) `loom run --elastic
    --hosts` with host 2's link cut (its veth down on the bridge) for cut_s seconds once
    both workers have synced: worker 0 drops worker 1 at its deadline and goes on alone;
    worker 1 hears no update for 3 deadlines and leaves the group (exit 1), or loom run's
    heartbeat watch, hearing nothing from it for --heartbeat-timeout, stops it first; loom
    run starts it again in host 2 with --elastic-join (again, if that fails while the link
    is down), and once the link is back it rejoins; the last sync has members=2 and is equal on both,
    exit 0, nothing left in the hosts."""
    run_dir = os.path.join(tmp, "loom_run_cut")
    steps = 400
    cmd = [loom, "run", "--elastic", "-n", "2", "--hosts", "10.231.0.1:1,10.231.0.2:1",
           "--run-dir", run_dir, "--grace", "5", "--max-restarts", "10",
           "--launcher-args", " ".join(MCA), "--"] + train + [
        "--steps", str(steps), "--inner-steps", "4", "--elastic-timeout", str(TIMEOUT_S),
        "--inject", "slow@1:0:30+"]  # ~0.1 s a step: the run outlasts the cut and the rejoin
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    logs = [os.path.join(run_dir, f"worker_{w}.log") for w in (0, 1)]
    synced = wait_until(lambda: p.poll() is not None or
                        any(s[1] == "outer sync" and s[2] == 2 for s in syncs(logs[0])), 120)
    cut_at = max((s[0] for s in syncs(logs[0])), default=0)
    if synced and p.poll() is None:
        subprocess.run(["ip", "link", "set", "dev", "loomv2", "down"], check=True)
        time.sleep(cut_s)
        subprocess.run(["ip", "link", "set", "dev", "loomv2", "up"], check=True)
    back_at = max((s[0] for s in syncs(logs[0])), default=0)
    try:
        _, err = p.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
    s0, s1 = syncs(logs[0]), syncs(logs[1])
    text0 = open(logs[0]).read() if os.path.exists(logs[0]) else ""
    alone = [s[0] for s in s0 if s[1] == "outer sync" and s[2] == 1 and s[0] > cut_at]
    rejoined = [s[0] for s in s0 if s[1] == "worker 1 joined" and s[0] > cut_at]
    end = [[s for s in x if s[0] == steps and s[1] == "outer sync" and s[2] == 2]
           for x in (s0, s1)]
    ok = (p.returncode == 0 and "worker 1 lost" in text0 and alone and rejoined and
          "worker 1 started again with --elastic-join on 10.231.0.2" in err and
          end[0] and end[1] and end[0][0][3] == end[1][0][3])
    report("loom run --elastic --hosts, host 2 cut off", ok,
           f"cut {cut_s} s after step {cut_at} (worker 0 at step {back_at} when it came back): "
           f"worker 0 alone at steps {alone[:3]}{'...' if len(alone) > 3 else ''}, worker 1 "
           f"rejoined at {rejoined}, last sync members=2 equal on both (exit {p.returncode}, "
           f"{time.time() - t0:.1f} s; launches: "
           f"{err.count('worker 1 started again')} restart(s) of worker 1)")
    if not ok:
        print(err[-3000:])
        print(text0[-1500:])
    left = {k: netns_pids(k) for k in (1, 2)}
    report("nothing left in the hosts after it", not any(left.values()), f"{left}")


def main():
    args = parse_test_args(lambda ap: ap.add_argument(
        "--cut", action="store_true", help="part 7 alone: host 2's link cut mid-run"))
    loom = os.path.abspath(args.loom)
    seed = args.seed
    skip_unless_possible()
    if not shutil.which("ompi-server"):
        raise Skip("no ompi-server")
    tmp = tempfile.mkdtemp(prefix="loom_elastic_")
    data = os.path.join(tmp, "train.bin")
    write_text_shard(data, seed)
    uri = os.path.join(tmp, "ompi_server.uri")
    lock = open("/run/loom-hosts.lock", "w")  # one user of the test hosts at a time
    fcntl.flock(lock, fcntl.LOCK_EX)
    server, jobs = None, []
    try:
        sh("up", "2")
        for k in (1, 2):
            cap_link(k, MBIT)
        # on the bridge's address only (the hosts reach nothing else: bench/probe_elastic.py)
        server = subprocess.Popen(["ompi-server", "--no-daemonize", "-r", uri, "--mca",
                                   "oob_tcp_if_include", SUBNET],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: os.path.exists(uri) and open(uri).read().strip(), 10)
        time.sleep(0.3)
        train = [loom, "train", "--family", "gpt2", "--vocab-size", "256", "--seq-len", "32",
                 "--n-layer", "2", "--d-model", "64", "--n-head", "4", "--d-ff", "128",
                 "--micro-batch", "2", "--global-batch", "4", "--seed", str(seed),
                 "--log-every", "0", "--threads", "1", "--data", data, "--steps", str(STEPS),
                 "--lr", "3e-3", "--warmup-steps", "4", "--outer", "diloco", "--workers", "2",
                 "--inner-steps", str(H), "--outer-nesterov", "--elastic-timeout",
                 str(TIMEOUT_S), "--inject", "slow@1:0:6+"]

        def start(k, tag, extra):
            # each job's mpirun inside its own host, its rank local to it (probe_elastic.py)
            cmd = [HOSTS_SH, "exec", str(k), "mpirun", "--allow-run-as-root", "--ompi-server",
                   f"file:{uri}", "--mca", "btl", "tcp,vader,self", "--mca",
                   "btl_tcp_if_include", SUBNET, "--mca", "oob_tcp_if_include", SUBNET,
                   "--mca", "mpi_yield_when_idle", "1", "--bind-to", "none", "-n", "1"]
            log = os.path.join(tmp, f"{tag}.log")
            with open(log, "w") as f:
                jobs.append((tag, subprocess.Popen(cmd + train + extra, stdout=f,
                                                   stderr=subprocess.STDOUT)))
            return log

        if args.cut:
            link_cut_across(loom, tmp, train[2:-2])
            return
        w0 = start(1, "worker0", ["--elastic-worker", "0", "--save-weights",
                                  os.path.join(tmp, "final.safetensors")])
        w1 = start(2, "worker1", ["--elastic-worker", "1"])
        # 1. both in, one outer sync of two members with the same parameters
        both = wait_until(lambda: any(s[1] == "outer sync" for s in syncs(w1)), 60)
        a = [s for s in syncs(w0) if s[1] == "outer sync"]
        b = [s for s in syncs(w1) if s[1] == "outer sync"]
        first = b[0] if b else None
        same = bool(first) and any(s[0] == first[0] and s[3] == first[3] for s in a)
        if not report("two workers sync", both and same and first[2] == 2,
                      f"step {first[0] if first else '?'}: members=2, checksums equal"):
            return
        # 2. host 2 dies: every process in it (its mpirun too)
        killed_at = max(s[0] for s in syncs(w0))
        kill_host_processes(2)
        alone = wait_until(lambda: any(s[1] == "outer sync" and s[2] == 1 for s in syncs(w0)),
                           4 * TIMEOUT_S + 30)
        text0 = open(w0).read()
        lone = [s for s in syncs(w0) if s[1] == "outer sync" and s[2] == 1]
        report("worker 1 dropped", alone and "worker 1 lost" in text0,
               f"killed after step {killed_at}; worker 0 alone from step "
               f"{lone[0][0] if lone else '?'}")
        wait_until(lambda: len([s for s in syncs(w0) if s[2] == 1]) >= 2, 30)
        lone = [s for s in syncs(w0) if s[1] == "outer sync" and s[2] == 1]
        report("worker 0 goes on alone", len(lone) >= 2 and lone[-1][0] > lone[0][0],
               f"{len(lone)} outer syncs of members=1 (steps {[s[0] for s in lone]})")
        # 3. it comes back: restarted on host 2 as a joiner
        w1b = start(2, "worker1_again", ["--elastic-worker", "1", "--elastic-join"])
        joined = wait_until(lambda: any(s[1] == "joined" for s in syncs(w1b)), 60)
        after = []

        def resynced():
            b2 = [s for s in syncs(w1b) if s[1] == "outer sync"]
            if not b2:
                return False
            a2 = [s for s in syncs(w0) if s[1] == "outer sync" and s[0] == b2[0][0]]
            after[:] = [b2[0], a2[0] if a2 else None]
            return a2 != []
        ok = joined and wait_until(resynced, 60)
        j = [s for s in syncs(w1b) if s[1] == "joined"]
        report("worker 1 rejoins", ok and after[0][2] == 2 and after[1][2] == 2 and
               after[0][3] == after[1][3],
               f"joined at step {j[0][0] if j else '?'}; step {after[0][0] if after else '?'}: "
               f"members=2 on both, checksums {after[0][3] if after else '?'} / "
               f"{after[1][3] if after and after[1] else '?'}")
        # 4. the run ends, nothing left
        codes = {}
        for tag, p in jobs[:1] + jobs[2:]:
            try:
                codes[tag] = p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                codes[tag] = f"hung (killed), {p.wait()}"
        last = [s for s in syncs(w0) if s[1] == "outer sync"]
        last1 = [s for s in syncs(w1b) if s[1] == "outer sync"]
        report("the run ends", codes == {"worker0": 0, "worker1_again": 0} and
               last and last1 and last[-1][0] == STEPS and last[-1][3] == last1[-1][3] and
               os.path.exists(os.path.join(tmp, "final.safetensors")),
               f"exit codes {codes}, last sync step {last[-1][0] if last else '?'} equal on both")
        left = {k: netns_pids(k) for k in (1, 2)}
        report("nothing left in the hosts", not any(left.values()), f"{left}")
        loom_run_across(loom, tmp, train[2:-2])  # without the slow steps
        coordinator_dies_across(loom, tmp, train[2:-2])
        streaming_across(loom, tmp, train[2:-2])
    finally:
        for tag, p in jobs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for k in (1, 2):
            cap_link(k, None)
        if server:
            server.terminate()
            server.wait()
        hosts_down(tmp, seed)
        lock.close()


if __name__ == "__main__":
    run_test(main)
