#!/usr/bin/env bash
# Configures and builds loom. BUILD_DIR (default build) and extra CMake args may be given:
#   scripts/build.sh                      # release build in build/
#   BUILD_DIR=build-asan scripts/build.sh -DLOOM_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${BUILD_DIR:-build}
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)"
