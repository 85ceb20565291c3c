#!/usr/bin/env bash
# loom plan: bad input exits 2 with one line naming the flag, file or field; a layout the
# plan proposes is one `loom train` accepts (its top layouts run `--dry-run` under mpirun);
# --explain and the JSON agree; the picture is written; --check reads a run's metrics;
# sharded accumulation is priced at m reductions a step, the bytes a run counts.
set -uo pipefail
LOOM=$1
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 # MPI workers (see test_calibrate.sh)
here=$(cd "$(dirname "$0")" && pwd)
source "$here/check_lib.sh"
profiles=$here/../../profiles
H100=$profiles/h100_nvlink_ib.json
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1)
seed=${LOOM_TEST_SEED:-$RANDOM}
echo "seed $seed (LOOM_TEST_SEED=$seed to repeat)"
layers=$((2 + seed % 4))
MODEL=(--family llama --n-layer $((2 * layers)) --d-model 64 --n-head 4 --n-kv-head 2 --d-ff 128
    --vocab-size 300 --seq-len 32 --global-batch 8 --micro-batch 2)

# bad input: one line, exit 2
expect "unknown flag" "unknown option '--frobnicate'" -- plan --frobnicate
expect "no world" "--world: required" -- plan "${MODEL[@]}" --profile "$H100"
expect "no profile" "--profile: required" -- plan "${MODEL[@]}" --world 4
expect "missing profile" "$TMP/none.json" -- plan "${MODEL[@]}" --world 4 --profile "$TMP/none.json"
python3 - "$H100" "$TMP/partial.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
del p["compute"][0]["gemm"]["tn"]
json.dump(p, open(sys.argv[2], "w"))
PY
expect "profile missing a term" "compute[0].gemm.tn" -- plan "${MODEL[@]}" --world 4 --profile "$TMP/partial.json"
expect "bad world" "--world 'x'" -- plan "${MODEL[@]}" --world x --profile "$H100"
expect "nothing fits" "the smallest needs" -- plan "${MODEL[@]}" --world 4 --profile "$H100" --memory-per-rank 0.0001
expect "layout refused" "--tp 3" -- plan "${MODEL[@]}" --explain "--tp 3"
MOE=("${MODEL[@]}" --n-experts 4 --top-k 2 --moe-every 2)
expect "routing of a dense model" "--moe-load-max 1.5: the model has no experts" -- plan "${MODEL[@]}" --explain "--dp 2" --profile "$H100" --moe-load-max 1.5
expect "routing below balanced" "--moe-load-max '0.5': expected a number >= 1" -- plan "${MOE[@]}" --explain "--dp 2" --profile "$H100" --moe-load-max 0.5
expect "routing beyond E / K" "expected at most E / K = 2" -- plan "${MOE[@]}" --explain "--dp 2" --profile "$H100" --moe-load-max 3
python3 - "$H100" "$TMP/nobf16.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
for c in p["compute"]:
    c.pop("gemm_bf16", None)  # a profile measured before bf16
json.dump(p, open(sys.argv[2], "w"))
PY
expect "bf16 without gemm_bf16" "--precision bf16: profile" -- plan "${MODEL[@]}" --explain "--dp 2" \
    --profile "$TMP/nobf16.json" --precision bf16
expect "bf16 reduction of fp32" "--grad-reduce-dtype bf16: needs --precision bf16" -- plan \
    "${MODEL[@]}" --explain "--dp 2" --profile "$H100" --grad-reduce-dtype bf16
expect "bad check folder" "$TMP/nothing" -- plan --check "$TMP/nothing" --profile "$H100"
expect "check without profile" "--check: needs --profile" -- plan --check "$TMP"
mkdir -p "$TMP/run/attempt_0" && echo "mpirun -n 2 /bin/true" >"$TMP/run/attempt_0/command.txt"
expect "check folder without train" "no \`loom train\` command" -- plan --check "$TMP/run" --profile "$H100"

# --precision bf16: the GEMMs from the profile's gemm_bf16 (here the H100's curves at twice
# the rate and half the latency: exactly the GEMM terms shrink), --grad-reduce-dtype bf16 the
# gradient buckets as bf16 all-to-alls (ZeRO 2: half the all-reduce's bytes)
python3 - "$H100" "$TMP/bf16.json" <<'PY'
import copy, json, sys
p = json.load(open(sys.argv[1]))
for c in p["compute"]:
    c["gemm_bf16"] = copy.deepcopy(c["gemm"])
    for g in c["gemm_bf16"].values():
        g["peak_gflops"] *= 2
        g["latency_us"] /= 2  # the model's GEMMs are small: the latency is most of them
json.dump(p, open(sys.argv[2], "w"))
PY
predicted() { "$LOOM" plan "${MODEL[@]}" --profile "$TMP/bf16.json" --explain "--dp 4 --zero 2" "$@" |
    sed -n 's/^predicted step: \([0-9.]*\) ms.*/\1/p'; }
p32=$(predicted) p16=$(predicted --precision bf16) r16=$(predicted --precision bf16 --grad-reduce-dtype bf16)
echo "plan, dp 4 ZeRO 2: fp32 $p32 ms, bf16 $p16 ms, bf16 + bf16 reduction $r16 ms"
check "bf16 GEMMs predict a shorter step" python3 -c "import sys; sys.exit(0 if 0 < float('$p16') < float('$p32') else 1)"
check "the bf16 reduction predicts no longer a step" python3 -c "import sys; sys.exit(0 if 0 < float('$r16') <= float('$p16') else 1)"
# bf16: the weights' bf16 copy, rounded again once a step (4 bytes read, 2 written a
# parameter at the add kernel's rate), a term of its own; none in fp32
for p in fp32 bf16; do
    "$LOOM" plan "${MODEL[@]}" --profile "$TMP/bf16.json" --explain "--dp 4 --zero 2" \
        --precision $p --json >"$TMP/copy_$p.json" 2>>"$TMP/err"
done
check "bf16: the weights' copy priced once a step, not in fp32" python3 - "$TMP/copy_fp32.json" \
    "$TMP/copy_bf16.json" <<'PY'
import json, sys
terms = [{t["name"]: t["ms"] for t in json.load(open(f))["time"]["terms"]} for f in sys.argv[1:3]]
print("bf16 weights copy ms (fp32, bf16):", [t.get("bf16 weights copy") for t in terms])
sys.exit(0 if "bf16 weights copy" not in terms[0] and terms[1].get("bf16 weights copy", 0) > 0 else 1)
PY
# pp under bf16: the stage boundary's messages at 2 bytes an element (pipeline/executor.c): the
# sends priced at half the bytes (a model whose messages are past the link's latency), the
# message buffers smaller (bf16 wire and an fp32 activation half: 12 of fp32's 16 parts and
# one fp32 scratch message)
for p in fp32 bf16; do
    "$LOOM" plan --family llama --n-layer 4 --d-model 512 --n-head 8 --n-kv-head 4 --d-ff 1024 \
        --vocab-size 300 --seq-len 256 --global-batch 16 --micro-batch 4 --profile "$TMP/bf16.json" \
        --explain "--pp 2" --precision $p --json >"$TMP/pp_$p.json" 2>>"$TMP/err"
done
check "pp bf16: half the message bytes priced and held" python3 - "$TMP/pp_fp32.json" "$TMP/pp_bf16.json" <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
send = [{t["name"]: t["ms"] for t in x["time"]["terms"]}["pp sends"] for x in (a, b)]
msg = [x["memory"]["pp_messages_bytes"] for x in (a, b)]
print("pp sends", send, "message buffers", msg)
a_bytes = msg[0] / (16 * a["memory"]["pp_slots"])  # one fp32 message of 4 bytes an element
want = 12 * a["memory"]["pp_slots"] * a_bytes + 4 * a_bytes
sys.exit(0 if 0 < send[1] < send[0] and msg[1] == want else 1)
PY

# tp under bf16: the linears' tensor-parallel sums and gathers at 2 bytes an element
# (tp/tp.h: a bf16 all-to-all, plus a bf16 all-gather without sequence parallelism; the
# gathers of GEMM inputs in bf16). On a profile whose collectives are bytes only (no
# latency, one bus bandwidth for every kind) llama's tp comm term is then half of fp32's
# but for what stays fp32: the embedding's all-reduce (one N x C message besides the 4 a
# block and the head's 1: 38/72 = 0.528 here without sequence parallelism) and the loss's
# pieces (N x tp maxima, 2N sums).
python3 - "$TMP/bf16.json" "$TMP/bytes.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
for c in p["collectives"]:
    c["alpha_us"], c["busbw_gbs"] = 0.0, 100.0
json.dump(p, open(sys.argv[2], "w"))
PY
for sp in "" "--sequence-parallel"; do
    for p in fp32 bf16; do
        "$LOOM" plan --family llama --n-layer 4 --d-model 512 --n-head 8 --n-kv-head 4 \
            --d-ff 1024 --vocab-size 300 --seq-len 256 --global-batch 16 --micro-batch 4 \
            --profile "$TMP/bytes.json" --explain "--tp 2 $sp" --precision $p --json \
            >"$TMP/tp_$p.json" 2>>"$TMP/err"
    done
    check "tp 2 $sp bf16: the tp messages priced at about half" python3 - "$TMP/tp_fp32.json" \
        "$TMP/tp_bf16.json" <<'PY'
import json, sys
tp = [{t["name"]: t["ms"] for t in json.load(open(f))["time"]["terms"]}["tp comm"]
      for f in sys.argv[1:3]]
print("tp comm ms (fp32, bf16):", tp)
sys.exit(0 if 0.5 * tp[0] < tp[1] < 0.55 * tp[0] else 1)
PY
done

# ep under bf16 on a CPU (a profile with memory_shared: the ranks' cores): both dispatches
# (backward's: Llama's bias-free experts) and both combines at 2 bytes an element
# (model/moe_dispatch.c). On the bytes-only profile that is (2 + 2 + 2 + 2) / 16: the moe
# all-to-all term 0.5 of fp32's (the routing counts' small all-to-alls aside); on a GPU
# profile (memory_shared false) unchanged
python3 - "$TMP/bytes.json" "$TMP/bytes_cpu.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p["machine"]["memory_shared"] = True
json.dump(p, open(sys.argv[2], "w"))
PY
for prof in bytes bytes_cpu; do
    for p in fp32 bf16; do
        "$LOOM" plan --family llama --n-layer 4 --d-model 512 --n-head 8 --n-kv-head 4 \
            --d-ff 1024 --vocab-size 300 --seq-len 256 --global-batch 16 --micro-batch 4 \
            --n-experts 8 --top-k 2 --profile "$TMP/$prof.json" --explain "--dp 4 --ep 4" \
            --precision $p --json >"$TMP/ep_${prof}_$p.json" 2>>"$TMP/err"
    done
done
check "ep 4 bf16: the four exchanges priced at 2 bytes on a CPU, 4 on a GPU" python3 - \
    "$TMP"/ep_bytes_cpu_fp32.json "$TMP"/ep_bytes_cpu_bf16.json "$TMP"/ep_bytes_fp32.json \
    "$TMP"/ep_bytes_bf16.json <<'PY'
import json, sys
moe = [{t["name"]: t["ms"] for t in json.load(open(f))["time"]["terms"]}["moe all-to-all"]
       for f in sys.argv[1:5]]
print("moe all-to-all ms (cpu fp32, cpu bf16, gpu fp32, gpu bf16):", moe)
sys.exit(0 if moe[0] > 0 and 0.49 < moe[1] / moe[0] < 0.51 and moe[3] == moe[2] else 1)
PY

# the search: the top layouts are ones loom train accepts
"$LOOM" plan "${MODEL[@]}" --world 4 --profile "$H100" --top 4 --json >"$TMP/top.json" 2>"$TMP/err"
check "search runs" test $? -eq 0
"$LOOM" plan "${MODEL[@]}" --world 4 --profile "$H100" --top 4 --html "$TMP/plan.html" >"$TMP/top.txt" 2>>"$TMP/err"
check "search prints" grep -q "predicted\|largest part" "$TMP/top.txt"
check "html written" grep -q "<svg" "$TMP/plan.html"
mapfile -t LAYOUTS < <(python3 -c "import json,sys; [print(t['layout']) for t in json.load(open(sys.argv[1]))['top']]" "$TMP/top.json")
check "four layouts" test "${#LAYOUTS[@]}" -eq 4
python3 - "$TMP/tokens.bin" <<'PY'
import struct, sys, random
n = 8192
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<3i", 20240520, 1, n) + bytes(1012))
    f.write(struct.pack(f"<{n}H", *[random.randrange(300) for _ in range(n)]))
PY
for lay in "${LAYOUTS[@]}"; do
    # shellcheck disable=SC2086 # the layout is loom train's flags, split on purpose
    "${MPIRUN[@]}" -n 4 "$LOOM" train "${MODEL[@]}" --data "$TMP/tokens.bin" --threads 1 $lay --dry-run \
        >/dev/null 2>"$TMP/dry.err"
    check "loom train accepts '$lay'" test $? -eq 0 || tail -3 "$TMP/dry.err"
done
# --explain: the same prediction as the search's entry, and the line a user reads
first=${LAYOUTS[0]}
"$LOOM" plan "${MODEL[@]}" --profile "$H100" --ranks-per-node 4 --explain "$first" >"$TMP/explain.txt" 2>>"$TMP/err"
check "explain prints predicted step" grep -q "^predicted step: [0-9.]* ms" "$TMP/explain.txt"
"$LOOM" plan "${MODEL[@]}" --profile "$H100" --ranks-per-node 4 --explain "$first" --json >"$TMP/explain.json" 2>>"$TMP/err"
check "explain json equals the search's" python3 - "$TMP/top.json" "$TMP/explain.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))["top"][0]["time"]["step_ms"]
b = json.load(open(sys.argv[2]))["time"]["step_ms"]
sys.exit(0 if abs(a - b) <= 1e-9 * max(a, b) else 1)
PY

# --check: a run's metrics against the prediction
"${MPIRUN[@]}" -n 2 "$LOOM" train "${MODEL[@]}" --data "$TMP/tokens.bin" --threads 1 --dp 2 --zero 1 \
    --steps 4 --log-every 0 --metrics "$TMP/m.jsonl" >/dev/null 2>"$TMP/train.err"
check "training ran" test $? -eq 0
"$LOOM" plan --check "$TMP/m.jsonl" --profile "$H100" "${MODEL[@]}" --dp 2 --zero 1 --html "$TMP/check.html" \
    >"$TMP/check.txt" 2>>"$TMP/err"
check "check compares step_ms" grep -q "step_ms .* ms .* ms" "$TMP/check.txt"
check "check html" grep -q "measured" "$TMP/check.html"
"$LOOM" run -n 2 --run-dir "$TMP/runs" -- train "${MODEL[@]}" --data "$TMP/tokens.bin" --threads 1 \
    --dp 2 --steps 4 --log-every 0 --metrics "$TMP/run.jsonl" >/dev/null 2>"$TMP/run.err"
check "loom run ran" test $? -eq 0
"$LOOM" plan --check "$TMP/runs" --profile "$H100" --json >"$TMP/check.json" 2>>"$TMP/err"
check "check reads the run folder" python3 - "$TMP/check.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
ok = r["layout"].startswith("--dp 2") and r["steps"] == 2 and r["measured_step_ms"] > 0
ok = ok and r["predicted_step_ms"] > 0 and {t["metric"] for t in r["terms"]} >= {"dp.compute_ms"}
sys.exit(0 if ok else 1)
PY
# --grad-accum sharded (ZeRO-3's default): every micro-batch's gradient reduced as backward
# produces it, so m micro-batches move m times local accumulation's bytes, each reduction
# 2 (P - c) x 4 on a rank's wire (P the parameters, c its shard: P / dp within a row);
# --explain names the term, and a run's metrics (dp.grad_bytes) count the plan's bytes
for ga in sharded local; do
    "$LOOM" plan "${MODEL[@]}" --profile "$H100" --explain "--dp 2 --zero 3 --grad-accum $ga" \
        --json >"$TMP/ga_$ga.json" 2>>"$TMP/err"
done
"$LOOM" plan "${MODEL[@]}" --profile "$H100" --explain "--dp 2 --zero 3" >"$TMP/ga.txt" 2>>"$TMP/err"
check "explain names the sharded reductions" grep -q "grad reduce-scatter x 2 micro-batches" "$TMP/ga.txt"
params=$(sed -n 's/^loom plan: llama model, \([0-9]*\) parameters.*/\1/p' "$TMP/ga.txt")
check "sharded accumulation priced at m x local's gradient bytes" python3 - "$TMP/ga_sharded.json" \
    "$TMP/ga_local.json" "${params:-0}" <<'PY'
import json, sys
s, l = (json.load(open(f))["time"] for f in sys.argv[1:3])
P, m, dp, row = float(sys.argv[3]), 8 // (2 * 2), 2, 128  # --global-batch 8, --micro-batch 2
terms = {t["name"] for t in s["terms"]}
print("grad bytes: sharded", s["grad_bytes"], "local", l["grad_bytes"], "parameters", P)
ok = P > 0 and s["grad_accum"] == "sharded" and l["grad_accum"] == "local"
ok = ok and s["grad_reductions"] == m and l["grad_reductions"] == 1
ok = ok and abs(l["grad_bytes"] - 8 * (P - P / dp)) <= 8 * row
ok = ok and s["grad_bytes"] == m * l["grad_bytes"] and "dp sharded accum" in terms
sys.exit(0 if ok else 1)
PY
"${MPIRUN[@]}" -n 2 "$LOOM" train "${MODEL[@]}" --data "$TMP/tokens.bin" --threads 1 --dp 2 --zero 3 \
    --steps 2 --log-every 0 --metrics "$TMP/ga.jsonl" >/dev/null 2>"$TMP/ga_train.err"
check "zero 3 training ran" test $? -eq 0
check "a sharded run moves the plan's gradient bytes" python3 - "$TMP/ga.jsonl" "$TMP/ga_sharded.json" <<'PY'
import json, sys
rows = [json.loads(x) for x in open(sys.argv[1]) if x.strip()]
want = json.load(open(sys.argv[2]))["time"]["grad_bytes"]
print("measured dp.grad_bytes", [r["dp"]["grad_bytes"] for r in rows], "planned", want)
sys.exit(0 if rows and all(r["dp"]["grad_bytes"] == want for r in rows) else 1)
PY
# an uneven router: every ep rank waits for the busiest expert's
for r in 1 1.5; do
    "$LOOM" plan "${MOE[@]}" --profile "$H100" --explain "--dp 4 --ep 4" --moe-load-max $r --json \
        >"$TMP/moe_$r.json" 2>>"$TMP/err"
done
check "an uneven router is slower" python3 - "$TMP/moe_1.json" "$TMP/moe_1.5.json" <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
sys.exit(0 if b["moe_load_max"] == 1.5 and b["time"]["step_ms"] > a["time"]["step_ms"] else 1)
PY
# --check of an MoE run predicts with the run's own routing
"${MPIRUN[@]}" -n 2 "$LOOM" train "${MOE[@]}" --data "$TMP/tokens.bin" --threads 1 --dp 2 --ep 2 \
    --steps 5 --log-every 0 --metrics "$TMP/moe.jsonl" >/dev/null 2>"$TMP/moe_train.err"
check "moe training ran" test $? -eq 0
"$LOOM" plan --check "$TMP/moe.jsonl" --profile "$H100" "${MOE[@]}" --dp 2 --ep 2 --json \
    >"$TMP/moe_check.json" 2>>"$TMP/err"
check "check uses the run's routing" python3 - "$TMP/moe.jsonl" "$TMP/moe_check.json" <<'PY'
import json, statistics, sys
rows = [json.loads(x) for x in open(sys.argv[1]) if x.strip()][2:]
want = statistics.median(r["moe"]["load_max"] / r["moe"]["load_mean"] for r in rows)
got = json.load(open(sys.argv[2]))["moe_load_max"]
print("routing", want, got)
sys.exit(0 if abs(got - max(want, 1.0)) <= 1e-9 * want else 1)
PY
# a vlm at pp 2: --explain prices both placements of the encoder (--vision-schedule first
# and bubbles: the run's placement on the plan's costs); the pieces' timeline is no longer
# than the simulator's with the encoder on stage 0, and the search lists bubbles layouts
VLM=(--model vlm-tiny --vit-layers $((2 + seed % 5)) --global-batch 8)
for sch in 1f1b zb; do
    "$LOOM" plan "${VLM[@]}" --profile "$H100" --explain "--pp 2 --micro-batch 1 --pp-schedule $sch" \
        >"$TMP/vlm_$sch.txt" 2>>"$TMP/err"
    check "vlm $sch: explain shows both placements" bash -c "grep -q '^  first  .* ms' '$TMP/vlm_$sch.txt' &&
        grep -q '^  bubbles .* ms  (micro-batches encoded per stage' '$TMP/vlm_$sch.txt'"
    "$LOOM" plan "${VLM[@]}" --profile "$H100" --explain \
        "--pp 2 --micro-batch 1 --pp-schedule $sch --vision-schedule bubbles" --json \
        >"$TMP/vlm_$sch.json" 2>>"$TMP/err"
    check "vlm $sch: bubbles no longer than the encoder on stage 0" python3 - "$TMP/vlm_$sch.json" <<'PY'
import json, sys
o = json.load(open(sys.argv[1]))
v = o["vision_schedule"]
print("vlm", o["layout"], v)
ok = sum(v["pieces"]) == 8 and 0 < v["pipeline_ratio"] <= 1 + 1e-12
ok = ok and abs(o["time"]["step_ms"] - v["bubbles_ms"]) <= 1e-9 * v["bubbles_ms"]
ok = ok and v["bubbles_ms"] - v["messages_ms"] <= v["first_ms"] * (1 + 1e-12)
ok = ok and any(t["name"] == "vision messages" for t in o["time"]["terms"]) == (v["pieces"][1] > 0)
sys.exit(0 if ok else 1)
PY
done
"$LOOM" plan "${VLM[@]}" --world 2 --profile "$H100" --top 400 --json >"$TMP/vlm_top.json" 2>>"$TMP/err"
check "vlm search: both placements, in step order" python3 - "$TMP/vlm_top.json" <<'PY'
import json, sys
top = json.load(open(sys.argv[1]))["top"]
steps = {t["layout"]: t["time"]["step_ms"] for t in top}
pairs = [(l, l.replace(" --vision-schedule bubbles", "")) for l in steps if "bubbles" in l]
ok = pairs and all(f in steps for _, f in pairs)
ok = ok and all(a["time"]["step_ms"] <= b["time"]["step_ms"] for a, b in zip(top, top[1:]))
sys.exit(0 if ok else 1)
PY
check "no sanitizer report" bash -c "! grep -qiE 'sanitizer|segmentation' '$TMP/err'"
finish test_plan
