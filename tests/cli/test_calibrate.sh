#!/usr/bin/env bash
# loom calibrate: bad flags exit 2 naming the flag; `--quick -o X` measures this machine
# (kernels, AdamW, MPI collectives under its own mpirun) in about a minute and writes a
# profile the planner's reader accepts (--validate), with plausible values: GEMM rates
# above 1 GFLOP/s and below what the cores could do, collectives with alpha >= 0 and a
# positive bandwidth, times growing with bytes; the checked-in GPU profiles (profiles/)
# load; a profile missing a term or a published one missing a source is refused (exit 2,
# the field named); on 2 cores or more the profile holds the cores-busy-at-once slowdown
# (machine.corun) of 2 one-thread processes.
set -uo pipefail
LOOM=$1
# Under the sanitizer build (CI runs the cli tests again there) the MPI workers' exit
# reports OpenMPI's, hwloc's and OpenBLAS's never-freed allocations as leaks and turns them
# into exit 1; the other MPI tests do not run under the sanitizer at all. Errors stay fatal.
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
here=$(cd "$(dirname "$0")" && pwd)
source "$here/check_lib.sh"
profiles=$here/../../profiles

expect2() { # NAME EXPECTED_TEXT ARGS...
    local name=$1 want=$2
    shift 2
    local out rc
    out=$("$LOOM" calibrate "$@" 2>&1)
    rc=$?
    if [[ $rc -ne 2 || $out != *"$want"* ]]; then
        echo "  $name: exit $rc, output: $out"
        return 1
    fi
}
check "unknown flag" expect2 unknown "unknown option '--frobnicate'" --frobnicate
check "bad --groups" expect2 groups "--groups '1'" --groups 1
check "bad --groups list" expect2 groups "--groups '2,'" --groups 2,
check "bad --threads" expect2 threads "--threads '0'" --threads 0
check "-o without value" expect2 output "needs a value" -o
check "stray argument" expect2 stray "unexpected argument 'extra'" extra
check "missing profile" expect2 missing "/nonexistent/p.json" --validate /nonexistent/p.json
OMPI_COMM_WORLD_SIZE=2 check "under mpirun" expect2 mpirun "run it without mpirun" --quick -o "$TMP/x.json"
check "unwritable output" expect2 unwritable "cannot write /nonexistent/dir/p.json" --quick -o /nonexistent/dir/p.json

# the quick calibration
start=$(date +%s)
"$LOOM" calibrate --quick -o "$TMP/p.json" 2>"$TMP/cal.err"
rc=$?
secs=$(($(date +%s) - start))
echo "calibrate --quick: exit $rc in ${secs} s"
tail -8 "$TMP/cal.err"
check "calibrate --quick exits 0" test "$rc" -eq 0
check "calibrate --quick under 90 s" test "$secs" -le 90
"$LOOM" calibrate --validate "$TMP/p.json" >"$TMP/validate.out" 2>&1
check "the reader accepts the measured profile" test $? -eq 0
cat "$TMP/validate.out"

plausible() {
    python3 - "$TMP/p.json" <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))
bad = []
cores = p["machine"]["cores"]
bound = 512.0 * cores  # GFLOP/s: far above any CPU core's fp32 FMA peak (~256 at 4 GHz AVX-512)
threads = [c["threads"] for c in p["compute"]]
if threads[0] != 1 or (cores > 1 and len(threads) != 2):
    bad.append(f"thread entries {threads}")
for c in p["compute"]:
    for op, g in c["gemm"].items():
        rates = g["grid"]["gflops"]
        if len(rates) != len(g["grid"]["M"]) ** 3:
            bad.append(f"gemm {op} grid size")
        if max(rates) <= 1.0 or max(rates) >= bound or g["peak_gflops"] >= bound * 4:
            bad.append(f"threads {c['threads']} gemm {op}: rates {min(rates):.1f}..{max(rates):.1f}, peak {g['peak_gflops']:.1f}")
    for k, a in c["attention"].items():
        if min(a["grid"]["us_per_head"]) <= 0:
            bad.append(f"attention {k}")
    for k, e in c["elementwise"].items():
        if not (e["gbps"] > 0 and e["alpha_us"] >= 0 and len(e["points"]) >= 3):
            bad.append(f"elementwise {k}: {e}")
    if not c["adamw"]["ns_per_param"] > 0:
        bad.append("adamw")
    # --precision bf16's GEMMs as this CPU runs them (oneDNN's, or widened to fp32 without
    # AVX512-BF16 / AMX-BF16): measured on every CPU
    if "gemm_bf16" not in c:
        bad.append(f"threads {c['threads']}: gemm_bf16 missing")
    for op, g in c.get("gemm_bf16", {}).items():
        rates = g["grid"]["gflops"]
        if len(rates) != len(g["grid"]["M"]) ** 3 or max(rates) <= 1.0 or max(rates) >= 4 * bound:
            bad.append(f"threads {c['threads']} gemm_bf16 {op}: rates {min(rates):.1f}..{max(rates):.1f}")
kinds = {x["kind"] for x in p["collectives"]}
if kinds != {"allreduce", "reduce_scatter", "allgather", "alltoall", "sendrecv"}:
    bad.append(f"collective kinds {kinds}")
for x in p["collectives"]:
    if not (x["alpha_us"] >= 0 and x["busbw_gbs"] > 0 and x["group"] == 2):
        bad.append(f"collective {x['kind']}: alpha {x['alpha_us']}, busbw {x['busbw_gbs']}")
    sizes = [b for b, t in x["points"]]
    if len(sizes) < 4 or sizes != sorted(sizes) or min(t for b, t in x["points"]) <= 0:
        bad.append(f"collective {x['kind']} points {x['points']}")
e = p["engine"]
if not (e["cpu_us_per_op"] >= 0 and e["post_us"] >= 0):
    bad.append(f"engine {e}")
# the cores busy at once: measured with the 2-rank group where it fits one process a core
# (a slowdown, so >= 1 up to noise; below 5: a shared machine can make it large)
corun = p["machine"].get("corun")
if cores >= 2 and not (corun and corun[0]["processes"] == 2 and
                       all(0.8 <= corun[0][k] <= 5 for k in ("gemm", "memory"))):
    bad.append(f"machine.corun {corun}")
for b in bad:
    print("  implausible:", b)
sys.exit(1 if bad else 0)
EOF
}
check "plausible values" plausible
monotone() { # every collective line of --validate: 4 KiB faster than 64 MiB
    local n=0
    while read -r kind _ group small _ _ big _; do
        n=$((n + 1))
        python3 -c "import sys; sys.exit(0 if float('${small}') < float('${big}') else 1)" ||
            { echo "  $kind $group: $small >= $big"; return 1; }
    done < <(grep -E '^  (allreduce|reduce_scatter|allgather|alltoall|sendrecv) group [0-9]+: 4 KiB' "$TMP/validate.out" |
        sed -E 's/^  ([a-z_]+) group ([0-9]+): 4 KiB ([0-9.e+-]+) ms, 64 MiB ([0-9.e+-]+) ms/\1 x \2 \3 x x \4 x/')
    [[ $n -ge 5 ]]
}
check "collective times grow with bytes" monotone

# the checked-in GPU cluster profiles
n=0
for f in "$profiles"/*.json; do
    [[ -e $f ]] || continue
    n=$((n + 1))
    "$LOOM" calibrate --validate "$f" >"$TMP/gpu.out" 2>&1
    check "profile $(basename "$f") loads" test $? -eq 0
    check "profile $(basename "$f") is published" grep -q '(published)' "$TMP/gpu.out"
done
check "GPU profiles present" test "$n" -ge 2

# refusals, the field named
python3 - "$TMP/p.json" "$TMP/missing.json" <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))
del p["compute"][0]["gemm"]["tn"]["peak_gflops"]
json.dump(p, open(sys.argv[2], "w"))
EOF
check "missing term refused" expect2 missing "missing.json: compute[0].gemm.tn.peak_gflops: missing" --validate "$TMP/missing.json"
first=$(ls "$profiles"/*.json 2>/dev/null | head -1)
if [[ -n $first ]]; then
    python3 - "$first" "$TMP/nosource.json" <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))
del p["collectives"][0]["sources"]
json.dump(p, open(sys.argv[2], "w"))
EOF
    check "published term without a source refused" expect2 nosource "nosource.json: collectives[0].sources: missing" --validate "$TMP/nosource.json"
fi
finish test_calibrate
