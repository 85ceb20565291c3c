#!/usr/bin/env bash
# README command 2 (and what CI runs): install what is missing, build, and run the whole
# suite: unit tests (cmocka), command-line tests, the PyTorch reference test, then the
# unit and command-line tests again under AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
BUILD_DIR=build-asan bash scripts/build.sh -DLOOM_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
(cd build && ctest --output-on-failure --timeout 900)
(cd build-asan && ctest --output-on-failure --timeout 900 -L 'unit|cli')
