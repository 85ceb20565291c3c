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
