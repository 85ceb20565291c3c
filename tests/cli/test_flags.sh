#!/usr/bin/env bash
# Every command parses its flags with the one flag table (core/flags.h): a mistyped flag
# exits 2 with one line that names the command once and suggests the nearest flag, and
# `loom CMD --help` prints its grouped help (exit 0) naming a docs page.
set -uo pipefail
loom=$1
fails=0
# "command words|mistyped flag|the suggestion"
cases=(
    "pp-schedule|--micro-bathces|--micro-batches"
    "ckpt|--dtpye|--dtype"
    "gpu-info|--arena-md|--arena-mb"
)
for c in "${cases[@]}"; do
    IFS='|' read -r words typo near <<<"$c"
    read -ra cmd <<<"$words"
    out=$("$loom" "${cmd[@]}" "$typo" 1 2>&1)
    rc=$?
    name="loom $words"
    if [[ $rc -ne 2 || $(wc -l <<<"$out") -ne 1 || $out != "$name: unknown option '$typo': did you mean $near? (see --help)" ||
        $(grep -o "loom $words" <<<"$out" | wc -l) -ne 1 ]]; then
        echo "FAIL: $name $typo: exit $rc: $out"
        fails=$((fails + 1))
    fi
    out=$("$loom" "${cmd[@]}" --help 2>&1)
    rc=$?
    if [[ $rc -ne 0 || $out != usage:* || $out != *"(docs/"*".md)"* ]]; then
        echo "FAIL: $name --help: exit $rc: $(head -3 <<<"$out")"
        fails=$((fails + 1))
    fi
done
[[ $fails -eq 0 ]] || exit 1
echo "ok: ${#cases[@]} commands"
