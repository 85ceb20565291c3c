#!/usr/bin/env bash
# Every command parses its flags with the one flag table (core/flags.h): a mistyped flag
# exits 2 with one line that names the command once and suggests the nearest flag, and
# `loom CMD --help` prints its grouped help (exit 0) naming a docs page (loom data SUB
# --help: that subcommand's own).
set -uo pipefail
loom=$1
fails=0
# "command words|its name in messages|mistyped flag|the suggestion"
cases=(
    "train|train|--global-bach|--global-batch"
    "run|run|--max-restart|--max-restarts"
    "rl|rl|--promts|--prompts"
    "plan|plan|--wrold|--world"
    "pp-schedule|pp-schedule|--micro-bathces|--micro-batches"
    "ckpt|ckpt|--dtpye|--dtype"
    "gpu-info|gpu-info|--arena-md|--arena-mb"
    "generate|generate|--weigths|--weights"
    "generate --image x.png|generate|--max-tokes|--max-tokens"
    "sample|sample|--wieghts|--weights"
    "plot|plot|--tilte|--title"
    "tokenizer encode|tokenizer|--tokenzier|--tokenizer"
    "tokenizer train|tokenizer|--vocab-szie|--vocab-size"
    "calibrate|calibrate|--quik|--quick"
    "data bytes|data|--val-fractoin|--val-fraction"
    "data prepare|data|--tokenzier|--tokenizer"
    "data images|data|--shard-sampels|--shard-samples"
    "data video|data|--from-imags|--from-images"
    "data arith|data|--digts|--digits"
    "data vlm|data|--mixde-images|--mixed-images"
)
for c in "${cases[@]}"; do
    IFS='|' read -r words named typo near <<<"$c"
    read -ra cmd <<<"$words"
    out=$("$loom" "${cmd[@]}" "$typo" 1 2>&1)
    rc=$?
    name="loom $named"
    if [[ $rc -ne 2 || $(wc -l <<<"$out") -ne 1 || $out != "$name: unknown option '$typo': did you mean $near? (see --help"*")" ||
        $(grep -o "loom $named" <<<"$out" | wc -l) -ne 1 ]]; then
        echo "FAIL: $name $typo: exit $rc: $out"
        fails=$((fails + 1))
    fi
    out=$("$loom" "${cmd[@]}" --help 2>&1)
    rc=$?
    if [[ $rc -ne 0 || $out != usage:* ]] || ! grep -q '^[A-Za-z].* (docs/[A-Za-z_.-]*\.md):$' <<<"$out"; then
        echo "FAIL: $name --help: exit $rc: $(head -3 <<<"$out")"
        fails=$((fails + 1))
    fi
    # a subcommand's help is its own (loom data SUB --help names that subcommand only)
    if [[ $words == "data "* && ($out != "usage: loom $words "* || $(grep -o 'loom data [a-z]*' <<<"$out" | sort -u | wc -l) -ne 1) ]]; then
        echo "FAIL: loom $words --help is not that subcommand's alone: $(head -3 <<<"$out")"
        fails=$((fails + 1))
    fi
done
out=$("$loom" --help)
grep -q '^Train (docs/' <<<"$out" || { echo "FAIL: loom --help: $(head -5 <<<"$out")"; fails=$((fails + 1)); }
[[ $fails -eq 0 ]] || exit 1
echo "ok: ${#cases[@]} commands"
