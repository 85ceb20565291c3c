#!/usr/bin/python3
"""Recovery from peers' memory (--ckpt-peer) after a host dies, across two test hosts
(tests/hosts/hosts.sh: network + UTS namespaces on one bridge).

`loom run -n 4 --hosts 10.231.0.1:2,10.231.0.2:2` trains dp 4 ZeRO-1 with --ckpt-dir every
4 steps and --ckpt-peer: each rank's shard is kept in its host's memory and a copy on the
other host's (DIR/HOSTNAME/TAG in a --ckpt-peer-dir of this test's own). Once step 8 is
committed in memory and on disk, host 2 dies: every process of its namespace is killed
(SIGKILL) and what it held in memory (DIR/loomh2) is removed. The supervisor restarts the
job on the same hosts (host 2 comes back empty).
1. Peer memory: the disk checkpoint of step 8 loses its data files (so any read of it would
   fail), and the restart must resume at step 8 from memory alone: rank 0's line says
   "peer memory", the bytes and chunks read from memory and 0 from disk, and the 4 shards
   host 2 lacks copied to it from host 1 over MPI; the supervisor's "recovered from" line
   says it too.
2. Disk fallback: host 1's copy of rank 3's shard is also removed (the peer copy is
   incomplete): the restart takes step 8 from disk (bytes from disk > 0, 0 from memory, the
   reason naming rank 3).
Both end with final weights bitwise those of the fault-free run (the same command without
faults under mpirun across the hosts), and the restarted attempt's losses (steps 9-16) are
bitwise the fault-free run's. Last, `hosts.sh down`: nothing left
(netns, bridge, veths, holders) and the test's memory folder is gone. Skipped (77) without
root, network namespaces or mpirun.
Usage: test_peer_ckpt.py --loom PATH [--seed S]
"""
import fcntl
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "harness"))
sys.path.insert(0, HERE)
from loomtest import Layouts, Run, parse_test_args, report, run_test, same_tensors, write_text_shard  # noqa: E402
from test_hosts import (MCA, MPIRUN_HOSTS, HOSTS, hosts_down, kill_host_processes, sh,  # noqa: E402
                        skip_unless_possible, wait_until)

def kill_host(k, mem):
    """Host k dies: every process in its network namespace, and what it held in memory."""
    segments = glob.glob(f"/dev/shm/vader_segment.loomh{k}.*")  # before any relaunch
    killed = kill_host_processes(k)
    shutil.rmtree(os.path.join(mem, f"loomh{k}"), ignore_errors=True)
    # and OpenMPI's shared-memory segments of the ranks that ran there (the test holds the
    # hosts' lock: no other job is on the host)
    for f in segments:
        try:
            os.unlink(f)
        except OSError:
            pass
    return killed


def steps_in(mem, host):
    return sorted(os.path.basename(d) for d in glob.glob(os.path.join(mem, host, "*", "step_*")))


def shards_in(mem, host, step):
    d = glob.glob(os.path.join(mem, host, "*", f"step_{step:08d}"))
    return sorted(os.path.basename(f) for f in glob.glob(os.path.join(d[0], "*.run.json"))) \
        if d else []


def line_with(text, words):
    return next((x for x in text.splitlines() if words in x), "")


def main():
    args = parse_test_args()
    seed = args.seed
    skip_unless_possible()
    tmp = tempfile.mkdtemp(prefix="loom_peer_")
    mem = f"/dev/shm/loom-peer-test-{os.getpid()}"
    lock = open("/run/loom-hosts.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    sh("down", check=False)
    try:
        sh("up", "2")
        data = os.path.join(tmp, "train.bin")
        write_text_shard(data, seed)
        steps = 16
        base = [args.loom, "train", "--family", "gpt2", "--vocab-size", "256", "--seq-len", "24",
                "--n-layer", "2", "--d-model", "48", "--n-head", "4", "--d-ff", "96",
                "--micro-batch", "2", "--global-batch", "16", "--steps", str(steps), "--lr",
                "3e-3", "--warmup-steps", "3", "--grad-clip", "0.5", "--seed", str(seed),
                "--log-every", "0", "--threads", "1", "--data", data, "--dp", "4", "--zero", "1"]
        ref = Layouts(base, tmp, mpirun=MPIRUN_HOSTS).run("ref", 4)
        print(f"fault-free across 2 hosts: loss {ref.losses[0]:.4f} -> {ref.losses[-1]:.4f}")

        for case in ("peer_memory", "disk_fallback"):
            out, rdir, ck = (os.path.join(tmp, case + x) for x in ("", "_run", "_ckpt"))
            # slow: the first attempt's steps take a while, so host 2 dies mid-run
            cmd = ([args.loom, "run", "-n", "4", "--hosts", HOSTS, "--startup-timeout", "30",
                    "--max-restarts", "2", "--run-dir", rdir, "--launcher-args", " ".join(MCA),
                    "--"] + base[2:] +
                   ["--ckpt-dir", ck, "--ckpt-every", "4", "--ckpt-peer", "--ckpt-peer-dir", mem,
                    "--inject", "slow@1:0:40", "--metrics", out + ".jsonl", "--dump-dir", out])
            job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
            # step 8 complete: on disk (manifest) and in memory (every host holding its 2
            # shards and the other host's 2)
            def committed():
                return (os.path.exists(os.path.join(ck, "step_00000008", "manifest.json")) and
                        all(len(shards_in(mem, h, 8)) == 4 for h in ("loomh1", "loomh2")))
            ready = (wait_until(lambda: job.poll() is not None or committed(), 60, 0.02)
                     and committed())
            if not ready:
                job.kill()
                o, e = job.communicate()
                report(case, False, f"step 8 never committed in memory and on disk "
                       f"(exit {job.returncode}): {e[-1500:]}")
                continue
            killed = kill_host(2, mem)
            if case == "peer_memory":  # no read of the disk's step 8 can succeed now
                for f in glob.glob(os.path.join(ck, "step_00000008", "rank_*.safetensors")):
                    os.rename(f, f + ".gone")
            else:  # host 1's copy of rank 3 is gone too: incomplete in memory
                for f in glob.glob(os.path.join(mem, "loomh1", "*", "step_00000008",
                                                "rank_00003.*")):
                    os.unlink(f)
            try:
                o, e = job.communicate(timeout=150)
            except subprocess.TimeoutExpired:
                job.kill()
                o, e = job.communicate()
            summary = json.load(open(os.path.join(rdir, "summary.json")))
            log1 = open(glob.glob(os.path.join(rdir, "attempt_1", "ranks", "*", "rank.0",
                                               "stderr"))[0]).read()
            source = line_with(log1, "loom: resume source:")
            resumed = line_with(log1, "resumed from")
            recovered = line_with(e, "loom run: recovered from")
            # the restarted attempt's metrics file holds the steps after the resumed one
            got = Run(out, log1)
            same = (len(got.losses) == steps - 8 and got.losses == ref.losses[8:] and
                    same_tensors(got.params, ref.params))
            m = re.search(r"step 8: (\d+) bytes \((\d+) chunks\) read from", source)
            read, chunks = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
            if case == "peer_memory":
                ok = ("resume source: peer memory, step 8:" in source and read > 0 and chunks > 0 and
                      " 0 bytes (0 chunks) from disk" in source and
                      "4 shard copies" in source and "peer memory" in recovered and
                      "(step 8)" in resumed)
            else:
                ok = ("resume source: disk, step 8:" in source and read > 0 and chunks > 0 and
                      "0 bytes from peer memory" in source and
                      "no surviving host holds rank(s) 3" in source and "disk" in recovered and
                      "(step 8)" in resumed)
            ok = ok and summary["outcome"] == "finished" and summary["attempts"] == 2 and same
            report(case, ok, f"killed {killed} process(es) of loomh2; {summary['outcome']} in "
                   f"{summary['attempts']} attempt(s); bitwise {same}\n      {source}\n"
                   f"      {recovered}")
            if not ok:
                print(e[-3000:])
    finally:
        shutil.rmtree(mem, ignore_errors=True)
        hosts_down(tmp, seed, also=[mem])


if __name__ == "__main__":
    run_test(main)
