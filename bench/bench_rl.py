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
Prints one JSON object last. Usage: bench_rl.py --loom PATH [--smoke]"""
import argparse
import json
import os
import re
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", required=True)
    ap.add_argument("--smoke", action="store_true", help="a tiny model, few tokens (seconds)")
    a = ap.parse_args()
    L, C, new = (2, 32, 8) if a.smoke else (4, 128, 32)
    out = {"bench": "rl", "smoke": a.smoke, "load_start": list(os.getloadavg())}
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
        cmp_bin = os.path.join(os.path.dirname(os.path.abspath(a.loom)), "reshard_cmp")
        if os.path.exists(cmp_bin):
            size = (["--n-layer", "2", "--d-model", "128", "--vocab", "512", "--iters", "2"]
                    if a.smoke else ["--n-layer", "8", "--d-model", "512", "--vocab", "4096",
                                     "--iters", "5"])
            bounds, load = {}, list(os.getloadavg())
            for key, pair in (("reshard_compare", ["--tp-train", "2", "--tp-gen", "1"]),
                              ("reshard_compare_pp_tp", ["--pp-train", "2", "--tp-gen", "2",
                                                         "--ckpt-iters", "1"]),
                              ("reshard_compare_tp_tp4", ["--tp-train", "2", "--tp-gen", "4",
                                                          "--ckpt-iters", "1"])):
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
        out["load"] = list(os.getloadavg())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
