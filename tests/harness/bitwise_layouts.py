#!/usr/bin/python3
"""Same layout, two builds: bitwise the same run? (A refactoring's proof, not a test.)

Runs 21 fixed layouts (both families, dp ZeRO 0-3, --overlap-param-gather, tp, sp, pp
schedules, MoE with ep, recompute, checkpoints; 8 steps, clipping on) with one loom binary
into OUT (metrics + --save-weights), or compares two such folders: per-step loss, grad
norm and validation loss, and the weights file's bytes. Issue 16 used it before/after.
usage: bitwise_layouts.py run LOOM OUT | bitwise_layouts.py cmp OUT_A OUT_B
(ONLY=name,name runs a subset)"""
import hashlib, json, os, subprocess, sys  # noqa: E401
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loomtest import write_text_shard
MPI = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1"]
MOE = ["--n-experts", "8", "--top-k", "2", "--capacity-factor", "1.0", "--aux-loss-coef", "0.01", "--z-loss-coef", "0.001"]
def base(fam):
    return ["train", "--family", fam, "--vocab-size", "256", "--seq-len", "16", "--n-layer", "4",
            "--d-model", "32", "--n-head", "4", "--n-kv-head", "2" if fam == "llama" else "4", "--d-ff", "64",
            "--micro-batch", "2", "--global-batch", "16", "--steps", "8", "--lr", "3e-3", "--warmup-steps", "2",
            "--grad-clip", "0.5", "--seed", "4242", "--log-every", "0", "--threads", "1",
            "--eval-every", "4", "--eval-batches", "2"]
L = [("g_single", "gpt2", 1, []), ("l_single", "llama", 1, []),
     ("g_dp2_z1", "gpt2", 2, ["--dp", "2", "--zero", "1"]), ("l_dp2_z2", "llama", 2, ["--dp", "2", "--zero", "2"]),
     ("g_dp2_z3", "gpt2", 2, ["--dp", "2", "--zero", "3"]), ("l_dp2_z0", "llama", 2, ["--dp", "2"]),
     ("l_dp2_z2_opg", "llama", 2, ["--dp", "2", "--zero", "2", "--overlap-param-gather"]),
     ("g_tp2_sp", "gpt2", 2, ["--tp", "2", "--sequence-parallel"]), ("l_tp2", "llama", 2, ["--tp", "2"]),
     ("g_pp2_1f1b", "gpt2", 2, ["--pp", "2"]), ("l_pp2_zb_dp2", "llama", 4, ["--pp", "2", "--dp", "2", "--pp-schedule", "zb", "--zero", "1"]),
     ("g_pp2_int_tp2", "gpt2", 4, ["--pp", "2", "--tp", "2", "--pp-schedule", "interleaved", "--virtual-stages", "2"]),
     ("l_pp2_dp2_z3", "llama", 4, ["--pp", "2", "--dp", "2", "--zero", "3"]),
     ("g_moe_single", "gpt2", 1, MOE + ["--shared-expert"]), ("l_moe_ep2_dp2", "llama", 2, MOE + ["--dp", "2", "--ep", "2"]),
     ("l_moe_ep2_dp2_z1", "llama", 2, MOE + ["--dp", "2", "--ep", "2", "--zero", "1"]),
     ("g_moe_ep2_dp4_z3", "gpt2", 4, MOE + ["--dp", "4", "--ep", "2", "--zero", "3"]),
     ("l_moe_tp2_ep2_dp2", "llama", 4, MOE + ["--tp", "2", "--dp", "2", "--ep", "2"]),
     ("g_moe_pp2_ep2_dp2", "gpt2", 4, MOE + ["--pp", "2", "--dp", "2", "--ep", "2"]),
     ("g_recompute_dp2_z3", "gpt2", 2, ["--dp", "2", "--zero", "3", "--recompute"]),
     ("l_ckpt_dp2", "llama", 2, ["--dp", "2", "--zero", "1", "--ckpt-every", "4"]),
]
def run(loom, out):
    os.makedirs(out, exist_ok=True)
    data = os.path.join(out, "train.bin")
    write_text_shard(data, 99)
    only = os.environ.get("ONLY")
    for name, fam, n, extra in L:
        if only and name not in only.split(","): continue
        o = os.path.join(out, name)
        cmd = [loom] + base(fam) + extra + ["--data", data, "--val-data", data, "--metrics", o + ".jsonl", "--save-weights", o + ".safetensors"]
        if "--ckpt-every" in extra: cmd += ["--ckpt-dir", o + "_ckpt"]
        if n > 1: cmd = MPI + ["-n", str(n)] + cmd
        p = subprocess.run(cmd, capture_output=True, text=True)
        print(name, "exit", p.returncode, flush=True)
        if p.returncode: print(p.stderr[-2000:])
def cmp(a, b):
    bad = 0
    for name, *_ in L:
        fa, fb = os.path.join(a, name), os.path.join(b, name)
        if not os.path.exists(fa + ".jsonl") or not os.path.exists(fb + ".jsonl"):
            print(name, "MISSING"); bad += 1; continue
        key = lambda f: [(r.get("loss"), r.get("grad_norm"), r.get("val_loss")) for r in map(json.loads, open(f))]
        h = lambda f: hashlib.sha256(open(f, "rb").read()).hexdigest()
        same_m = key(fa + ".jsonl") == key(fb + ".jsonl")
        same_w = h(fa + ".safetensors") == h(fb + ".safetensors")
        print(f"{name:22s} metrics {'same' if same_m else 'DIFF'} weights {'same' if same_w else 'DIFF'}")
        bad += not (same_m and same_w)
    print("bitwise:", "all same" if not bad else f"{bad} differ")
    return bad
if __name__ == "__main__":
    if sys.argv[1] == "run": run(sys.argv[2], sys.argv[3])
    else: sys.exit(1 if cmp(sys.argv[2], sys.argv[3]) else 0)
