#!/usr/bin/python3
"""Checkpoint faults: whatever goes wrong with the newest checkpoint, the previous one
stays valid and is the one `--resume auto` takes, and the problem is reported naming the
file. Cases: SIGKILL of the process in the middle of writing its data file; a flipped
byte in a data file (also `loom ckpt verify`, exit 2); a truncated manifest; a full disk
during a save (a small tmpfs when mounting is permitted, else RLIMIT_FSIZE, which fails
the write the same way: EFBIG instead of ENOSPC); bad manifests (paths outside the
folder, overlapping chunks, holes, wrong dtype, shape disagreeing with the model); a
resume with another --seed (an error naming both seeds, unless --resume-ignore-seed).
Usage: test_faults.py --loom PATH [--seed S]
"""
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import loomtest  # noqa: E402
from loomtest import keep_or_remove, parse_test_args, run_test, write_text_shard  # noqa: E402

def check(ok, what):
    loomtest.check(ok, f"  {what}:")


def main():
    args = parse_test_args()
    seed = args.seed
    rng = random.Random(seed)
    tmp = tempfile.mkdtemp(prefix="loom_ckpt_faults_")
    try:
        data = os.path.join(tmp, "train.bin")
        write_text_shard(data, seed)
        base = [args.loom, "train", "--vocab-size", "256", "--seq-len", "32", "--n-layer", "2",
                "--d-model", "64", "--n-head", "4", "--d-ff", "128", "--micro-batch", "2",
                "--global-batch", "2", "--seed", str(seed), "--log-every", "0", "--threads",
                "1", "--data", data]

        def train(ck, steps, extra=(), **kw):
            return subprocess.run(base + ["--steps", str(steps), "--ckpt-dir", ck] + list(extra),
                                  capture_output=True, text=True, **kw)

        def resumed_step(ck):
            p = train(ck, 1, ["--resume", "auto", "--steps", "40"])
            line = [x for x in p.stderr.splitlines() if "resumed from" in x]
            return (int(line[0].rsplit("step ", 1)[1].rstrip(")")) if line else None), p

        # A good base: checkpoints at 10 and 20.
        good = os.path.join(tmp, "good")
        p = train(good, 20, ["--ckpt-every", "10"])
        check(p.returncode == 0 and os.path.exists(os.path.join(good, "step_00000020",
                                                                "manifest.json")),
              "two checkpoints written")
        ok = subprocess.run([args.loom, "ckpt", "verify", good], capture_output=True, text=True)
        check(ok.returncode == 0, "loom ckpt verify on a good checkpoint")

        # Flipped byte in the newest data file.
        ck = os.path.join(tmp, "flip")
        shutil.copytree(good, ck)
        f = os.path.join(ck, "step_00000020", "rank_00000.safetensors")
        size = os.path.getsize(f)
        with open(f, "r+b") as fh:
            hlen = int.from_bytes(fh.read(8), "little")
            pos = rng.randrange(8 + hlen, size)
            fh.seek(pos)
            b = fh.read(1)
            fh.seek(pos)
            fh.write(bytes([b[0] ^ (1 << rng.randrange(8))]))
        v = subprocess.run([args.loom, "ckpt", "verify", ck], capture_output=True, text=True)
        check(v.returncode == 2 and "rank_00000.safetensors" in v.stderr and "tensor" in v.stderr,
              f"verify names the file and tensor of a flipped byte at {pos} (exit {v.returncode})")
        step, p = resumed_step(ck)
        check(step == 10 and "rank_00000.safetensors" in p.stderr and "checksum" in p.stderr,
              f"flipped byte: resumed step {step}, reported the file")

        # Truncated manifest.
        ck = os.path.join(tmp, "trunc")
        shutil.copytree(good, ck)
        m = os.path.join(ck, "step_00000020", "manifest.json")
        os.truncate(m, os.path.getsize(m) // 2)
        step, p = resumed_step(ck)
        check(step == 10 and "step_00000020/manifest.json" in p.stderr,
              f"truncated manifest: resumed step {step}, reported the file")

        # SIGKILL in the middle of the save at step 20: poll for the temporary data file.
        ck = os.path.join(tmp, "kill")
        tmpfile = os.path.join(ck, "step_00000020", "rank_00000.safetensors.tmp")
        proc = subprocess.Popen(base + ["--steps", "30", "--ckpt-dir", ck, "--ckpt-every", "10",
                                        "--d-model", "256", "--d-ff", "1024", "--vocab-size",
                                        "256"], stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 120
        killed = False
        while time.time() < deadline and proc.poll() is None:
            if os.path.exists(tmpfile):
                proc.send_signal(signal.SIGKILL)
                killed = True
                break
            time.sleep(0.0005)
        proc.wait()
        if killed:
            p = subprocess.run(base + ["--steps", "30", "--ckpt-dir", ck, "--resume", "auto",
                                       "--d-model", "256", "--d-ff", "1024", "--steps", "31"],
                               capture_output=True, text=True)
            line = [x for x in p.stderr.splitlines() if "resumed from" in x]
            check(bool(line) and line[0].endswith("(step 10)") and
                  "step_00000020 unfinished, ignored (no manifest.json" in p.stderr and
                  "not usable" not in p.stderr,
                  "SIGKILL during the data write: resumed step 10, reported the unfinished one")
        else:
            print("  SIGKILL: the temporary data file was never seen (save too fast); not run")

        # Full disk during a save: room for one checkpoint, not two.
        ck = os.path.join(tmp, "full")
        os.makedirs(ck)
        one = sum(os.path.getsize(os.path.join(good, "step_00000010", x))
                  for x in os.listdir(os.path.join(good, "step_00000010")))
        room = one * 3 // 2
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={room}", "tmpfs", ck],
                                 capture_output=True).returncode == 0
        try:
            if mounted:
                how, limit = f"tmpfs of {room} bytes", None
            else:  # no mount permission: a file-size limit fails the write alike (EFBIG)
                how = "RLIMIT_FSIZE (mount not permitted)"

                def limit():
                    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                    resource.setrlimit(resource.RLIMIT_FSIZE, (one // 2, one // 2))
                shutil.copytree(os.path.join(good, "step_00000010"),
                                os.path.join(ck, "step_00000010"))
            p = train(ck, 20, ["--ckpt-every", "10"] + ([] if mounted else ["--resume", "auto"]),
                      preexec_fn=limit)
            reported = "rank_00000" in p.stderr and "failed" in p.stderr
            step, p2 = resumed_step(ck)
            check(p.returncode != 0 and reported and step == 10,
                  f"full disk ({how}): exit {p.returncode}, reported the file, resumed step {step}")
            if not reported:
                print(p.stderr[-1500:])
        finally:
            if mounted:
                subprocess.run(["umount", ck])

        # Bad manifests: refused with a message, never a crash.
        def bad_manifest(what, edit, expect):
            ck = os.path.join(tmp, "bad_" + what.replace(" ", "_"))
            shutil.copytree(os.path.join(good, "step_00000010"), ck)
            m = os.path.join(ck, "manifest.json")
            doc = json.load(open(m))
            edit(doc)
            json.dump(doc, open(m, "w"))
            v = subprocess.run([args.loom, "ckpt", "verify", ck], capture_output=True, text=True)
            r = subprocess.run(base + ["--steps", "12", "--resume", ck], capture_output=True,
                               text=True)
            check(v.returncode == 2 and r.returncode == 2 and expect in v.stderr and
                  expect in r.stderr, f"bad manifest ({what}): '{expect}' (exit {v.returncode}, "
                  f"{r.returncode})")

        def first_2d(doc):
            return [t for t in doc["tensors"] if len(t["shape"]) == 2][0]

        bad_manifest("dotdot", lambda d: d["files"].__setitem__(0, "../x.safetensors"),
                     "not a plain name inside the checkpoint directory")
        bad_manifest("absolute", lambda d: d["files"].__setitem__(0, "/etc/passwd"),
                     "not a plain name inside the checkpoint directory")

        def overlap(d):
            t = [t for t in d["tensors"] if len(t["chunks"]) == 1 and len(t["shape"]) == 2][0]
            c = dict(t["chunks"][0])
            t["chunks"].append(c)
        bad_manifest("overlap", overlap, "overlapping chunks")

        def hole(d):
            t = first_2d(d)
            t["shape"][0] += 1
        bad_manifest("hole", hole, "a hole")
        bad_manifest("dtype", lambda d: d["tensors"][0].__setitem__("dtype", "F16"),
                     "dtype must be F32")

        def huge_offset(d):
            d["tensors"][0]["chunks"][0]["byte_offset"] = 1 << 45
        ck = os.path.join(tmp, "bad_offset")
        shutil.copytree(os.path.join(good, "step_00000010"), ck)
        m = os.path.join(ck, "manifest.json")
        doc = json.load(open(m))
        huge_offset(doc)
        json.dump(doc, open(m, "w"))
        v = subprocess.run([args.loom, "ckpt", "verify", ck], capture_output=True, text=True)
        check(v.returncode == 2 and "beyond the end of the file" in v.stderr,
              f"byte offset beyond the file: refused (exit {v.returncode})")
        # Another --seed: refused (the data order would change), unless overridden.
        other = str(seed + 1)
        for resume in (os.path.join(good, "step_00000010"), "auto"):
            r = subprocess.run(base + ["--steps", "12", "--seed", other, "--ckpt-dir", good,
                                       "--resume", resume], capture_output=True, text=True)
            check(r.returncode == 2 and f"--seed {other}" in r.stderr and
                  f"--seed {seed}" in r.stderr and "--resume-ignore-seed" in r.stderr and
                  "starting fresh" not in r.stderr,
                  f"--resume {os.path.basename(resume)} with another --seed: refused, both "
                  f"seeds named (exit {r.returncode})")
        ck = os.path.join(tmp, "seed_override")
        shutil.copytree(good, ck)
        r = subprocess.run(base + ["--steps", "22", "--seed", other, "--ckpt-dir", ck,
                                   "--resume", "auto", "--resume-ignore-seed"],
                           capture_output=True, text=True)
        check(r.returncode == 0 and "resumed from" in r.stderr and "warning" in r.stderr,
              f"--resume-ignore-seed: resumed with a warning (exit {r.returncode})")
        # Shape that disagrees with the model: resume a 2-layer checkpoint into 3 layers.
        r = subprocess.run(base + ["--steps", "12", "--resume", os.path.join(good, "step_00000010"),
                                   "--d-ff", "192"], capture_output=True, text=True)
        check(r.returncode == 2 and "different model" in r.stderr,
              f"resume into a different model: refused (exit {r.returncode})")
    finally:
        keep_or_remove(tmp, seed)


if __name__ == "__main__":
    run_test(main)
