# Shared by the CLI tests that count named checks: sourced after LOOM is set.
# Gives $TMP (removed on exit), check NAME COMMAND... and finish (summary + exit code).
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0
fail=0
check() { # NAME CONDITION...
    local name=$1
    shift
    if "$@"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $name"; fi
}
finish() { # NAME_OF_TEST
    echo "$1: $pass passed, $fail failed"
    [ "$fail" -eq 0 ]
}
expect() { # NAME EXPECTED_SUBSTRING -- loom args...: exit 2, the last stderr line names it
    local name=$1 want=$2
    shift 3
    "$LOOM" "$@" >"$TMP/out" 2>"$TMP/err"
    local rc=$? last
    last=$(tail -n 1 "$TMP/err")
    if [ $rc -eq 2 ] && grep -qF -- "$want" <<<"$last" &&
        ! grep -qiE "sanitizer|segmentation|core dumped" "$TMP/err"; then
        pass=$((pass + 1))
    else
        fail=$((fail + 1))
        echo "FAIL: $name: exit $rc, last stderr line: '$last' (expected exit 2 and '$want')"
    fi
}
