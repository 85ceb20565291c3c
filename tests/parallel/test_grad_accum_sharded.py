#!/usr/bin/python3
"""--grad-accum sharded: ZeRO 2 and 3 reduce every micro-batch's gradients into the rank's
shard as backward produces them (no whole local gradient kept across micro-batches).

Llama and GPT-2 (tiny), 8 micro-batches per step on every rank: dp 4 with ZeRO-3 and
dp 2 with ZeRO-2 (sharded) against one process (losses and final weights
within 1e-5, the layouts criterion, tests/harness/loomtest.py), against today's ZeRO-3
with local accumulation (the same criterion; the sum's order differs: micro-batches are
summed after the reduction over ranks instead of before it, so it is not bitwise, and
the test says whether it happened to be), the same sharded layout twice (bitwise), and
the start-up report's gradient bytes (two adjacent ranges + the shard's sum, below local's
whole model for Llama, whose untied head of 1024 rows is handed over in 4 ranges), and the
local gradient pages resident at every range boundary (mincore) within the planned two
ranges. Pipelines (pp 2 x dp 2, 8 micro-batches per rank, 2 steps, Llama 1f1b ZeRO-2
and zb ZeRO-3, GPT-2 zb ZeRO-2; every action completing a micro-batch's backward of a
chunk, B or zb's W, reduces its ranges): against one process and the same layout with
local accumulation (the usual criterion; the test says whether bitwise), Llama's zb
layout twice bitwise, and the resident local gradient within the plan. Experts (a Llama
MoE, dp 4 x ep 2, ZeRO-2 and ZeRO-3, 8 micro-batches per rank): against one process with
the same micro-batches, ZeRO-3 twice bitwise, the resident local gradient within the plan
(one range); with a pipeline too (pp 2 x dp 2 x ep 2, ZeRO-2 1f1b sharded, ZeRO-3 zb by
default), against one process, zb twice bitwise. ZeRO-3 without --grad-accum (auto, the
default) is sharded: bitwise the run with --grad-accum sharded; the local runs name
--grad-accum local. Bad input: --grad-accum sharded with --zero 1, an unknown value: exit 2.
Usage: test_grad_accum_sharded.py --loom PATH [--seed S]
"""
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
from loomtest import (ADAM_EPS, TOL, Layouts, bitwise, loss_error, parse_test_args, weights_error,  # noqa: E402
                      write_text_shard)
from loomtest import check, keep_or_remove, run_test  # noqa: E402

D = 32


def base(loom, family, data, seed):
    # llama: an untied head of 1024 rows, larger than a block: handed over in 4 ranges
    return [loom, "train", "--family", family,
            "--vocab-size", "1024" if family == "llama" else "256", "--seq-len", "32",
            "--n-layer", "3", "--d-model", str(D), "--n-head", "4",
            "--n-kv-head", "2" if family == "llama" else "4", "--d-ff", "64",
            "--steps", "4", "--lr", "3e-3", "--warmup-steps", "1", "--grad-clip", "0.5",
            "--seed", str(seed), "--log-every", "0", "--threads", "1", "--data", data,
            "--bucket-mb", "0.01", "--adam-eps", ADAM_EPS]


def grads_mib(run):
    m = re.search(r"grads ([\d.]+) MiB \((?:local|sharded) accumulation\)", run.stderr)
    return float(m.group(1))


def resident(run):
    """(measured MiB, planned MiB, head ranges) of --grad-accum sharded's end line."""
    m = re.search(r"at most ([\d.]+) MiB measured, ([\d.]+) MiB planned \((?:two ranges|one "
                  r"range[^;]*); the head in (\d+) range", run.stderr)
    return float(m.group(1)), float(m.group(2)), int(m.group(3))


def compare(got, ref):
    le = loss_error(got.losses, ref.losses)
    we, worst, name = weights_error(got.params, ref.params, D)
    ok = len(got.losses) == len(ref.losses) and le <= TOL and we <= TOL and worst <= 10 * TOL
    return ok, f"losses {le:.2e}  weights {we:.2e} (worst {worst:.2e} {name})"


def pipelines(loom, family, data, seed, tmp):
    """pp 2 x dp 2, 8 micro-batches per rank: Llama 1f1b ZeRO-2 and zb ZeRO-3 (split
    backward: a block's ranges go with its W), zb twice; GPT-2 (its tied embedding reduced
    once a step, after the stages' swap) zb ZeRO-2."""
    flags = base(loom, family, data, seed)
    flags[flags.index("--steps") + 1] = "2"  # two steps: the sum is cleared between them
    lay = Layouts(flags, tmp, family + "_pp_")
    ref = lay.run("single", 1, ["--micro-batch", "4", "--global-batch", "32"])
    pp = ["--pp", "2", "--dp", "2", "--micro-batch", "2", "--global-batch", "32"]
    cases = (("2", "1f1b"), ("3", "zb")) if family == "llama" else (("2", "zb"),)
    for zero, schedule in cases:
        flags = pp + ["--zero", zero, "--pp-schedule", schedule]
        name = f"pp2_dp2_z{zero}_{schedule}"
        local = lay.run(name + "_local", 4, flags + ["--grad-accum", "local"])
        sharded = lay.run(name + "_sharded", 4, flags + ["--grad-accum", "sharded"])
        ok, text = compare(sharded, ref)
        check(ok, f"  pp2 dp2 ZeRO-{zero} {schedule} sharded vs one process: {text}")
        ok, text = compare(sharded, local)
        check(ok, f"  pp2 dp2 ZeRO-{zero} {schedule} sharded vs local: {text} "
              f"({'bitwise' if bitwise(sharded, local) else 'not bitwise: the sum order differs'})")
        got_mib, plan_mib, _ = resident(sharded)
        check(got_mib <= plan_mib, f"  pp2 dp2 ZeRO-{zero} {schedule} resident local gradient "
              f"(mincore, stage 0): {got_mib:.3f} <= {plan_mib:.3f} MiB planned")
    if family != "llama":
        return
    again = lay.run("pp2_dp2_z3_zb_sharded_again", 4,
                    flags + ["--grad-accum", "sharded"])
    check(bitwise(again, sharded), "  pp2 dp2 ZeRO-3 zb sharded twice: bitwise")


def experts(loom, data, seed, tmp):
    """--ep 2: a Llama MoE at dp 4 (expert replicas over edp 2), 8 micro-batches per rank;
    every range of every micro-batch reduce-scattered per kind (dense over dp, experts over
    edp) into the segments' sum. The aux losses depend on the micro-batch's tokens, so the
    one process runs the same micro-batches (1 x 32 tokens)."""
    flags = base(loom, "llama", data, seed)
    flags[flags.index("--steps") + 1] = "2"
    flags += ["--n-experts", "8", "--top-k", "2", "--capacity-factor", "0", "--moe-every", "1"]
    lay = Layouts(flags, tmp, "moe_")
    mb = ["--micro-batch", "1", "--global-batch", "32"]
    ref = lay.run("single", 1, mb)
    lay4 = mb + ["--dp", "4", "--ep", "2", "--grad-accum", "sharded"]
    for zero in ("2", "3"):
        got = lay.run(f"dp4_ep2_z{zero}_sharded", 4, lay4 + ["--zero", zero])
        ok, text = compare(got, ref)
        check(ok, f"  MoE dp4 x ep2 ZeRO-{zero} sharded vs one process: {text}")
        got_mib, plan_mib, _ = resident(got)
        check(got_mib <= plan_mib, f"  MoE dp4 x ep2 ZeRO-{zero} resident local gradient "
              f"(mincore): {got_mib:.3f} <= {plan_mib:.3f} MiB planned (one range)")
    again = lay.run("dp4_ep2_z3_sharded_again", 4, lay4 + ["--zero", "3"])
    check(bitwise(again, got), "  MoE dp4 x ep2 ZeRO-3 sharded twice: bitwise")
    # with a pipeline: each action completing a chunk's micro-batch reduces its ranges per
    # kind (blocking); ZeRO-3's default (no --grad-accum) is sharded
    pp = mb + ["--pp", "2", "--dp", "2", "--ep", "2"]
    for zero, schedule, extra in (("2", "1f1b", ["--grad-accum", "sharded"]), ("3", "zb", [])):
        name = f"pp2_dp2_ep2_z{zero}_{schedule}"
        got = lay.run(name, 4, pp + ["--zero", zero, "--pp-schedule", schedule] + extra)
        ok, text = compare(got, ref)
        check(ok, f"  MoE pp2 x dp2 x ep2 ZeRO-{zero} {schedule} sharded vs one process: {text}")
        got_mib, plan_mib, _ = resident(got)
        check(got_mib <= plan_mib, f"  MoE pp2 x dp2 x ep2 ZeRO-{zero} {schedule} resident local "
              f"gradient (mincore, stage 0): {got_mib:.3f} <= {plan_mib:.3f} MiB planned")
    again = lay.run(name + "_again", 4, pp + ["--zero", zero, "--pp-schedule", schedule])
    check(bitwise(again, got), f"  MoE pp2 x dp2 x ep2 ZeRO-{zero} {schedule} twice: bitwise")


def main():
    args = parse_test_args()
    seed = args.seed
    tmp = tempfile.mkdtemp(prefix="loom_grad_accum_")
    try:
        data = os.path.join(tmp, "train.bin")
        write_text_shard(data, seed)
        for family in ("llama", "gpt2"):
            lay = Layouts(base(args.loom, family, data, seed), tmp, family + "_")
            print(f"{family} (seed {seed}), 8 micro-batches per step:")
            ref = lay.run("single", 1, ["--micro-batch", "4", "--global-batch", "32"])
            dp4 = ["--dp", "4", "--micro-batch", "1", "--global-batch", "32"]
            dp2 = ["--dp", "2", "--micro-batch", "2", "--global-batch", "32"]
            local = lay.run("dp4_z3_local", 4, dp4 + ["--zero", "3", "--grad-accum", "local"])
            sharded = lay.run("dp4_z3_sharded", 4, dp4 + ["--zero", "3", "--grad-accum",
                                                         "sharded"])
            for name, run in (("dp4 ZeRO-3 local", local), ("dp4 ZeRO-3 sharded", sharded)):
                ok, text = compare(run, ref)
                check(ok, f"  {name:22s} vs one process: {text}")
            ok, text = compare(sharded, local)
            same = bitwise(sharded, local)
            check(ok, f"  sharded vs today's ZeRO-3: {text} "
                  f"({'bitwise' if same else 'not bitwise: the sum order differs'})")
            # ZeRO-3 at dp 2 is dp 4's code path; ZeRO-2 here (and in the pipelines)
            got = lay.run("dp2_z2_sharded", 2, dp2 + ["--zero", "2", "--grad-accum", "sharded"])
            ok, text = compare(got, ref)
            check(ok, f"  dp2 ZeRO-2 sharded vs one process: {text}")
            # ZeRO-3's default (auto) is sharded: the same run without the flag
            again = lay.run("dp4_z3_default", 4, dp4 + ["--zero", "3"])
            check(bitwise(again, sharded), "  dp4 ZeRO-3 sharded twice (the second by default, "
                  "no --grad-accum): bitwise")
            g_local, g_sharded = grads_mib(local), grads_mib(sharded)
            if family == "llama":  # gpt2's tied embedding is written whole by the head's
                # backward and stays beside the two ranges: at this size not below local's
                check(g_sharded < g_local, f"  report: grads {g_sharded:.3f} MiB sharded < "
                      f"{g_local:.3f} MiB local")
            got_mib, plan_mib, pieces = resident(sharded)
            want = 4 if family == "llama" else 1  # gpt2's head is tied to the embedding
            check(got_mib <= plan_mib and pieces == want,
                  f"  resident local gradient (mincore): {got_mib:.3f} <= {plan_mib:.3f} MiB "
                  f"planned, the head in {pieces} range(s) (expected {want})")
            pipelines(args.loom, family, data, seed, tmp)
        experts(args.loom, data, seed, tmp)
        for bad, want in ((["--zero", "1", "--dp", "2", "--micro-batch", "1", "--global-batch", "2",
                           "--grad-accum", "sharded"], "--grad-accum sharded"),
                          (["--grad-accum", "both"], "--grad-accum 'both'")):
            p = subprocess.run([args.loom, "train", "--data", data, "--steps", "1"] + bad,
                               capture_output=True, text=True, timeout=60)
            check(p.returncode == 2 and want in p.stderr,
                  f"  bad input {' '.join(bad)}: exit {p.returncode}, "
                  f"{p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ''}")
    finally:
        keep_or_remove(tmp, seed)


if __name__ == "__main__":
    run_test(main)
