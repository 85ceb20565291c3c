#!/usr/bin/python3
"""Checkpoint recovery paths: the fast tier, stop signals, and a rank killed mid-save.

1. Two tiers: --ckpt-dir every 10 steps and --ckpt-fast-dir (a folder under /dev/shm)
   every 3. With the durable final checkpoint gone (as if the job died before it),
   `--resume auto` takes the newest valid one of either tier (fast step 12 over durable
   10), and with that one corrupted the next newest (durable 10 over fast 9). Each resumed
   run must be bitwise the uninterrupted run (losses, final weights).
2. SIGTERM and SIGINT during training (one process; and SIGTERM to rank 1 only of a
   2-rank job: the ranks agree through the per-step sum): the run saves, exits 0, and
   resuming from that checkpoint gives the uninterrupted run's losses bitwise.
3. SIGKILL of rank 1 of a 2-rank job (dp 2, ZeRO-1) while it writes its data file of the
   step-20 save: the step-10 checkpoint stays the newest valid one, `--resume auto`
   takes it (reporting the incomplete step 20) and continues bitwise.
Usage: test_recovery.py --loom PATH [--seed S]
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import loomtest  # noqa: E402
from loomtest import (MPIRUN, failed, losses, parse_test_args, run_test, safetensors_io,  # noqa: E402
                      same_tensors, write_text_shard)

def check(ok, what):
    loomtest.check(ok, f"  {what}:")


def weights(out):
    return safetensors_io.load(os.path.join(out, "params_final.safetensors"))


def resumed_step(log):
    line = [x for x in log.splitlines() if "resumed from" in x]
    return int(line[0].rsplit("step ", 1)[1].rstrip(")")) if line else None


def rank_pid(parent, rank):
    """The pid of the loom process of MPI rank `rank` among parent's descendants."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
        except OSError:
            continue
        if exe == "loom" and f"OMPI_COMM_WORLD_RANK={rank}".encode() in env and \
                f"LOOM_TEST_PARENT={parent}".encode() in env:
            return int(pid)
    return None


def wait_for(pred, timeout, proc=None):
    deadline = time.time() + timeout
    while time.time() < deadline and (proc is None or proc.poll() is None):
        v = pred()
        if v:
            return v
        time.sleep(0.001)
    return None


def main():
    args = parse_test_args()
    seed = args.seed
    tmp = tempfile.mkdtemp(prefix="loom_ckpt_recovery_")
    shm = tempfile.mkdtemp(prefix="loom_ckpt_fast_", dir="/dev/shm")
    tag = f"{os.getpid()}_{seed}"
    env = dict(os.environ, LOOM_TEST_PARENT=tag)
    try:
        data = os.path.join(tmp, "train.bin")
        write_text_shard(data, seed)
        base = [args.loom, "train", "--vocab-size", "256", "--seq-len", "16", "--n-layer", "2",
                "--d-model", "32", "--n-head", "4", "--d-ff", "64", "--micro-batch", "2",
                "--global-batch", "4", "--seed", str(seed), "--log-every", "0", "--threads", "1",
                "--lr", "3e-3", "--warmup-steps", "2", "--data", data]

        def train(name, steps, extra=(), n=1, check_rc=True):
            out = os.path.join(tmp, name)
            cmd = (MPIRUN + ["-n", str(n)] if n > 1 else []) + base + [
                "--steps", str(steps), "--metrics", out + ".jsonl", "--dump-dir", out] + list(extra)
            p = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if check_rc and p.returncode != 0:
                print(f"  {name}: exit {p.returncode}\n{p.stderr[-2000:]}")
            return out, p

        # ---- 1. two tiers
        print("two tiers")
        ref, _ = train("ref20", 20)
        ref_l, ref_w = losses(ref + ".jsonl"), weights(ref)
        ck, fast = os.path.join(tmp, "tiers_ck"), os.path.join(shm, "fast")
        tiers = ["--ckpt-dir", ck, "--ckpt-every", "10", "--ckpt-fast-dir", fast,
                 "--ckpt-fast-every", "3"]
        out, p = train("tiers", 20, tiers)
        have = sorted(os.listdir(ck)) + sorted(os.listdir(fast))
        check(p.returncode == 0 and losses(out + ".jsonl") == ref_l and
              same_tensors(weights(out), ref_w),
              "saving to both tiers does not change the run (bitwise)")
        want = ["latest", "step_00000010", "step_00000020", "latest", "step_00000003",
                "step_00000006", "step_00000009", "step_00000012", "step_00000015",
                "step_00000018"]
        check(have == want, f"durable 10, 20 (final); fast 3..18, not where durable is due: {have}")
        shutil.rmtree(os.path.join(ck, "step_00000020"))  # died before the final save
        out, p = train("tiers_resume18", 20, tiers + ["--resume", "auto"])
        check(resumed_step(p.stderr) == 18 and fast in p.stderr and
              losses(out + ".jsonl") == ref_l[18:] and same_tensors(weights(out), ref_w),
              f"newest is fast 18: resumed step {resumed_step(p.stderr)}, bitwise")
        # Corrupt fast 18 and 15 (flip a data byte), remove durable 20 again: fast 12 is the
        # newest valid one; then with fast 12-18 gone (the resumed run rewrote 15 and 18),
        # durable 10 is newer than fast 9.
        shutil.rmtree(os.path.join(ck, "step_00000020"))
        for s in (18, 15):
            f = os.path.join(fast, f"step_{s:08d}", "rank_00000.safetensors")
            with open(f, "r+b") as fh:
                fh.seek(os.path.getsize(f) - 5)
                b = fh.read(1)
                fh.seek(-1, 1)
                fh.write(bytes([b[0] ^ 0x10]))
        out, p = train("tiers_resume12", 20, tiers + ["--resume", "auto"])
        check(resumed_step(p.stderr) == 12 and "checksum" in p.stderr and
              losses(out + ".jsonl") == ref_l[12:] and same_tensors(weights(out), ref_w),
              f"fast 18, 15 corrupt: resumed step {resumed_step(p.stderr)} (fast 12), bitwise")
        shutil.rmtree(os.path.join(ck, "step_00000020"))
        for s in (18, 15, 12):
            shutil.rmtree(os.path.join(fast, f"step_{s:08d}"))
        out, p = train("tiers_resume10", 20, tiers + ["--resume", "auto"])
        check(resumed_step(p.stderr) == 10 and losses(out + ".jsonl") == ref_l[10:] and
              same_tensors(weights(out), ref_w),
              f"newest valid is durable 10: resumed step {resumed_step(p.stderr)}, bitwise")

        # ---- 2. stop signals: save, exit 0, resume bitwise
        print("stop signals")
        steps = 400
        dp2 = ["--dp", "2", "--zero", "1"]
        refs = {}
        for n in (1, 2):
            ref, _ = train(f"ref_long{n}", steps, dp2 if n > 1 else [], n)
            refs[n] = losses(ref + ".jsonl"), weights(ref)
        for name, sig, n, target in (("sigterm", signal.SIGTERM, 1, None),
                                     ("sigint", signal.SIGINT, 1, None),
                                     ("sigterm_rank1", signal.SIGTERM, 2, 1)):
            ref_l, ref_w = refs[n]
            ck = os.path.join(tmp, "ck_" + name)
            out = os.path.join(tmp, name)
            extra = ["--ckpt-dir", ck, "--ckpt-every", "1000"] + (dp2 if n > 1 else [])
            cmd = (MPIRUN + ["-n", str(n)] if n > 1 else []) + base + [
                "--steps", str(steps), "--metrics", out + ".jsonl"] + extra
            proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)

            def progressed():
                try:
                    return sum(1 for _ in open(out + ".jsonl")) >= 5
                except OSError:
                    return False
            sent = wait_for(progressed, 60, proc)
            pid = proc.pid if target is None else rank_pid(tag, target)
            if sent and pid:
                os.kill(pid, sig)
            _, err = proc.communicate(timeout=120)
            if not (sent and pid):
                check(False, f"{name}: the run ended before the signal could be sent")
                continue
            got = losses(out + ".jsonl")
            stop = len(got)
            saved = os.path.join(ck, f"step_{stop:08d}", "manifest.json")
            check(proc.returncode == 0 and "stop requested" in err and stop < steps and
                  os.path.exists(saved) and got == ref_l[:stop],
                  f"{name}: exit {proc.returncode} after step {stop}, checkpoint saved")
            out2, p = train(name + "_resume", steps, ["--resume", "auto"] + extra, n)
            check(resumed_step(p.stderr) == stop and losses(out2 + ".jsonl") == ref_l[stop:] and
                  same_tensors(weights(out2), ref_w),
                  f"{name}: resumed step {resumed_step(p.stderr)}, bitwise to step {steps}")

        # ---- 3. SIGKILL of one rank in the middle of a save
        print("SIGKILL of one rank during a save")
        big = ["--d-model", "256", "--d-ff", "1024", "--n-head", "4", "--dp", "2", "--zero", "1"]
        ref, _ = train("ref_big", 30, big, 2)
        ref_l = losses(ref + ".jsonl")
        ck = os.path.join(tmp, "ck_kill")
        extra = big + ["--ckpt-dir", ck, "--ckpt-every", "10"]
        out = os.path.join(tmp, "kill")
        cmd = MPIRUN + ["-n", "2"] + base + ["--steps", "30", "--metrics", out + ".jsonl"] + extra
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, env=env)
        tmpfile = os.path.join(ck, "step_00000020", "rank_00001.safetensors.tmp")
        pid = [None]

        def writing():
            if os.path.exists(tmpfile):
                pid[0] = pid[0] or rank_pid(tag, 1)
                return pid[0]
            return None
        killed = wait_for(writing, 120, proc)
        if killed:
            os.kill(killed, signal.SIGKILL)
        try:
            proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        done20 = os.path.exists(os.path.join(ck, "step_00000020", "manifest.json"))
        if not killed or done20:
            print(f"  the save of step 20 was not caught mid-write (killed {killed}, committed "
                  f"{done20}); not run")
        else:
            check(proc.returncode != 0, f"killed rank 1 (pid {killed}): the job failed "
                  f"(exit {proc.returncode})")
            out2, p = train("kill_resume", 30, extra + ["--resume", "auto"], 2)
            check(resumed_step(p.stderr) == 10 and
                  "step_00000020 unfinished, ignored (no manifest.json" in p.stderr and
                  losses(out2 + ".jsonl") == ref_l[10:],
                  f"resumed step {resumed_step(p.stderr)} (the unfinished step 20 reported), "
                  "losses 11-30 bitwise")
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        if failed():
            print(f"kept {tmp} (seed {seed})")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    run_test(main)
