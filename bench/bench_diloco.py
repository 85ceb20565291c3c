#!/usr/bin/python3
"""DiLoCo against synchronous data parallelism on one host (docs/diloco.md).

The KJV demo data (scripts/demo.sh's preparation: Debian's bible-kjv, a 4096-token
byte-level BPE, 2% of the paragraphs for validation), a small GPT-2 (4 layers, d_model 128,
T 64; --model LxD for another), --workers W ranks, the same global batch and steps (so the same tokens), three runs
side by side in one invocation:
  sync_dp    --dp W: every step all-reduces every gradient
  diloco     --outer diloco --workers W --inner-steps H (fp32 outer gradients, Nesterov
             momentum 0.9, outer lr 0.7)
  streaming  the same with --outer-fragments F --outer-dtype int4 (one scale per 64 values)
For each: tokens/s (all tokens over the summed step times), validation loss at the end (and
every --eval-every steps: the curves, and a PNG through `loom plot` when gnuplot is there),
and bytes on the wire per token (with --outer-start-step S over the whole run, the S
synchronous steps included, and over the steps after S alone). DiLoCo's bytes are counted
by loom (the metrics' "outer" object: what each rank sends to the other workers, summed
over ranks). Synchronous dp's are
the ring all-reduce's (what MPI's ring and NCCL send): each of n ranks sends
2 (n - 1) / n x 4 P bytes per step (P parameters), n times that over the ranks, divided by
the step's tokens. The ratios are against sync_dp's, measured in the same invocation.
On one host the links are shared memory: tokens/s says what the outer sync costs in
compute, not what a slow link would (tests/hosts and bench_hosts need root for that).
The last line of output is one JSON object.
Speed separately: --rounds rounds, each running every configuration in turn for
--speed-outer-rounds x H steps without evaluation (the load of a shared machine drifts;
each round's ratios are against that round's sync_dp), tokens/s over the steps after the
first H.
Across two test hosts (--hosts, needs root; tests/hosts/hosts.sh, bench_hosts.py's MPI
settings): W = 2 ranks, one per host, each rank a worker (or a dp replica for sync_dp), the
same configurations on the KJV data (--hosts-model: the GPT-2 model's n_layer x d_model;
--hosts-seq-len T, default 64, and --hosts-micro-batch sequences per rank, default 1;
bench_hosts' 124M runs T 128 and 2; --diloco-dtypes, --streaming-inner-steps, --no-streaming
and --hosts-no-sync choose the runs as on one host), each run at every placement
(--hosts-repeats R: the placements R times in turn, each capped run's ratio against the
one-host run just before it, the JSON's ratio the median):
  one_host   both ranks on test host 1 (shared memory, no cap): the yardstick
  capG       one rank on each host, both ends of each host's link capped with tbf at G Gbit/s
             (--caps, bench_hosts' cap_links)
--hosts-steps steps (2 H: the outer syncs after step H and at the last step), an evaluation
at the last step (the validation loss at equal tokens; the capped runs compute the same
function as one_host, and the JSON says whether their losses are equal). tokens/s: the
tokens of the steps after --hosts-warmup over their summed step_ms (rank 0's metrics; a
DiLoCo step's time includes its share of the outer sync, exposed); ratio_to_one_host per
configuration and cap; bytes on the wire per token (DiLoCo: loom's count; sync dp: the
2-rank ring all-reduce's 4P bytes per rank per step) and sync dp's over each; wire_ms_per_step
(a rank's bytes per step over the cap) and model_ratio_no_overlap = one-host median step /
(that + wire_ms_per_step): what the link alone costs, without overlap, free of the machine's
load (on a shared 2-core machine the measured ratios move more than the link's effect).
The recipe (one host): --lr (inner AdamW peak, cosine to a tenth), --warmup-steps,
--outer-lr, --outer-momentum, --no-nesterov, --outer-warmup, --outer-start-step (a warm
start: synchronous dp over the W workers for the first S steps, then DiLoCo's rounds, as
the DiLoCo paper starts from a synchronously trained model; the same tokens every step, so
the runs still compare at equal tokens), --global-batch, --micro-batch,
--streaming-inner-steps (the streaming run's H; default --inner-steps) and --inner-lr (the
DiLoCo runs' own AdamW peak, cosine to a tenth, for the whole run, the warm start's
synchronous steps included; sync dp keeps --lr) and --inner-lr-scale F (the DiLoCo runs'
schedule times F after --outer-start-step only: loom's --inner-lr-scale); the JSON's
"recipe" and "loadavg" (os.getloadavg() before the runs and after each) record them.
--rounds 0 skips the speed rounds (quality only); --no-streaming leaves the streaming run
out (sync dp and DiLoCo only). --diloco-dtypes fp32,bf16 runs the DiLoCo configuration once
per outer dtype on the wire (--outer-dtype; runs "diloco" for fp32, "diloco_bf16" ...), each
with its bytes per token, fewer_bytes_than_sync and, beside an fp32 run,
val_loss_vs_diloco_fp32 and fewer_bytes_than_diloco_fp32 (bf16: 100x fewer than sync dp at
H = 50, docs/diloco.md "bf16 on the wire").
The quality recipe (docs/diloco.md, "The inner lr in the rounds"; within 2% of sync dp for
five seeds of seven on 2026-12-06/07: +1.93%, +1.98%, +1.91%, +2.09%, +1.94%, +2.20%,
+1.95% with --seed 1337, 2, 3, 4, 5, 6, 7; seeds 8, 9, 10: +2.04%, +1.94%, +2.02%): --steps 300 --rounds 0 --no-streaming --outer-start-step 150 --outer-lr 0.8
--outer-momentum 0.5 --inner-lr-scale 2 (tests/parallel/test_diloco_quality.py runs it
with --model 2x64).
Usage: bench_diloco.py --loom build/loom [--steps 300] [--inner-steps 50] [--workers 4]
                       [--fragments 4] [--global-batch 16] [--rounds 3] [--smoke]
                       [--lr 2e-3] [--outer-lr 0.7] [--outer-momentum 0.9]
                       [--streaming-inner-steps H] [--outer-start-step S]
                       [--inner-lr LR] [--inner-lr-scale F] [--model 4x128]
                       [--no-streaming] [--diloco-dtypes fp32,bf16]
       bench_diloco.py --loom build/loom --hosts [--caps 1,2.5] [--hosts-model 6x384]
                       [--hosts-steps 100] [--inner-steps 50] [--fragments 4]
                       [--hosts-seq-len 64] [--hosts-micro-batch 1] [--diloco-dtypes fp32]
                       [--streaming-inner-steps H] [--no-streaming] [--hosts-no-sync]
                       [--hosts-repeats R]
Every run: --seed (default 1337).
"""
import argparse
import fcntl
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1"]


def prepare(loom, work):
    """scripts/demo.sh's KJV data: the text, a 4096-token BPE, train/val shards."""
    txt = os.path.join(work, "kjv.txt")
    with open(txt, "w") as f:
        subprocess.run(["bible", "gen1:1-rev22:21"], stdout=f, check=True)
    subprocess.run([loom, "tokenizer", "train", "--input", txt, "--vocab-size", "4096", "--out",
                    os.path.join(work, "tok")], check=True, capture_output=True)
    subprocess.run([loom, "data", "prepare", "--input", txt, "--tokenizer",
                    os.path.join(work, "tok"), "--out", os.path.join(work, "bpe"),
                    "--doc-separator", "blank-line", "--val-fraction", "0.02"], check=True,
                   capture_output=True)
    return os.path.join(work, "bpe")


def outer_configs(outer, dtypes, H, HS, F, streaming):
    """The DiLoCo runs' flags by name: one per outer dtype ("diloco" for fp32, "diloco_DTYPE"
    for the others; int8/int4 with one scale per 64 values), then streaming int4 (F
    fragments, H = HS) unless streaming is off."""
    configs = {}
    for d in dtypes:
        configs["diloco" if d == "fp32" else "diloco_" + d] = (
            outer + ["--inner-steps", str(H), "--outer-dtype", d] +
            (["--outer-block", "64"] if d in ("int8", "int4") else []))
    if streaming:
        configs["streaming"] = outer + ["--inner-steps", str(HS), "--outer-fragments", str(F),
                                        "--outer-dtype", "int4", "--outer-block", "64"]
    return configs


def hosts_bench(args, data):
    """sync dp, DiLoCo and streaming int4 with 2 ranks: on one test host and across two over
    capped links (the module's docstring); the JSON object."""
    sys.path.insert(0, HERE)
    import bench_hosts  # noqa: E402 (its MPI settings, link caps and hosts.sh)
    L, D = (int(x) for x in args.hosts_model.split("x"))
    H, F, S, T = args.inner_steps, args.fragments, args.hosts_steps, args.hosts_seq_len
    G = 2 * args.hosts_micro_batch
    base = [args.loom, "train", "--family", "gpt2", "--n-layer", str(L), "--n-head", "4",
            "--d-model", str(D), "--d-ff", str(4 * D), "--vocab-size", "4096",
            "--seq-len", str(T), "--micro-batch", str(args.hosts_micro_batch),
            "--global-batch", str(G),
            "--steps", str(S), "--lr", "2e-3", "--min-lr", "2e-4", "--warmup-steps", "10",
            "--threads", "1", "--log-every", "0", "--seed", str(args.seed),
            "--data", os.path.join(data, "train_*.bin"),
            "--val-data", os.path.join(data, "val_*.bin"),
            "--eval-every", str(S), "--eval-batches", "8"]
    HS = args.streaming_inner_steps or H
    outer = ["--outer", "diloco", "--workers", "2", "--outer-lr", "0.7", "--outer-momentum",
             "0.9", "--outer-nesterov"]
    configs = {} if args.no_sync else {"sync_dp": ["--dp", "2"]}
    configs.update(outer_configs(outer, args.dtypes, H, HS, F, not args.no_streaming))
    caps = [float(c) for c in args.caps.split(",")]
    places = [("one_host", "10.231.0.1:2", None)] + [
        (f"cap{g:g}", "10.231.0.1:1,10.231.0.2:1", g) for g in caps]
    runs, params, load = {}, None, [os.getloadavg()[0]]
    lock = open("/run/loom-hosts.lock", "w")  # the hosts are shared with the tests
    fcntl.flock(lock, fcntl.LOCK_EX)
    # SIGTERM: the finally below (the child mpirun killed, caps removed, hosts down)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        bench_hosts.sh(bench_hosts.HOSTS_SH, "up", "2")
        # each configuration's placements back to back, --hosts-repeats times in turn (the
        # ratios pair each repeat's capped run with the one-host run just before it)
        for name, flags in configs.items():
            for place, hosts, gbit in [p for _ in range(args.hosts_repeats) for p in places]:
                bench_hosts.cap_links(gbit)
                metrics = os.path.join(os.path.dirname(data), f"{place}_{name}.jsonl")
                cmd = (["mpirun", "--allow-run-as-root", "--host", hosts] + bench_hosts.MCA +
                       ["-x", "OMP_NUM_THREADS=1", "-x", "OPENBLAS_NUM_THREADS=1", "-n", "2"] +
                       base + flags + ["--metrics", metrics])
                p = subprocess.run(cmd, capture_output=True, text=True,
                                   timeout=args.run_timeout)
                if p.returncode != 0:
                    print(f"bench_diloco: {place} {name} failed (exit {p.returncode}):\n"
                          f"$ {' '.join(cmd)}\n{p.stderr[-2000:]}")
                    sys.exit(1)
                m = re.search(r"gpt2 model, (\d+) parameters", p.stderr)
                params = params or (int(m.group(1)) if m else None)
                rows = [json.loads(x) for x in open(metrics) if x.strip()]
                meas = [r for r in rows if r["step"] > args.hosts_warmup]
                toks = rows[-1]["tokens"] - rows[args.hosts_warmup - 1]["tokens"]
                r = {"tokens": rows[-1]["tokens"],
                     "tokens_per_s": round(toks / (sum(x["step_ms"] for x in meas) / 1e3), 1),
                     "val_loss": rows[-1].get("val_loss"),
                     "step_ms_median": round(sorted(x["step_ms"] for x in meas)[len(meas) // 2],
                                             1)}
                if "outer" in rows[-1]:
                    r["bytes_per_token"] = round(rows[-1]["outer"]["bytes_total"] /
                                                 rows[-1]["tokens"], 2)
                    r["outer_exposed_ms_total"] = round(sum(x["outer"]["exposed_ms"]
                                                            for x in rows), 1)
                    r["outer_hidden_ms_total"] = round(sum(x["outer"]["hidden_ms"]
                                                           for x in rows), 1)
                runs.setdefault(name, {}).setdefault(place, []).append(r)
                print(f"  {place} {name}: {r}", flush=True)
                load.append(os.getloadavg()[0])
    finally:
        bench_hosts.cap_links(None)
        bench_hosts.sh(bench_hosts.HOSTS_SH, "down", check=False)
        lock.close()
    sync_bpt = 2 * 4 * params / (G * T)  # 2 ranks, each 2 (n-1)/n x 4P = 4P bytes a step
    out = {"bench": "bench_diloco", "host": "two test hosts (tests/hosts), 1 rank each",
           "model": f"gpt2 {L} layers d_model {D} vocab 4096 (KJV BPE)", "params": params,
           "seq_len": T, "global_batch": G, "steps": S, "inner_steps": H, "fragments": F,
           "streaming_inner_steps": HS, "diloco_dtypes": args.dtypes, "seed": args.seed,
           "repeats": args.hosts_repeats,
           "outer_dtype_streaming": "int4 (block 64)", "warmup_steps_excluded": args.hosts_warmup,
           "loadavg": load, "runs": {}}
    for name, per in runs.items():
        one = per["one_host"][0]
        ones = [x["tokens_per_s"] for x in per["one_host"]]
        o = {"one_host_tokens_per_s": statistics.median(ones), "val_loss": one["val_loss"],
             "bytes_per_token": one.get("bytes_per_token", round(sync_bpt, 2)),
             "caps": {}}
        o["fewer_bytes_than_sync"] = round(sync_bpt / o["bytes_per_token"], 1)
        # the link alone: each rank's bytes a step (half the run's) over the cap, added to the
        # one-host step without any overlap (a floor for the ratio; measured ratios on a
        # loaded shared machine move more than this)
        rank_bytes_step = o["bytes_per_token"] * G * T / 2
        for place, _, gbit in places[1:]:
            rs = per[place]
            wire_ms = rank_bytes_step * 8 / (gbit * 1e9) * 1e3
            ratios = [round(r["tokens_per_s"] / u, 3) for r, u in zip(rs, ones)]
            step_ms = statistics.median([x["step_ms_median"] for x in per["one_host"]])
            o["caps"][f"{gbit:g}gbit"] = {
                "tokens_per_s": statistics.median([r["tokens_per_s"] for r in rs]),
                "ratio_to_one_host": statistics.median(ratios),
                "wire_ms_per_step": round(wire_ms, 2),
                "model_ratio_no_overlap": round(step_ms / (step_ms + wire_ms), 3),
                "val_loss": rs[0]["val_loss"], "val_loss_equal_one_host":
                all(r["val_loss"] == one["val_loss"] for r in rs + per["one_host"])}
            if len(rs) > 1:
                o["caps"][f"{gbit:g}gbit"]["ratios_per_repeat"] = ratios
        if name != "sync_dp" and "sync_dp" in runs:
            o["val_loss_vs_sync"] = round(one["val_loss"] / runs["sync_dp"]["one_host"][0]
                                          ["val_loss"] - 1.0, 4)
        o["detail"] = per
        out["runs"][name] = o
    return out


def own_lr(base, flags):
    """base + flags, where flags' own --lr / --min-lr (the DiLoCo runs' --inner-lr) replace
    base's instead of repeating them."""
    cmd, flags = list(base), list(flags)
    for f in ("--lr", "--min-lr"):
        if f in flags:
            i = flags.index(f)
            cmd[cmd.index(f) + 1] = flags[i + 1]
            del flags[i:i + 2]
    return cmd + flags


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--inner-steps", type=int, default=50)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--fragments", type=int, default=4)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=2e-3, help="inner (AdamW) peak learning rate")
    ap.add_argument("--inner-lr", type=float, default=0.0,
                    help="the DiLoCo runs' inner AdamW peak lr (cosine to a tenth; 0: --lr); "
                         "sync dp keeps --lr")
    ap.add_argument("--inner-lr-scale", type=float, default=1.0,
                    help="the DiLoCo runs' inner lr schedule times F after --outer-start-step "
                         "(loom's --inner-lr-scale; the warm start's steps keep --lr)")
    ap.add_argument("--no-streaming", action="store_true",
                    help="leave the streaming run out (sync dp and DiLoCo only)")
    ap.add_argument("--diloco-dtypes", default="fp32",
                    help="the DiLoCo (H) runs' outer gradient on the wire, comma-separated "
                         "(fp32, bf16, int8, int4; one run each: diloco for fp32, diloco_DTYPE "
                         "for the others; int8/int4 with one scale per 64 values)")
    ap.add_argument("--warmup-steps", type=int, default=20)
    ap.add_argument("--outer-lr", type=float, default=0.7, help="the DiLoCo paper's 0.7")
    ap.add_argument("--outer-momentum", type=float, default=0.9)
    ap.add_argument("--no-nesterov", action="store_true", help="plain outer momentum")
    ap.add_argument("--outer-warmup", type=int, default=0,
                    help="the first R outer syncs only average (loom's --outer-warmup)")
    ap.add_argument("--outer-start-step", type=int, default=0,
                    help="warm start: synchronous dp for the first S steps, then DiLoCo "
                         "(loom's --outer-start-step; the DiLoCo paper starts from a model "
                         "trained synchronously)")
    ap.add_argument("--streaming-inner-steps", type=int, default=0,
                    help="H of the streaming run (0: --inner-steps)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved speed rounds (every config once per round, no eval)")
    ap.add_argument("--speed-outer-rounds", type=int, default=2,
                    help="each speed run: this many outer rounds (x --inner-steps steps)")
    ap.add_argument("--smoke", action="store_true", help="20 steps, H 6, F 2 (seconds)")
    ap.add_argument("--hosts", action="store_true",
                    help="2 ranks across two test hosts with capped links (root)")
    ap.add_argument("--caps", default="1,2.5", help="--hosts: link caps in Gbit/s")
    ap.add_argument("--hosts-model", default="6x384", help="--hosts: n_layer x d_model")
    ap.add_argument("--model", default="4x128",
                    help="one host: the GPT-2 model's n_layer x d_model (4 heads, d_ff 4 x)")
    ap.add_argument("--hosts-seq-len", type=int, default=64)
    ap.add_argument("--hosts-micro-batch", type=int, default=1,
                    help="--hosts: sequences per rank and step (global batch: twice this)")
    ap.add_argument("--hosts-steps", type=int, default=100, help="--hosts: steps per run")
    ap.add_argument("--hosts-warmup", type=int, default=2,
                    help="--hosts: first steps left out of tokens/s")
    ap.add_argument("--hosts-no-sync", dest="no_sync", action="store_true",
                    help="--hosts: leave the synchronous dp runs out (its bytes per token "
                         "are still computed: 4P per rank and step)")
    ap.add_argument("--hosts-repeats", type=int, default=1,
                    help="--hosts: every placement this many times in turn (the JSON: the "
                         "median ratio and each repeat's)")
    ap.add_argument("--seed", type=int, default=1337, help="every run's --seed")
    ap.add_argument("--run-timeout", type=float, default=900.0)
    args = ap.parse_args()
    args.loom = os.path.abspath(args.loom)
    if args.smoke:
        args.steps, args.inner_steps, args.fragments, args.eval_every = 24, 12, 2, 12
        args.rounds = 1
    if shutil.which("bible") is None or shutil.which("mpirun") is None:
        print("bench_diloco: needs bible-kjv (the `bible` command) and mpirun")
        sys.exit(77)
    if args.hosts and os.geteuid() != 0:
        print("SKIP: --hosts needs root for network namespaces")
        sys.exit(77)
    args.dtypes = [d.strip() for d in args.diloco_dtypes.split(",") if d.strip()]
    bad = [d for d in args.dtypes if d not in ("fp32", "bf16", "int8", "int4")]
    if bad or not args.dtypes or len(set(args.dtypes)) != len(args.dtypes):
        print(f"--diloco-dtypes {args.diloco_dtypes}: expected distinct fp32, bf16, int8 "
              f"or int4, comma-separated")
        sys.exit(2)
    work = tempfile.mkdtemp(prefix="loom_bench_diloco_")
    try:
        data = prepare(args.loom, work)
        if args.hosts:
            if args.smoke:
                args.caps, args.hosts_model, args.hosts_steps = "2.5", "4x64", 16
                args.inner_steps, args.fragments = 8, 2
            print(json.dumps(hosts_bench(args, data)))
            return
        W, H, F, G, T = args.workers, args.inner_steps, args.fragments, args.global_batch, 64
        HS = args.streaming_inner_steps or H
        load = [list(os.getloadavg())]
        L, D = (int(x) for x in args.model.split("x"))
        base = [args.loom, "train", "--family", "gpt2", "--n-layer", str(L), "--n-head", "4",
                "--d-model", str(D), "--d-ff", str(4 * D), "--vocab-size", "4096",
                "--seq-len", str(T),
                "--micro-batch", str(args.micro_batch), "--global-batch", str(G),
                "--steps", str(args.steps), "--lr", f"{args.lr:g}", "--min-lr",
                f"{args.lr / 10:g}", "--warmup-steps", str(args.warmup_steps), "--threads", "1",
                "--log-every", "0", "--seed", str(args.seed),
                "--data", os.path.join(data, "train_*.bin"),
                "--val-data", os.path.join(data, "val_*.bin"),
                "--eval-every", str(args.eval_every), "--eval-batches", "8"]
        outer = ["--outer", "diloco", "--workers", str(W), "--outer-lr", f"{args.outer_lr:g}",
                 "--outer-momentum", f"{args.outer_momentum:g}",
                 "--outer-warmup", str(args.outer_warmup),
                 "--outer-start-step", str(args.outer_start_step),
                 "--inner-lr-scale", f"{args.inner_lr_scale:g}"]
        outer += [] if args.no_nesterov else ["--outer-nesterov"]
        ilr = args.inner_lr or args.lr
        if args.inner_lr:  # the DiLoCo runs' own inner lr in place of base's --lr / --min-lr
            outer += ["--lr", f"{ilr:g}", "--min-lr", f"{ilr / 10:g}"]
        dtypes = args.dtypes
        configs = {"sync_dp": ["--dp", str(W)]}
        configs.update(outer_configs(outer, dtypes, H, HS, F, not args.no_streaming))
        result = {"bench": "bench_diloco", "host": "one host (shared memory)", "workers": W,
                  "inner_steps": H, "streaming_inner_steps": HS, "fragments": F,
                  "diloco_dtypes": dtypes,
                  "steps": args.steps, "global_batch": G, "micro_batch": args.micro_batch,
                  "seq_len": T, "model": f"gpt2 {L} layers d_model {D} vocab 4096 (KJV BPE)",
                  "recipe": {"lr": args.lr, "min_lr": args.lr / 10, "inner_lr": ilr,
                             "inner_min_lr": ilr / 10, "inner_lr_scale": args.inner_lr_scale,
                             "warmup_steps": args.warmup_steps, "outer_lr": args.outer_lr,
                             "outer_momentum": args.outer_momentum,
                             "outer_nesterov": not args.no_nesterov,
                             "outer_warmup": args.outer_warmup,
                             "outer_start_step": args.outer_start_step,
                             "start": ("from scratch" if args.outer_start_step == 0 else
                                       f"warm start: synchronous dp over the {W} workers for "
                                       f"steps 1-{args.outer_start_step} (tokens counted "
                                       f"alike), then DiLoCo rounds, as the DiLoCo paper "
                                       f"starts from a synchronously trained model")},
                  "runs": {}}
        params = None
        for name, flags in configs.items():
            metrics = os.path.join(work, name + ".jsonl")
            p = subprocess.run(MPIRUN + ["-n", str(W)] + own_lr(base, flags) +
                               ["--metrics", metrics], capture_output=True, text=True)
            if p.returncode != 0:
                print(f"bench_diloco: {name} failed (exit {p.returncode}):\n{p.stderr[-2000:]}")
                sys.exit(1)
            m = re.search(r"gpt2 model, (\d+) parameters", p.stderr)
            params = params or (int(m.group(1)) if m else None)
            rows = [json.loads(x) for x in open(metrics) if x.strip()]
            tokens = rows[-1]["tokens"]
            ms = sum(r["step_ms"] for r in rows)
            run = {"tokens": tokens, "tokens_per_s": tokens / (ms / 1e3),
                   "val_loss": rows[-1].get("val_loss"),
                   "val_curve": [[r["step"], r["val_loss"]] for r in rows if "val_loss" in r],
                   "train_loss_last": rows[-1]["loss"]}
            if "outer" in rows[-1]:
                o = rows[-1]["outer"]
                run["bytes_per_token"] = o["bytes_total"] / tokens
                run["outer_exposed_ms_total"] = sum(r["outer"]["exposed_ms"] for r in rows)
                run["outer_hidden_ms_total"] = sum(r["outer"]["hidden_ms"] for r in rows)
                run["outer_grad_norm_last"] = o["grad_norm"]
                S = args.outer_start_step
                if 0 < S < len(rows):  # the DiLoCo phase alone (after the synchronous steps)
                    run["bytes_per_token_after_start"] = (
                        (o["bytes_total"] - rows[S - 1]["outer"]["bytes_total"]) /
                        (tokens - rows[S - 1]["tokens"]))
            result["runs"][name] = run
            load.append(list(os.getloadavg()))
            shutil.copy(metrics, os.path.join(work, "keep_" + name + ".jsonl"))
        # speed: every config in turn, --rounds times (the machine's load drifts), each run
        # as long as two outer rounds; tokens/s over the steps after the first round
        speed = {name: [] for name in configs}
        sp_steps = max(args.speed_outer_rounds, 2) * max(H, HS)
        for _ in range(args.rounds):
            for name, flags in configs.items():
                metrics = os.path.join(work, "speed_" + name + ".jsonl")
                cmd = list(base)
                cmd[cmd.index("--steps") + 1] = str(sp_steps)
                i = cmd.index("--eval-every")
                del cmd[i:i + 2]
                p = subprocess.run(MPIRUN + ["-n", str(W)] + own_lr(cmd, flags) +
                                   ["--metrics", metrics], capture_output=True, text=True)
                if p.returncode != 0:
                    print(f"bench_diloco: speed {name} failed:\n{p.stderr[-2000:]}")
                    sys.exit(1)
                rows = [json.loads(x) for x in open(metrics) if x.strip()][H:]
                speed[name].append(sum(G * T for _ in rows) / (sum(r["step_ms"] for r in rows)
                                                               / 1e3))
        for name in configs:
            result["runs"][name]["tokens_per_s_rounds"] = speed[name]
            result["runs"][name]["tokens_per_s_speed"] = (
                sorted(speed[name])[len(speed[name]) // 2] if speed[name] else None)
        sync = result["runs"]["sync_dp"]
        sync["bytes_per_token"] = W * 2 * (W - 1) / W * 4 * params / (G * T)
        sync["bytes_note"] = "ring all-reduce: 2 (n-1)/n x 4P bytes per rank per step"
        result["params"] = params
        result["loadavg"] = load + [list(os.getloadavg())]
        for name in (n for n in configs if n != "sync_dp"):
            r = result["runs"][name]
            r["fewer_bytes_than_sync"] = sync["bytes_per_token"] / r["bytes_per_token"]
            if "bytes_per_token_after_start" in r:
                r["fewer_bytes_than_sync_after_start"] = (sync["bytes_per_token"] /
                                                          r["bytes_per_token_after_start"])
            r["tokens_per_s_vs_sync"] = r["tokens_per_s"] / sync["tokens_per_s"]
            r["tokens_per_s_speed_vs_sync"] = [a / b for a, b in
                                               zip(r["tokens_per_s_rounds"],
                                                   sync["tokens_per_s_rounds"])]
            r["val_loss_vs_sync"] = r["val_loss"] / sync["val_loss"] - 1.0
            if name.startswith("diloco_") and "diloco" in result["runs"]:
                r["val_loss_vs_diloco_fp32"] = (r["val_loss"] /
                                                result["runs"]["diloco"]["val_loss"] - 1.0)
                r["fewer_bytes_than_diloco_fp32"] = (result["runs"]["diloco"]["bytes_per_token"]
                                                     / r["bytes_per_token"])
        png = os.path.join(os.getcwd(), "bench_diloco.png")
        if shutil.which("gnuplot") and not args.smoke:
            q = subprocess.run([args.loom, "plot"] +
                               [os.path.join(work, n + ".jsonl") for n in configs] +
                               ["-o", png, "--title", " vs ".join(
                                   {"sync_dp": "sync dp", "diloco": "DiLoCo",
                                    "streaming": "streaming int4"}.get(
                                       n, n.replace("diloco_", "DiLoCo ")) for n in configs)],
                               capture_output=True, text=True)
            if q.returncode == 0:
                result["plot"] = png
        print(json.dumps(result))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
