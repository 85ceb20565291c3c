#!/usr/bin/python3
"""loom on a real Slurm cluster (tests/hosts/slurm.sh: Debian's slurm-wlm and munge,
slurmctld here, one slurmd in each of 2 test hosts).

Checks: `slurm.sh up 2` (and again: idempotent, kept as it is); an `sbatch -N 2 -n 4` job
of `loom run -n 4` (which launches with srun --mpi=pmix from inside the allocation, on the
first node) trains fault-free; so do `salloc -N 2 -n 4 loom run -n 4` and `loom run -n 4
--launcher srun` (srun's own allocation) from the root namespace (no node; heartbeats to
its address on the bridge, found from Slurm's NodeAddr), to the same weights, bitwise;
a loom in this machine's /tmp (no node sees it): exit 2 and one line naming the rank,
its node and the path, no restart; the same job with a crash injected into a rank on the
second host: the supervisor names that rank and host, restarts from the newest
checkpoint and ends with the fault-free job's weights, bitwise; every rank's heartbeats
reached the supervisor (summary.json: each rank with its host). Bad environments, one
line naming the flag or host and what was expected, exit 2, no run folder, nothing left
running: `--hosts` inside the allocation naming a host outside it; `--launcher srun`
with munged stopped; with slurmctld stopped too. Last, `slurm.sh down` and `hosts.sh down`:
no daemon, job step, state folder, namespace or bridge left (after a bounded wait for
killed daemons to exit). The nodes run a copy of --loom in the test's folder under
/var/tmp, which every node sees (each node has its own /tmp, as /tmp is node-local on a
real cluster): the test runs from any checkout. Skipped (77) without root, network
namespaces, mpirun or Slurm/munge.
Usage: test_slurm.py --loom PATH [--seed S]
"""
import fcntl
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "harness"))
from loomtest import Skip, keep_or_remove, parse_test_args, report, run_test, write_text_shard  # noqa: E402
from test_hosts import net_leftovers, wait_until  # noqa: E402

HOSTS_SH = os.path.join(HERE, "hosts.sh")
SLURM_SH = os.path.join(HERE, "slurm.sh")
STATE = "/var/lib/loom-slurm"
ENV = dict(os.environ, SLURM_CONF=f"{STATE}/slurm.conf")
STEPS = 16


def sh(script, *args, check=True):
    p = subprocess.run([script, *args], capture_output=True, text=True, env=ENV)
    if check and p.returncode != 0:
        print(f"FAIL: {os.path.basename(script)} {' '.join(args)}: exit {p.returncode}\n"
              f"{p.stdout}{p.stderr}")
        sys.exit(1)
    return p


def skip_unless_possible():
    if os.geteuid() != 0:
        raise Skip(f"needs root for network namespaces and slurmd (uid {os.geteuid()})")
    for tool in ("ip", "nsenter", "unshare", "mpirun", "munged", "slurmctld", "slurmd", "sbatch",
                 "srun", "scontrol", "sinfo"):
        if not shutil.which(tool):
            raise Skip(f"no '{tool}' (scripts/setup.sh installs slurm-wlm and munge)")
    probe = f"loomprobe{os.getpid()}"
    p = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if p.returncode != 0:
        raise Skip(f"'ip netns add' fails here: {p.stderr.strip()}")
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)


def procs(pred):
    """Live processes matching pred(cmdline, comm). A zombie is dead (only its exit
    status waits for a parent), so it is not counted."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
            comm = open(f"/proc/{pid}/comm").read().strip()
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            continue
        state = stat[stat.rfind(")") + 2:].split()[0]
        if int(pid) != os.getpid() and state != "Z" and pred(cmd, comm):
            found.append(f"{pid} {comm} ({state}): {cmd[:80]}")
    return found


def daemons_left():
    return procs(lambda cmd, comm: STATE in cmd or comm in ("slurmstepd", "slurmd") or
                 (comm == "slurmctld" and STATE in cmd) or cmd.startswith("loom-hosts-holder"))


def leftovers():
    """What the teardown must not leave, checked independently of the scripts. A killed
    daemon can take a moment to finish exiting on a busy machine (its command line is
    already empty then): waits up to 10 s for such processes before naming them."""
    wait_until(lambda: not daemons_left(), 10, 0.2)
    left = daemons_left() + net_leftovers("loomh")
    left += [p for p in (STATE, "/run/loom-hosts") if os.path.exists(p)]
    return left


def job_state(job):
    out = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True,
                         env=ENV).stdout
    state = re.search(r"JobState=(\S+)", out)
    code = re.search(r"ExitCode=(\d+):(\d+)", out)
    return (state.group(1) if state else "GONE"), (int(code.group(1)) if code else -1)


def sbatch(script, out, timeout=150):
    """Submits script to 2 nodes x 2 tasks, waits (polling, sbatch --wait polls slowly):
    (exit code of the batch script, its output)."""
    # --chdir: the job starts where every node sees (ctest's folder may be node-local /tmp,
    # and slurmstepd then adds its "couldn't chdir" lines to the job's output).
    p = subprocess.run(["sbatch", "--parsable", "--chdir", os.path.dirname(os.path.abspath(out)),
                        "-N", "2", "-n", "4", "-o", out, script],
                       capture_output=True, text=True, env=ENV)
    if p.returncode != 0:
        return -1, f"sbatch failed: {p.stderr}"
    job = p.stdout.strip().split(";")[0]
    last = []  # the last (state, exit code) seen

    def ended():
        last[:] = job_state(job)
        return last[0] not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")
    if not wait_until(ended, timeout, 0.3):
        subprocess.run(["scancel", job], env=ENV)
        return -1, f"job {job} did not end within {timeout} s"
    code = last[1]
    return code, open(out).read() if os.path.exists(out) else ""


def main():
    args = parse_test_args()
    seed = args.seed
    skip_unless_possible()
    rng = random.Random(seed)
    # Not under /tmp: each slurmd host has its own /tmp. Every host sees /var/tmp: the data,
    # the run folders, and the loom the nodes run (a copy: --loom may be under /tmp).
    tmp = tempfile.mkdtemp(prefix="loom_slurm_", dir="/var/tmp")
    loom = os.path.join(tmp, "loom")
    shutil.copy2(args.loom, loom)
    lock = open("/run/loom-hosts.lock", "w")  # one user of the test hosts at a time
    fcntl.flock(lock, fcntl.LOCK_EX)
    sh(SLURM_SH, "down", check=False)  # whatever an earlier crashed run left
    sh(HOSTS_SH, "down", check=False)
    try:
        t = time.time()
        sh(SLURM_SH, "up", "2")
        up_s = time.time() - t
        ctld = open(f"{STATE}/run/slurmctld.pid").read().strip()
        t = time.time()
        sh(SLURM_SH, "up", "2")  # up and right: kept
        again_s = time.time() - t
        nodes = sh(SLURM_SH, "status").stdout
        ok = (nodes.count(" idle") >= 2 and "loomh1" in nodes and "loomh2" in nodes and
              open(f"{STATE}/run/slurmctld.pid").read().strip() == ctld and
              os.path.exists(f"/proc/{ctld}"))
        report("slurm up (twice)", ok, f"2 nodes idle in {up_s:.1f} s, again in {again_s:.1f} s "
               f"(daemons kept)")
        if not ok:
            print(nodes)
            return

        data = os.path.join(tmp, "train.bin")
        write_text_shard(data, seed)
        train = ["--vocab-size", "256", "--seq-len", "24", "--n-layer", "2", "--d-model", "48",
                 "--n-head", "4", "--d-ff", "96", "--micro-batch", "2", "--global-batch", "8",
                 "--steps", str(STEPS), "--lr", "3e-3", "--warmup-steps", "3", "--seed",
                 str(seed), "--threads", "1", "--log-every", "0", "--data", data,
                 "--bucket-mb", "0.01"]

        def job(name, run_flags, train_extra):
            """A batch script of `loom run` in the allocation: its exit code, its output,
            the run folder."""
            rdir = os.path.join(tmp, name)
            script = os.path.join(tmp, name + ".sh")
            cmd = ([loom, "run", "-n", "4", "--run-dir", rdir, "--startup-timeout", "30"] +
                   run_flags + ["--"] + train + ["--save-weights", f"{rdir}/weights.safetensors",
                                                 "--ckpt-dir", f"{rdir}/ckpt", "--ckpt-every",
                                                 "4"] + train_extra)
            with open(script, "w") as f:
                f.write("#!/bin/bash\nexec " + " ".join(cmd) + "\n")
            os.chmod(script, 0o755)
            t = time.time()
            rc, out = sbatch(script, os.path.join(tmp, name + ".out"))
            print(f"  $ sbatch -N 2 -n 4 {name}.sh: loom run {' '.join(run_flags + train_extra)}"
                  f" -> exit {rc} in {time.time() - t:.1f} s")
            return rc, out, rdir

        def ranks_ok(rdir):
            s = json.load(open(os.path.join(rdir, "summary.json")))
            hosts = [r["host"] for r in s["ranks"]]
            beats = [r["heartbeats"] for r in s["ranks"]]
            return (hosts == ["loomh1", "loomh1", "loomh2", "loomh2"] and min(beats) > 0,
                    f"ranks on {hosts}, heartbeats {beats}", s)

        rc, out, ref_dir = job("fault_free", [], [])
        ok_ranks, where, s = ranks_ok(ref_dir) if rc == 0 else (False, "", {})
        via = next((x for x in out.splitlines() if "via srun" in x), "")
        ok = (rc == 0 and ok_ranks and s.get("attempts") == 1 and "via srun" in via and
              "heartbeats on 10.231.0.1:" in via)
        report("sbatch: loom run", ok, f"exit {rc}, {s.get('attempts')} attempt(s), {where}")
        if not ok:
            print(out[-3000:])
            return

        # From here, the root namespace, which is no node and does not resolve the nodes'
        # names: inside `salloc`, and with srun making its own allocation. loom run finds
        # its address towards the nodes from Slurm's NodeAddr (the bridge's 10.231.0.254).
        def from_here(name, prefix, flags):
            rdir = os.path.join(tmp, name)
            cmd = (prefix + [loom, "run", "-n", "4", "--run-dir", rdir,
                             "--startup-timeout", "30"] + flags + ["--"] + train +
                   ["--save-weights", f"{rdir}/weights.safetensors"])
            t = time.time()
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=150)
                rc, out = p.returncode, p.stdout + p.stderr
            except subprocess.TimeoutExpired as e:
                rc, out = -1, f"did not end within 150 s: {e}"
            print(f"  $ {' '.join(prefix)} loom run -n 4 {' '.join(flags)} (from the root "
                  f"namespace) -> exit {rc} in {time.time() - t:.1f} s")
            ok_ranks, where, s = ranks_ok(rdir) if rc == 0 else (False, "", {})
            same = rc == 0 and open(f"{rdir}/weights.safetensors", "rb").read() == open(
                f"{ref_dir}/weights.safetensors", "rb").read()
            ok = (rc == 0 and ok_ranks and s.get("attempts") == 1 and same and
                  "via srun, heartbeats on 10.231.0.254:" in out)
            report(f"{name}: loom run", ok, f"exit {rc}, {s.get('attempts')} attempt(s), "
                   f"{where}, weights {'bitwise the sbatch job' if same else 'DIFFER'}")
            if not ok:
                print(out[-3000:])

        from_here("salloc", ["salloc", "-N", "2", "-n", "4"], [])
        from_here("srun alone", [], ["--launcher", "srun"])

        # A loom the nodes do not see (this machine's /tmp; each node has its own): the
        # rank that cannot be started is named with its node and the path, no restart.
        local = tempfile.mkdtemp(prefix="loom_slurm_local_", dir="/tmp")
        shutil.copy2(args.loom, os.path.join(local, "loom"))
        rdir = os.path.join(tmp, "not_on_nodes")
        p = subprocess.run([os.path.join(local, "loom"), "run", "-n", "4", "--launcher", "srun",
                            "--run-dir", rdir, "--"] + train, capture_output=True, text=True,
                           env=ENV, timeout=60)
        shutil.rmtree(local, ignore_errors=True)
        said = next((x for x in p.stderr.splitlines() if "every node sees" in x), "")
        ok = (p.returncode == 2 and not os.path.exists(os.path.join(rdir, "attempt_1")) and
              re.search(rf"loom run: rank \d on loomh[12]: {re.escape(local)}/loom: no such file "
                        "or directory; is it on a filesystem every node sees", said))
        report("loom not on the nodes", ok, f"exit {p.returncode}: {said.strip()}")
        if not ok:
            print(p.stderr[-3000:])

        step, rank = rng.randint(3, STEPS - 3), rng.choice([2, 3])
        rc, out, run_dir = job("crash", [], ["--inject", f"crash@{step}:{rank}"])
        ok_ranks, where, s = ranks_ok(run_dir) if rc == 0 else (False, "", {})
        d = json.load(open(os.path.join(run_dir, "diagnosis.json"))) if rc == 0 else {}
        same = rc == 0 and open(f"{run_dir}/weights.safetensors", "rb").read() == open(
            f"{ref_dir}/weights.safetensors", "rb").read()
        named = f"crash of rank {rank} on loomh2 at step {step}" in out
        ok = (rc == 0 and s.get("attempts") == 2 and d.get("kind") == "crash" and
              d.get("rank") == rank and d.get("step") == step and named and same and ok_ranks)
        f = (s.get("failures") or [{}])[0]
        report(f"sbatch: crash@{step}:{rank}", ok,
               f"diagnosis {d.get('kind')} of rank {d.get('rank')} at step {d.get('step')} "
               f"({'named with its host' if named else 'line naming rank and host missing'}), "
               f"resumed at step {f.get('resumed_at_step')} in {f.get('recovery_s', 0):.1f} s, "
               f"weights {'bitwise the fault-free job' if same else 'DIFFER'}")
        if not ok:
            print(out[-3000:])

        def refused(name, ok, rc, err, rdir, want):
            lines = err.strip().splitlines()
            running = procs(lambda cmd, comm: tmp in cmd and comm != "sbatch")
            good = (ok and rc == 2 and len(lines) == 1 and all(w in err for w in want) and
                    not os.path.exists(rdir) and not running)
            report(name, good, f"exit {rc}: {err.strip()}"
                   f"{'' if not running else f'  still running: {running}'}")

        # --hosts inside the allocation, naming a host outside it: refused in the job.
        rc, out, rdir = job("hosts_disagree", ["--hosts", "loomh1:2,loomh3:2"], [])
        refused("--hosts outside the job", True, rc, out, rdir,
                ["--hosts: host 'loomh3' is not in this Slurm allocation", "loomh[1-2]"])

        def srun_here(name):
            rdir = os.path.join(tmp, name)
            t = time.time()
            p = subprocess.run([loom, "run", "-n", "2", "--launcher", "srun", "--run-dir",
                                rdir, "--"] + train, capture_output=True, text=True, env=ENV,
                               timeout=60)
            return p.returncode, p.stderr, rdir, time.time() - t

        # No munged (slurmctld up: scontrol's request cannot be signed), then no
        # slurmctld either: `scontrol ping` says which.
        pid = open(f"{STATE}/munge/munged.pid").read().strip()
        os.kill(int(pid), 15)  # stopped (a killed one leaves its socket: clients retry long)
        wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 5, 0.1)
        time.sleep(0.3)
        rc, err, rdir, secs = srun_here("no_munged")
        refused("srun without munged", secs < 20, rc, err, rdir,
                ["--launcher srun: Slurm does not answer", "Munge encode failed", "munged"])
        pid = open(f"{STATE}/run/slurmctld.pid").read().strip()
        os.kill(int(pid), 9)
        time.sleep(0.3)
        rc, err, rdir, secs = srun_here("no_slurmctld")
        refused("srun without slurmctld", secs < 20, rc, err, rdir,
                ["--launcher srun: Slurm does not answer", "is DOWN", "expected a running "
                 "slurmctld and munged"])
    finally:
        p1 = sh(SLURM_SH, "down", check=False)
        p2 = sh(HOSTS_SH, "down", check=False)
        # The scripts' own verdicts are shown; what fails the check is what leftovers(),
        # after its wait, still finds.
        said = " ".join(x for x in (p1.stderr.strip(), p2.stderr.strip()) if x)
        left = leftovers()
        report("slurm and hosts down", not left, (f"left: {left}" if left else "nothing left") +
               (f" ({said})" if said else ""))
        keep_or_remove(tmp, seed)


if __name__ == "__main__":
    run_test(main)
