#!/usr/bin/env bash
# loom gpu-info: with a CUDA device it lists it (exit 0); without one (no driver, no GPU,
# or a CPU-only build) it prints one "no CUDA device: <reason>" line and exits 1, never
# crashing; bad flags exit 2 with a message naming the flag.
set -uo pipefail
loom=$1
out=$("$loom" gpu-info 2>&1)
rc=$?
case $rc in
0) grep -q '^device 0: .*compute capability' <<<"$out" || { echo "FAIL: devices: $out"; exit 1; } ;;
1) [[ $(wc -l <<<"$out") -eq 1 && $out == "no CUDA device: "* ]] || { echo "FAIL: no-device message: $out"; exit 1; } ;;
*) echo "FAIL: gpu-info exit $rc: $out"; exit 1 ;;
esac
echo "gpu-info (exit $rc): $out"
out=$("$loom" gpu-info --arena-mb 0 2>&1)
[[ $? -eq 2 && $out == *"--arena-mb"*"positive integer"* ]] || { echo "FAIL: bad flag: $out"; exit 1; }
out=$("$loom" gpu-info --frobnicate 2>&1)
[[ $? -eq 2 && $out == *"unknown option '--frobnicate'"* ]] || { echo "FAIL: unknown flag: $out"; exit 1; }
if [[ $rc -eq 0 ]]; then # with a device: a 64 MiB arena is carved and its peak reported
    out=$("$loom" gpu-info --arena-mb 64 2>&1)
    [[ $? -eq 0 && $out == *"arena 0.062 GiB: peak 0.047 GiB used"* ]] || { echo "FAIL: arena: $out"; exit 1; }
fi
echo "ok"
