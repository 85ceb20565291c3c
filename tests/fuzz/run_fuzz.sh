#!/usr/bin/env bash
# Builds fuzz targets with clang + libFuzzer (ASan, UBSan) and runs each for a bounded time
# on a copy of its seed corpus (tests/fuzz/corpus_TARGET).
#   tests/fuzz/run_fuzz.sh [target...]   (default: load encode)
# Targets: load, encode (tokenizer: fuzz_tokenizer_TARGET.c), ckpt_manifest,
#          ckpt_safetensors (checkpoint readers: fuzz_TARGET.c).
# Env: LOOM_FUZZ_SECONDS (default 20 per target), LOOM_FUZZ_KEEP=1 keeps the work dir,
#      CC (default clang), LOOM_FUZZ_GPT2_DIR (default third_party/gpt2 when present).
# Exit: 0 clean, 1 a crash/leak/UB/timeout was found (input path + hexdump printed),
#       2 build failure, 77 skipped (no clang or no libFuzzer runtime).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cc=${CC:-clang}
secs=${LOOM_FUZZ_SECONDS:-20}
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(load encode)

if ! command -v "$cc" >/dev/null 2>&1 || ! "$cc" --version 2>/dev/null | grep -q clang; then
    echo "SKIP: $cc is not clang (libFuzzer needs clang)"
    exit 77
fi
rt=$("$cc" -print-file-name=libclang_rt.fuzzer-x86_64.a 2>/dev/null)
if [ ! -f "$rt" ]; then # older layouts: ask for the runtime dir instead
    rt=$(find "$("$cc" -print-resource-dir)" -name 'libclang_rt.fuzzer-*.a' 2>/dev/null | head -1)
fi
if [ -z "$rt" ] || [ ! -f "$rt" ]; then
    echo "SKIP: no libFuzzer runtime (libclang_rt.fuzzer) for $cc"
    exit 77
fi
if ! deps=$(pkg-config --cflags --libs jansson libpcre2-8 libxxhash 2>/dev/null); then
    echo "SKIP: pkg-config cannot find jansson, libpcre2-8 and libxxhash"
    exit 77
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/loom_fuzz.XXXXXX")
# The load target writes two files per input: on tmpfs where possible (ext4 is ~5x slower).
scratch=$(mktemp -d /dev/shm/loom_fuzz.XXXXXX 2>/dev/null || mktemp -d "$work/tmp.XXXXXX")
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    rm -rf "$scratch"
    [ "${LOOM_FUZZ_KEEP:-0}" = 1 ] || [ -n "${found:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
if [ -z "${LOOM_FUZZ_GPT2_DIR+x}" ] && [ -f "$root/third_party/gpt2/encoder.json" ]; then
    export LOOM_FUZZ_GPT2_DIR="$root/third_party/gpt2"
fi
export TMPDIR="$scratch" # the targets' scratch files
# halt_on_error: UBSan findings stop the run like ASan's; leaks are checked per input.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"

found=
for t in "${targets[@]}"; do
    case $t in
    ckpt_*)
        name="fuzz_$t"
        sources=("$root"/src/ckpt/manifest.c "$root"/src/ckpt/safetensors.c
            "$root"/src/ckpt/ckpt_loader.c "$root"/src/ckpt/ckpt_plan.c
            "$root"/src/model/config.c "$root"/src/model/config_json.c "$root/src/core/error.c"
            "$root/src/core/json_field.c" "$root/src/core/clock.c") ;;
    *)
        name="fuzz_tokenizer_$t"
        sources=("$root"/src/data/tokenizer*.c "$root/src/core/error.c" "$root/src/core/json_field.c") ;;
    esac
    src="$root/tests/fuzz/$name.c"
    [ -f "$src" ] || { echo "no such target: $t ($src)"; exit 2; }
    bin="$work/$name"
    # shellcheck disable=SC2086 # deps is a flag list
    if ! "$cc" -std=c17 -D_GNU_SOURCE -Wall -Wextra -Werror -g -O1 \
        -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer \
        -I "$root/src" -I "$root/tests/fuzz" "$src" "${sources[@]}" $deps -o "$bin"; then
        echo "FAIL: cannot build $bin"
        exit 2
    fi
    corpus="$work/corpus_$t"
    mkdir -p "$corpus" "$work/artifacts_$t"
    cp "$root/tests/fuzz/corpus_$t/"* "$corpus/"
    # error/timeout exit codes set explicitly: libFuzzer's default error code is 77, which
    # ctest would take for "skipped".
    echo "== $name for ${secs}s (corpus copy in $corpus)"
    "$bin" "$corpus" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=20 -max_len=8192 \
        -error_exitcode=1 -timeout_exitcode=1 -print_final_stats=1 \
        -artifact_prefix="$work/artifacts_$t/" >"$work/log_$t" 2>&1
    rc=$?
    grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)|^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)' "$work/log_$t"
    crashes=("$work/artifacts_$t"/*)
    if [ $rc -ne 0 ] || [ -e "${crashes[0]}" ]; then
        found=1
        echo "FOUND by $name (exit $rc); log: $work/log_$t"
        grep -E 'ERROR|SUMMARY|runtime error|fuzz check failed' "$work/log_$t" | head -20
        for c in "${crashes[@]}"; do
            [ -e "$c" ] || continue
            echo "input: $c ($(stat -c %s "$c") bytes); reproduce: $bin $c"
            od -A x -t x1z -v "$c" | head -16
        done
    fi
done
[ -n "$found" ] && exit 1
echo "no crashes"
exit 0
