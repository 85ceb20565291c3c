#!/usr/bin/python3
"""--precision bf16 in every kind of layout: dp 2 (ZeRO 1 and 3), tp 2 with and without
sequence parallelism, pp 2 (gpt2 1f1b, llama zb and interleaved), cp 2 (llama), dp 2 x ep 2
(llama MoE) against one bf16 process, 8 steps, both families; dp2_zero3 (and gpt2's tp2_sp,
the MoE's ZeRO-3) twice bitwise.

Why the tolerance is not fp32's 1e-5. In fp32 the layouts differ from one process only by
summation order: operands of the GEMMs differ by delta ~ 1e-7 relative. In bf16 those
operands are rounded to 8 significant bits first, and rounding turns a small difference
into either none or one bf16 step: an operand within delta of a rounding midpoint (a
fraction ~ delta / 2^-8 of them) moves by ~2^-8 of itself, the others not at all. Over a
tensor that is a relative 2-norm difference of about sqrt(delta / 2^-8) * 2^-8 =
sqrt(delta) * 2^-4 ~ 2e-5 per GEMM (instead of 1e-7), which backward, AdamW and 8 steps
carry on. dp keeps every GEMM's operands and sums as one process has them, so it stays at
fp32's level (measured 0 to 3e-7); tp with fp32 messages split the row-parallel GEMMs' sums
over the ranks, so it saw the flips: measured over 3 seeds, losses 2.9e-6 to 1.2e-5, the
whole model's weights 2.0e-5 to 1.3e-4, the worst single tensor 1.2e-4 to 1.2e-3. Bounds:
losses 1e-4, whole model 4e-4 (3x the worst measured), worst tensor 5e-3 (a small tensor
whose few elements flip, as fp32's per-tensor bound is 10x its whole-model one).

Tensor parallelism. Under bf16 its linears' messages are bf16 (tp/tp.h): each rank's partial
sum of a row-parallel output or a column-parallel input gradient is rounded to bf16 and the
pieces added in fp32 in rank order (without sequence parallelism the sum is rounded once more
for the bf16 all-gather); the gathers of GEMM inputs move bf16, which the GEMMs read unchanged.
Those roundings are full bf16 steps, not reorderings: against the plain process tp 2 measured
(seeds 1-2) whole weights 5.4e-4 to 1.3e-3, worst tensor 3.6e-3 to 3.2e-2, as far as fp32 is
from bf16 (above). So, as for pipelines, tp is compared with one bf16 process that rounds the
same values at the same places: LOOM_BF16_ROUND_TP=2 (model/tp_round.c) computes each of those
sums as tp's two partial GEMMs (the same shapes, prepared as tp prepares them), rounds each and
adds them in rank order (`2,sum`: and rounds the sum, for tp without sequence parallelism).
Measured (seed 1): llama tp 2 and tp 2 + sp and gpt2 tp 2 bitwise equal to it, gpt2 tp 2 + sp
within 1.1e-10 of the whole weights (its norm gradients are summed over the ranks' rows in
another order). Bounds: the same three. Each tp run must also be more than 1e-5 from the plain
process (its messages were rounded: measured 5.8e-4 and up). And the bytes: rank 0's count of
what it sent (the run's end line) in bf16 is exactly half of what the fp32 tp 2 run sent for
the same messages (llama: every linear's message is bf16, the rest fp32 in both).

Pipelines. Under bf16 the stage boundary's messages are bf16 (docs/precision.md): the
residual stream entering the next stage is rounded to nearest even once per boundary in
forward, and its gradient once per boundary in backward, a relative change of at most
u = 2^-8 per element (RMS about 2^-9). That is one extra rounding per crossing of each
kind, not a reordering, so it is not the delta of the argument above but a full bf16
step: against the plain bf16 process the pp runs measured (seeds 1-3, both families, 1f1b,
gpipe, zb and interleaved) losses 2.0e-5 to 1.1e-4, whole weights 5.1e-4 to 2.2e-3, worst
tensor 4.4e-3 to 4.6e-2. Why that large: the step-1 gradient of every weight below a
boundary changes by ~2^-9 relative per element (more where the token sum cancels), and
AdamW (eps 1e-6, so an update is ~ lr * sign for most elements, +-lr flipped where a
near-cancelling element changes sign: test_grad_reduce_bf16.py's analysis) turns a
relative gradient change r into a relative weight change ~ r * (sum of lr) / |w| ~ r
here; that is as large as fp32 against bf16 (8.8e-4 to 2.7e-3, below), so no bound against
the plain process could tell bf16 messages from a layout that is not bf16 at all.
Instead the pp runs are compared with one bf16 process that rounds at the same two places
(LOOM_BF16_ROUND_STREAM=l,...: the residual stream entering layer l and its gradient
leaving it, rounded in place, model/model.c): then every GEMM operand and sum is the one
process's again, and the derivation above holds with delta the fp32 reordering (gpt2's
tied embedding: its two copies' gradients are added on the first and last stage). Measured
over 4 seeds (1-4): llama bitwise equal (1f1b, zb, interleaved); gpt2 losses 0 to 5.7e-6,
whole 7.7e-9 to 3.7e-5, worst tensor 1.8e-8 to 3.8e-4 (the sign flips of near-cancelling
elements stay at that reordering's level, inside the dp/tp bounds above). Bounds: the same
three. The check that the messages really are bf16: each pp run must differ from the plain
process by more than 1e-5 in the whole model's weights (measured 5.1e-4 and up: 50x above
it); fp32 messages (before this) measured 0 to 3e-7 there.

What this still catches: a layout whose GEMMs are not in bf16 at all (the sensitivity
check: one process in fp32 differs from the bf16 one by 8.8e-4 to 2.7e-3 in the whole
model's weights, above the bound), a pipeline whose messages are not rounded, or rounded
elsewhere than at the boundary (the plain/rounded pair), or any real error of the layout,
which moves fp32 runs far above 1e-5 and bf16 runs as far.

Experts (llama MoE, 4 experts, dp 2 x ep 2 at ZeRO 1 and 3; gpt2 MoE at ZeRO 1). The forward dispatch sends the
experts' rows as bf16, rounded once where the fc GEMM would round them: the same function
(checked bitwise against the build before by hand), half its bytes: every forward dispatch
is followed by one backward dispatch of the same rows in fp32, so rank 0's bf16 dispatch
bytes are exactly half its fp32 ones (no evaluation here). The experts' outputs are rounded
to bf16 values in every layout (one process too: a rounding of its own, where autocast's
down-projection output is bf16) and the forward combine carries them as bf16; the
experts' input gradients likewise (rounded in every layout, where autocast's fc GEMM gives
them in bf16) for backward's combine. Backward's dispatch of the output gradients travels
as bf16 too: with llama's bias-free experts their only readers there are the proj GEMMs,
which round them anyway (the same function); gpt2's experts' proj bias sums them, so they
are rounded to bf16 values first in every layout (where autocast's output gradient is
bf16; gpt2 MoE dp 2 x ep 2 at ZeRO 1 is checked too). So no exchange is fp32 and rank 0's
dispatch bytes equal its combine bytes (with every token routed to every expert each rank
receives as many rows as it sends). Against one process the dp
argument holds as long as routing is continuous, so the check routes every token to every
expert (top-4 of 4: the choice cannot flip, each token's rows still cross the ranks):
measured over 16 seeds (2026-12-07, ZeRO-3) losses up to 2.1e-5, whole weights 9.6e-5,
worst tensor 4.1e-4, inside the dp bounds, while fp32 against bf16 was 1.1e-3 to 3.0e-3.
With top-2 of 4 a token whose margin is within the flips' reach picks another expert and
changes that expert's whole gradient: over 32 seeds whole weights up to 2.3e-3, worst tensor
1.7e-2, as far as fp32 is from bf16, so no bound there would tell a layout error from a flip
(test_layouts_moe.py compares top-2 routing across layouts in fp32, near ties allowed).

The logits: one process (and dp, pp) keeps them in bf16, the head's fp32 sums rounded once;
tp 2's vocabulary-parallel loss reads fp32 logits, which its head rounds to the same bf16
values in place, so tp computes the same function. Without that rounding tp 2 computed another
function (unrounded logits) and exceeded the weight bound (4.1e-4 at seed 592893038, when tp
was compared with the plain process; 4.5e-5 with it).

Usage: test_layouts_bf16.py --loom PATH [--seed S]
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
from loomtest import (ADAM_EPS, Layouts, bitwise, loss_error, parse_test_args, weights_error,  # noqa: E402
                      write_text_shard)
from loomtest import bf16_gemms, check, run_test  # noqa: E402

D_MODEL = 48
LOSS_TOL, WHOLE_TOL, TENSOR_TOL = 1e-4, 4e-4, 5e-3
PP_MIN = 1e-5  # a pp run's distance from the plain process: above it, its messages are bf16
LAYOUTS = [
    ("dp2_zero1", 2, ["--dp", "2", "--zero", "1"]),
    ("dp2_zero3", 2, ["--dp", "2", "--zero", "3"]),
]
# (name, flags, LOOM_BF16_ROUND_TP of the one process that rounds as it does)
TENSOR = [("tp2_sp", ["--tp", "2", "--sequence-parallel"], "2"), ("tp2", ["--tp", "2"], "2,sum")]
TP_BYTES = re.compile(r"tensor-parallel messages: (\d+) bytes sent per step by rank 0 "
                      r"\((\d+) in bf16, (\d+) in fp32\)")
EP_BYTES = re.compile(r"expert-parallel messages: \d+ bytes sent per step by rank 0 .*: dispatch "
                      r"(\d+) bf16 \+ (\d+) fp32, combine (\d+) bf16 \+ (\d+) fp32")
EXPERTS = [("dp2_ep2_zero1", ["--dp", "2", "--ep", "2", "--zero", "1"]),
           ("dp2_ep2_zero3", ["--dp", "2", "--ep", "2", "--zero", "3"])]
CP_BYTES = re.compile(r"context-parallel messages: (\d+) bytes sent per step by rank 0 "
                      r"\((\d+) in bf16, (\d+) in fp32\)")
# cp 2 in bf16 (llama): its ring K/V blocks and Ulysses' qkv/output all-to-alls travel as bf16,
# which changes no value (qkv are bf16 values, the output is rounded right after attention:
# tests/parallel/test_cp_attention.c proves it bitwise); against one process it differs only
# as fp32 cp does (attention summed in another order, then rounded), so the dp tolerances hold
CONTEXT = [("cp2_ring", ["--cp", "2"]), ("cp2_ulysses", ["--cp", "2", "--cp-mode", "ulysses"])]
# (name, layers, the layers whose input is a stage boundary, flags): against the rounded process
# (gpipe runs 1f1b's code in another order: measured the same bits as 1f1b)
PIPELINES = {
    "gpt2": [("pp2_1f1b", 2, "1", ["--pp-schedule", "1f1b"])],
    "llama": [("pp2_zb", 2, "1", ["--pp-schedule", "zb"]),
              ("pp2_interleaved", 4, "1,2,3", ["--pp-schedule", "interleaved",
                                                "--virtual-stages", "2"])],
}


def check_tp_rounded(family, base, tmp, d_model):
    """The dit and vlm tp 2 in bf16, with and without sequence parallelism
    (test_layouts_dit.py, test_layouts_vlm.py call this on their own base command, fp32
    flags without --precision): their blocks use the same linears (model/tp_linear.c), whose
    partial sums tp 2 sends as bf16 and, without sequence parallelism, rounds once more (the
    TENSOR list's rounding flags, as for gpt2 and llama). One process with
    LOOM_BF16_ROUND_TP set so rounds the same sums (model/tp_round.c); everything else tp 2
    computes on the same operands in the same order as one process (the replicated parts,
    the dit's conditioning and the vlm's encoder, are each rank's whole computation; the
    vlm's vocabulary-parallel loss as gpt2's and llama's above, which are bitwise), so the
    bound is bitwise on oneDNN's bf16 matmul (with the GEMMs widened to fp32 on a CPU
    without bf16 instructions, a shard sums in OpenBLAS's order for its shape: the layout
    bounds above) (measured seeds 1-5: bitwise, dit and vlm). The rounding is real: tp 2
    differs from the plain bf16 process by more than PP_MIN (measured seeds 1-5: dit 4.3e-5
    to 1.4e-4, vlm 4.4e-4 to 9.8e-4), and rank 0 sent bf16 bytes. About 6 s a family on
    this machine (five small runs)."""
    lay = Layouts(base + ["--precision", "bf16"], tmp, f"{family}_bf16_")
    plain = lay.run("single", 1)
    for name, extra, rounding in TENSOR:
        rounded = run_rounded_as_tp(lay, rounding)
        got = lay.run(name, 2, extra)
        sent = TP_BYTES.search(got.stderr)
        check("the linears' sums and gathers sent as bf16" in got.stderr and sent and
              int(sent.group(2)) > 0, f"{family} bf16 {name}: the messages' start-up line and "
              f"{sent.group(0) if sent else 'no bytes line'}")
        l_err = loss_error(got.losses, rounded.losses)
        whole, worst, w_name = weights_error(got.params, rounded.params, d_model)
        # on GEMMs widened to fp32 (no bf16 CPU) a shard sums in OpenBLAS's order for its
        # shape, not the whole GEMM's: the layout bounds above instead of bitwise
        widened = bf16_gemms(got.stderr) == "widened"
        same = (l_err <= LOSS_TOL and whole <= WHOLE_TOL and worst <= TENSOR_TOL if widened
                else bitwise(got, rounded))
        check(same, f"{family} bf16 {name} against one process rounding the partial sums as it "
              f"does (LOOM_BF16_ROUND_TP={rounding}): "
              f"{'within the layout bounds (GEMMs widened)' if widened else 'bitwise'} (losses "
              f"{l_err:.1e}, weights {whole:.1e}, worst tensor {worst:.1e} {w_name})")
        check_moved(family, name, got, plain, d_model)


def run_rounded_as_tp(lay, rounding):
    """One bf16 process that rounds the partial sums as tp 2 does (LOOM_BF16_ROUND_TP)."""
    os.environ["LOOM_BF16_ROUND_TP"] = rounding
    try:
        return lay.run(f"rounded_tp_{rounding.replace(',', '_')}", 1)
    finally:
        del os.environ["LOOM_BF16_ROUND_TP"]


def check_moved(family, name, got, plain, d_model):
    """tp's bf16 messages are real roundings: the run is more than PP_MIN from the plain
    bf16 process."""
    whole, _, _ = weights_error(got.params, plain.params, d_model)
    check(whole > PP_MIN, f"{family} bf16 {name}: its bf16 messages move the weights "
          f"{whole:.1e} from the plain process (> {PP_MIN:.0e})")


def compare(family, name, got, ref, what, tol=(LOSS_TOL, WHOLE_TOL, TENSOR_TOL)):
    """got against ref within tol: (losses, whole model's weights, worst tensor)."""
    l_err = loss_error(got.losses, ref.losses)
    whole, worst, w_name = weights_error(got.params, ref.params, D_MODEL)
    check(l_err <= tol[0] and whole <= tol[1] and worst <= tol[2],
          f"{family} bf16 {name} against {what}: losses {l_err:.1e} (<= {tol[0]:.1e}), "
          f"weights {whole:.1e} (<= {tol[1]:.1e}), worst tensor {worst:.1e} {w_name} "
          f"(<= {tol[2]:.1e})")


def check_experts(family, base, tmp):
    """MoE in bf16, every token to every expert (top-4 of 4: routing cannot flip): dp 2 x ep
    2 (llama: ZeRO 1 and 3, ZeRO-3 twice bitwise; gpt2, whose experts have biases: ZeRO 1)
    against one bf16 process within the dp bounds (docstring), every exchange in bf16."""
    lay = Layouts(base + ["--n-layer", "2", "--precision", "bf16", "--n-experts", "4",
                          "--top-k", "4", "--capacity-factor", "0"], tmp, f"{family}_moe_")
    ref = lay.run("single", 1)
    for name, extra in EXPERTS if family == "llama" else EXPERTS[:1]:
        got = lay.run(name, 2, extra)
        compare(f"{family} MoE", name, got, ref, "one process")
        sent = EP_BYTES.search(got.stderr)
        d16, d32, c16, c32 = (int(sent.group(i)) for i in (1, 2, 3, 4)) if sent else (0,) * 4
        check(sent and c16 > 0 and d32 == 0 and c32 == 0 and d16 == c16,
              f"{family} MoE bf16 {name}: {sent.group(0) if sent else 'no bytes line'}: both "
              f"dispatches and both combines in bf16, the same rows each way")
    if family == "llama":
        again = lay.run("dp2_ep2_zero3_again", 2, EXPERTS[1][1])
        check(bitwise(again, lay.runs["dp2_ep2_zero3"]),
              "llama MoE bf16 dp2_ep2_zero3 twice: bitwise the same losses and weights")


def plan_cp_bytes(base, precision, extra):
    """loom plan --explain's cp_message_bytes (total, bf16, fp32) for the run base + extra."""
    p = subprocess.run([base[0], "plan"] + base[2:] + ["--n-layer", "2", "--precision", precision,
                                                       "--explain", " ".join(extra), "--json"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return f"loom plan exit {p.returncode}: {p.stderr[-500:]}"
    j = json.loads(p.stdout)
    return [int(j.get(k, -1)) for k in ("cp_message_bytes", "cp_message_bytes_bf16",
                                         "cp_message_bytes_fp32")]


def main():
    args = parse_test_args()
    seed = args.seed
    tmp = tempfile.mkdtemp(prefix="loom_layouts_bf16_")
    try:
        data = os.path.join(tmp, "train.bin")
        write_text_shard(data, seed)
        for family in ("gpt2", "llama"):
            base = [args.loom, "train", "--family", family, "--vocab-size", "256",
                    "--seq-len", "24", "--d-model", str(D_MODEL),
                    "--n-head", "8" if family == "llama" else "4", "--n-kv-head", "4",
                    "--d-ff", "96", "--micro-batch", "2", "--global-batch", "8",
                    "--steps", "8", "--lr", "3e-3", "--warmup-steps", "2",
                    "--grad-clip", "1.0", "--seed", str(seed), "--log-every", "0",
                    "--threads", "1", "--data", data, "--bucket-mb", "0.02",
                    "--adam-eps", ADAM_EPS]
            layouts = Layouts(base + ["--n-layer", "2", "--precision", "bf16"], tmp, f"{family}_")
            ref = layouts.run("single", 1)
            check(bf16_gemms(ref.stderr) is not None, f"{family}: the bf16 start-up line "
                  f"({bf16_gemms(ref.stderr)})")
            print(f"{family}: one bf16 process, loss {ref.losses[0]:.4f} -> {ref.losses[-1]:.4f}")
            for name, ranks, extra in LAYOUTS:
                compare(family, name, layouts.run(name, ranks, extra), ref, "one process")
            for name, extra, emulate in TENSOR:
                rounded = run_rounded_as_tp(layouts, emulate)
                got = layouts.run(name, 2, extra)
                check("the linears' sums and gathers sent as bf16" in got.stderr,
                      f"{family} {name}: the messages' start-up line")
                compare(family, name, got, rounded,
                        f"one process rounding the partial sums as tp 2 (LOOM_BF16_ROUND_TP={emulate})")
                check_moved(family, name, got, ref, D_MODEL)
            if family == "llama":  # the bytes: every linear's message at 2 bytes an element
                tp32 = Layouts(base + ["--n-layer", "2"], tmp, f"{family}_fp32_").run(
                    "tp2", 2, ["--tp", "2"])
                b16, b32 = (TP_BYTES.search(r.stderr) for r in (layouts.runs["tp2"], tp32))
                check(b16 and b32 and int(b32.group(2)) == 0 and int(b16.group(2)) > 0 and
                      2 * int(b16.group(2)) + int(b16.group(3)) == int(b32.group(1)),
                      f"{family} tp2 bytes sent per step by rank 0: bf16 run "
                      f"{b16.group(0) if b16 else None}; fp32 run {b32.group(0) if b32 else None}: "
                      f"the bf16 messages half of what fp32 sent for them")
            for name, extra in CONTEXT if family == "llama" else []:
                got = layouts.run(name, 2, extra)
                compare(family, name, got, ref, "one process")
                b16 = CP_BYTES.search(got.stderr)
                ok, fp32_line = b16 and int(b16.group(2)) > 0, ""
                if name == "cp2_ring":  # the bytes: the K/V blocks at 2 bytes an element
                    b32 = CP_BYTES.search(Layouts(base + ["--n-layer", "2"], tmp,
                                                  f"{family}_fp32_").run(name, 2, extra).stderr)
                    ok = ok and b32 and int(b32.group(2)) == 0 and \
                        2 * int(b16.group(2)) + int(b16.group(3)) == int(b32.group(1))
                    fp32_line = f"; fp32 run {b32.group(0) if b32 else None}"
                else:  # Ulysses: d(out) and dqkv too (no key/value head replicated here)
                    ok = ok and int(b16.group(3)) == 0
                check(ok, f"{family} {name} bytes sent per step by rank 0: bf16 run "
                      f"{b16.group(0) if b16 else None}{fp32_line}: bf16 messages, half of what "
                      f"fp32 sent for them")
                # loom plan prices what the run sent: its cp_message_bytes are the line's
                for prec, line in [("bf16", b16)] + ([("fp32", b32)] if name == "cp2_ring" else []):
                    planned = plan_cp_bytes(base, prec, extra)
                    check(line and planned == [int(line.group(i)) for i in (1, 2, 3)],
                          f"{family} {name} {prec}: loom plan's cp_message_bytes (total, bf16, "
                          f"fp32) {planned}, the run's line {line.group(0) if line else None}")
            for name, n_layer, bounds, extra in PIPELINES[family]:
                lay = layouts if n_layer == 2 else Layouts(
                    base + ["--n-layer", str(n_layer), "--precision", "bf16"], tmp,
                    f"{family}{n_layer}_")
                rounded = lay.runs.get(f"rounded_{bounds}")
                if rounded is None:
                    os.environ["LOOM_BF16_ROUND_STREAM"] = bounds
                    try:
                        rounded = lay.run(f"rounded_{bounds}", 1)
                    finally:
                        del os.environ["LOOM_BF16_ROUND_STREAM"]
                got = lay.run(name, 2, ["--pp", "2"] + extra)
                check("sent as bf16" in got.stderr, f"{family} {name}: the messages' start-up line")
                compare(family, name, got, rounded,
                        f"one process rounding the stream entering layer(s) {bounds}")
                if n_layer == 2:  # (the interleaved run's plain process would be one more run)
                    whole, _, _ = weights_error(got.params, ref.params, D_MODEL)
                    check(whole > PP_MIN, f"{family} bf16 {name}: its bf16 messages move the "
                          f"weights {whole:.1e} from the plain process (> {PP_MIN:.0e})")
            again = layouts.run("dp2_zero3_again", 2, LAYOUTS[1][2])
            check(bitwise(again, layouts.runs["dp2_zero3"]),
                  f"{family} bf16 dp2_zero3 twice: bitwise the same losses and weights")
            if family == "gpt2":  # its sp run is not bitwise its reference (norm sums' order)
                again = layouts.run("tp2_sp_again", 2, TENSOR[0][1])
                check(bitwise(again, layouts.runs["tp2_sp"]),
                      f"{family} bf16 tp2_sp twice: bitwise the same losses and weights")
            check_experts(family, base, tmp)
            fp32 = Layouts(base + ["--n-layer", "2"], tmp, f"{family}_fp32_").run("single", 1)
            whole, _, _ = weights_error(fp32.params, ref.params, D_MODEL)
            l_err = loss_error(fp32.losses, ref.losses)
            check(whole > WHOLE_TOL,
                  f"{family} sensitivity: fp32 against bf16 differs by weights {whole:.1e} "
                  f"(> {WHOLE_TOL:.0e}; losses {l_err:.1e})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    run_test(main)
