"""loom rl's speed, one run (docs/rl.md):
1. Rollout: 64 sampled completions of 64 prompts (G x P = 64 sequences) decoded batched
   (`loom generate --prompt-file --batch 64`) against one sequence at a time (`--batch 1`,
   the same binary, the same tokens: sampling is per-sequence, so both write the same
   completions, checked); the process's fixed cost (`--max-tokens 0`: start, weights,
   prompts) is subtracted from both. Target >= 5x. Threads: OMP_NUM_THREADS.
2. Each phase's share of an iteration (`loom rl` metrics: rollout, reward, log-probs,
   update, reshard), one process.
3. Reshard inside `loom rl` (--train-layout "--tp 2", --gen-layout "--dp 2", 2 ranks):
   the bytes it moves and its time (the best iteration's reshard_ms) for the bench's model
   and one twice as wide (`reshard_in_rl`; at these sizes a few MB: the comparison with
   the bandwidth and the alternatives is 5.).
4. One GRPO iteration against plain PyTorch (torch_iteration below: the same model and
   weights, the same P x G sequences, its own batched KV-cache sampling, the same
   micro-batches, AdamW; one thread each): the mean iteration time of loom rl's metrics
   against the PyTorch loop's, both over the same number of iterations. Target: loom >= 2x.
5. Reshard against the alternatives (bench/reshard_cmp.c, 4 ranks, a larger model so that
   fixed costs do not dominate: 8 layers, d_model 512, vocab 4096, 151 MB), two layout
   pairs: the issue's train tp 2 x dp 2 -> gen dp 4 (`reshard_compare`), and two with a
   sharded generation layout: train pp 2 x dp 2 -> gen tp 2 x dp 2
   (`reshard_compare_pp_tp`) and train tp 2 x dp 2 -> gen tp 4 (`reshard_compare_tp_tp4`;
   their checkpoint comparison: one round, not two). Each:
   loom's in-memory reshard, an all-gather of every rank's training buffer on every rank
   (the transfer only), and saving a checkpoint of the training layout and loading it
   into the generation layout (loom's ckpt writer and loader, fsync included, in the
   temporary folder); the time predicted from what the reshard moves: the bytes a rank
   receives over MPI / the point-to-point bandwidth + the bytes it copies in memory (what
   it keeps, packs, unpacks) / the memcpy bandwidth, both measured in the same run, the
   slowest rank's. Best of 5 (checkpoint: 2), slowest rank. `reshard_bounds` says per
   pair whether 3x over the all-gather is reachable at all: the all-gather's measured
   time over the reshard's predicted time (at most that ratio, were the reshard exactly
   as fast as its bytes). With whole replicas in generation each rank must receive what
   it lacks and copy what it keeps, so the first pair's bound is below 3 whatever the
   bandwidths (its byte ratio is 3.0 and the copies come on top); pp -> tp receives a
   sixth of the all-gather's bytes but copies what it keeps and packs half rows (on one
   machine, where a message is a memory copy too, about 2.6x at equal bandwidths); tp 2 ->
   tp 4 receives a sixth and copies almost nothing.
6. The issue's pair across test hosts (--hosts, or --only hosts for it alone; root:
   tests/hosts/hosts.sh network namespaces on one bridge, bench_hosts' MPI settings, TCP
   between hosts): reshard_cmp as in 5., train tp 2 x dp 2 -> gen dp 4, its 4 ranks on 4
   hosts, one each, each host's link (both ends of its veth) capped with tbf at each of
   --host-caps Gbit/s (0: the veth uncapped). One rank a host because then every byte a
   rank receives crosses its own link and its host's link counters are its own; with two
   ranks a host (hosts.sh and mpirun allow it too) the tp pairs (ranks 0-1, 2-3) share a
   host, the plan takes a rank's missing half from its own replica's other tp rank, on
   the same host (OpenMPI's shared memory), and the reshard would cross no link at all.
   At each cap, each of --host-transports: OpenMPI's TCP defaults (`default`) and
   without RDMA put (`no_put`, NO_PUT below): by default the rest of a large message
   after its first 128 KiB is one put fragment, and in an exchange both ways between two
   ranks (a tp pair here) one side's rendezvous reply waits behind its own outgoing
   message, so the two directions often run one after the other (reshard_cmp's
   `pair_bytes_per_s`: one message each way between rank pairs, against
   `p2p_bytes_per_s`: a ring, one direction a connection).
   Per run (`reshard_compare_hosts.runs`): reshard_cmp's JSON (its `link`: each rank's
   bytes received and sent on its host's eth0 per operation, the kernel's counters);
   predicted_link_ms: the reshard's and the all-gather's largest bytes received by a rank
   / the ring's point-to-point bandwidth of the same run (the rank's copies left out: they
   run while its messages are in flight), and a checkpoint's were its storage behind the
   same link (a rank writes its shard, then reads the whole model: not measured, the
   checkpoint here goes to this machine's disk, which the test hosts share, so it crosses
   no link); the ratios and `3x_over_allgather`. --host-pairs adds the other pairs of 5.
   (`other_pairs`, the same figures; a checkpoint over the link then reads the model /
   its generation tp).
Prints one JSON object last. Usage: bench_rl.py --loom PATH [--smoke] [--hosts | --only
hosts] [--host-caps 1,0] [--host-transports default,no_put] [--host-pairs
reshard_compare,reshard_compare_pp_tp,reshard_compare_tp_tp4]"""
import argparse
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1"]


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, encoding="latin-1", **kw)  # bytes as chars
    if p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)}: exit {p.returncode}\n{p.stderr[-2000:]}")
    return p


def model_flags(L, C):
    return ["--family", "llama", "--vocab-size", "256", "--seq-len", "64", "--n-layer", str(L),
            "--d-model", str(C), "--n-head", "4", "--n-kv-head", "2", "--d-ff", str(4 * C)]


def weights(loom, tmp, data, L, C, name):
    path = os.path.join(tmp, name)
    run([loom, "train"] + model_flags(L, C) + ["--micro-batch", "4", "--global-batch", "4",
        "--steps", "1", "--threads", "2", "--log-every", "0", "--data", data,
        "--save-weights", path])
    return path


def torch_iteration(w, prompts, L, C, P, G, new, M, iterations, temperature=1.0, lr=1e-4):
    """GRPO in plain PyTorch: rollout (lockstep batched decoding with a KV cache), the
    exact-match reward, old log-probabilities, one clipped-ratio update over micro-batches
    of M sequences, AdamW. Returns the mean iteration time (ms) and each phase's."""
    import torch
    sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
    import safetensors_io
    import torch_model as tm
    torch.set_num_threads(1)
    cfg = tm.Config("llama", n_layer=L, n_head=4, n_kv_head=2, d_model=C, d_ff=4 * C,
                    vocab_size=256, seq_len=64)
    model = tm.build_model(cfg)
    tm.load_params(model, safetensors_io.load(w))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(1)
    hd, H, KV = cfg.head_dim, cfg.n_head, cfg.n_kv_head
    cos, sin = tm.rope_tables(cfg.seq_len, hd, cfg.rope_theta, torch.float32)
    m = model.model
    phases = {"rollout": 0.0, "logprob": 0.0, "update": 0.0}
    for it in range(iterations):
        ps = [prompts[(it * P + k) % len(prompts)] for k in range(P)]
        seqs = [list(p.encode()) for p in ps for _ in range(G)]
        B = len(seqs)
        t0 = time.time()
        with torch.no_grad():  # rollout: every sequence at position t at step t
            cache = [[None, None] for _ in range(L)]
            comp = [[] for _ in range(B)]
            done = [False] * B
            cur = torch.tensor([s[0] for s in seqs])
            for t in range(cfg.seq_len - 1):
                x = m.embed_tokens(cur)[:, None, :]
                for li, blk in enumerate(m.layers):
                    a = blk.self_attn
                    h = blk.input_layernorm(x)
                    q = a.q_proj(h).view(B, 1, H, hd).transpose(1, 2)
                    k = a.k_proj(h).view(B, 1, KV, hd).transpose(1, 2)
                    v = a.v_proj(h).view(B, 1, KV, hd).transpose(1, 2)
                    c, sn = cos[t:t + 1], sin[t:t + 1]
                    q = q * c + tm.rotate_half(q) * sn
                    k = k * c + tm.rotate_half(k) * sn
                    kc, vc = cache[li]
                    kc = k if kc is None else torch.cat([kc, k], dim=2)
                    vc = v if vc is None else torch.cat([vc, v], dim=2)
                    cache[li] = [kc, vc]
                    kk, vv = kc.repeat_interleave(H // KV, 1), vc.repeat_interleave(H // KV, 1)
                    att = torch.softmax(q @ kk.transpose(-1, -2) / hd ** 0.5, dim=-1) @ vv
                    x = x + a.o_proj(att.transpose(1, 2).reshape(B, 1, H * hd))
                    x = x + blk.mlp(blk.post_attention_layernorm(x))
                probs = torch.softmax(model.lm_head(m.norm(x))[:, 0] / temperature, dim=-1)
                drawn = torch.multinomial(probs, 1, generator=gen)[:, 0].tolist()
                nxt = []
                for b in range(B):
                    if t + 1 < len(seqs[b]):
                        nxt.append(seqs[b][t + 1])
                        continue
                    if not done[b]:
                        comp[b].append(drawn[b])
                        done[b] = drawn[b] == 10 or len(comp[b]) >= new or \
                            len(seqs[b]) + len(comp[b]) > cfg.seq_len
                    nxt.append(drawn[b])
                if all(done):
                    break
                cur = torch.tensor(nxt)
        t1 = time.time()
        reward = []
        for b in range(B):
            p = bytes(seqs[b]).decode()
            want = str(eval(p[:-1])) + "\n"
            reward.append(1.0 if bytes(comp[b]) == want.encode() else 0.0)
        r = torch.tensor(reward).view(P, G)
        adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
        T = cfg.seq_len
        rec = torch.zeros(B, T + 1, dtype=torch.long)
        mask = torch.zeros(B, T)
        for b in range(B):
            full = seqs[b] + comp[b]
            rec[b, :len(full)] = torch.tensor(full)
            lo = len(seqs[b]) - 1
            mask[b, lo:lo + len(comp[b])] = 1.0 / (B * max(1, len(comp[b])))
        inp, tgt = rec[:, :-1], rec[:, 1:]

        def logp(i0):
            lg = model(inp[i0:i0 + M]) / temperature
            return torch.log_softmax(lg, -1).gather(-1, tgt[i0:i0 + M, :, None])[..., 0]

        with torch.no_grad():
            old = torch.cat([logp(i) for i in range(0, B, M)])
        t2 = time.time()
        opt.zero_grad()
        for i in range(0, B, M):
            lp = logp(i)
            ratio = torch.exp(lp - old[i:i + M])
            a = adv[i:i + M, None]
            loss = -torch.minimum(ratio * a, ratio.clamp(0.8, 1.2) * a)
            (loss * mask[i:i + M]).sum().backward()
        opt.step()
        t3 = time.time()
        phases["rollout"] += (t1 - t0) * 1e3
        phases["logprob"] += (t2 - t1) * 1e3
        phases["update"] += (t3 - t2) * 1e3
    phases = {k: v / iterations for k, v in phases.items()}
    return sum(phases.values()), phases


def cmp_size(smoke):
    """reshard_cmp's model: a tiny one for --smoke, else 151 MB (8 x 512, vocabulary 4096)."""
    return (["--n-layer", "2", "--d-model", "128", "--vocab", "512", "--iters", "2"]
            if smoke else ["--n-layer", "8", "--d-model", "512", "--vocab", "4096",
                           "--iters", "5"])


# reshard_cmp's layout pairs (5. above): the issue's, then two with a sharded generation
# layout (their checkpoint comparison: one round)
PAIRS = {"reshard_compare": ["--tp-train", "2", "--tp-gen", "1"],
         "reshard_compare_pp_tp": ["--pp-train", "2", "--tp-gen", "2", "--ckpt-iters", "1"],
         "reshard_compare_tp_tp4": ["--tp-train", "2", "--tp-gen", "4", "--ckpt-iters", "1"]}
NAMES = {"reshard_compare": "train tp 2 x dp 2 -> gen dp 4",
         "reshard_compare_pp_tp": "train pp 2 x dp 2 -> gen tp 2 x dp 2",
         "reshard_compare_tp_tp4": "train tp 2 x dp 2 -> gen tp 4"}

# OpenMPI's TCP transport without RDMA put (--host-transports no_put): a large message goes
# as 128 KiB fragments of send/receive, not as one fragment of its whole remainder
NO_PUT = ["--mca", "btl_tcp_flags", "send,inplace,need-ack,need-csum"]


def hosts_cell(a, cmp_bin, tmp):
    """The issue's pair (train tp 2 x dp 2 -> gen dp 4) across 4 test hosts, one rank each,
    with capped links (6. above); the JSON object."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_hosts  # noqa: E402 (its MPI settings, link caps and hosts.sh)
    n_hosts = 4
    hosts = ",".join(f"10.231.0.{k}:1" for k in range(1, n_hosts + 1))
    caps = [float(c) for c in a.host_caps.split(",")]
    transports = a.host_transports.split(",")
    pairs = a.host_pairs.split(",")
    cell = {"pair": NAMES["reshard_compare"], "ranks": 4,
            "placement": "4 test hosts x 1 rank (tests/hosts: network namespaces, veth, one "
                         "bridge; MPI over TCP; bench_hosts' MCA settings)",
            "hosts": hosts, "link_dev": "eth0",
            "transports": {"default": "OpenMPI's btl_tcp_flags (send, put, ...)",
                           "no_put": " ".join(NO_PUT)},
            "ckpt_storage": "this machine's disk, shared by the test hosts (no link bytes)",
            "runs": {}}
    lock = open("/run/loom-hosts.lock", "w")  # the hosts are shared with the tests
    fcntl.flock(lock, fcntl.LOCK_EX)
    # SIGTERM: the finally below (caps removed, hosts down)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        bench_hosts.sh(bench_hosts.HOSTS_SH, "up", str(n_hosts))
        for gbit in caps:
            bench_hosts.cap_links(gbit or None, n_hosts)
            for key in pairs:
                for tr in transports:
                    name = (f"{gbit:g}gbit" if gbit else "uncapped") + "_" + tr
                    if key != "reshard_compare":  # the other pairs: under their own key
                        runs = cell.setdefault("other_pairs", {}).setdefault(
                            key, {"pair": NAMES[key], "runs": {}})["runs"]
                    else:
                        runs = cell["runs"]
                    runs[name] = hosts_run(a, cmp_bin, tmp, bench_hosts.MCA, hosts, gbit, tr,
                                           key, name)
    finally:
        bench_hosts.cap_links(None, n_hosts)
        bench_hosts.sh(bench_hosts.HOSTS_SH, "down", check=False)
        lock.close()
    return cell


def hosts_run(a, cmp_bin, tmp, mca, hosts, gbit, transport, key, name):
    """One reshard_cmp run of PAIRS[key] across the hosts at link cap gbit (0: none); its
    figures."""
    load = list(os.getloadavg())
    cmd = (["mpirun", "--allow-run-as-root", "--host", hosts] + mca +
           (NO_PUT if transport == "no_put" else []) +
           ["-x", "OMP_NUM_THREADS=1", "-n", "4", cmp_bin, "--dir",
            os.path.join(tmp, f"ck_hosts_{key}_{name}"), "--link-dev", "eth0"] + PAIRS[key] +
           cmp_size(a.smoke))
    print(f"$ {' '.join(cmd)}", file=sys.stderr, flush=True)
    rc = json.loads(run(cmd, timeout=a.run_timeout).stdout.strip().split("\n")[-1])
    rc["load_before"], rc["load_after"] = load, list(os.getloadavg())
    bw, pair = rc["p2p_bytes_per_s"], rc["pair_bytes_per_s"]
    rx = {k: max(v) for k, v in rc["link"]["rx_bytes"].items()}
    tx = {k: max(v) for k, v in rc["link"]["tx_bytes"].items()}
    shard = rc["allgather_recv_bytes"] / 3  # a rank's training buffer (4 ranks: 3 received)
    pred = {"reshard": rc["reshard_max_recv_bytes"] / bw * 1e3,
            "allgather": rc["allgather_recv_bytes"] / bw * 1e3,
            # were the checkpoint on storage behind the same link: a rank of replica 0
            # writes its shard, then every rank reads its generation copy (the model /
            # tp_gen; not measured here)
            "ckpt_over_link": (shard + rc["model_bytes"] / rc["tp_gen"]) / bw * 1e3}
    d = {"cap_gbit": gbit or None, "transport": transport,
         "link_gbit": round(bw * 8 / 1e9, 3), "pair_link_gbit": round(pair * 8 / 1e9, 3),
         "reshard_ms": rc["reshard_ms"], "allgather_ms": rc["allgather_ms"],
         "ckpt_ms": rc["ckpt_ms"],
         "link_rx_bytes_max": rx, "link_tx_bytes_max": tx,
         # what crossed a link over what the plan (or the all-gather) receives
         "link_rx_over_planned": {
             "reshard": round(rx["reshard"] / max(1, rc["reshard_max_recv_bytes"]), 4),
             "allgather": round(rx["allgather"] / max(1, rc["allgather_recv_bytes"]), 4)},
         "predicted_link_ms": {k: round(v, 3) for k, v in pred.items()},
         "reshard_over_predicted_link": round(rc["reshard_ms"] / pred["reshard"], 3),
         "allgather_over_predicted_link": round(rc["allgather_ms"] / pred["allgather"], 3),
         "allgather_over_reshard": rc["allgather_over_reshard"],
         "median_allgather_over_reshard": rc["median"]["allgather_over_reshard"],
         "ckpt_over_reshard": rc["ckpt_over_reshard"],
         "ckpt_over_link_predicted_over_reshard": round(pred["ckpt_over_link"] /
                                                        rc["reshard_ms"], 3),
         "ideal_bytes": rc["ideal_allgather_over_reshard_bytes"],
         "3x_over_allgather": rc["allgather_over_reshard"] >= 3.0,
         "reshard_cmp": rc}
    if gbit:  # the same at the nominal cap
        d["predicted_cap_ms"] = {
            "reshard": round(rc["reshard_max_recv_bytes"] * 8 / (gbit * 1e9) * 1e3, 3),
            "allgather": round(rc["allgather_recv_bytes"] * 8 / (gbit * 1e9) * 1e3, 3)}
    print(f"hosts {key} {name}: reshard {rc['reshard_ms']:.1f} ms (link-predicted "
          f"{pred['reshard']:.1f}), all-gather {rc['allgather_ms']:.1f} ms "
          f"({rc['allgather_over_reshard']:.2f}x, median "
          f"{rc['median']['allgather_over_reshard']:.2f}x), checkpoint {rc['ckpt_ms']:.1f} ms, "
          f"link {bw * 8 / 1e9:.2f} Gbit/s (pair exchange {pair * 8 / 1e9:.2f})",
          file=sys.stderr, flush=True)
    return d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", required=True)
    ap.add_argument("--smoke", action="store_true", help="a tiny model, few tokens (seconds)")
    ap.add_argument("--hosts", action="store_true",
                    help="add the issue's pair across test hosts with capped links (root)")
    ap.add_argument("--only", choices=("all", "hosts"), default="all",
                    help="hosts: only the cross-host cell")
    ap.add_argument("--host-caps", default="1,0",
                    help="--hosts: link caps in Gbit/s, 0 for the veth uncapped")
    ap.add_argument("--host-transports", default="default,no_put",
                    help="--hosts: OpenMPI's TCP settings to run at each cap: default, no_put")
    ap.add_argument("--host-pairs", default="reshard_compare",
                    help="--hosts: layout pairs, of " + ", ".join(PAIRS))
    ap.add_argument("--run-timeout", type=float, default=600.0,
                    help="--hosts: seconds for one reshard_cmp run")
    a = ap.parse_args()
    L, C, new = (2, 32, 8) if a.smoke else (4, 128, 32)
    out = {"bench": "rl", "smoke": a.smoke, "load_start": list(os.getloadavg())}
    cmp_bin = os.path.join(os.path.dirname(os.path.abspath(a.loom)), "reshard_cmp")
    if a.only == "hosts" or a.hosts:
        if set(a.host_transports.split(",")) - {"default", "no_put"}:
            print(f"--host-transports {a.host_transports}: expected default and/or no_put",
                  file=sys.stderr)
            sys.exit(2)
        if set(a.host_pairs.split(",")) - set(PAIRS):
            print(f"--host-pairs {a.host_pairs}: expected some of {', '.join(PAIRS)}",
                  file=sys.stderr)
            sys.exit(2)
        if a.smoke:
            a.host_caps, a.host_transports = "10", "default"
        if os.geteuid() != 0:
            print("SKIP: --hosts needs root for network namespaces", file=sys.stderr)
            if a.only == "hosts":
                sys.exit(77)
            a.hosts = False
            out["reshard_compare_hosts"] = {"skipped": "needs root"}
        if not os.path.exists(cmp_bin):
            sys.exit(f"FAIL: {cmp_bin}: reshard_cmp not built next to --loom")
    if a.only == "hosts":
        run([a.loom, "version"])  # a broken --loom fails here, as in the other cells
        with tempfile.TemporaryDirectory() as tmp:
            out["reshard_compare_hosts"] = hosts_cell(a, cmp_bin, tmp)
        out["load"] = list(os.getloadavg())
        print(json.dumps(out))
        return
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "d")
        run([a.loom, "data", "arith", "--out", d, "--digits", "3", "--train", "2000", "--val",
             "64"])
        w = weights(a.loom, tmp, d + "/train_*.bin", L, C, "w.safetensors")
        prompts = os.path.join(d, "val_prompts.txt")
        t0 = time.time()  # the process's fixed cost: start, load the weights, read the prompts
        run([a.loom, "generate", "--weights", w, "--prompt-file", prompts, "--max-tokens", "0"])
        fixed = time.time() - t0
        times, outs = {}, {}
        for batch in (64, 1):
            t0 = time.time()
            p = run([a.loom, "generate", "--weights", w, "--prompt-file", prompts, "--batch",
                     str(batch), "--max-tokens", str(new), "--temperature", "1", "--seed", "1"])
            times[batch] = max(1e-6, time.time() - t0 - fixed)
            outs[batch] = p.stdout
        lines = outs[64].split("\n")[:-1]
        tokens = sum(min(new, len(x) + 1) for x in lines)  # a stop token ends a short line
        out["rollout"] = {"sequences": 64, "tokens": tokens,
                          "batched_tokens_per_s": tokens / times[64],
                          "one_at_a_time_tokens_per_s": tokens / times[1],
                          "speedup": times[1] / times[64],
                          "process_fixed_s": fixed,
                          "same_completions": outs[64] == outs[1]}
        print(f"rollout: batched {tokens / times[64]:.0f} tok/s, one at a time "
              f"{tokens / times[1]:.0f} tok/s: {times[1] / times[64]:.2f}x", file=sys.stderr)

        base = ["rl", "--init-from", w, "--prompts", os.path.join(d, "train_prompts.txt"),
                "--iterations", "2" if a.smoke else "4", "--prompts-per-iter", "8",
                "--group-size", "8", "--ppo-micro-batch", "8", "--max-new-tokens", str(new),
                "--threads", "1", "--lr", "1e-4"]
        m = os.path.join(tmp, "one.jsonl")
        run([a.loom] + base + ["--metrics", m])
        rows = [json.loads(x) for x in open(m) if "rollout_ms" in x]
        phases = ("rollout_ms", "reward_ms", "logprob_ms", "update_ms", "reshard_ms")
        total = sum(r["iteration_ms"] for r in rows)
        out["phase_share"] = {k[:-3]: sum(r[k] for r in rows) / total for k in phases}
        loom_ms = total / len(rows)
        torch_ms, torch_phases = torch_iteration(
            w, open(os.path.join(d, "train_prompts.txt")).read().split("\n")[:-1], L, C, 8, 8,
            new, 8, len(rows))
        out["grpo_iteration"] = {"loom_ms": loom_ms, "torch_ms": torch_ms,
                                 "speedup": torch_ms / loom_ms,
                                 "loom_phases_ms": {k[:-3]: sum(r[k] for r in rows) / len(rows)
                                                    for k in phases},
                                 "torch_phases_ms": torch_phases,
                                 "threads": 1, "sequences": 64}
        print(f"GRPO iteration: loom {loom_ms:.0f} ms, PyTorch {torch_ms:.0f} ms: "
              f"{torch_ms / loom_ms:.2f}x", file=sys.stderr)
        reshard = {}
        for L2, C2 in ((L, C), (L, 2 * C)):
            w2 = weights(a.loom, tmp, d + "/train_*.bin", L2, C2, f"w{C2}.safetensors")
            m2 = os.path.join(tmp, f"tp{C2}.jsonl")
            base2 = list(base)
            base2[base2.index("--init-from") + 1] = w2
            p = run(MPIRUN + ["-n", "2", a.loom] + base2 + [
                "--train-layout", "--tp 2", "--gen-layout", "--dp 2", "--metrics", m2])
            mib = float(re.search(r"reshard moves ([0-9.]+) MiB", p.stderr).group(1))
            rows2 = [json.loads(x) for x in open(m2) if "reshard_ms" in x]
            ms = min(r["reshard_ms"] for r in rows2)
            reshard[C2] = (mib * 1048576, ms)
        (b1, t1), (b2, t2) = reshard[C], reshard[2 * C]
        out["reshard_in_rl"] = {"bytes": b1, "ms": t1, "bytes_2x_model": b2, "ms_2x_model": t2}
        if os.path.exists(cmp_bin):
            size = cmp_size(a.smoke)
            bounds, load = {}, list(os.getloadavg())
            for key, pair in PAIRS.items():
                p = run(MPIRUN + ["-n", "4", cmp_bin, "--dir", os.path.join(tmp, "ck_" + key)] +
                        pair + size)
                rc = json.loads(p.stdout.strip().split("\n")[-1])
                rc["load_before"] = load
                out[key] = rc
                bounds[key] = {"allgather_over_predicted": rc["allgather_over_predicted"],
                               "allgather_over_reshard": rc["allgather_over_reshard"],
                               "ideal_bytes": rc["ideal_allgather_over_reshard_bytes"],
                               "3x_reachable": rc["allgather_over_predicted"] >= 3.0}
                print(f"{key}: reshard {rc['reshard_ms']:.1f} ms (predicted "
                      f"{rc['predicted_ms']:.1f}), all-gather {rc['allgather_ms']:.1f} ms, "
                      f"checkpoint {rc['ckpt_ms']:.1f} ms", file=sys.stderr)
                load = list(os.getloadavg())
            out["reshard_bounds"] = bounds
        else:
            out["reshard_compare"] = None  # reshard_cmp not built next to loom
        if a.hosts:
            out["reshard_compare_hosts"] = hosts_cell(a, cmp_bin, tmp)
        out["load"] = list(os.getloadavg())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
