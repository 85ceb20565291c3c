#!/usr/bin/python3
"""Checkpoint speed for the 124M GPT-2 model (params + AdamW m, v = 1.49 GB).

Trains 5 steps with a checkpoint after steps 2 and 4 and the final one at 5 (the
sequence length is cut to 64 so a step stays short on a small machine; the parameter
count is still 124M less 0.7M of position rows). Measured in the same run on the same
filesystem:
- the training stall per save: the writer thread copies the weights during the next
  step's forward/backward; the stall is the wait for that copy before the optimizer
  step, plus any wait for the previous save or its commit (also reported apart);
- the step times of the steps that overlapped a save (3, 5) against those that did not
  (2, 4) and against the same steps rerun without checkpointing (the background copy's
  and write's cost to compute), with the writer thread's CPU time per phase;
- the background write bandwidth of the final save (data file write + fsync + index,
  after staging) against a plain sequential write+fsync of the same byte count (Python,
  64 MiB blocks; before and after the run, mean);
- the load bandwidth of --resume against a sequential read of the data file, and the
  load time when resharding (saved with dp 2 / ZeRO-1, loaded by one process) against
  the same-layout load (saved by one process). Loads are measured cold (the files' pages
  dropped with posix_fadvise first, as after a restart; O_DIRECT saves leave nothing
  cached anyway) and warm (page cache), each against a sequential read in the same state;
  the bytes still resident after each drop are recorded (mincore), and 3x the checkpoint's
  bytes of memory are touched once first (a VM may back its memory lazily: the loader's
  fresh buffers would time the hypervisor's first touch).
The machine may be shared: the load average before and after is recorded. Last line: JSON.
Load against read: --repeats N rounds (default 3), each a cold and a warm pair (loader and
baseline in the same state, their order alternating between rounds); the baseline is the
best plain sequential read of the same file into a fresh buffer (see baseline()); the
JSON has each round's ratios and their median and worst.
Usage: bench_ckpt.py --loom PATH [--dir DIR] [--repeats N] [--smoke]
--smoke: a tiny model (2 layers, d_model 64, vocabulary 256) and one round: that the bench
runs end to end, in seconds (its figures mean nothing).
"""
import argparse
import ctypes
import json
import mmap
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "harness"))
from loomtest import MPIRUN, write_text_shard  # noqa: E402


def grab(pattern, text, what):
    m = re.findall(pattern, text)
    if not m:
        sys.exit(f"bench_ckpt: no '{what}' in the log:\n{text[-3000:]}")
    return m[-1]


def seq_write(root, nbytes):
    """Plain sequential write + fsync of nbytes (64 MiB blocks) on root's filesystem: MB/s."""
    block = memoryview(os.urandom(64 << 20))
    path = os.path.join(root, "seq.bin")
    t0 = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        left = nbytes
        while left > 0:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n
        os.fsync(f.fileno())
    s = time.perf_counter() - t0
    os.unlink(path)
    return nbytes / s / 1e6


def resident(path):
    """Bytes of the file in the page cache (mincore over a mapping of it)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return -1
        page = mmap.PAGESIZE
        vec = ctypes.create_string_buffer((size + page - 1) // page)
        ok = libc.mincore(addr, size, vec) == 0
        libc.munmap(addr, size)
        return sum(b & 1 for b in vec.raw) * page if ok else -1
    finally:
        os.close(fd)


def drop_cache(paths):
    """Drops the files' (clean) pages from the page cache: the next read is from disk.
    posix_fadvise may keep pages on some filesystems: the bytes still resident (mincore)
    are returned, so that a 'cold' baseline is known to be cold."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    return sum(resident(p) for p in paths)


def warm_memory(nbytes):
    """Touches nbytes of anonymous memory (huge pages where the kernel allows) and frees it.
    In a VM whose memory the host backs lazily (measured here: a first touch of memory
    unused since boot costs ~7 s/GiB, afterwards 0.2 s), the loader's fresh buffers would
    otherwise time the hypervisor, not the load. Returns the seconds taken."""
    t0 = time.perf_counter()
    m = mmap.mmap(-1, nbytes)
    if hasattr(m, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        m.madvise(mmap.MADV_HUGEPAGE)
    block = b"\1" * (64 << 20)
    for at in range(0, nbytes, len(block)):
        n = min(len(block), nbytes - at)
        m[at:at + n] = block[:n]
    m.close()
    return time.perf_counter() - t0


MADV_POPULATE_WRITE = 23  # Linux >= 5.14 (not in Python's mmap module yet)


def seq_read(path, into="fresh"):
    """Plain sequential read of a whole file in 64 MiB blocks: MB/s. into: "fresh": a new
    anonymous mapping the size of the file (what a program that reads a checkpoint into
    memory gets: its pages are made during the reads); "huge": the same, but its pages made
    first as huge pages (MADV_HUGEPAGE + MADV_POPULATE_WRITE, inside the clock: what the
    loader does with fresh buffers); "touched": one reused 64 MiB buffer, touched before the
    clock starts (the disk and the kernel's copy alone)."""
    size = os.path.getsize(path)
    private = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS  # as malloc's (Python's default is shared)
    if into == "touched":
        buf = mmap.mmap(-1, 64 << 20, flags=private)
        buf.write(b"\1" * (64 << 20))
    t0 = time.perf_counter()
    if into != "touched":
        buf = mmap.mmap(-1, size, flags=private)
        if into == "huge":
            buf.madvise(mmap.MADV_HUGEPAGE)
            try:
                buf.madvise(MADV_POPULATE_WRITE)
            except OSError:
                pass  # older kernel: the reads make the pages
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        at = 0
        while at < size:
            part = view[:] if into == "touched" else view[at:at + (64 << 20)]
            n = f.readinto(part)
            part.release()
            if not n:
                break
            at += n
    s = time.perf_counter() - t0
    view.release()
    buf.close()
    return size / s / 1e6


def baseline(path, cold):
    """The best plain sequential read of the file into a fresh buffer (the loader's
    destination is the training buffers, which a restarted process has just allocated),
    fresh and huge each after a drop when cold; the touched-buffer read is reported
    beside it. Returns (best MB/s, {variant: MB/s}, bytes resident after the drops)."""
    bw, res = {}, 0
    for into in ("fresh", "huge", "touched"):
        if cold:
            res += drop_cache([path])
        bw[into] = seq_read(path, into)
    return max(bw["fresh"], bw["huge"]), bw, res


def loaded(log, what):
    b, ms = grab(r"loaded (\d+) bytes \(\d+ chunks\) in ([\d.]+) ms", log, what)
    return int(b), float(ms)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", required=True)
    ap.add_argument("--dir", default=None, help="filesystem to measure (default: a temp dir)")
    ap.add_argument("--repeats", type=int, default=3, help="cold/warm load rounds")
    ap.add_argument("--smoke", action="store_true", help="a tiny model, one round (seconds)")
    args = ap.parse_args()
    if args.smoke:
        args.repeats = 1
    root = tempfile.mkdtemp(prefix="loom_bench_ckpt_", dir=args.dir)
    load0 = os.getloadavg()
    try:
        data = os.path.join(root, "train.bin")
        write_text_shard(data, 1)
        tiny = ["--vocab-size", "256", "--n-layer", "2", "--d-model", "64", "--n-head", "4",
                "--d-ff", "128"] if args.smoke else []
        base = [args.loom, "train", "--model", "gpt2-small"] + tiny + [
            "--seq-len", "64", "--micro-batch", "1", "--global-batch", "2", "--data", data,
            "--log-every", "1", "--threads", "2", "--steps", "5"]
        ckpt_bytes = 1484518816 if not args.smoke else 8 << 20  # checked against the log below
        warm_s = warm_memory(3 * ckpt_bytes)
        seq_before = seq_write(root, ckpt_bytes)
        ck1 = os.path.join(root, "ck1")
        # Saves after steps 2 and 4 (their copies overlap steps 3 and 5) and the final one.
        p = subprocess.run(base + ["--ckpt-dir", ck1, "--ckpt-every", "2"], capture_output=True,
                           text=True)
        if p.returncode:
            sys.exit(p.stderr[-3000:])
        log = p.stderr
        stall_ms, stall_max, stalls, waits, wait_ms = grab(
            r"training stall per save ([\d.]+) ms \(max ([\d.]+), over (\d+) saves before an "
            r"update\), waited for the previous save (\d+) time\(s\) and for its commit \d+ "
            r"time\(s\) \(([\d.]+) ms in all\)", log, "stall")
        stall_ms, stall_max, wait_ms = float(stall_ms), float(stall_max), float(wait_ms)
        per_save = [float(x) for x in re.findall(r"checkpoint step \d+: training stall ([\d.]+) ms",
                                                 log)]
        step_ms = [float(x) for x in re.findall(r"\| (\d+) ms \|", log)]
        writes = re.findall(r"staging copy \+ checksums ([\d.]+) ms \(cpu ([\d.]+)\); (\d+) bytes "
                            r"in ([\d.]+) ms \(write ([\d.]+), fsync ([\d.]+); cpu ([\d.]+)\)", log)
        if not writes:
            sys.exit(f"bench_ckpt: no 'write' in the log:\n{log[-3000:]}")
        stage_ms = [float(w[0]) for w in writes]
        stage_cpu = [float(w[1]) for w in writes]
        write_wall = [float(w[3]) for w in writes]
        write_cpu = [float(w[6]) for w in writes]
        _, _, wbytes, wms, wwrite, wfsync, _ = writes[-1]
        wbytes, wms, wwrite, wfsync = int(wbytes), float(wms), float(wwrite), float(wfsync)
        # Baseline: sequential write + fsync of the same bytes, same filesystem, before the
        # training run and after it (the machine is shared: both reported, mean used).
        seq_after = seq_write(root, wbytes)
        seq_bw = (seq_before * ckpt_bytes / wbytes + seq_after) / 2
        # Loads, cold (the files' pages dropped from the page cache first: O_DIRECT saves do
        # not leave them there anyway) and warm (just read), each against a sequential read
        # of the same file in the same state.
        data_file = os.path.join(ck1, "step_00000002", "rank_00000.safetensors")
        step2 = os.path.join(ck1, "step_00000002")
        # Same-layout load (saved by one process, loaded by one process); the first cold
        # one also runs steps 3-5 again without checkpointing: the step time a save's
        # background copy and write cost.
        p = None
        rounds = []
        for r in range(max(1, args.repeats)):
            rnd = {}
            for cold in (True, False):
                state = "cold" if cold else "warm"
                order = ("base", "load") if r % 2 == 0 else ("load", "base")
                for what in order:
                    if what == "base":
                        best, bw, res = baseline(data_file, cold)
                        rnd[f"seq_{state}_MBps"] = bw
                        rnd[f"seq_{state}_resident_after_drop"] = res
                        rnd[f"seq_{state}_best_MBps"] = best
                        continue
                    rnd[f"load_{state}_resident_after_drop"] = (drop_cache([data_file])
                                                                if cold else None)
                    steps = [] if (r == 0 and cold) else ["--steps", "2"]
                    q = subprocess.run(base + steps + ["--resume", step2], capture_output=True,
                                       text=True)
                    if q.returncode:
                        sys.exit(q.stderr[-3000:])
                    if r == 0 and cold:
                        p = q
                    rbytes, ms = loaded(q.stderr, f"{state} load")
                    rnd[f"load_{state}_ms"] = ms
                    rnd[f"load_{state}_MBps"] = rbytes / ms / 1e3
                rnd[f"ratio_{state}"] = rnd[f"load_{state}_MBps"] / rnd[f"seq_{state}_best_MBps"]
                rnd[f"ratio_{state}_vs_touched"] = (rnd[f"load_{state}_MBps"] /
                                                    rnd[f"seq_{state}_MBps"]["touched"])
            rounds.append(rnd)
        rbytes, rms = loaded(p.stderr, "load")
        plain_ms = [float(x) for x in re.findall(r"\| (\d+) ms \|", p.stderr)]
        rms_warm = rounds[0]["load_warm_ms"]
        seq_cold = rounds[0]["seq_cold_best_MBps"]
        seq_warm = rounds[0]["seq_warm_best_MBps"]
        res_seq = rounds[0]["seq_cold_resident_after_drop"]
        res_load = rounds[0]["load_cold_resident_after_drop"]

        def summary(state, key="ratio_{}"):
            each = [rnd[key.format(state)] for rnd in rounds]
            x = sorted(each)
            return {"median": x[len(x) // 2] if len(x) % 2 else (x[len(x) // 2 - 1] +
                                                                 x[len(x) // 2]) / 2,
                    "worst": x[0], "each": each}
        # Saved with dp 2 / ZeRO-1 (two files, other chunk boundaries), loaded by one process.
        ck2 = os.path.join(root, "ck2")
        p2 = subprocess.run(MPIRUN + ["-n", "2"] + base[:-2] + ["--steps", "1", "--dp", "2",
                                                               "--zero", "1", "--threads", "1",
                                                               "--ckpt-dir", ck2],
                            capture_output=True, text=True)
        if p2.returncode:
            sys.exit(p2.stderr[-3000:])
        step1 = os.path.join(ck2, "step_00000001")
        res_reshard = drop_cache([os.path.join(step1, f) for f in os.listdir(step1)
                                  if f.endswith(".safetensors")])
        reshard = base + ["--steps", "1", "--resume", step1]
        _, sms = loaded(subprocess.run(reshard, capture_output=True, text=True).stderr,
                        "resharded load")
        _, sms_warm = loaded(subprocess.run(reshard, capture_output=True, text=True).stderr,
                             "resharded warm load")
        step = sorted(step_ms)[len(step_ms) // 2] if step_ms else float("nan")
        out = {
            "model": "smoke: gpt2 L2 C64 V256" if args.smoke else "gpt2-small (124M), seq_len 64",
            "checkpoint_bytes": wbytes,
            "step_ms_median": step,
            "step_ms_each": step_ms,
            "step_ms_overlapping_a_save_3_5": [step_ms[2], step_ms[4]],
            "step_ms_without_save_2_4": [step_ms[1], step_ms[3]],
            "step_ms_3_4_5_rerun_without_ckpt": plain_ms,
            "stall_ms_per_save": stall_ms,
            "stall_ms_each": per_save,
            "stall_ms_max": stall_max,
            "stall_fraction_of_step": stall_ms / step,
            "saves_fenced": int(stalls),
            "waits_for_previous_save": int(waits),
            "wait_ms_total": wait_ms,
            "background_stage_ms_each": stage_ms,
            "background_stage_cpu_ms_each": stage_cpu,
            "background_write_ms_each": write_wall,
            "background_write_cpu_ms_each": write_cpu,
            "save_write_ms": wwrite,
            "save_fsync_ms": wfsync,
            "save_bw_MBps": wbytes / wms / 1e3,
            "seq_write_bw_MBps": seq_bw,
            "seq_write_bw_MBps_before_after": [seq_before, seq_after],
            "save_vs_seq_write": (wbytes / wms / 1e3) / seq_bw,
            "load_vs_seq_read": {"cold": summary("cold"), "warm": summary("warm"),
                                 "rounds": len(rounds), "target": 0.8,
                                 "baseline": "best of fresh/huge (fresh buffer)"},
            # beside it, against a read into a reused, already touched buffer (no page making)
            "load_vs_seq_read_touched": {"cold": summary("cold", "ratio_{}_vs_touched"),
                                         "warm": summary("warm", "ratio_{}_vs_touched")},
            "load_rounds": rounds,
            "load_bw_MBps_cold": rbytes / rms / 1e3,
            "seq_read_bw_MBps_cold": seq_cold,
            "load_vs_seq_read_cold": (rbytes / rms / 1e3) / seq_cold,
            "load_bw_MBps_warm": rbytes / rms_warm / 1e3,
            "seq_read_bw_MBps_warm": seq_warm,
            "load_vs_seq_read_warm": (rbytes / rms_warm / 1e3) / seq_warm,
            "load_ms_same_layout_cold_warm": [rms, rms_warm],
            "load_ms_resharded_dp2z1_to_dp1_cold_warm": [sms, sms_warm],
            "reshard_vs_same_layout_cold": sms / rms,
            "reshard_vs_same_layout_warm": sms_warm / rms_warm,
            "cold_resident_bytes_after_drop_seq_load_reshard": [res_seq, res_load, res_reshard],
            "memory_warmup_s": warm_s,
            "direct_io": "direct I/O" in log,
            "loadavg_before": load0,
            "loadavg_after": os.getloadavg(),
            "filesystem_dir": root,
        }
        print(json.dumps(out))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
