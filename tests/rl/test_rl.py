"""loom rl's invariants on a tiny model (seconds): the on-policy ratio of the first PPO
epoch is exactly 1 for every token (the actor's log-probabilities of its own samples are
the rollout's, bitwise); the same run twice is bitwise (metrics and weights); the
(train, gen) layout pairs (1, 1) (bitwise), (dp 2, dp 2), (dp 2 ZeRO-3, dp 2), (tp 2, dp 2), (tp 2 x dp 2 ZeRO-1, dp 4), (pp 2, dp 2), (pp 2 x dp 2 ZeRO-3, dp 4), (dp 2
ZeRO-3, tp 2), (tp 2 x dp 2 ZeRO-3, tp 2 x dp 2), (pp 2 x tp 2, tp 2 x dp 2), (cp 2, dp 2) (twice:
bitwise), (cp 2 x tp 2 with sequence parallelism, tp 2 x dp 2) and (pp 2 x cp 2 ZeRO-3, dp 4),
the ZeRO-3, tp and pp ones moving the weights into the generator's whole copy (tp 2
generation: its tp shard) after every update (pp: the log-probabilities and the GRPO loss on
the pipeline's last stage), give the same rewards as one process and the same weights after 3 iterations
(<= 1e-5); so does a mixture-of-experts policy trained expert parallel (dp 4 with ep 2: two
ep groups, each rank 2 of the 4 experts; and pp 2 x dp 2 with ep 2, the auxiliary losses of
both stages in the GRPO loss; generation on 4 whole replicas) against its own
one-process run, whose saved capacity limit rl does not apply (one line says so); a
difference from one process is accepted (and the pair run again with the next seed) only
when both runs' dumps (--dump-dir: every draw with its margin, a MoE's router decisions)
show a near-tie sampling or routing flip before which they agree; GRPO raises a dense reward (a digit count) several-fold in 20 iterations; bad
input is one line and exit 2. The reward is a command (awk over
the JSON lines: a number from the completion's length) so that a weak model still gets
varied rewards, and the KL term is on. Usage: test_rl.py --loom PATH [--seed S]"""
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
from loomtest import (ADAM_EPS, MPIRUN, TOL, check, parse_test_args, run, run_test, safetensors_io,  # noqa: E402
                      weights_error)
import moe_routes  # noqa: E402
import sample_flips  # noqa: E402
from rl_fixture import arith_and_sft, sft_model  # noqa: E402

REWARD = "awk '{print length($0) % 5}'"
SEEDS = 3  # seeds tried for a pair without a (near-tie) sampling or routing flip
TIMING = ("rollout_ms", "reward_ms", "logprob_ms", "update_ms", "iteration_ms")


def metrics(path):
    rows = [json.loads(line) for line in open(path)]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def main():
    a = parse_test_args()
    seed = a.seed
    with tempfile.TemporaryDirectory() as tmp:
        d, sft = arith_and_sft(a.loom, tmp, seed, 500, 16)
        # a mixture of experts (4, top 2), trained with a capacity limit that rl does not
        # apply (generation routes one token at a time and drops none)
        moe = sft_model(a.loom, tmp, d, seed, "sft_moe",
                        ["--n-experts", "4", "--top-k", "2", "--capacity-factor", "1.25"])
        base = ["rl", "--prompts", d + "/train_prompts.txt", "--eval-prompts",
                d + "/val_prompts.txt", "--init-from", sft, "--iterations", "3",
                "--prompts-per-iter", "4", "--group-size", "4", "--ppo-micro-batch", "4",
                "--ppo-epochs", "2", "--max-new-tokens", "6", "--kl-coef", "0.05", "--lr", "3e-3",
                "--adam-eps", ADAM_EPS, "--threads", "1", "--seed", str(seed), "--reward-cmd",
                REWARD]

        logs = {}

        def dump(name):
            return os.path.join(tmp, name + "_dump")

        def rl(name, extra=(), ranks=1, init=sft, run_seed=seed):
            """One run; every run dumps its draws (and a MoE its router decisions)."""
            m, w = os.path.join(tmp, name + ".jsonl"), os.path.join(tmp, name + ".safetensors")
            args = list(base)
            args[args.index("--init-from") + 1] = init
            args[args.index("--seed") + 1] = str(run_seed)
            cmd = [a.loom] + args + list(extra) + ["--metrics", m, "--save-weights", w,
                                                   "--dump-dir", dump(name)]
            if ranks > 1:
                cmd = MPIRUN + ["-n", str(ranks)] + cmd
            logs[name] = run(cmd, name)
            return metrics(m), safetensors_io.load(w)

        m1, w1 = rl("one")
        iters = [r for r in m1 if "reward_mean" in r]
        check(len(iters) == 3, f"3 iteration lines ({len(iters)})")
        # the first iteration's old log-probabilities come from a forward pass of their own
        # (later ones from the first epoch's forward): its ratios are exactly 1
        check(iters[0].get("ratio_not_one_first_epoch") == 0 and
              not any("ratio_not_one_first_epoch" in r for r in iters[1:]),
              "first PPO epoch: every token's ratio is exactly 1 (on-policy, bitwise), checked "
              "in the first iteration: " + str([r.get("ratio_not_one_first_epoch") for r in iters]))
        check(any(r["reward_std"] > 0 for r in iters) and all(r["grad_norm"] > 0 for r in iters),
              "varied rewards and a gradient every iteration")
        check(any(r["kl"] > 0 for r in iters[1:]), "the KL to the reference grows after an update")
        raw = json.loads(open(os.path.join(tmp, "one.jsonl")).readlines()[1])
        check(all(k in raw for k in ("reward_mean", "reward_std", "accuracy", "kl",
                                     "clip_fraction", "completion_len", "entropy") + TIMING) and
              "heldout_accuracy" in m1[0] and "heldout_accuracy" in iters[-1],
              "metrics: every field, held-out accuracy before and after")
        m2, w2 = rl("two")
        check(m1 == m2 and set(w1) == set(w2) and all((w1[k] == w2[k]).all() for k in w1),
              "the same run twice: bitwise the same metrics and weights")
        m11, w11 = rl("train_1_gen_1", ["--train-layout", "--dp 1", "--gen-layout", "--dp 1"])
        check(m11 == m1 and all((w11[k] == w1[k]).all() for k in w1),
              "(train, gen) = (1, 1) given explicitly: bitwise the one-process run")
        layouts = (("dp2", ["--dp", "2"], 2),
                   ("train_dp2z3_gen_dp2",
                    ["--train-layout", "--dp 2 --zero 3", "--gen-layout", "--dp 2", "--trace",
                     os.path.join(tmp, "z3_trace.json")], 2),
                   ("train_tp2_gen_dp2", ["--train-layout", "--tp 2", "--gen-layout", "--dp 2"], 2),
                   ("train_tp2dp2z1_gen_dp4",
                    ["--train-layout", "--tp 2 --dp 2 --zero 1", "--gen-layout", "--dp 4"], 4),
                   ("train_pp2_gen_dp2", ["--train-layout", "--pp 2", "--gen-layout", "--dp 2"], 2),
                   ("train_pp2dp2z3_gen_dp4",
                    ["--train-layout", "--pp 2 --dp 2 --zero 3", "--gen-layout", "--dp 4"], 4),
                   ("train_dp2z3_gen_tp2",
                    ["--train-layout", "--dp 2 --zero 3", "--gen-layout", "--tp 2"], 2),
                   ("train_tp2dp2z3_gen_tp2dp2",
                    ["--train-layout", "--tp 2 --dp 2 --zero 3", "--gen-layout", "--tp 2 --dp 2"], 4),
                   ("train_pp2tp2_gen_tp2dp2",
                    ["--train-layout", "--pp 2 --tp 2", "--gen-layout", "--tp 2 --dp 2"], 4),
                   ("train_cp2_gen_dp2", ["--train-layout", "--cp 2", "--gen-layout", "--dp 2"], 2),
                   ("train_cp2tp2sp_gen_tp2dp2",
                    ["--train-layout", "--cp 2 --tp 2 --sequence-parallel", "--gen-layout",
                     "--tp 2 --dp 2"], 4),
                   ("train_pp2cp2z3_gen_dp4",
                    ["--train-layout", "--pp 2 --cp 2 --zero 3", "--gen-layout", "--dp 4"], 4))
        # the (cp 2, dp 2) layout runs twice (bitwise); two runs at a time (the ranks of
        # these tiny runs mostly wait on each other: the suite's time, not the checks)
        cp2 = next(j for j in layouts if j[0] == "train_cp2_gen_dp2")
        # the MoE policy: one process, expert parallel training (2 ep groups of 2), and a
        # pipeline (pp 2 x dp 2 with ep 2: each stage one MoE layer, its auxiliary losses
        # weighted in the GRPO loss; a stage dumps its own layers' decisions)
        moe_layouts = (("moe_train_dp4ep2_gen_dp4", "--dp 4 --ep 2", 4),
                       ("moe_train_pp2dp2ep2_gen_dp4", "--pp 2 --dp 2 --ep 2", 2))
        moe_dp = {name: dp for name, _, dp in moe_layouts}  # data ranks: one route dump each
        moe_jobs = (("moe_one", [], 1),) + tuple(
            (name, ["--train-layout", train, "--gen-layout", "--dp 4"], 4)
            for name, train, _ in moe_layouts)
        jobs = list(layouts) + [(cp2[0] + "_again",) + cp2[1:]] + [j + (moe,) for j in moe_jobs]
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            done = list(pool.map(lambda j: rl(j[0], j[1], ranks=j[2], init=j[3] if len(j) > 3
                                              else sft), jobs))
        results = dict(zip([j[0] for j in jobs], done))
        m_moe, w_moe = results["moe_one"]
        check([r.get("ratio_not_one_first_epoch") for r in m_moe if "reward_mean" in r] ==
              [0, None, None] and all(r["grad_norm"] > 0 for r in m_moe if "reward_mean" in r),
              "MoE, one process: first-epoch ratio exactly 1, a gradient every iteration")
        check("routes dropless (capacity factor 1.25 not applied" in logs["moe_one"],
              "MoE: the model's capacity limit is not applied in rl (one line says so)")

        # A layout's weights differ from one process's by rounding (~1e-7), and two things
        # are discrete: a sampled token whose uniform draw lies within that much of its
        # interval's end (or that nearly ties a neighbour, or a top-k/top-p cut), and a MoE's
        # top-k routing of a token whose router probabilities tie within rounding (docs/
        # moe.md, "Routing flips"). Either moves the run far apart (a flip seen once in
        # about 30 seeds each). Every run dumps its draws with their margins, and a MoE its
        # router decisions (--dump-dir): a pair that differs is accepted, and run again with
        # the next seed, only when its first difference is a near tie on both sides and the
        # runs agree before it; any other difference fails.
        n_seq, epochs = 4 * 4, 2  # a rollout's sequences (prompts x group), --ppo-epochs
        refs = {(sft, seed): (m1, w1, dump("one")), (moe, seed): (m_moe, w_moe, dump("moe_one"))}

        def earliest_flip(d_ref, d_got, dp, is_moe):
            """(iteration, how many iterations' rewards must agree, its description, near
            tie) of the first difference, None if none."""
            found = []
            f = sample_flips.first_flip(sample_flips.samples(d_ref), sample_flips.samples(d_got),
                                        n_seq)
            if f is not None:  # a rollout: before the iteration's updates
                it, flips = f
                found.append(((it, 0), it, "draws differ first in iteration "
                              f"{it + 1} ({len(flips)} sequence(s)): {sample_flips.describe(flips)}",
                              sample_flips.near_tie(flips)))
            if is_moe:
                steps = 3 * epochs
                f = moe_routes.first_flip(moe_routes.routes(d_ref, 1, steps),
                                          moe_routes.routes(d_got, dp, steps))
                if f is not None:  # an update: after the iteration's rollout
                    s, flips = f
                    found.append(((s // epochs, 1), s // epochs + 1, f"routing differs first at "
                                  f"update {s + 1} ({len(flips)} token(s)): "
                                  f"{moe_routes.describe(flips)}", moe_routes.near_tie(flips)))
            return min(found) if found else None

        def settle(name, extra, ranks, init):
            """(one process's run, the layout's run) at the first seed without a flip; None
            after a failed check."""
            got, run_seed = results[name], seed
            for retry in range(SEEDS):
                m_ref, w_ref, d_ref = refs[(init, run_seed)]
                suffix = "" if run_seed == seed else f"_s{run_seed}"
                flip = earliest_flip(d_ref, dump(name + suffix), moe_dp.get(name), init == moe)
                if flip is None:
                    if retry:
                        print(f"{name}: no flip with --seed {run_seed}")
                    return (m_ref, w_ref), got
                (it, _), agree, what, near = flip
                its_ref = [r for r in m_ref if "reward_mean" in r]
                its_got = [r for r in got[0] if "reward_mean" in r]
                before = all(its_ref[i][k] == its_got[i][k] for i in range(agree)
                             for k in ("reward_mean", "completion_len")) and \
                    all(abs(its_got[i][k] - its_ref[i][k]) <= TOL * abs(its_ref[i][k])
                        for i in range(it) for k in ("loss", "grad_norm"))
                check(near and before, f"{name} (--seed {run_seed}): {what}; "
                      f"{'near tie' if near else 'NOT A NEAR TIE'}; the iterations before "
                      f"{'agree' if before else 'DIFFER'}")
                if not (near and before):
                    return None
                run_seed += 1
                print(f"{name}: both runs again with --seed {run_seed}")
                if (init, run_seed) not in refs:
                    ref_name = ("moe_one" if init == moe else "one") + f"_s{run_seed}"
                    refs[(init, run_seed)] = rl(ref_name, init=init, run_seed=run_seed) + \
                        (dump(ref_name),)
                got = rl(name + f"_s{run_seed}", extra, ranks, init, run_seed)
            check(False, f"{name}: a near-tie flip at each of {SEEDS} seeds, the weights were "
                  "never compared")
            return None

        for name, extra, ranks, *init in list(layouts) + [j + (moe,) for j in moe_jobs[1:]]:
            pair = settle(name, extra, ranks, init[0] if init else sft)
            if pair is None:
                continue
            (m1_, w1_), (m, w) = pair
            same = [r.get("reward_mean") for r in m] == [r.get("reward_mean") for r in m1_] and \
                [r.get("completion_len") for r in m] == [r.get("completion_len") for r in m1_]
            check(same, f"{name}: the same rewards and completion lengths as one process")
            whole, worst, tensor = weights_error(w, w1_, 32)
            check(whole <= TOL and worst <= 10 * TOL,
                  f"{name}: weights after 3 iterations: {whole:.2e} (worst {tensor} {worst:.2e})")
            its = [r for r in m if "reward_mean" in r]
            check(its[0].get("ratio_not_one_first_epoch") == 0,
                  f"{name}: first-epoch ratio exactly 1")
        # --trace: a span per phase, reshard included (ZeRO-3 keeps a generation copy)
        names = {e.get("name") for e in json.load(open(os.path.join(tmp, "z3_trace.json")))
                 ["traceEvents"]}
        want = {"generation", "reward", "logprob", "reference", "update", "reshard"}
        check(want <= names, f"--trace (ZeRO-3 training, dp 2 generation): {sorted(want & names)}")
        m, w = results["train_cp2_gen_dp2"]
        m_again, w_again = results["train_cp2_gen_dp2_again"]
        check(m_again == m and all((w_again[k] == w[k]).all() for k in w),
              "train_cp2_gen_dp2 twice: bitwise the same metrics and weights")

        # GRPO learns: rewarded for each digit 5-9 in the completion (at most 6), the policy
        # goes from about 0.5 to about 5 in 20 iterations (seeds 5-7: 5.4-5.6).
        learn = os.path.join(tmp, "learn.jsonl")
        args = list(base)
        args[args.index("--iterations") + 1] = "20"
        for k, v in (("--prompts-per-iter", "8"), ("--group-size", "8"), ("--ppo-micro-batch", "16"),
                     ("--ppo-epochs", "1"), ("--kl-coef", "0"), ("--lr", "1e-2"),
                     ("--reward-cmd", "awk -F'\"completion\":\"' '{print gsub(/[5-9]/, \"\", $2)}'")):
            args[args.index(k) + 1] = v
        run([a.loom] + args + ["--min-lr", "1e-2", "--warmup-steps", "0", "--metrics", learn],
            "learning run")
        r = [x["reward_mean"] for x in metrics(learn) if "reward_mean" in x]
        first, last = sum(r[:3]) / 3, sum(r[-3:]) / 3
        check(len(r) == 20 and last >= 3 * first and last >= 2.5,
              f"GRPO learns a dense reward: {first:.3f} -> {last:.3f} (first and last 3 iterations)")

        # --time-limit: no iteration starts after it; the held-out accuracy and the weights
        # of the policy follow
        mt, wt = rl("time_limit", ["--time-limit", "1e-7"])
        it_rows = [r for r in mt if "reward_mean" in r]
        check(len(it_rows) == 1 and mt[-1] == {"iteration": 1, "heldout_accuracy":
                                               mt[-1].get("heldout_accuracy")} and wt,
              f"--time-limit: one iteration, then the held-out accuracy and the weights ({mt[-1]})")

        def bad(what, extra, want, prompts=None):
            args = list(base)
            if prompts:
                args[args.index("--prompts") + 1] = prompts
            p = subprocess.run([a.loom] + args + extra, capture_output=True, text=True)
            last = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
            check(p.returncode == 2 and want in last,
                  f"bad input, {what}: exit {p.returncode}, '{last}'")

        bad("G < 2", ["--group-size", "1"], "--group-size")
        bad("reward command fails", ["--reward-cmd", "cat >/dev/null; exit 3"], "--reward-cmd")
        bad("reward not a number", ["--reward-cmd", "awk '{print \"x\"}'"], "output line 1")
        bad("too few rewards", ["--reward-cmd", "head -n 2 >/dev/null; echo 1"], "--reward-cmd")
        empty = os.path.join(tmp, "empty.txt")
        with open(empty, "w") as f:
            f.write("1+2=\n\n")
        bad("empty prompt line", [], empty + ":2: empty line", prompts=empty)
        bad("expert parallel, a dense model", ["--train-layout", "--ep 2"], "--n-experts")
        bad("MoE with a tp generation layout", ["--init-from", moe, "--gen-layout", "--tp 2"],
            "--gen-layout")
        bad("tp generation layout does not fit", ["--gen-layout", "--tp 2"], "--gen-layout")
        bad("pipelined generation layout", ["--gen-layout", "--pp 2"], "--gen-layout")
        bad("tp generation does not divide the heads", ["--gen-layout", "--tp 8"],
            "must divide the model's heads")
        bad("gen layout does not fit", ["--gen-layout", "--dp 3"], "--gen-layout")


if __name__ == "__main__":
    run_test(main)
