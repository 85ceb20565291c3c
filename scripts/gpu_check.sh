#!/usr/bin/env bash
# The GPU check: one command for a session that has a GPU machine (which starts bare and
# only briefly). Builds the CUDA backend, runs the CUDA tests, prints a short table and,
# last, one JSON line. Aim: well under 5 minutes on one H200 (16 cores).
#
#   bash scripts/gpu_check.sh            # OUT=dir also keeps the logs there
#
# Build: the full CMake build (-DLOOM_CUDA=ON, build-gpu-check/) when cmake and loom's
# Debian dependencies are there; otherwise a direct nvcc build of the kernel test alone
# (it needs only the CUDA toolkit), so the kernels are checked on a bare machine too.
# LOOM_GPU_PREBUILT=DIR skips the build and takes loom and the test binaries from DIR (a
# -DLOOM_CUDA=ON build made on another machine and carried over, with LD_LIBRARY_PATH
# naming any library the GPU machine lacks).
# Tests: cuda_kernels (every kernel vs float64), cuda_nccl_np1 (and np2 with >= 2 GPUs),
# loom gpu-info with a 1 GiB arena, reference_cuda (tests/reference/test_vs_torch.py with
# `loom train --device cuda`: logits, step-1 gradients, 10 steps' losses and the final
# weights against PyTorch in float64); then bench/bench_gpu.py (kernels) and
# bench/bench_gpu_train.py (training vs PyTorch on the same GPU) if torch is there
# (LOOM_GPU_BENCH=0 skips both). Exit 0: all passed; 1: something failed; 3: nothing failed but the kernel
# test did not pass either (skipped: no usable GPU), so nothing was verified.
set -uo pipefail
cd "$(dirname "$0")/.."
t_start=$(date +%s)
logs=${OUT:-$(mktemp -d /tmp/loom_gpu_check_XXXXXX)}
mkdir -p "$logs"
jobs=$(nproc)
nvcc=$(command -v nvcc || { [[ -x /usr/local/cuda/bin/nvcc ]] && echo /usr/local/cuda/bin/nvcc; } || true)
cuda_root=$( [[ -n $nvcc ]] && cd "$(dirname "$nvcc")/.." && pwd )
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || true)
declare -A result
py=python3 # the one with torch and numpy: a GPU machine's venv, else Debian's
"$py" -c 'import numpy, torch' 2>/dev/null || py=/usr/bin/python3
build=none
note=""

json_escape() { python3 -c 'import json,sys; print(json.dumps(sys.stdin.read().strip()))' 2>/dev/null || echo '""'; }

# Runs a test binary/command, records passed/failed/skipped and its "N passed, F failed".
checks_passed=0
checks_failed=0
run_test() {
    local name=$1
    shift
    timeout 240 "$@" >"$logs/$name.log" 2>&1
    local rc=$?
    case $rc in
    0) result[$name]=passed ;;
    77) result[$name]=skipped ;;
    124) result[$name]=timeout ;;
    *) result[$name]="failed(rc=$rc)" ;;
    esac
    local line
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$logs/$name.log" | tail -1)
    if [[ -n $line ]]; then
        checks_passed=$((checks_passed + $(awk '{print $1}' <<<"$line")))
        checks_failed=$((checks_failed + $(awk '{print $3}' <<<"$line")))
    fi
}

have_cmake_deps() {
    command -v cmake >/dev/null && command -v mpicc >/dev/null && command -v pkg-config >/dev/null &&
        pkg-config --exists jansson inih cmocka libpcre2-8 libxxhash 2>/dev/null
}

t_build=$(date +%s)
if [[ -n ${LOOM_GPU_PREBUILT:-} ]]; then
    build=prebuilt
    note="prebuilt binaries from $LOOM_GPU_PREBUILT"
elif [[ -z $nvcc ]]; then
    note="nvcc not found (PATH, /usr/local/cuda/bin)"
elif [[ ${LOOM_GPU_CHECK_DIRECT:-0} != 1 ]] && have_cmake_deps &&
    cmake -S . -B build-gpu-check -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON \
        -DCMAKE_CUDA_COMPILER="$nvcc" >"$logs/configure.log" 2>&1 &&
    cmake --build build-gpu-check -j"$jobs" >"$logs/build.log" 2>&1; then
    build=cmake
else
    # Bare machine: only the toolkit. The test then skips the CPU-kernel AdamW comparison.
    [[ -f $logs/build.log ]] && note="cmake build failed (see build.log); "
    mkdir -p build-gpu-check/direct
    ok=1
    objs=()
    pids=()
    for f in src/kernels/cuda/*.cu; do
        o=build-gpu-check/direct/$(basename "$f").o
        "$nvcc" -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
            -Isrc -c "$f" -o "$o" >>"$logs/build.log" 2>&1 &
        pids+=($!)
        objs+=("$o")
    done
    for p in "${pids[@]}"; do wait "$p" || ok=0; done
    for f in src/kernels/cuda/device.c src/kernels/cuda/arena.c src/core/error.c tests/cuda/test_cuda_kernels.c; do
        o=build-gpu-check/direct/$(basename "$f").o
        cc -O2 -std=c17 -D_GNU_SOURCE -Isrc -I"$cuda_root/include" -c "$f" -o "$o" >>"$logs/build.log" 2>&1 || ok=0
        objs+=("$o")
    done
    if [[ $ok == 1 ]] && "$nvcc" -o build-gpu-check/direct/test_cuda_kernels "${objs[@]}" -L"$cuda_root/lib64" -Xlinker -rpath -Xlinker "$cuda_root/lib64" -lcublas -lcublasLt -lm \
        >>"$logs/build.log" 2>&1; then
        build=nvcc-direct
        note+="direct nvcc build (kernel test only)"
    else
        build=failed
        note+="direct nvcc build failed (see build.log)"
    fi
fi
build_s=$(($(date +%s) - t_build))

if [[ $build == cmake || $build == prebuilt ]]; then
    b=build-gpu-check
    [[ $build == prebuilt ]] && b=$LOOM_GPU_PREBUILT
    run_test cuda_kernels "$b/test_cuda_kernels"
    run_test cuda_nccl_np1 "$b/test_nccl"
    ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
    if [[ $ngpu -ge 2 ]]; then
        run_test cuda_nccl_np2 mpirun --allow-run-as-root --oversubscribe -n 2 "$b/test_nccl"
    else
        result[cuda_nccl_np2]="skipped(<2 GPUs)"
    fi
    run_test gpu_info bash tests/cli/test_gpu_info.sh "$b/loom"
    "$b/loom" gpu-info --arena-mb 1024 >"$logs/gpu_info_arena.log" 2>&1
    run_test device_cuda bash tests/cli/test_device.sh "$b/loom"
    if "$b/loom" gpu-info >/dev/null 2>&1; then
        run_test reference_cuda "$py" tests/reference/test_vs_torch.py --loom "$b/loom" --device cuda \
            --configs "${LOOM_GPU_REF_CONFIGS:-8}"
    else
        result[reference_cuda]="skipped(no GPU)"
    fi
elif [[ $build == nvcc-direct ]]; then
    run_test cuda_kernels build-gpu-check/direct/test_cuda_kernels
fi

bench_json=null
train_json=null
if [[ ${LOOM_GPU_BENCH:-1} != 0 && ($build == cmake || $build == prebuilt) ]]; then
    timeout 150 "$py" bench/bench_gpu.py --build "$b" >"$logs/bench_gpu.log" 2>&1
    last=$(tail -1 "$logs/bench_gpu.log")
    python3 -c 'import json,sys; json.loads(sys.argv[1])' "$last" 2>/dev/null && bench_json=$last
    timeout "${LOOM_GPU_TRAIN_TIMEOUT:-420}" "$py" bench/bench_gpu_train.py --loom "$b/loom" \
        ${LOOM_GPU_TRAIN_ARGS:-} >"$logs/bench_gpu_train.log" 2>&1
    last=$(tail -1 "$logs/bench_gpu_train.log")
    python3 -c 'import json,sys; json.loads(sys.argv[1])' "$last" 2>/dev/null && train_json=$last
fi

# The short table, then the JSON line last.
echo "---- gpu_check ($build build in ${build_s}s; logs in $logs) ----"
printf '%-16s %s\n' "gpu" "${gpu:-none (nvidia-smi)}"
for k in cuda_kernels cuda_nccl_np1 cuda_nccl_np2 gpu_info device_cuda reference_cuda; do
    printf '%-16s %s\n' "$k" "${result[$k]:-not run}"
done
printf '%-16s %s passed, %s failed\n' "kernel checks" "$checks_passed" "$checks_failed"
[[ -f $logs/gpu_info_arena.log ]] && printf '%-16s %s\n' "arena" "$(tail -1 "$logs/gpu_info_arena.log")"
grep -h '^FAIL' "$logs"/*.log 2>/dev/null | head -20
fails=$checks_failed
for k in "${!result[@]}"; do [[ ${result[$k]} == failed* || ${result[$k]} == timeout ]] && fails=$((fails + 1)); done
[[ $build == failed || $build == none ]] && fails=$((fails + 1))
tests_json=$(for k in "${!result[@]}"; do printf '"%s": "%s", ' "$k" "${result[$k]}"; done)
seed=$(grep -ho 'seed [0-9]*' "$logs/cuda_kernels.log" 2>/dev/null | head -1 | awk '{print $2}')
# Without a passing kernel test nothing on the GPU was verified: "unverified", exit 3.
status=ok
[[ ${result[cuda_kernels]:-} != passed ]] && status=unverified
[[ $fails != 0 ]] && status=failed
echo "{\"gpu_check\": \"$status\", \"gpu\": $(echo "${gpu:-}" | json_escape), \"build\": \"$build\", \"build_s\": $build_s, \"tests\": {${tests_json%, }}, \"kernel_checks_passed\": $checks_passed, \"kernel_checks_failed\": $checks_failed, \"seed\": ${seed:-null}, \"note\": $(echo "$note" | json_escape), \"bench\": $bench_json, \"bench_train\": $train_json, \"wall_s\": $(($(date +%s) - t_start))}"
case $status in ok) exit 0 ;; unverified) exit 3 ;; *) exit 1 ;; esac
