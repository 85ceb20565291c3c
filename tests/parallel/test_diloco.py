#!/usr/bin/python3
"""DiLoCo (--outer diloco) computes what it should, in every layout inside the workers.

What is exactly equal, and why (H = 1, outer lr 1, outer momentum 0, fp32): one round
starts every worker from the same parameters p, each takes one inner step to p_w, and the
outer step gives p - 1 * mean_w(p - p_w) = mean_w(p_w): the average of the W workers'
one-step results. Synchronous dp takes one step on the mean gradient g = mean_w(g_w)
(worker w's gradient is that of the mean loss over its 1/W of the global batch). The two
are the same when the inner step is linear in the gradient, which SGD (the paper's
statement) and SGD with momentum are (the moments, kept per worker, average to the
synchronous run's moment by induction), and AdamW is not: with W > 1 the mean of W AdamW
steps m_w / sqrt(v_w) is not m / sqrt(v) of the mean gradient. So the test checks:
1. W = 1 with loom's AdamW: the same losses and weights as plain training (<= TOL):
   the worker split, the outer round trip (p - (p - p_1)) and the metrics change nothing.
2. W = 2 with the inner AdamW made linear: --adam-eps 1e8 (sqrt(v) + eps rounds to eps
   in fp32, so the step is lr * m_hat / eps: SGD with momentum at lr / eps), no weight
   decay, no clipping (both nonlinear across workers): the same losses (the workers' mean)
   and weights as synchronous --dp 2 (<= TOL). This checks the data slices (worker w takes
   slice w of each step's global batch), the per-worker loss normalisation, the exchange,
   the mean and the outer step against an independent code path.
3. W = 2 with ordinary AdamW differs from --dp 2 (the check above can fail).
Then the layouts inside the workers (H = 3, Nesterov momentum, evaluation, a last round
cut short): W = 2 groups of dp 2 ZeRO-1, of tp 2, of pp 2, of dp 2 ZeRO-3 (each rank syncs
its parameter shard) give the losses and weights of W = 2 groups of one rank (<= TOL; the
worst tensor <= 10 TOL as in test_layouts*.py), and so do MoE groups of dp 2 x ep 2 (ZeRO-0,
whose dense and expert tensors sync over their own replicas: the bytes and outer gradient
norm of one-rank groups; streaming F = 2; and ZeRO-3, whose ranks sync their shard's own
ranges only and save outer state for them alone), also with the warm start (ZeRO-1, ZeRO-2 with --grad-accum sharded, ZeRO-3; and dp 2
ZeRO-2 with --grad-accum sharded without ep); the same layout twice is bitwise (ZeRO-1,
ZeRO-3); checkpoints hold the outer state (round-start parameters, momentum): a resume
mid-round (from DIR/step_N, and --resume auto; ZeRO-3 groups, whose ranks save their
shard's state, about half a ZeRO-1 rank's) is bitwise; with --ckpt-fast-dir too, each
tier keeping (and pruning) the outer state of its own steps, a resume from the fast tier
mid-round (--resume auto across the tiers, and FAST/step_N) and one from the hosts' memory
(--ckpt-peer, a job killed mid-run) bitwise; streaming (F = 2) in fp32 in a dp 2
group (ZeRO-1, ZeRO-3) equals it in one-rank groups, and with --overlap-param-gather in
dp 2 ZeRO-1 groups bitwise the run without it; int4 in ZeRO-3 groups trains; bf16 on the
wire (plain DiLoCo) sends half of fp32's bytes, differs from fp32, and in dp 2 ZeRO-1
groups equals one-rank groups within a bound derived from the bf16-vs-fp32 difference
(the comment at the check); streaming int4 twice is bitwise (also with the outer engine's
thread
off: LOOM_MPI_THREAD=funneled), sends fewer bytes than fp32 and trains. Elastic workers
(--elastic-worker, two jobs through an ompi-server, each a group of dp 2 ZeRO-1, or of dp 2
ZeRO-3, and of dp 2 x ep 2 ZeRO-3 with a MoE) without faults: bitwise the weights of the same
groups in one job (streaming F = 2 too, in one-rank and dp 2 ZeRO-1 workers, and resumed
with a fragment about to land); their checkpoints
hold the outer state (each worker's lead writes its group's) and both resumed mid-round end
bitwise the same; with --ckpt-fast-dir too, a coordinator resumed from its fast step 5 and a
worker resumed from its fast step 7 that reloads its own step 5 there end bitwise the same. `loom run --elastic` launches two elastic workers (an ompi-server, one
mpirun each), restarts worker 1 after it dies, and it rejoins at the step the test names
(--inject admit@16: worker 0 waits there for it, so the check does not depend on timing;
the same with streaming F = 2, admitted when step 15's sync has landed; and streaming's
coordinator killed and started again from its checkpoint: bitwise the run without the kill);
restarted with --resume auto (the job has --ckpt-dir) it loads its own checkpoint and still
takes the coordinator's newer state; --ckpt-keep prunes the outer state with the step folders.
The coordinator (worker 0) killed mid-run: loom run starts it again from its newest
checkpoint, worker 1 leaves and rejoins it from its own checkpoint of that step, both end at
the last sync with the same parameters, nothing is left running, and the run is bitwise the
same run without the kill. A worker's rank hung (--inject hang@6:3): loom run's heartbeat
watch names it, stops and restarts it, and it rejoins at admit@16. A joiner slow to withdraw
its name (its MPI_Unpublish_name delayed 3 s by an LD_PRELOADed shim against a 2 s deadline)
is still admitted: it takes the state before it withdraws the name. --outer-warmup in elastic
workers: bitwise the one-job run. A whole machine paused (both workers and the ompi-server stopped for longer
than the deadline): nobody is dropped. --outer-start-step 4 in elastic workers (one rank,
dp 2 ZeRO-1): bitwise the one-job run; resumed from its checkpoint with --outer-start-step 3
both workers refuse (exit 2, the flag and both values named). --outer-dtype bf16 and int8 in elastic workers (outer lr 1, no momentum):
bitwise the one-job run, and the bytes fall by the wire format's ratio.
A warm start (--outer-start-step S: synchronous dp over the workers for steps 1..S, then
DiLoCo's rounds from S, the DiLoCo paper's set-up of a synchronously trained start): with
S >= steps it is --dp 2 with ordinary AdamW (<= TOL); with S = 4 of 8 the outer syncs come
at S + H and the last step, resumes before, at and after the switch are bitwise, a
resume with another S is refused (exit 2), and W=2 groups of dp 2 ZeRO-1, of tp 2, of
pp 2 and of dp 2 ZeRO-3 with S = 4 equal groups of one rank.
Usage: test_diloco.py --loom PATH [--seed S]
"""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
from loomtest import (ADAM_EPS, MPIRUN, TOL, Layouts, Run, bitwise, loss_error, parse_test_args,  # noqa: E402
                      same_tensors, weights_error, write_text_shard)
from loomtest import check, descendants, keep_or_remove, run_test  # noqa: E402

D = 48


def compare(name, got, ref, tol=TOL):
    loss_err = loss_error(got.losses, ref.losses)
    whole, worst, w_name = weights_error(got.params, ref.params, D)
    ok = (len(got.losses) == len(ref.losses) and loss_err <= tol and whole <= tol
          and worst <= 10 * tol)
    check(ok, f"  {name:34s} losses rel err {loss_err:.2e}  weights rel err {whole:.2e} "
              f"(worst {worst:.2e} {w_name})")
    return ok


def stop(jobs, server):
    """Kills the worker jobs still running, then the ompi-server."""
    for j in jobs:
        if j.poll() is None:
            j.kill()
            j.wait()
    server.terminate()
    server.wait()


def elastic_pair(base, tmp, ranks=1, name="elastic"):
    """Two --elastic-worker jobs (mpirun -n RANKS each) through a local ompi-server; worker
    0's Run (--dump-dir, --metrics), or None (the failure printed)."""
    codes, errs, out = elastic_jobs(base, tmp, ranks, name)
    if any(codes):
        print(f"  elastic workers: exit {codes}\n{errs[0][-2000:]}\n{errs[1][-2000:]}")
        return None
    return Run(out, errs[0])


def flip_saved_start(ckpt_dir, pattern, offset):
    """Flips the low bit of the --outer-start-step field at `offset` in the outer-state
    files `pattern` under `ckpt_dir` (the test's S is 4: the files then say 5)."""
    paths = glob.glob(os.path.join(ckpt_dir, pattern), recursive=True)
    assert paths, f"no outer state {pattern} in {ckpt_dir}"
    for path in paths:
        with open(path, "r+b") as f:
            f.seek(offset)
            b = f.read(1)
            f.seek(offset)
            f.write(bytes([b[0] ^ 1]))


def name_server(uri, ranks=1):
    """An ompi-server that writes its URI to `uri` (waited for, 10 s at most), and the
    mpirun prefix of a worker job of `ranks` ranks that finds names through it."""
    server = subprocess.Popen(["ompi-server", "--no-daemonize", "-r", uri],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    until = time.time() + 10
    while time.time() < until and not (os.path.exists(uri) and open(uri).read().strip()):
        time.sleep(0.05)
    return server, ["mpirun", "--allow-run-as-root", "--oversubscribe", "--ompi-server",
                    f"file:{uri}", "--mca", "mpi_yield_when_idle", "1", "-n", str(ranks)]


def elastic_jobs(base, tmp, ranks, name):
    """elastic_pair's two jobs: their exit codes, their stderr and worker 0's output path."""
    uri, out = os.path.join(tmp, name + ".uri"), os.path.join(tmp, name + "_w0")
    server, mpirun = name_server(uri, ranks)
    jobs = []
    try:
        for w, extra in ((0, ["--metrics", out + ".jsonl", "--dump-dir", out]), (1, [])):
            jobs.append(subprocess.Popen(mpirun + base + ["--elastic-worker", str(w)] + extra,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                         text=True))
        errs = [p.communicate(timeout=120)[1] for p in jobs]
        return [p.returncode for p in jobs], errs, out
    finally:
        stop(jobs, server)


def worker_logs(run_dir, step=24):
    """loom run --elastic's two worker logs (RUN_DIR/worker_I.log, "" when missing), and each
    one's checksums of its outer syncs of two members at `step` (the last)."""
    logs = []
    for w in (0, 1):
        path = os.path.join(run_dir, f"worker_{w}.log")
        logs.append(open(path).read() if os.path.exists(path) else "")
    last = [[ln.split("checksum ")[-1] for ln in log.splitlines()
             if f"step {step}: outer sync, members=2" in ln] for log in logs]
    return logs, last


def elastic_run(loom, model, tmp, name="elastic_run", extra=(), death="crash@6:1"):
    """loom run --elastic with --workers 2: an ompi-server and one mpirun per worker; worker
    1 dies before step 6 (`death`), worker 0 drops it at the outer step of 8 and goes on
    alone (12); loom run starts it again with --elastic-join; worker 0 admits it at step 16
    (admit@16: there it waits until the worker joined, so the rejoin's step does not depend
    on the machine's load); both end at the last sync (24) with the same parameters, exit
    0. Returns (loom run's result, the two workers' logs, worker 0's Run) when it did."""
    run_dir = os.path.join(tmp, name)
    out = os.path.join(run_dir, "w0")
    cmd = [loom, "run", "--elastic", "-n", "2", "--grace", "2", "--run-dir", run_dir, "--"] + model[2:] + [
        "--steps", "24", "--lr", "3e-3", "--outer", "diloco", "--workers", "2",
        "--inner-steps", "4", "--elastic-timeout", "2", "--inject", death,
        "--inject", "admit@16", "--metrics", out + ".jsonl", "--dump-dir", out] + list(extra)
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    logs, last = worker_logs(run_dir)
    alone = "worker 0 step 12: outer sync, members=1 [0]" in logs[0]
    joined = "worker 0 step 16: worker 1 joined, members=2" in logs[0]
    # summary.json: the outcome, each worker's launches and exit codes, its last sync
    path = os.path.join(run_dir, "summary.json")
    summ = json.load(open(path)) if os.path.exists(path) else {}
    ws = summ.get("workers", [{}, {}])
    syncs = [w.get("last_sync") or {} for w in ws]
    summed = (summ.get("outcome") == "finished" and summ.get("exit_code") == 0 and
              summ.get("restarts") == 1 and [w.get("launches") for w in ws] == [1, 2] and
              ws[0].get("exits") == [0] and ws[1].get("exits") == [137, 0] and
              all(x.get("step") == 24 and x.get("members") == 2 for x in syncs) and
              last[0] and [x.get("checksum") for x in syncs] == [last[0][-1], last[1][-1]])
    ok = (p.returncode == 0 and "worker 1 ended (exit 137)" in p.stderr and
          "worker 1 started again with --elastic-join" in p.stderr and
          "worker 1 lost" in logs[0] and alone and joined and last[0] and last[0] == last[1] and
          summed)
    check(ok, f"  loom run --elastic --workers 2{' ' + ' '.join(extra) if extra else ''}: "
              f"worker 1 died, dropped at 8, worker 0 alone at 12 ({alone}), rejoined at 16 "
              f"({joined}), last sync equal on both, summary.json says so ({summed}) (exit "
              f"{p.returncode}, {time.time() - t0:.1f} s)")
    if not ok:
        print(p.stderr[-2000:])
        return None
    return p, logs, Run(out, logs[0])


def elastic_run_streaming(loom, model, tmp):
    """Streaming DiLoCo in elastic workers under loom run --elastic (F = 2, H = 6: fragment 0
    synced after steps 3, 9, 15, 21, fragment 1 after 6, 12, 18, 24; with MPI_THREAD_MULTIPLE
    each exchange runs during the two steps after its sync and lands then): worker 1 dies at
    step 5, worker 0 drops it at the sync of step 6 (or of step 3, when its gradient was
    still going out when it died) and goes on alone (9), loom run starts it again with
    --elastic-join, worker 0 admits it when fragment 0's sync of step 15 has landed (17,
    admit@17: no exchange under way), and both end at the last step's syncs with the same
    round-start parameters, exit 0."""
    run_dir = os.path.join(tmp, "elastic_streaming")
    cmd = [loom, "run", "--elastic", "-n", "2", "--grace", "2", "--run-dir", run_dir, "--"] + model[2:] + [
        "--steps", "24", "--lr", "3e-3", "--outer", "diloco", "--workers", "2",
        "--inner-steps", "6", "--outer-fragments", "2", "--outer-nesterov",
        "--elastic-timeout", "2", "--inject", "crash@5:1", "--inject", "admit@17"]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    logs, _ = worker_logs(run_dir)
    last = [[ln.split("checksum ")[-1] for ln in log.splitlines()
             if "step 24: outer sync of fragment 1, members=2" in ln] for log in logs]
    dropped = any(f"worker 0 step {s}: worker 1 lost" in logs[0] for s in (3, 6))
    alone = "worker 0 step 9: outer sync of fragment 0, members=1 [0]" in logs[0]
    joined = "worker 0 step 17: worker 1 joined, members=2" in logs[0]
    both = "worker 1 step 18: outer sync of fragment 1, members=2 [0,1]" in logs[1]
    ok = (p.returncode == 0 and "worker 1 started again with --elastic-join" in p.stderr and
          dropped and alone and joined and both and last[0] and last[0] == last[1])
    check(ok, f"  loom run --elastic, streaming F=2 H=6: worker 1 died, dropped at 3 or 6 "
              f"({dropped}), worker 0 alone at 9 ({alone}), rejoined at 17 ({joined}), both "
              f"synced at 18 ({both}), the last syncs equal on both (exit {p.returncode}, "
              f"{time.time() - t0:.1f} s)")
    if not ok:
        print(p.stderr[-2000:] + "\n" + "\n".join(elastic_lines(logs[0])[-12:]) + "\n" +
              "\n".join(elastic_lines(logs[1])[-12:]))


def join_checksum(log, who):
    """The checksum of the state worker 1 took when it joined at step 16 (`who`'s line)."""
    lines = [ln for ln in log.splitlines() if f"worker {who} step 16:" in ln and "join" in ln]
    return lines[-1].split("checksum ")[-1] if lines else None


def elastic_run_resumed(loom, model, tmp):
    """elastic_run with --ckpt-dir: loom run restarts worker 1 with --resume auto; it loads
    its newest complete checkpoint (step 2: its save of step 4 is killed half-written), then
    takes the coordinator's newer state at step 16 (the checksum worker 0 sent, not its
    own; it has no checkpoint of step 16, and says so) and keeps only the checkpoint's
    AdamW moments. --ckpt-keep 2: two step folders per
    worker remain, and the outer state of those two only. (The final weights differ from a
    restart without a checkpoint, whose joiner's moments start at zero: docs/diloco.md.)"""
    ck = os.path.join(tmp, "elastic_run_ck")
    got = elastic_run(loom, model, tmp, "elastic_run",
                      ["--ckpt-dir", ck, "--ckpt-every", "2", "--ckpt-keep", "2"],
                      death="kill-during-save@4:1")
    if not got:
        return
    p, logs, _ = got
    again = logs[1][logs[1].rfind("elastic-join = 1"):]  # the restarted worker's part
    resumed = f"resumed from {os.path.join(ck, 'worker_1')}/step_00000002 (step 2)" in again
    took, sent = join_checksum(again, 1), join_checksum(logs[0], 0)
    kept = "kept" in again
    # it has no checkpoint of the group's step (16): today's rule, said in one line
    said = "no usable checkpoint of the group's step 16 in its folder" in again
    check("--resume auto" in p.stderr and resumed and took and took == sent and not kept and said,
          f"  restarted with --resume auto: resumed from its step 2 ({resumed}), took the "
          f"coordinator's state of step 16 ({took} = {sent}), not its own ({not kept}), "
          f"said it has no checkpoint of step 16 ({said})")
    left = {}
    for w in (0, 1):
        d = os.path.join(ck, f"worker_{w}")
        steps = sorted(x for x in os.listdir(d) if x.startswith("step_"))
        outer = sorted(os.listdir(os.path.join(d, "outer")))
        left[w] = (steps, outer)
    want = ["step_00000022", "step_00000024"]
    check(all(s == want and o == want for s, o in left.values()),
          f"  --ckpt-keep 2: step folders and outer state left {left}")


def alive_with(text):
    """The pids of the processes whose command line holds `text` (this one's excepted)."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    pids.append(int(d))
        except OSError:
            pass
    return pids


def sync_checksums(log):
    """{step: checksum} of a worker log's outer syncs with members=2 (the last line per step)."""
    out = {}
    for ln in log.splitlines():
        if ": outer sync, members=2" in ln and " step " in ln:
            out[int(ln.split(" step ")[1].split(":")[0])] = ln.split("checksum ")[-1]
    return out


def coordinator_dies_run(loom, model, tmp, name, inject):
    """loom run --elastic, --workers 2, H 4, --ckpt-dir, --ckpt-every 2 (every step folder
    kept: --ckpt-keep's default), with the faults `inject`; (loom run's result, the two
    workers' logs, the run folder, the checkpoint folder, worker 0's output prefix)."""
    run_dir = os.path.join(tmp, name)
    ck, out = os.path.join(tmp, name + "_ck"), os.path.join(run_dir, "w0")
    cmd = [loom, "run", "--elastic", "-n", "2", "--grace", "2", "--max-restarts", "6",
           "--run-dir", run_dir, "--"] + model[2:] + [
        "--steps", "24", "--lr", "3e-3", "--outer", "diloco", "--workers", "2",
        "--inner-steps", "4", "--elastic-timeout", "3", "--ckpt-dir", ck, "--ckpt-every", "2",
        "--metrics", out + ".jsonl", "--dump-dir", out] + inject
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    logs = []
    for w in (0, 1):
        path = os.path.join(run_dir, f"worker_{w}.log")
        logs.append(open(path).read() if os.path.exists(path) else "")
    return p, logs, run_dir, ck, out



def elastic_pause(loom, model, tmp):
    """Two elastic workers, worker 0 (the coordinator) 3x slower, so worker 1 spends most of
    its time waiting for the outer update (a deadline of 3 x --elastic-timeout 2 = 6 s). The
    whole machine pauses: every process of both jobs and the ompi-server SIGSTOPped for 8 s,
    worker 1 woken 0.5 s before worker 0. Nobody is dropped (the time a process was not
    scheduled does not count against its peer): both end at the last sync with members=2
    and the same checksum."""
    uri = os.path.join(tmp, "pause.uri")
    server, mpirun = name_server(uri)
    metrics = os.path.join(tmp, "pause_w0.jsonl")
    args = model + ["--steps", "30", "--lr", "3e-3", "--outer", "diloco", "--workers", "2",
                    "--inner-steps", "3", "--elastic-timeout", "2"]
    jobs = [subprocess.Popen(mpirun + args + ["--elastic-worker", str(w)] + extra,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for w, extra in ((0, ["--inject", "slow@1:0:3", "--metrics", metrics]), (1, []))]
    try:
        t0 = time.time()
        rows = lambda: sum(1 for _ in open(metrics)) if os.path.exists(metrics) else 0  # noqa: E731
        while rows() < 8 and time.time() - t0 < 60 and all(j.poll() is None for j in jobs):
            time.sleep(0.02)
        at = rows()
        procs = [[j.pid] + descendants(j.pid) for j in jobs]
        for p in [server.pid] + procs[0] + procs[1]:
            os.kill(p, signal.SIGSTOP)
        time.sleep(8.0)
        for group in ([server.pid], procs[1], procs[0]):
            for p in group:
                os.kill(p, signal.SIGCONT)
            time.sleep(0.5)
        errs = [j.communicate(timeout=120)[1] for j in jobs]
    finally:
        stop(jobs, server)
    last = [[ln.split("checksum ")[-1] for ln in e.splitlines()
             if "step 30: outer sync, members=2" in ln] for e in errs]
    dropped = any("lost" in e or "leaves the group" in e for e in errs)
    ok = [j.returncode for j in jobs] == [0, 0] and not dropped and last[0] and last[0] == last[1]
    check(ok, f"  elastic workers, the machine paused 8 s at step {at} of worker 0 (deadline "
              f"6 s): nobody dropped ({not dropped}), last sync members=2 equal on both (exit "
              f"{[j.returncode for j in jobs]})")
    if not ok:
        print(errs[0][-1500:] + "\n" + errs[1][-1500:])


def elastic_run_coordinator_dies(loom, model, tmp):
    """Worker 0, the coordinator, SIGKILLed at the start of step 10 (crash@10:0, --ckpt-dir,
    --ckpt-every 2): loom run starts it again with --resume auto and without --elastic-join,
    so it founds the group again from its newest complete checkpoint (before step 10: 6 when
    the asynchronous save of 8 was not committed yet); worker 1 hears no outer update at its next outer step within 3 x
    --elastic-timeout, ends, is started again with --elastic-join --resume auto and joins
    the new coordinator; it loads its own checkpoint of the coordinator's step (not its
    newer newest one), finds it is the group's state and keeps it (its parameters and AdamW
    moments); both train to step 24 and end with the same checksum at the last sync with
    members=2, exit 0; worker 1 never coordinates (one authority: a new coordinator only
    after the old one's job ended) and nothing is left running. The run is bitwise the
    same run without the kill: every outer sync's checksum from the restart's step on,
    worker 0's losses of every step and its final weights. The timeouts are generous (a
    join waits up to 60 s), and the checks do not depend on when worker 1 noticed or
    rejoined."""
    t0 = time.time()
    p, logs, run_dir, ck, out = coordinator_dies_run(loom, model, tmp, "elastic_w0",
                                                     ["--inject", "crash@10:0"])
    # worker 0's second life: the last founding, from the checkpoint it resumed
    again = logs[0][logs[0].rfind("coordinates from step"):]
    words = again.split()
    founded = int(words[3].rstrip(";")) if len(words) > 3 and words[3].rstrip(";").isdigit() else -1
    resumed = (0 < founded < 10 and
               f"resumed from {os.path.join(ck, 'worker_0')}/step_{founded:08d}" in logs[0])
    last = [[ln.split("checksum ")[-1] for ln in log.splitlines()
             if "step 24: outer sync, members=2" in ln] for log in logs]
    rejoined = "worker 1 joined" in again and "no outer update from the coordinator" in logs[1]
    restarted = ("worker 0 ended (exit 137)" in p.stderr and
                 "worker 0 started again (the coordinator) --resume auto" in p.stderr and
                 "worker 1 started again with --elastic-join" in p.stderr)
    one = "coordinates" not in logs[1] and logs[0].count("coordinates from step") == 2
    left, until = alive_with(run_dir), time.time() + 10  # (a process still ending)
    while left and time.time() < until:
        time.sleep(0.5)
        left = alive_with(run_dir)
    ok = (p.returncode == 0 and restarted and resumed and rejoined and one and last[0] and
          last[0] == last[1] and not left)
    check(ok, f"  loom run --elastic, worker 0 (the coordinator) killed at step 10: started "
              f"again ({restarted}) from its step {founded} ({resumed}), worker 1 left and "
              f"rejoined it ({rejoined}), one coordinator ({one}), last sync members=2 equal "
              f"on both ({bool(last[0]) and last[0] == last[1]}), left running {left} "
              f"(exit {p.returncode}, {time.time() - t0:.1f} s)")
    if not ok:
        print(p.stderr[-3000:])
        print(logs[0][-3000:])
        print(logs[1][-3000:])
        return
    run = Run(out, logs[0])
    check(run.losses and all(x == x for x in run.losses) and run.losses[-1] < run.losses[0],
          f"  trained to the end: worker 0's loss {run.losses[0]:.4f} -> {run.losses[-1]:.4f}")
    # worker 1's last life loaded its checkpoint of the founded step and kept it
    w1 = logs[1][logs[1].rfind("elastic-join = 1"):]
    own = f"resumed from {os.path.join(ck, 'worker_1')}/step_{founded:08d} (step {founded})" in w1
    kept = f"step {founded}: joined (its checkpoint is the group's state: kept)" in w1
    check(own and kept, f"  worker 1 rejoined from its own checkpoint of step {founded} ({own}) "
                        f"and kept it ({kept})")
    # the same run without the kill: bitwise
    t1 = time.time()
    q, qlogs, _, _, qout = coordinator_dies_run(loom, model, tmp, "elastic_w0_ref", [])
    ref = Run(qout, qlogs[0])
    if q.returncode != 0:
        check(False, f"  the run without the kill: exit {q.returncode}")
        print(q.stderr[-2000:])
        return
    got_sums, ref_sums = sync_checksums(logs[0]), sync_checksums(qlogs[0])
    after = {s: c for s, c in got_sums.items() if s > founded}
    sums = bool(after) and all(ref_sums.get(s) == c for s, c in after.items())
    by_step = {}
    for r in run.rows:  # the restarted life's rows after the first's (the last per step)
        by_step[r["step"]] = r["loss"]
    ref_steps = {r["step"]: r["loss"] for r in ref.rows}
    losses = (set(range(founded + 1, 25)) <= set(by_step) and
              all(ref_steps.get(s) == x for s, x in by_step.items()))
    weights = same_tensors(run.params, ref.params)
    check(sums and losses and weights,
          f"  bitwise the run without the kill: outer syncs {sorted(after)} ({sums}), worker "
          f"0's losses ({losses}), final weights ({weights}) ({time.time() - t1:.1f} s)")


def elastic_run_coordinator_dies_streaming(loom, model, tmp):
    """Streaming (F = 2, H = 6) in elastic workers with the coordinator SIGKILLed at the start
    of step 10 (fragment 0's exchange of step 9 under way): started again from its newest
    checkpoint, worker 1 rejoins; worker 0's losses from the founded step on and its final
    weights are bitwise the same run without the kill."""
    t0 = time.time()
    stream = ["--inner-steps", "6", "--outer-fragments", "2"]
    p, logs, _, _, out = coordinator_dies_run(loom, model, tmp, "elastic_w0_stream",
                                              stream + ["--inject", "crash@10:0"])
    q, qlogs, _, _, qout = coordinator_dies_run(loom, model, tmp, "elastic_w0_stream_ref",
                                                stream)
    founded = [int(ln.split("coordinates from step ")[1].split(";")[0])
               for ln in logs[0].splitlines() if "coordinates from step " in ln]
    ok = p.returncode == 0 and q.returncode == 0 and len(founded) == 2 and 0 < founded[1] < 10
    if ok:
        run, ref = Run(out, logs[0]), Run(qout, qlogs[0])
        by_step = {r["step"]: r["loss"] for r in run.rows}  # the last life's row per step
        ref_steps = {r["step"]: r["loss"] for r in ref.rows}
        ok = (set(range(founded[1] + 1, 25)) <= set(by_step) and
              all(ref_steps.get(s) == x for s, x in by_step.items()) and
              same_tensors(run.params, ref.params))
    check(ok, f"  streaming elastic workers, the coordinator killed at step 10: started again "
              f"from its step {founded[1] if len(founded) > 1 else '?'}, bitwise the run "
              f"without the kill (exit {p.returncode}, {q.returncode}; {time.time() - t0:.1f} s)")
    if not ok:
        print(p.stderr[-2000:] + "\n" + "\n".join(elastic_lines(logs[0])[-12:]))


def ckpt_tiers(runs, ref, tmp):
    """W = 2 one-rank groups (H = 3, 8 steps) with both checkpoint tiers: --ckpt-dir every 4
    steps and --ckpt-fast-dir every step, --ckpt-keep 3. Bitwise the run without them; each
    tier's outer state is kept and pruned with that tier's step folders (fast: 5, 6, 7; disk:
    4, 8); --resume auto (disk's step 8 removed) takes the fast tier's step 7 and its outer
    state, and --resume FAST/step_5 (mid-round) the same: bitwise the uninterrupted run. Then
    --ckpt-peer: a job killed at the start of step 8 (its one save: step 4, in the hosts'
    memory and on disk) resumes from memory at step 4 (mid-round), the outer state from beside
    its disk folder, bitwise the uninterrupted run."""
    ck, fast = os.path.join(tmp, "tiers_ck"), os.path.join(tmp, "tiers_fast")
    both = ["--ckpt-dir", ck, "--ckpt-every", "4", "--ckpt-fast-dir", fast, "--ckpt-fast-every",
            "1", "--ckpt-keep", "3"]
    a = runs.run("tiers", 2, both)
    check(bitwise(a, ref), "  --ckpt-fast-dir with --ckpt-dir changes nothing (bitwise)")

    def steps(d):
        return sorted(int(n[5:]) for n in os.listdir(d) if n.startswith("step_")) \
            if os.path.isdir(d) else []
    held = [(steps(os.path.join(t, f"worker_{w}")), steps(os.path.join(t, f"worker_{w}", "outer")))
            for t in (fast, ck) for w in (0, 1)]
    want = [([5, 6, 7], [5, 6, 7])] * 2 + [([4, 8], [4, 8])] * 2
    check(held == want, f"  --ckpt-keep 3 per tier, the outer state with its step folders "
                        f"(fast, disk; per worker: steps, outer): {held}")
    for w in (0, 1):  # disk's newest gone: the fast tier's step 7 is the newest
        for sub in ("", "outer"):
            shutil.rmtree(os.path.join(ck, f"worker_{w}", sub, "step_00000008"))
    for name, at, flags in (("auto", 7, ["--resume", "auto", "--ckpt-dir", ck, "--ckpt-fast-dir",
                                         fast]),
                            ("step", 5, ["--resume", os.path.join(fast, "step_00000005")])):
        b = runs.run("tiers_" + name, 2, flags)
        got = f"the outer state of step {at} from {os.path.join(fast, 'worker_0')}/outer"
        ok = ((name == "step" or got in b.stderr) and
              f"resumed from {os.path.join(fast, 'worker_1')}/step_{at:08d}" in b.stderr and
              bitwise((b.losses, b.params), (a.losses_after(at), a.params)))
        check(ok, f"  resume from the fast tier at step {at} ({name}): bitwise the "
                  f"uninterrupted run")
    # --ckpt-peer: killed at step 8's start (rank 0), the save of step 4 in memory
    ckp, peer = os.path.join(tmp, "tiers_peer_ck"), os.path.join(tmp, "tiers_peer_mem")
    pf = ["--ckpt-dir", ckp, "--ckpt-every", "4", "--ckpt-peer", "--ckpt-peer-dir", peer]
    cmd = MPIRUN + ["-n", "2"] + runs.base + pf + ["--inject", "crash@8:0"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    check(p.returncode != 0 and "crash at step 8" in p.stderr,
          f"  --ckpt-peer run killed at step 8: exit {p.returncode}")
    c = runs.run("tiers_peer", 2, pf + ["--resume", "auto"])
    ok = ("resume source: peer memory, step 4" in c.stderr and
          bitwise((c.losses, c.params), (a.losses_after(4), a.params)))
    check(ok, "  --ckpt-peer: resumed from memory at step 4 (mid-round), the outer state from "
              "disk: bitwise the uninterrupted run")


def elastic_tiers(base, ref, tmp):
    """Elastic workers (one rank each, H = 3, 8 steps) with both checkpoint tiers (--ckpt-dir
    every 4 steps, --ckpt-fast-dir every step, --ckpt-keep 3): bitwise the one-job run `ref`.
    Then both workers' disk step 8 and worker 0's fast steps 6 and 7 are removed: with
    --resume auto the coordinator resumes its fast step 5 (the outer state beside it, in the
    fast tier) and worker 1 its fast step 7; worker 1 learns the group's step 5 when it joins
    and loads its own fast step 5 with the outer state there: bitwise the uninterrupted run."""
    ck, fast = os.path.join(tmp, "el_tiers_ck"), os.path.join(tmp, "el_tiers_fast")
    both = ["--ckpt-dir", ck, "--ckpt-every", "4", "--ckpt-fast-dir", fast, "--ckpt-fast-every",
            "1", "--ckpt-keep", "3"]
    a = elastic_pair(base + both, tmp, 1, "elastic_tiers")
    ok = a is not None and same_tensors(a.params, ref.params)
    check(ok, "  elastic workers with --ckpt-fast-dir and --ckpt-dir: bitwise the one-job run")
    if a is None:
        return
    gone = [(ck, w, 8) for w in (0, 1)] + [(fast, 0, 6), (fast, 0, 7)]
    for tier, w, n in gone:
        for sub in ("", "outer"):
            shutil.rmtree(os.path.join(tier, f"worker_{w}", sub, f"step_{n:08d}"))
    codes, errs, out = elastic_jobs(base + ["--resume", "auto", "--ckpt-dir", ck,
                                            "--ckpt-fast-dir", fast], tmp, 1, "elastic_tiers_b")
    b = Run(out, errs[0]) if not any(codes) else None
    w0 = f"resumed from {os.path.join(fast, 'worker_0')}/step_00000005 (step 5)"
    w1 = (f"resumed from {os.path.join(fast, 'worker_1')}/step_00000007 (step 7)",
          f"resumed from {os.path.join(fast, 'worker_1')}/step_00000005 (step 5) instead")
    ok = (b is not None and w0 in errs[0] and all(x in errs[1] for x in w1) and
          bitwise((b.losses, b.params), (a.losses_after(5), a.params)))
    check(ok, f"  elastic workers resumed from the fast tier (coordinator at 5, worker 1 at 7, "
              f"reloading its step 5 there): bitwise the uninterrupted run (exit {codes})")
    if not ok:
        print(errs[0][-1500:], errs[1][-1500:])


def elastic_run_hang(loom, model, tmp):
    """loom run --elastic -n 4, --workers 2 of dp 2: worker 1's rank 1 (slot 3) hangs at step
    6 (hang@6:3: it stops before the step's first collective and keeps beating), its rank 0
    waits in the dp all-reduce. loom run's heartbeat watch sees the wait pass
    --heartbeat-timeout 5 with rank 1 never in it, names worker 1, rank 1 and the hang in one
    line, stops the job and starts it again with --elastic-join; worker 0 dropped it at 8 and
    admits it at 16 (admit@16); both end at the last sync (24) with the same checksum, exit
    0, and summary.json holds the detection in worker 1's entry (none in worker 0's)."""
    run_dir = os.path.join(tmp, "elastic_hang")
    cmd = [loom, "run", "--elastic", "-n", "4", "--grace", "2", "--heartbeat-timeout", "5",
           "--run-dir", run_dir, "--"] + model[2:] + [
        "--dp", "2", "--steps", "24", "--lr", "3e-3", "--outer", "diloco", "--workers", "2",
        "--inner-steps", "4", "--elastic-timeout", "2", "--inject", "hang@6:3",
        "--inject", "admit@16"]
    t0 = time.time()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        stacks = watch_restart(proc, os.path.join(run_dir, "worker_1.log"), tmp, t0 + 120)
        try:
            proc.wait(timeout=max(1.0, t0 + 120 - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        out.seek(0), err.seek(0)
        p = subprocess.CompletedProcess(cmd, proc.returncode, out.read(), err.read())
    logs, last = worker_logs(run_dir)
    said = [ln for ln in p.stderr.splitlines() if "hang detected" in ln]
    named = (len(said) == 1 and "worker 1: rank 1 (slot 3" in said[0] and
             "rank 1 never entered it" in said[0] and "its job is stopped" in said[0])
    hung = "fault injection: hang at step 6" in logs[1]
    rejoined = ("worker 1 lost" in logs[0] and
                "worker 0 step 16: worker 1 joined, members=2" in logs[0] and
                "worker 1 started again with --elastic-join" in p.stderr)
    path = os.path.join(run_dir, "summary.json")
    summ = json.load(open(path)) if os.path.exists(path) else {}
    ws = summ.get("workers", [{}, {}])
    det = ws[1].get("detections") or [{}]
    exits = ws[1].get("exits") or [0, 1]
    summed = (summ.get("outcome") == "finished" and summ.get("restarts") == 1 and
              [w.get("launches") for w in ws] == [1, 2] and ws[0].get("detections") == [] and
              len(det) == 1 and det[0].get("kind") == "hang" and det[0].get("rank") == 1 and
              det[0].get("slot") == 3 and det[0].get("launch") == 1 and
              det[0].get("step") == 6 and exits[0] != 0 and exits[1:] == [0] and
              bool(last[0]) and [(w.get("last_sync") or {}).get("checksum") for w in ws] ==
              [last[0][-1], last[1][-1]])
    ok = (p.returncode == 0 and named and hung and rejoined and bool(last[0]) and
          last[0] == last[1] and summed)
    check(ok, f"  loom run --elastic, worker 1's rank 1 hung at step 6: detected and named "
              f"({named}), restarted and rejoined at 16 ({rejoined}), last sync equal on both "
              f"({bool(last[0]) and last[0] == last[1]}), summary.json holds the detection "
              f"({summed}) (exit {p.returncode}, {time.time() - t0:.1f} s)")
    if not ok:
        print(p.stderr[-3000:])
        for w in (0, 1):  # both sides of the join (a CI failure once showed only the joiner's)
            print(f"worker_{w}.log, its join, admission, sync and error lines:")
            print("\n".join(elastic_lines(logs[w])[-40:]))
    if stacks:  # a restart slow to publish its name (CI, twice): where every process was
        print(stacks)


def watch_restart(proc, log_path, tmp, deadline, late_s=25.0):
    """While loom run `proc` runs (until the time `deadline`): once worker 1's log says it hung, its restart should say
    "publishing its name" again within about 8 s (5 s to detect, 1-2 s to stop, 0.5 s to
    start). If late_s pass without it, the state of every process of this run (ps, and each
    one's threads' stacks with gdb when installed, else the kernel's wait channel and
    system call) is returned once, to be printed: a restart that waits 56 s for the other
    worker to end was seen twice in CI and never here (docs/diloco.md)."""
    hung_at = None
    while proc.poll() is None and time.time() < deadline:
        time.sleep(0.5)
        log = open(log_path).read() if os.path.exists(log_path) else ""
        if hung_at is None and "fault injection: hang at step" in log:
            hung_at = time.time()
        if hung_at is None or log.count("publishing its name") >= 2:
            continue
        if time.time() - hung_at > late_s:
            return process_states(tmp)
    return ""


def process_states(tmp):
    """ps lines and stacks of the processes whose command line names `tmp` (the ranks, the
    mpiruns, the ompi-server, loom run)."""
    ps = subprocess.run(["ps", "-eo", "pid,ppid,stat,etimes,wchan:24,args"],
                        capture_output=True, text=True).stdout.splitlines()
    mine = [ln for ln in ps[1:] if tmp in ln and "ps -eo" not in ln]
    lines = [f"{len(mine)} process(es) of this run, {time.time():.3f}:", ps[0]] + \
        [ln[:300] for ln in mine]
    gdb = shutil.which("gdb")
    for ln in mine:
        pid = ln.split()[0]
        if gdb:
            bt = subprocess.run([gdb, "-p", pid, "-batch", "-ex", "thread apply all bt 12"],
                                capture_output=True, text=True, timeout=60).stdout
            lines.append(f"pid {pid} stacks:\n" + "\n".join(
                b for b in bt.splitlines() if b.startswith(("#", "Thread"))))
        else:
            for t in sorted(glob.glob(f"/proc/{pid}/task/*")):
                def read(name):
                    try:
                        return open(os.path.join(t, name)).read().strip()
                    except OSError:
                        return "?"
                lines.append(f"pid {pid} thread {os.path.basename(t)}: wchan {read('wchan')}, "
                             f"syscall {read('syscall').split(' ')[0]}")
    return "\n".join(lines)


def elastic_slow_withdraw(loom, model, tmp):
    """A joiner slow to withdraw its name (its MPI_Unpublish_name delayed 3 s by
    shim_slow_unpublish.c, LD_PRELOADed; --elastic-timeout 2): the coordinator sends the
    state as soon as its connect returns and waits 2 s for it to be taken, so the joiner must
    take it before it withdraws the name. It is admitted at the founding: "worker 1 joined"
    on worker 0, "joined" on worker 1, no "did not take the state". (Before, the joiner
    withdrew first: worker 0 said "did not take the state" and went on without it, and
    worker 1 ended: the way a loaded machine's slow name server could keep a restarted
    worker out, docs/diloco.md.) Once joined, the joiner is as late to its first sync as
    the withdrawal took, so it is dropped there and ends (exit 1); only the admission is
    checked."""
    mpicc = shutil.which("mpicc")
    shim = os.path.join(tmp, "shim_slow_unpublish.so")
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shim_slow_unpublish.c")
    built = mpicc and subprocess.run([mpicc, "-shared", "-fPIC", "-o", shim, src],
                                     capture_output=True, text=True).returncode == 0
    if not built:
        check(False, f"  elastic joiner slow to withdraw its name: mpicc ({mpicc}) could not "
                     f"build {src}")
        return
    uri = os.path.join(tmp, "slow_withdraw.uri")
    server, mpirun = name_server(uri)
    jobs, logs = [], []
    try:
        args = model + ["--steps", "8", "--lr", "3e-3", "--outer", "diloco", "--workers", "2",
                        "--inner-steps", "8", "--elastic-timeout", "2"]
        slow = dict(os.environ, LD_PRELOAD=shim, LOOM_SHIM_NAME="loom-elastic-w1",
                    LOOM_SHIM_DELAY_S="3")
        logs = [os.path.join(tmp, f"slow_withdraw_w{w}.log") for w in (0, 1)]
        for w, env in ((0, os.environ), (1, slow)):
            with open(logs[w], "w") as log:
                jobs.append(subprocess.Popen(mpirun + ["-x", "LD_PRELOAD"] * (w == 1) + args +
                                             ["--elastic-worker", str(w)], env=env,
                                             stdout=subprocess.DEVNULL, stderr=log))
        # worker 1 ends by itself (dropped at step 8, it hears no update in 6 s); before the
        # fix worker 0 hung in MPI_Comm_connect to the port worker 1 had left (600 s)
        until = time.time() + 60
        while time.time() < until and any(j.poll() is None for j in jobs):
            time.sleep(0.1)
    finally:
        stop(jobs, server)
    errs = [open(f, errors="replace").read() if os.path.exists(f) else "" for f in logs]
    ok = ("worker 0 step 0: worker 1 joined" in errs[0] and
          "did not take the state" not in errs[0] and
          "worker 1 step 0: joined" in errs[1] and "shim: MPI_Unpublish_name" in errs[1])
    check(ok, f"  elastic joiner 3 s slow to withdraw its name (deadline 2 s): admitted at the "
              f"founding (exit {[j.returncode for j in jobs]})")
    if not ok:
        for w in (0, 1):
            print(f"worker {w}:\n" + "\n".join(elastic_lines(errs[w])[-20:]))


def elastic_dead_joiner(loom, model, tmp):
    """A joiner SIGKILLed with its mpirun while it waits to be admitted leaves its name in
    the ompi-server, and nobody can withdraw it (docs/diloco.md). Worker 1 is started
    alone, as a joiner, and killed (its mpirun and rank) once it waits; started again, it
    finds loom-elastic-w1 held by a process that is gone (its liveness endpoint refuses)
    and publishes loom-elastic-w1.1. Worker 0 then founds the group: loom-elastic-w1 is
    stale, not connected to (OpenMPI 4.1's connect to it would block 600 s), and worker 1
    is admitted at step 0 through loom-elastic-w1.1; both end at the last sync (8) with the
    same checksum, exit 0, in well under a minute."""
    uri = os.path.join(tmp, "dead_joiner.uri")
    server, mpirun = name_server(uri)
    jobs, t0 = [], time.time()
    logs = [os.path.join(tmp, f"dead_joiner_{n}.log") for n in ("w0", "w1_killed", "w1")]
    read = [lambda i=i: open(logs[i], errors="replace").read() if os.path.exists(logs[i])
            else "" for i in range(3)]

    def start(i, worker):
        with open(logs[i], "w") as log:
            jobs.append(subprocess.Popen(
                mpirun + args + ["--elastic-worker", str(worker)] + ["--elastic-join"] * worker,
                stdout=subprocess.DEVNULL, stderr=log, start_new_session=True))

    def wait_for(i, text, seconds=30):
        until = time.time() + seconds
        while time.time() < until and text not in read[i]() and jobs[-1].poll() is None:
            time.sleep(0.05)
        return text in read[i]()

    try:
        args = model + ["--steps", "8", "--lr", "3e-3", "--outer", "diloco", "--workers", "2",
                        "--inner-steps", "4", "--elastic-timeout", "5"]
        start(1, 1)
        waited = wait_for(1, "waiting to join")
        procs = [jobs[0].pid] + descendants(jobs[0].pid)
        for pid in procs:  # the mpirun and its rank: nothing of the job withdraws the name
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        jobs[0].wait()
        start(2, 1)
        republished = wait_for(2, "waiting to join")
        start(0, 0)
        until = time.time() + 90
        while time.time() < until and any(j.poll() is None for j in jobs[1:]):
            time.sleep(0.1)
    finally:
        stop(jobs, server)
    errs = [r() for r in read]
    sums = [[ln.split("checksum ")[-1] for ln in errs[i].splitlines()
             if "step 8: outer sync, members=2" in ln] for i in (0, 2)]
    ok = (waited and republished and [j.returncode for j in jobs[1:]] == [0, 0] and
          "loom-elastic-w1 is held by a process that is gone" in errs[2] and
          "loom-elastic-w1.1 published" in errs[2] and
          "loom-elastic-w1 is stale" in errs[0] and
          "worker 0 step 0: worker 1 joined, members=2" in errs[0] and
          bool(sums[0]) and sums[0] == sums[1] and time.time() - t0 < 60)
    check(ok, f"  elastic joiner SIGKILLed while it waited: its name found stale, the one "
              f"started again admitted under loom-elastic-w1.1, the last sync equal on both "
              f"(exit {[j.returncode for j in jobs[1:]]}, {time.time() - t0:.1f} s)")
    if not ok:
        for i in (0, 1, 2):
            print(f"{os.path.basename(logs[i])}:\n" + "\n".join(elastic_lines(errs[i])[-20:]))


def elastic_lines(log):
    """A worker log's lines about the group (joins, admissions, syncs, losses), faults and
    errors, without the configuration dump."""
    keep = ("loom: elastic", "fault injection", "rror", "MPI_", "mpirun", "--elastic-worker")
    return [ln for ln in log.splitlines() if " = " not in ln and any(k in ln for k in keep)]


def main():
    args = parse_test_args()
    seed = args.seed
    tmp = tempfile.mkdtemp(prefix="loom_diloco_")
    try:
        data = os.path.join(tmp, "train.bin")
        write_text_shard(data, seed)
        model = [args.loom, "train", "--family", "gpt2", "--vocab-size", "256", "--seq-len", "24",
                 "--n-layer", "2", "--d-model", str(D), "--n-head", "4", "--d-ff", "96",
                 "--micro-batch", "2", "--global-batch", "8", "--seed", str(seed),
                 "--log-every", "0", "--threads", "1", "--data", data]
        h1 = ["--outer", "diloco", "--inner-steps", "1", "--outer-lr", "1", "--outer-momentum", "0"]

        # 1. W = 1, AdamW: plain training
        adam = model + ["--steps", "6", "--lr", "3e-3", "--warmup-steps", "2",
                        "--adam-eps", ADAM_EPS]
        runs = Layouts(adam, tmp, "adam_")
        plain = runs.run("plain", 1)
        print(f"plain training, loss {plain.losses[0]:.4f} -> {plain.losses[-1]:.4f}")
        compare("W=1 H=1 (AdamW) = plain", runs.run("w1", 1, h1 + ["--workers", "1"]), plain)

        # 2. W = 2, the inner step linear in the gradient: synchronous dp 2
        linear = model + ["--steps", "6", "--lr", "3e5", "--warmup-steps", "2",
                          "--adam-eps", "1e8", "--weight-decay", "0", "--grad-clip", "0"]
        runs = Layouts(linear, tmp, "linear_")
        dp2 = runs.run("dp2", 2, ["--dp", "2"])
        w2 = runs.run("w2", 2, h1 + ["--workers", "2"])
        compare("W=2 H=1 (linear inner) = --dp 2", w2, dp2)
        outer = w2.rows[-1].get("outer", {})
        check(outer.get("bytes_step", 0) > 0 and outer.get("syncs") == 1,
              f"  metrics: outer {outer}")
        # 2b. --inner-lr-scale F multiplies the inner schedule in DiLoCo's rounds (here all
        # of them): W=2 H=1 at F 0.5 is --dp 2 at half the --lr and --min-lr (6e-5, the
        # default), the schedule being linear in both
        half = Layouts(model + ["--steps", "6", "--lr", "1.5e5", "--min-lr", "3e-5",
                                "--warmup-steps", "2", "--adam-eps", "1e8", "--weight-decay",
                                "0", "--grad-clip", "0"], tmp, "linear_half_")
        w2h = runs.run("w2_scale05", 2, h1 + ["--workers", "2", "--inner-lr-scale", "0.5"])
        compare("W=2 H=1 --inner-lr-scale 0.5 = --dp 2 at lr/2", w2h,
                half.run("dp2", 2, ["--dp", "2"]))
        check(loss_error(w2h.losses, w2.losses) > 100 * TOL,
              f"  --inner-lr-scale 0.5 differs from 1 by {loss_error(w2h.losses, w2.losses):.2e}")

        # 3. W = 2 with AdamW is not synchronous dp (the mean of two AdamW steps)
        runs = Layouts(adam, tmp, "adam2_")
        a_dp2 = runs.run("dp2", 2, ["--dp", "2"])
        a_w2 = runs.run("w2", 2, h1 + ["--workers", "2"])
        differs = loss_error(a_w2.losses, a_dp2.losses) > 100 * TOL
        check(differs, f"  W=2 H=1 (AdamW) differs from --dp 2 by "
                       f"{loss_error(a_w2.losses, a_dp2.losses):.2e} (expected: not the same)")

        # 3b. a warm start, --outer-start-step S: steps 1..S are synchronous dp over the
        # workers (each group's gradient averaged over the workers before the norm and
        # AdamW); with S >= steps the whole run is --dp 2 (<= TOL: the sums' order differs)
        s6 = runs.run("w2_start6", 2, ["--outer", "diloco", "--workers", "2", "--inner-steps",
                                       "3", "--outer-start-step", "6"])
        compare("W=2 H=3 --outer-start-step 6 = --dp 2", s6, a_dp2)
        compare("  ... and with --inner-lr-scale 0.5 (no round)", runs.run(
            "w2_start6_scale05", 2, ["--outer", "diloco", "--workers", "2", "--inner-steps", "3",
                                     "--outer-start-step", "6", "--inner-lr-scale", "0.5"]), a_dp2)
        first = s6.rows[0].get("outer", {})
        check(first.get("bytes_step", 0) > 0 and all(r["outer"]["syncs"] == 0 for r in s6.rows),
              f"  warm start: gradient bytes counted, no outer sync (step 1: {first})")

        # 4. layouts inside the workers
        real = model + ["--steps", "8", "--lr", "3e-3", "--warmup-steps", "2",
                        "--adam-eps", ADAM_EPS, "--grad-clip", "0.5", "--val-data", data,
                        "--eval-every", "4", "--eval-batches", "2", "--bucket-mb", "0.02"]
        diloco = ["--outer", "diloco", "--workers", "2", "--inner-steps", "3",
                  "--outer-lr", "0.7", "--outer-momentum", "0.9", "--outer-nesterov"]
        runs = Layouts(real + diloco, tmp, "layout_")
        ref = runs.run("w2_single", 2)
        print(f"W=2 H=3 groups of one rank, loss {ref.losses[0]:.4f} -> {ref.losses[-1]:.4f}")
        # (ZeRO-3: each rank syncs its own parameter shard with its peers in the other group)
        for name, flags in (("dp2_zero1", ["--dp", "2", "--zero", "1"]), ("tp2", ["--tp", "2"]),
                            ("pp2", ["--pp", "2"]), ("dp2_zero3", ["--dp", "2", "--zero", "3"])):
            compare(f"W=2 groups of {name}", runs.run(name, 4, flags), ref)
        # the warm start inside the groups: its synchronous steps average each group's
        # gradient over the workers, whatever the group's layout
        ws = ["--outer-start-step", "4"]
        single4 = runs.run("w2_single_start4", 2, ws)
        # (ZeRO-3: each rank averages its reduced gradient shard)
        for name, flags in (("dp2_zero1", ["--dp", "2", "--zero", "1"]), ("tp2", ["--tp", "2"]),
                            ("pp2", ["--pp", "2"]), ("dp2_zero3", ["--dp", "2", "--zero", "3"])):
            compare(f"W=2 groups of {name}, --outer-start-step 4",
                    runs.run(name + "_start4", 4, flags + ws), single4)
        # the replicas of a dp-2 group sync half of the model each: the same bytes in all
        b1, b2, b3 = (r.rows[-1]["outer"]["bytes_total"]
                      for r in (ref, runs.runs["dp2_zero1"], runs.runs["dp2_zero3"]))
        check(b2 == b1 and b3 == b1, f"  dp2 groups (ZeRO-1, ZeRO-3) send the bytes of one-rank "
                                     f"groups ({b2:.0f}, {b3:.0f} vs {b1:.0f})")
        # bf16 on the wire (--outer-dtype bf16; test_outer.c checks its rounding bitwise):
        # half the bytes of fp32 (each chunk's 2n bytes padded to whole 4-byte words), a
        # different run from fp32, and dp-2 groups equal one-rank groups within a bf16
        # bound. The bound: the layouts' fp32 outer gradients and updates differ in their
        # last bits (<= ~1e-7 relative, the fp32 checks above), so their bf16 roundings
        # differ only for values that close to a rounding boundary, a fraction
        # p ~ 1e-7 / 2^-8 ~ 3e-5, each by one bf16 ulp. Rounding every value moves the run
        # by d_round (bf16 against fp32, measured here), an rms of ulp / sqrt(12) per value;
        # p of the values moved by an ulp move it by sqrt(12 p) d_round ~ 2% of d_round
        # (9 seeds: up to 5% of d_round, the inner steps after a sync carry it on; the worst
        # tensor, a small bias, up to 0.75 d_round against its 10x bound). The bound is
        # d_round / 3 (weights and losses; the worst tensor 10x, as in fp32): a dp-2 group
        # that rounded nothing (fp32) or the wrong part would be d_round or more apart.
        bf16 = ["--outer-dtype", "bf16"]
        ref16 = runs.run("w2_single_bf16", 2, bf16)
        b16 = ref16.rows[-1]["outer"]["bytes_total"]
        check(b1 / 2 <= b16 <= b1 / 2 * 1.01,
              f"  bf16 on the wire: {b16:.0f} bytes, fp32 {b1:.0f} ({b1 / b16:.3f}x fewer, "
              f"expected 2x up to word padding)")
        d_round = weights_error(ref16.params, ref.params, D)[0]
        check(d_round > 10 * TOL, f"  bf16 differs from fp32 by {d_round:.2e} (weights rel; "
                                  f"expected: not the same)")
        bound = max(TOL, d_round / 3)
        compare(f"W=2 groups of dp2_zero1, bf16 (<= {bound:.1e})",
                runs.run("dp2_zero1_bf16", 4, ["--dp", "2", "--zero", "1"] + bf16), ref16, bound)
        again = runs.run("dp2_zero1_again", 4, ["--dp", "2", "--zero", "1"])
        same = bitwise(again, runs.runs["dp2_zero1"])
        check(same, f"  W=2 dp2_zero1 twice: {'bitwise identical' if same else 'runs differ'}")
        # elastic workers without faults (--elastic-worker: two jobs joined through an
        # ompi-server, the outer sync through a coordinator; each job's rank 0 speaks for
        # its group): the weights of the same groups in one job, bitwise; the dp2 pair
        # writes checkpoints (the outer state beside them), and both workers resumed from
        # step 4 (mid-round) end bitwise the same
        if shutil.which("ompi-server"):
            eck, saved = os.path.join(tmp, "elastic_ck"), {}
            # (pp 2 and tp 2 groups, whose ranks hold different buffers, were checked the
            # same way by hand: bitwise; left out here for the suite's time)
            # dp 2 ZeRO-3 workers: each rank holds its parameter shard, the lead gathers the
            # shards for the exchange and scatters the result back
            for name, zero in (("dp2_zero1", "1"), ("dp2_zero3", "3")):
                group = ["--dp", "2", "--zero", zero]
                ck = ["--ckpt-dir", eck + zero, "--ckpt-every", "4"]
                el = elastic_pair(real + diloco + group + ck, tmp, 2, "elastic_" + name)
                same = el is not None and same_tensors(el.params, runs.runs[name].params)
                check(same, f"  W=2 {name} as two elastic worker jobs of 2 ranks: "
                            f"{'bitwise the one-job run' if same else 'FAIL: differs or failed'}")
                saved[zero] = el
            for zero in ("1", "3"):
                step4 = ["--resume", os.path.join(eck + zero, "step_00000004")]
                el = elastic_pair(real + diloco + ["--dp", "2", "--zero", zero] + step4, tmp, 2,
                                  "elastic_resume" + zero)
                sv = saved[zero]
                want = sv.losses[4:8] + sv.losses[9:] if sv else None
                ok = (el is not None and sv is not None and "resumed from" in el.stderr and
                      el.losses == want and same_tensors(el.params, sv.params))
                check(ok, f"  elastic workers of dp2 ZeRO-{zero} resumed mid-round from their "
                          f"checkpoints: bitwise")
            elastic_tiers(real + diloco, ref, tmp)
            # the warm start in elastic workers (--outer-start-step 4: each synchronous step's
            # gradients, every rank's part, averaged through the coordinator; DiLoCo's rounds
            # from step 4): bitwise the one-job runs, in one-rank and dp 2 ZeRO-1 workers
            sck = os.path.join(tmp, "elastic_start4_ck")
            for name, n, flags, want in (("single", 1, ["--ckpt-dir", sck, "--ckpt-every", "6"],
                                          single4),
                                         ("dp2_zero1", 2, ["--dp", "2", "--zero", "1"],
                                          runs.runs["dp2_zero1_start4"])):
                el = elastic_pair(real + diloco + flags + ws, tmp, n, "elastic_start4_" + name)
                same = el is not None and same_tensors(el.params, want.params)
                check(same, f"  --outer-start-step 4 in elastic workers ({name}): bitwise the "
                            f"one-job run's weights")
            # the outer state an elastic lead saves records S: a resume with another is
            # refused by both workers before they meet
            codes, errs, _ = elastic_jobs(real + diloco + [
                "--outer-start-step", "3", "--resume", os.path.join(sck, "step_00000006")],
                tmp, 1, "elastic_start3")
            named = all("--outer-start-step 3: " in e and
                        "was saved by a run with --outer-start-step 4" in e for e in errs)
            check(codes == [2, 2] and named,
                  f"  elastic workers resumed with another --outer-start-step: exit {codes} "
                  f"(expected [2, 2]), the flag and both values named: {named}")
            if not named:
                print(errs[0][-1000:])
            # each worker's file with a bit flipped in S (after the 296-byte head): corrupt
            flip = sck + "_flip"
            shutil.copytree(sck, flip)
            flip_saved_start(flip, "worker_*/outer/step_00000006/elastic.bin", 296)
            codes, errs, _ = elastic_jobs(real + diloco + ws + [
                "--resume", os.path.join(flip, "step_00000006")], tmp, 1, "elastic_flip")
            corrupt = any("truncated or corrupt" in e for e in errs) and not any(
                "saved by a run with" in e for e in errs)
            check(2 in codes and all(c != 0 for c in codes) and corrupt,
                  f"  elastic: a bit flipped in the saved --outer-start-step: exit {codes}, "
                  f"reported as corrupt: {corrupt}")
            elastic_run_resumed(args.loom, model, tmp)
            elastic_run_coordinator_dies(args.loom, model, tmp)
            elastic_run_hang(args.loom, model, tmp)
            elastic_pause(args.loom, model, tmp)
            elastic_slow_withdraw(args.loom, model, tmp)
            elastic_dead_joiner(args.loom, model, tmp)
            # --outer-warmup 1 (the first sync only averages) in one-rank elastic workers:
            # bitwise the one-job run, which differs from the run without warm-up
            warm = ["--outer-warmup", "1"]
            w_ref = runs.run("w2_warmup", 2, warm)
            el = elastic_pair(real + diloco + warm, tmp, 1, "elastic_warmup")
            same = el is not None and same_tensors(el.params, w_ref.params)
            differs = not same_tensors(w_ref.params, ref.params)
            check(same and differs, f"  --outer-warmup 1 in elastic workers: bitwise the one-job "
                                    f"run ({same}), which differs from no warm-up ({differs})")
            # --outer-dtype in one-rank elastic workers: the outer gradients and the mean
            # cross in the wire format. With outer lr 1 and no momentum the update is minus
            # the mean, so the one-job run (whose wire carries the update) does the same
            # arithmetic: bitwise. Bytes fall by the format's ratio (the 276-byte message
            # head keeps them a little above it): bf16 2x, int8 with 32-value blocks 3.56x.
            plain = real + ["--outer", "diloco", "--workers", "2", "--inner-steps", "3",
                            "--outer-lr", "1", "--outer-momentum", "0"]
            el32 = elastic_pair(plain, tmp, 1, "elastic_fp32")
            q_runs = Layouts(plain, tmp, "wire_")
            for dt, lo, hi in ((["bf16"], 1.9, 2.0), (["int8", "--outer-block", "32"], 3.3, 3.56)):
                flags = ["--outer-dtype"] + dt
                one = q_runs.run("w2_" + dt[0], 2, flags)
                el = elastic_pair(plain + flags, tmp, 1, "elastic_" + dt[0])
                same = el is not None and same_tensors(el.params, one.params)
                differs = el32 is not None and el is not None and not same_tensors(el32.params,
                                                                                   el.params)
                ratio = (el32.rows[-1]["outer"]["bytes_total"] / el.rows[-1]["outer"]["bytes_total"]
                         if el32 is not None and el is not None else 0)
                check(same and differs and lo < ratio <= hi,
                      f"  --outer-dtype {dt[0]} in elastic workers: bitwise the one-job run "
                      f"({same}), differs from fp32 ({differs}), {ratio:.3f}x fewer bytes than "
                      f"fp32 (expected {lo}-{hi})")
            # streaming DiLoCo in elastic workers (F = 2, H = 6): each fragment's exchange
            # through the coordinator runs on the lead's thread during the two steps after its
            # sync and lands then, as the one-job mode's overlap has it: bitwise the one-job run in one-rank and dp 2 ZeRO-1 workers (tp 2,
            # pp 2 and dp 2 ZeRO-3 by hand, 2026-12-07: bitwise too), and resumed from step 4,
            # fragment 0 synced at 3 and landing at 5 (bitwise the run without the stop)
            stream = real + diloco[:5] + ["6", "--outer-fragments", "2", "--steps", "14"] + \
                diloco[6:]
            s_runs = Layouts(stream, tmp, "stream_")
            s_ck = os.path.join(tmp, "elastic_stream_ck")
            for name, n, flags in (("single", 1, ["--ckpt-dir", s_ck, "--ckpt-every", "4"]),
                                   ("dp2_zero1", 2, ["--dp", "2", "--zero", "1"])):
                want = s_runs.run(name, 2 * n, flags if n == 2 else [])
                el = elastic_pair(stream + flags, tmp, n, "elastic_stream_" + name)
                same = el is not None and same_tensors(el.params, want.params)
                check(same, f"  streaming F=2 in elastic workers ({name}): bitwise the one-job run")
            # without MPI_THREAD_MULTIPLE every exchange runs at its sync (no overlap): the
            # same numbers
            before = os.environ.get("LOOM_MPI_THREAD")
            os.environ["LOOM_MPI_THREAD"] = "funneled"
            try:
                el = elastic_pair(stream, tmp, 1, "elastic_stream_funneled")
            finally:
                if before is None:
                    del os.environ["LOOM_MPI_THREAD"]
                else:
                    os.environ["LOOM_MPI_THREAD"] = before
            same = el is not None and same_tensors(el.params, s_runs.runs["single"].params)
            check(same, "  streaming F=2 in elastic workers, LOOM_MPI_THREAD=funneled (the "
                        "exchanges not overlapped): bitwise the one-job run")
            el = elastic_pair(stream + ["--resume", os.path.join(s_ck, "step_00000004")], tmp, 1,
                              "elastic_stream_resume")
            same = (el is not None and "resumed from" in el.stderr and
                    same_tensors(el.params, s_runs.runs["single"].params))
            check(same, "  streaming elastic workers resumed from step 4, a fragment landing at "
                        "5: bitwise the run without the stop")
            elastic_run_streaming(args.loom, model, tmp)
            elastic_run_coordinator_dies_streaming(args.loom, model, tmp)
        else:
            print("  (no ompi-server: elastic workers not checked)")
        # experts inside the workers: each rank syncs its own buffer (its experts), with
        # ZeRO-3 only its shard's ranges (the dense half and its experts); the warm start
        # averages the gradients where the group reduced them (ZeRO-2's sharded sum, the
        # segments of --ep): all equal to groups of one rank holding every expert
        moe = [a if a != "gpt2" else "llama" for a in real] + [
            "--n-kv-head", "2", "--n-experts", "4", "--top-k", "2", "--capacity-factor", "0"]
        m_runs = Layouts(moe + diloco, tmp, "moe_")
        m_ref = m_runs.run("single", 2)
        m_ep = [("dp2_ep2", ["--dp", "2", "--ep", "2"]),
                ("dp2_ep2_zero3", ["--dp", "2", "--ep", "2", "--zero", "3"])]
        for name, flags in m_ep:
            compare(f"W=2 groups of {name} (MoE)", m_runs.run(name, 4, flags), m_ref)
        # the dense tensors' replicas (dp) and the experts' (edp) each sync their part: the
        # group sends the bytes of one-rank groups and reports the same outer gradient norm
        for name, _ in m_ep:
            o, o1 = m_runs.runs[name].rows[-1]["outer"], m_ref.rows[-1]["outer"]
            check(o["bytes_total"] == o1["bytes_total"] and
                  abs(o["grad_norm"] / o1["grad_norm"] - 1) < TOL,
                  f"  W=2 groups of {name} (MoE): {o['bytes_total']:.0f} bytes, outer gradient "
                  f"norm {o['grad_norm']:.7g} (one-rank groups: {o1['bytes_total']:.0f}, "
                  f"{o1['grad_norm']:.7g})")
        m_stream = Layouts(moe + diloco[:5] + ["6", "--outer-fragments", "2", "--steps", "14"] +
                           diloco[6:], tmp, "moe_stream_")
        compare("W=2 groups of dp2_ep2 (MoE), streaming F=2 H=6",
                m_stream.run("dp2_ep2", 4, m_ep[0][1]), m_stream.run("single", 2))
        if shutil.which("ompi-server"):  # two elastic worker jobs of dp 2 x ep 2 ZeRO-3: each
            # rank's own ranges packed into the lead's exchange, bitwise the one-job run
            el = elastic_pair(moe + diloco + m_ep[1][1], tmp, 2, "elastic_moe_zero3")
            same = el is not None and same_tensors(el.params, m_runs.runs["dp2_ep2_zero3"].params)
            check(same, "  W=2 dp2_ep2_zero3 (MoE) as two elastic worker jobs of 2 ranks: "
                        f"{'bitwise the one-job run' if same else 'FAIL: differs or failed'}")
        m1 = m_runs.runs["dp2_ep2_zero3"]
        m2 = m_runs.run("dp2_ep2_zero3_again", 4, m_ep[1][1])
        check(bitwise(m1, m2) and m1.losses[7] < m1.losses[0],
              f"  W=2 groups of dp2 ep2 ZeRO-3 (MoE): trains {m1.losses[0]:.4f} -> "
              f"{m1.losses[7]:.4f}, bitwise twice")
        m_ref4 = m_runs.run("single_start4", 2, ws)
        for name, flags in (("dp2_ep2_zero1", ["--dp", "2", "--ep", "2", "--zero", "1"]),
                            ("dp2_ep2_zero2_sharded", ["--dp", "2", "--ep", "2", "--zero", "2",
                                                       "--grad-accum", "sharded"]),
                            ("dp2_ep2_zero3", ["--dp", "2", "--ep", "2", "--zero", "3"]),
                            ("dp2_zero2_sharded", ["--dp", "2", "--zero", "2", "--grad-accum",
                                                   "sharded"])):
            compare(f"W=2 groups of {name} (MoE), --outer-start-step 4",
                    m_runs.run(name + "_start4", 4, flags + ws), m_ref4)
        # a ZeRO-3 rank with --ep keeps round-start values for its own ranges only, D / 2 +
        # X / 2 (D dense, X expert values in the model), and its worker's half of their
        # momentum; a ZeRO-1 rank the round-start values of its whole buffer, D + X / 2, and
        # its worker's half of its replica's half of the dense momentum and of its experts',
        # D / 4 + X / 4: a ratio of 0.75 (D + X) / (1.25 D + 0.75 X) (header and block
        # padding: < 1%); resumed mid-round bitwise
        sizes, ckm = {}, os.path.join(tmp, "ck_moe")
        for z in ("1", "3"):
            flags = ["--dp", "2", "--ep", "2", "--zero", z]
            ma = m_runs.run("ckpt_zero" + z, 4, flags + ["--ckpt-dir", ckm + z, "--ckpt-every", "4"])
            sizes[z] = [os.path.getsize(f) for f in sorted(glob.glob(os.path.join(
                ckm + z, "worker_1", "outer", "step_00000004", "rank_*.bin")))]
            mb = m_runs.run("ckpt_zero" + z + "_resume", 4,
                            flags + ["--resume", os.path.join(ckm + z, "step_00000004")])
            want = ma.losses[4:8] + ma.losses[9:]
            ok = "resumed from" in mb.stderr and bitwise((mb.losses, mb.params), (want, ma.params))
            check(ok, f"  dp2 ep2 ZeRO-{z} groups (MoE): resume mid-round bitwise")
        dense = sum(v.size for k, v in m_ref.params.items() if "experts" not in k)
        experts = sum(v.size for k, v in m_ref.params.items() if "experts" in k)
        want = 0.75 * (dense + experts) / (1.25 * dense + 0.75 * experts)
        got = [b / a for a, b in zip(sizes["1"], sizes["3"])]
        check(len(got) == 2 and all(abs(g / want - 1) < 0.01 for g in got),
              f"  dp2 ep2 ZeRO-3 outer state per rank {sizes['3']} bytes, ZeRO-1 {sizes['1']}: "
              f"ratios {[round(g, 4) for g in got]} (expected {want:.4f})")

        # 5. checkpoints hold the outer state: a resume mid-round (step 4 of the round
        # 3..6) is bitwise the uninterrupted run, from DIR/step_N and from --resume auto
        ck = os.path.join(tmp, "ck")
        a = runs.run("ckpt_a", 4, ["--dp", "2", "--zero", "1", "--ckpt-dir", ck,
                                   "--ckpt-every", "4"])
        check(bitwise(a, runs.runs["dp2_zero1"]), "  checkpointing changes nothing (bitwise)")
        for name, flags in (("step_dir", ["--resume", os.path.join(ck, "step_00000004")]),
                            ("auto", ["--resume", "auto", "--ckpt-dir", ck + "_auto"])):
            if name == "auto":  # only step 4 there
                for w in (0, 1):
                    shutil.copytree(os.path.join(ck, f"worker_{w}", "step_00000004"),
                                    os.path.join(ck + "_auto", f"worker_{w}", "step_00000004"))
                    shutil.copytree(os.path.join(ck, f"worker_{w}", "outer", "step_00000004"),
                                    os.path.join(ck + "_auto", f"worker_{w}", "outer",
                                                 "step_00000004"))
            b = runs.run("ckpt_b_" + name, 4, ["--dp", "2", "--zero", "1"] + flags)
            want = a.losses[4:8] + a.losses[9:]  # steps 5-8, validation at 8
            ok = ("resumed from" in b.stderr and b.losses == want and
                  bitwise((b.losses, b.params), (want, a.params)))
            check(ok, f"  resume mid-round ({name}): bitwise the uninterrupted run")
        # ZeRO-3 groups: the same run twice (the second writes checkpoints) is bitwise, each
        # rank's outer state is its shard's (a ZeRO-1 rank of P parameters saves the whole
        # buffer's round-start values, 4P bytes, and its quarter of the momentum, P; a ZeRO-3
        # rank its half's, 2P, and the same quarter, P: 3/5), and a resume mid-round is bitwise
        z3, ckz = ["--dp", "2", "--zero", "3"], os.path.join(tmp, "ck_zero3")
        za = runs.run("ckpt_zero3", 4, z3 + ["--ckpt-dir", ckz, "--ckpt-every", "4"])
        check(bitwise(za, runs.runs["dp2_zero3"]), "  W=2 dp2_zero3 twice (with checkpoints): "
                                                   "bitwise")
        size = [os.path.getsize(os.path.join(d, "worker_1", "outer", "step_00000004",
                                             f"rank_{r:05d}.bin")) for d in (ck, ckz) for r in (0, 1)]
        check(max(size[2:]) < 0.65 * min(size[:2]),
              f"  ZeRO-3 outer state per rank {size[2:]} bytes (ZeRO-1: {size[:2]}; expected "
              f"about 3/5)")
        zb = runs.run("ckpt_zero3_resume", 4, z3 + ["--resume", os.path.join(ckz, "step_00000004")])
        want = za.losses[4:8] + za.losses[9:]
        ok = "resumed from" in zb.stderr and bitwise((zb.losses, zb.params), (want, za.params))
        check(ok, "  ZeRO-3 groups: resume mid-round bitwise the uninterrupted run")
        # 5a. both checkpoint tiers and --ckpt-peer keep the outer state with each step
        ckpt_tiers(runs, ref, tmp)

        # 5b. --outer-start-step 4 with H = 3: synchronous steps 1-4, an outer sync at 7 and
        # at the last step; checkpoints before, at and after the switch resume bitwise, and
        # a resume with another S is refused (the switch is part of the run's configuration)
        ws, ck3 = ["--outer-start-step", "4"], os.path.join(tmp, "ck_start")
        sa = runs.run("start4", 2, ws + ["--ckpt-dir", ck3, "--ckpt-every", "2"])
        syncs = [r["step"] for r in sa.rows if r["outer"]["syncs"]]
        check(syncs == [7, 8] and loss_error(sa.losses, ref.losses) > 100 * TOL,
              f"  W=2 H=3 --outer-start-step 4: outer syncs at {syncs} (expected [7, 8]), "
              f"differs from S=0 by {loss_error(sa.losses, ref.losses):.2e}")
        for at in (2, 4, 6):
            sb = runs.run(f"start4_resume{at}", 2,
                          ws + ["--resume", os.path.join(ck3, f"step_{at:08d}")])
            want = sa.losses[at:8] + sa.losses[8 + at // 4:]  # validation at 4 and 8
            ok = "resumed from" in sb.stderr and bitwise((sb.losses, sb.params), (want, sa.params))
            check(ok, f"  --outer-start-step 4: resume at step {at}: bitwise")
        bad = subprocess.run(MPIRUN + ["-n", "2"] + real + diloco + [
            "--outer-start-step", "3", "--resume", os.path.join(ck3, "step_00000002")],
            capture_output=True, text=True)
        named = ("--outer-start-step 3: " in bad.stderr and
                 "was saved by a run with --outer-start-step 4" in bad.stderr)
        check(bad.returncode == 2 and named,
              f"  resume with another --outer-start-step: exit {bad.returncode} (expected 2), "
              f"the flag and both values named: {named}")
        if not named:
            print(bad.stderr[-1000:])
        # a flipped bit in the saved S is corruption, not another S: the CRC is checked first
        flip = os.path.join(tmp, "ck_start_flip")
        shutil.copytree(ck3, flip)
        flip_saved_start(flip, "**/outer/step_00000002/rank_*.bin", 40)
        bad = subprocess.run(MPIRUN + ["-n", "2"] + real + diloco + ws + [
            "--resume", os.path.join(flip, "step_00000002")], capture_output=True, text=True)
        corrupt = "truncated or corrupt" in bad.stderr and "saved by a run with" not in bad.stderr
        check(bad.returncode == 2 and corrupt,
              f"  a bit flipped in the saved --outer-start-step: exit {bad.returncode} "
              f"(expected 2), reported as corrupt: {corrupt}")

        # 6. streaming
        stream = real[:] + ["--outer", "diloco", "--workers", "2", "--inner-steps", "6",
                            "--outer-fragments", "2", "--outer-lr", "0.7", "--outer-momentum",
                            "0.9", "--outer-nesterov"]
        stream[stream.index("--steps") + 1] = "14"
        runs = Layouts(stream, tmp, "stream_")
        s_ref = runs.run("fp32_single", 2)
        compare("streaming F=2 fp32, groups of dp2", runs.run("fp32_dp2", 4, ["--dp", "2"]), s_ref)
        compare("streaming F=2 fp32, groups of dp2 ZeRO-3",
                runs.run("fp32_dp2_zero3", 4, ["--dp", "2", "--zero", "3"]), s_ref)
        # --overlap-param-gather (ZeRO-1: the next forward gathers the parameters): the
        # outer sync waits for the gathers on the steps it reads or writes the parameters
        # (a fragment sent, in flight or landing), so the run is the same, bitwise
        o_a = runs.run("fp32_dp2_z1", 4, ["--dp", "2", "--zero", "1"])
        o_b = runs.run("fp32_dp2_z1_opg", 4, ["--dp", "2", "--zero", "1", "--overlap-param-gather"])
        check(bitwise(o_a, o_b), "  streaming F=2 in dp2 ZeRO-1 groups with --overlap-param-gather: "
                                 "bitwise the run without it")
        q = runs.run("int4", 2, ["--outer-dtype", "int4", "--outer-block", "32"])
        q2 = runs.run("int4_again", 2, ["--outer-dtype", "int4", "--outer-block", "32"])
        check(bitwise(q, q2), "  streaming F=2 int4 twice: bitwise")
        # the outer sync's engine (comm/engine.h) without its thread: the same run
        q3 = runs.run("int4_funneled", 2, ["--outer-dtype", "int4", "--outer-block", "32"],
                      ["LOOM_MPI_THREAD=funneled"])
        check(bitwise(q, q3), "  streaming F=2 int4 with LOOM_MPI_THREAD=funneled: bitwise")
        # a checkpoint while a fragment is in flight (step 4: fragment 0's all-gather, sent
        # after step 3; step 6: fragment 1's all-to-all): the resume is bitwise
        ck2 = os.path.join(tmp, "ck_stream")
        int4 = ["--outer-dtype", "int4", "--outer-block", "32"]
        qa = runs.run("int4_ckpt", 2, int4 + ["--ckpt-dir", ck2, "--ckpt-every", "2"])
        check(bitwise(qa, q), "  streaming: checkpointing changes nothing (bitwise)")
        for at in (4, 6):
            qb = runs.run(f"int4_resume{at}", 2,
                          int4 + ["--resume", os.path.join(ck2, f"step_{at:08d}")])
            want = qa.losses[at:14] + qa.losses[14 + at // 4:]  # validation every 4 steps
            ok = "resumed from" in qb.stderr and bitwise((qb.losses, qb.params), (want, qa.params))
            check(ok, f"  streaming: resume at step {at} (a fragment in flight): bitwise")
        b32 = s_ref.rows[-1]["outer"]["bytes_total"]
        b4 = q.rows[-1]["outer"]["bytes_total"]
        check(b4 < b32 / 5, f"  int4 bytes on the wire {b4:.0f} vs fp32 {b32:.0f} "
                            f"({b32 / b4:.1f}x fewer)")
        check(q.losses[13] < q.losses[0] - 0.3,
              f"  int4 trains: loss {q.losses[0]:.4f} -> {q.losses[13]:.4f}")
        # int4 in ZeRO-3 groups (each rank's shard quantized in its own blocks): trains, and
        # sends about the bytes of one-rank groups (a few more partial blocks' scales)
        qz = runs.run("int4_dp2_zero3", 4, ["--dp", "2", "--zero", "3"] + int4)
        bz = qz.rows[-1]["outer"]["bytes_total"]
        check(qz.losses[13] < qz.losses[0] - 0.3 and bz < b32 / 5,
              f"  int4 in ZeRO-3 groups trains: loss {qz.losses[0]:.4f} -> {qz.losses[13]:.4f}, "
              f"{bz:.0f} bytes (one-rank groups {b4:.0f})")
    finally:
        keep_or_remove(tmp, seed)


if __name__ == "__main__":
    run_test(main)
