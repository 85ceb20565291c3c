#!/usr/bin/env bash
# Configures and builds loom. BUILD_DIR (default build) and extra CMake args may be given:
#   scripts/build.sh                      # release build in build/
#   BUILD_DIR=build-asan scripts/build.sh -DLOOM_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${BUILD_DIR:-build}
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)"
# The CUDA build (-DLOOM_CUDA=ON) is compiled and linked too whenever nvcc is there, GPU
# or not, so it never rots (default invocation only; LOOM_SKIP_CUDA=1 skips it).
nvcc=$(command -v nvcc || { [[ -x /usr/local/cuda/bin/nvcc ]] && echo /usr/local/cuda/bin/nvcc; } || true)
if [[ -z ${BUILD_DIR:-} && ${LOOM_SKIP_CUDA:-0} != 1 && -n $nvcc ]]; then
    cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" >/dev/null
    cmake --build build-cuda -j"$(nproc)"
fi
